"""`serve`'s start-up (issue 26): the default layout follows what the backend has (CPU devices
share the cores: one instance per 2 cores; accelerators: one per device) and --devices still
wins; the persistent compilation cache is on by default in the user cache directory, and a
warm start loads every program from it (no backend compile) and says so; a program needed on
several identical devices is compiled once and loaded onto the others; the warm-up compiles
every step program without running it, and serving compiles nothing more."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from _subprocess import run_python

from flexnpu import compilation_cache
from flexnpu.cli import serve
from flexnpu.cli.errors import CliError
from flexnpu.serving import layout


def _devices(n: int, platform: str = "cpu") -> list[SimpleNamespace]:
    return [SimpleNamespace(platform=platform) for _ in range(n)]


@pytest.mark.parametrize(
    ("devices", "cores", "instances", "reason"),
    [
        (4, 2, 1, "4 CPU devices share 2 cores: 1 instance"),
        (4, 1, 1, "4 CPU devices share 1 core: 1 instance"),
        (4, 5, 2, "4 CPU devices share 5 cores: 2 instances"),
        (4, 8, 4, "4 CPU devices over 8 cores: 4 instances"),
        (4, 64, 4, "4 CPU devices over 64 cores: 4 instances"),
        (1, 2, 1, "1 CPU device over 2 cores: 1 instance"),
    ],
)
def test_cpu_devices_get_the_instances_their_cores_hold(
    devices: int, cores: int, instances: int, reason: str
) -> None:
    choice = layout.default_instances(_devices(devices), cores=cores)
    assert (choice.instances, choice.reason) == (instances, reason)


def test_accelerators_get_one_instance_per_device() -> None:
    choice = layout.default_instances(_devices(8, "gpu"), cores=2)
    assert (choice.instances, choice.reason) == (8, "8 gpu devices: one instance each")
    # FlexNPU's virtual NPUs over an accelerator backend: their physical platform decides.
    over_cuda = layout.default_instances(_devices(4, "flexnpu"), cores=2, platform="cuda")
    assert over_cuda.instances == 4


def test_flexnpu_devices_over_the_cpu_plugin_count_as_cpu(npu_devices: list) -> None:
    assert layout.physical_platform(npu_devices[0]) == "cpu"
    choice = layout.default_instances(npu_devices, cores=2)
    assert choice.instances == 1
    assert choice.reason == f"{len(npu_devices)} CPU devices share 2 cores: 1 instance"


def test_emulated_accelerators_get_one_instance_per_device() -> None:
    # Their programs compile for the CPU but never run: the host's cores do not limit them.
    r = run_python(
        "import jax\n"
        "from flexnpu.serving import layout\n"
        "devices = jax.devices()\n"
        "choice = layout.default_instances(devices, cores=2)\n"
        "print(layout.emulated_device_kind(devices[0]), choice.instances, choice.reason)\n",
        {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_BACKEND": "emulate:910c",
         "FLEXNPU_BACKEND_OPTIONS": "device_count=6"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == (
        "ascend910c 6 6 emulated ascend910c devices: one instance each"
    )


def test_no_devices_is_an_error() -> None:
    with pytest.raises(ValueError, match="no devices"):
        layout.default_instances([], cores=2)


def _args(*argv: str) -> argparse.Namespace:
    return serve.build_parser().parse_args(list(argv))


def test_the_default_instances_apply_unless_devices_is_given() -> None:
    assert serve.engine_config(_args(), 4, default_instances=1).num_devices == 1
    assert serve.engine_config(_args("--devices", "3"), 4, default_instances=1).num_devices == 3
    assert serve.engine_config(_args("--devices", "4"), 4, default_instances=1).num_devices == 4
    split = serve.engine_config(_args("--prefill-devices", "1"), 4, default_instances=1)
    assert (split.layout, split.prefill_devices, split.decode_devices) == ("split", 1, 3)


def test_the_adaptive_layout_co_locates_at_capacity_unless_told_not_to() -> None:
    on = serve.engine_config(_args("--layout", "adaptive"), 4, default_instances=1)
    assert (on.layout, on.split_colocate, on.split_hold_s) == ("adaptive", True, 2.0)
    off = serve.engine_config(
        _args("--layout", "adaptive", "--no-split-colocate", "--split-hold", "0"),
        4,
        default_instances=1,
    )
    assert (off.split_colocate, off.split_hold_s) == (False, 0.0)


def test_cache_directory_follows_xdg_cache_home(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation_cache.default_directory() == tmp_path / "flexnpu" / "jax-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec says
    home = Path.home() / ".cache" / "flexnpu" / "jax-cache"
    assert compilation_cache.default_directory() == home
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compilation_cache.default_directory() == home


def test_serve_caches_in_the_default_directory_unless_told_otherwise(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = serve._compilation_cache_dir(_args())
    assert default == tmp_path / "xdg" / "flexnpu" / "jax-cache" and default.is_dir()
    assert serve._compilation_cache_dir(_args("--no-compilation-cache")) is None
    mine = tmp_path / "mine"
    assert serve._compilation_cache_dir(_args("--compilation-cache", str(mine))) == mine
    with pytest.raises(SystemExit):
        _args("--compilation-cache", str(mine), "--no-compilation-cache")
    capsys.readouterr()

    # A default directory that cannot be created: served without the cache, said in one line;
    # one named on the command line: an error naming it.
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert serve._compilation_cache_dir(_args()) is None
    out = capsys.readouterr().out
    assert f"compilation cache {blocker / 'flexnpu' / 'jax-cache'}" in out
    assert "serving without it" in out
    with pytest.raises(CliError, match="compilation cache .*file/sub"):
        serve._compilation_cache_dir(_args("--compilation-cache", str(blocker / "sub")))


# Warms a tiny engine over 2 identical devices up through serve's warm-up, with JAX's persistent
# cache in argv[1]: prints the warm-up output's last line, then one JSON line of counters.
_WARM_UP = r"""
import contextlib, io, json, sys
import jax
from flexnpu import compilation_cache, stats
from flexnpu.cli import serve
from flexnpu.serving.engine import Engine, EngineConfig
from flexnpu.serving.loading import load_model
from flexnpu.serving.output import IdsOutput
from flexnpu.serving.sampling import SamplingParams

cache_dir = sys.argv[1]
compilation_cache.use_directory(cache_dir)
m = load_model("random:tiny", log=lambda *a: None)
config = EngineConfig(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32,
                      chunk_buckets=[32])
engine = Engine(None, m.params, config, devices=jax.devices()[:2], model_config=m.config)
COUNTERS = ("backend_compiles", "backend_loads", "shared_loads")
before = {k: stats.clients()[0][k] for k in COUNTERS}  # the model's own set-up aside
out = io.StringIO()
with contextlib.redirect_stdout(out):
    serve._warm_up(engine, cache_dir)
compiles_after_warm_up = stats.clients()[0]["compiles"]
# One request on each instance (the second goes to the less loaded one), greedy.
sampling = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
outputs = [IdsOutput(sampling, engine.eos_ids) for _ in range(2)]
requests = [engine.submit([1, 2, 3 + i], sampling, o) for i, o in enumerate(outputs)]
engine.start()
for o in outputs:
    assert o.done.wait(300)
engine.stop()
client = stats.clients()[0]
print(json.dumps({"output": out.getvalue(), "ids": [o.ids for o in outputs],
                  "compiles_serving": client["compiles"] - compiles_after_warm_up,
                  "instances": [r.instance.name for r in requests],
                  "programs_per_instance": len(engine.instances[0].runner.programs()),
                  **{k: client[k] - before[k] for k in COUNTERS}}))
"""


def _warm_up(cache_dir: Path) -> dict:
    proc = run_python(
        _WARM_UP.replace("sys.argv[1]", repr(str(cache_dir))),
        env={"JAX_PLATFORMS": "flexnpu"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_programs_compile_once_for_identical_devices_and_a_warm_start_loads_them(
    tmp_path: Path,
) -> None:
    cold = _warm_up(tmp_path)
    assert [len(ids) for ids in cold["ids"]] == [6, 6]
    n = cold["programs_per_instance"]
    assert n == 3  # the decode-only step at two widths, one chunk bucket
    # Each program compiled for the first device and loaded onto the second.
    assert (cold["backend_compiles"], cold["shared_loads"]) == (n, n)
    assert "compiled in" in cold["output"] and "compiling" in cold["output"]
    assert "loading from cache" not in cold["output"]
    assert len(list(tmp_path.iterdir())) >= 2 * n, "one cache entry per program and device"
    # The warm-up compiled without running; serving then finds every executable.
    assert cold["compiles_serving"] == 0

    warm = _warm_up(tmp_path)
    assert warm["backend_compiles"] == 0, "a warm start compiles nothing"
    assert warm["backend_loads"] == 2 * n
    assert "loading from cache" in warm["output"] and "compiling" not in warm["output"]
    assert "loaded from the compilation cache in" in warm["output"]
    assert cold["instances"] == ["mixed-0", "mixed-1"]
    assert warm["ids"] == cold["ids"], "the loaded programs compute what the compiled ones did"
