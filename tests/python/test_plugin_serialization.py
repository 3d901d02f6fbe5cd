"""Executable serialization on flexnpu: jax.experimental.serialize_executable round trips, JAX's
persistent compilation cache across processes, across policies and device counts, and corrupt
input. Programs: one device, SPMD over 4, and a donating update (what KV caches use)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _subprocess import run_python
from jax.experimental import serialize_executable
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# Run in fresh interpreters: argv = mode (cache | write | read), directory. Prints one JSON line.
_PROGRAMS = r"""
import json, os, pickle, sys
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import serialize_executable as se
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from flexnpu import stats

mode, directory = sys.argv[1], sys.argv[2]
if mode == "cache":
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
hits = []
HIT = "/jax/compilation_cache/cache_hits"
jax.monitoring.register_event_listener(lambda e, **kw: hits.append(e) if e == HIT else None)
devices = jax.devices()
mesh = Mesh(np.array(devices[:4]), ("d",))
shard = NamedSharding(mesh, P("d"))
x = np.arange(16, dtype=np.float32)
programs = {
    "single": (jax.jit(lambda x: jnp.sin(x) * 2 + 1), [devices[1]],
               lambda: (jax.device_put(x, devices[1]),)),
    "spmd": (jax.jit(lambda x: x * 3 + x.sum(), in_shardings=shard, out_shardings=shard),
             devices[:4], lambda: (jax.device_put(x, shard),)),
    "donating": (jax.jit(lambda c, r: c.at[1].set(r), donate_argnums=(0,)), [devices[2]],
                 lambda: (jax.device_put(np.zeros((4, 16), np.float32), devices[2]),
                          jax.device_put(x, devices[2]))),
}
if mode != "cache":  # written on virtual device 6 (8 devices), read elsewhere on 4 devices
    d6 = devices[6] if len(devices) > 6 else devices[2]
    programs["on_device_6"] = (jax.jit(lambda x: x - 1), [d6], lambda: (jax.device_put(x, d6),))
results, errors, donated = {}, {}, None
for name, (fn, on, make_args) in programs.items():
    args = make_args()
    path = os.path.join(directory, name + ".pkl")
    if mode == "cache":
        out = fn(*args)
    elif mode == "write":
        compiled = fn.lower(*args).compile()
        with open(path, "wb") as f:
            pickle.dump(se.serialize(compiled), f)
        out = compiled(*args)
    else:
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        try:
            loaded = se.deserialize_and_load(payload, in_tree, out_tree, execution_devices=on)
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
            continue
        out = loaded(*args)
    results[name] = np.asarray(out).tolist()
    if name == "donating":
        donated = args[0].is_deleted()
client = stats.clients()[0]
print(json.dumps({"results": results, "errors": errors, "donated": donated, "hits": len(hits),
                  "compiles": client["compiles"], "backend_compiles": client["backend_compiles"],
                  "backend_loads": client["backend_loads"], "policy": client["policy"],
                  "platform_version": client["platform_version"]}))
"""

_PASSTHROUGH_4 = {"FLEXNPU_POLICY": "passthrough"}
_DYNAMIC_8_OVER_4 = {"FLEXNPU_POLICY": "dynamic", "FLEXNPU_NUM_VIRTUAL_DEVICES": "8"}


def _run(mode: str, directory: Path, env: dict[str, str]) -> dict:
    proc = run_python(
        _PROGRAMS.replace("sys.argv[1], sys.argv[2]", f"{mode!r}, {str(directory)!r}"),
        env={"JAX_PLATFORMS": "flexnpu", **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


def _expected() -> dict[str, list]:
    x = np.arange(16, dtype=np.float32)
    cache = np.zeros((4, 16), np.float32)
    cache[1] = x
    return {
        "single": (np.sin(x) * 2 + 1).tolist(),
        "spmd": (x * 3 + x.sum()).tolist(),
        "donating": cache.tolist(),
        "on_device_6": (x - 1).tolist(),
    }


def _assert_results(info: dict, names: list[str]) -> None:
    expected = _expected()
    assert sorted(info["results"]) == sorted(names), info
    for name in names:
        np.testing.assert_allclose(info["results"][name], expected[name], rtol=1e-5, atol=1e-6)
    assert info["donated"] is True, "the loaded donating executable must still donate"


def test_second_process_hits_the_persistent_cache_under_any_policy(tmp_path: Path) -> None:
    written = _run("cache", tmp_path, _PASSTHROUGH_4)
    names = ["single", "spmd", "donating"]
    _assert_results(written, names)
    assert written["hits"] == 0
    assert len(list(tmp_path.iterdir())) == 3, "one cache entry per program"

    same = _run("cache", tmp_path, _PASSTHROUGH_4)
    _assert_results(same, names)
    assert same["results"] == written["results"]
    assert same["hits"] == 3
    assert same["compiles"] == 0, "every program came from the cache"
    # Same policy and devices: every variant is the backend's serialized one, none recompiled.
    assert (same["backend_loads"], same["backend_compiles"]) == (3, 0)

    # 8 virtual devices over 4 under the dynamic policy: the same entries hit (the key hashes
    # the program, the virtual assignment and the platform version), and the executables are
    # rebuilt for this placement: variants it maps differently are compiled from the program.
    other = _run("cache", tmp_path, _DYNAMIC_8_OVER_4)
    _assert_results(other, names)
    assert other["results"] == written["results"]
    assert other["policy"] == "dynamic"
    assert other["hits"] == 3 and other["compiles"] == 0
    assert other["backend_loads"] >= 1


def test_serialized_executables_load_under_another_device_count(tmp_path: Path) -> None:
    written = _run("write", tmp_path, _DYNAMIC_8_OVER_4)
    _assert_results(written, ["single", "spmd", "donating", "on_device_6"])

    loaded = _run("read", tmp_path, _PASSTHROUGH_4)
    _assert_results(loaded, ["single", "spmd", "donating"])
    for name in ("single", "spmd", "donating"):
        assert loaded["results"][name] == written["results"][name]
    assert loaded["compiles"] == 0
    # A program for virtual device 6 cannot exist on a 4-device client: rejected, by name.
    error = loaded["errors"]["on_device_6"]
    assert "INVALID_ARGUMENT" in error
    assert "PJRT_Executable_DeserializeAndLoad" in error
    assert "virtual device id 6" in error and "devices 0..3" in error


@pytest.fixture(scope="module")
def single_compiled(npu_devices: list) -> tuple:
    device = npu_devices[3]
    x = jax.device_put(np.linspace(-2, 2, 64, dtype=np.float32), device)
    compiled = jax.jit(lambda v: jnp.tanh(v) @ jnp.ones((64, 8), jnp.float32)).lower(x).compile()
    return compiled, x


def test_round_trip_in_process_equals_direct(single_compiled: tuple, npu_devices: list) -> None:
    compiled, x = single_compiled
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    loaded = serialize_executable.deserialize_and_load(
        payload, in_tree, out_tree, execution_devices=[npu_devices[3]]
    )
    direct = np.asarray(compiled(x))
    np.testing.assert_array_equal(np.asarray(loaded(x)), direct)
    np.testing.assert_allclose(direct, np.tanh(np.asarray(x)) @ np.ones((64, 8)), atol=1e-5)
    # Written again from the loaded one: the same program, still loadable.
    again = serialize_executable.deserialize_and_load(
        *serialize_executable.serialize(loaded), execution_devices=[npu_devices[3]]
    )
    np.testing.assert_array_equal(np.asarray(again(x)), direct)


def test_spmd_round_trip_in_process(npu_devices: list) -> None:
    mesh = Mesh(np.array(npu_devices[:4]), ("d",))
    shard = NamedSharding(mesh, P("d"))
    x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), shard)
    compiled = jax.jit(lambda v: v * 2 - v.sum(), out_shardings=shard).lower(x).compile()
    loaded = serialize_executable.deserialize_and_load(
        *serialize_executable.serialize(compiled), execution_devices=npu_devices[:4]
    )
    out = loaded(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(compiled(x)))
    assert out.sharding == shard


def _raw(compiled: object) -> bytes:
    return compiled.runtime_executable().serialize()  # type: ignore[attr-defined]


# FlexNPU's envelope (pjrt_flexnpu/runtime/executable_serialization.h): magic, format (u32),
# payload size (u64), CRC-32C of all other bytes (u32), all little-endian; then the payload.
_MAGIC = b"flexnpu-executable"
_HEADER = len(_MAGIC) + 4 + 8 + 4


def _envelope_at(serialized: bytes) -> tuple[int, int]:
    """Where FlexNPU's envelope lies in a serialized executable (jaxlib wraps it in its own
    header): its start and its size."""
    start = serialized.find(_MAGIC)
    assert start >= 0, "no FlexNPU envelope"
    payload = int.from_bytes(serialized[start + 22 : start + 30], "little")
    return start, _HEADER + payload


def test_corrupt_entries_are_rejected_with_a_clear_error(
    single_compiled: tuple, npu_devices: list
) -> None:
    from jax._src.lib import xla_client

    compiled, _ = single_compiled
    raw = _raw(compiled)
    client = npu_devices[0].client
    on = xla_client.DeviceList((npu_devices[3],))
    start, size = _envelope_at(raw)
    assert start + size == len(raw), "the envelope is the tail of jaxlib's bytes"

    def rejected(bad: bytes) -> str:
        with pytest.raises(jax.errors.JaxRuntimeError) as info:
            client.deserialize_executable(bad, on)
        message = str(info.value)
        assert "INVALID_ARGUMENT" in message, message
        assert "PJRT_Executable_DeserializeAndLoad: serialized executable: " in message, message
        return message

    # Fixed positions (the bytes differ from compile to compile, the verdicts do not): every
    # header byte after the magic, every 97th payload byte, the last 8 bytes (format 1 lost
    # flips there); a bit chosen by position.
    after_magic = range(start + len(_MAGIC), start + _HEADER)
    payload = range(start + _HEADER, start + size - 8, 97)
    tail = range(start + size - 8, start + size)
    for position in [*after_magic, *payload, *tail]:
        bad = bytearray(raw)
        bad[position] ^= 1 << (position % 8)
        message = rejected(bytes(bad))
        assert "checksum mismatch (stored 0x" in message, (position, message)
        assert "the bytes are corrupt" in message, (position, message)
    bad = bytearray(raw)
    bad[start + 3] ^= 0x10
    assert "magic 'flexnpu-executable' damaged at byte 3" in rejected(bytes(bad))
    assert "(bytes appended?)" in rejected(raw + b"\0")


def test_a_corrupt_persistent_cache_entry_is_a_miss_and_compiles_again(tmp_path: Path) -> None:
    """A damaged file in JAX's persistent cache: FlexNPU refuses it (checksum mismatch), JAX
    warns and compiles the program again (a miss), and the results are right."""
    from jax._src import compilation_cache

    names = ["single", "spmd", "donating"]
    written = _run("cache", tmp_path, _PASSTHROUGH_4)
    _assert_results(written, names)
    entries = sorted(tmp_path.iterdir())
    assert len(entries) == 3
    for entry in entries:
        data = bytearray(compilation_cache.decompress_executable(entry.read_bytes()))
        start, size = _envelope_at(bytes(data))
        data[start + _HEADER + (size - _HEADER) // 2] ^= 0x04  # a bit mid-payload
        entry.write_bytes(compilation_cache.compress_executable(bytes(data)))

    damaged = _run("cache", tmp_path, _PASSTHROUGH_4)
    _assert_results(damaged, names)
    assert damaged["hits"] == 0, "a damaged entry must not load"
    assert damaged["backend_loads"] == 0
    assert damaged["compiles"] == 3, "each program compiled again"
    warning = damaged["stderr"]
    assert "Error reading persistent compilation cache entry" in warning, warning[-3000:]
    assert "checksum mismatch" in warning and "the bytes are corrupt" in warning, warning[-3000:]


def test_platform_version_names_backend_build_and_format(npu_devices: list) -> None:
    version = npu_devices[0].client.platform_version
    assert "flexnpu 0.1.0 over cpu (" in version
    assert "backend build " in version and "executable format 2" in version


def test_cache_hook_is_installed_and_jax_still_lists_platforms() -> None:
    """Pins the JAX internals flexnpu/compilation_cache.py relies on (fails on a JAX upgrade
    that moves them): the platform list inside is_cache_used, wrapped by the plugin."""
    import inspect

    from jax._src import compilation_cache, compiler

    assert getattr(compilation_cache.is_cache_used, "_flexnpu_wrapped", False)
    source = inspect.getsource(compiler._get_cache_key)
    assert "compilation_cache.is_cache_used(backend)" in source
    wrapped = compilation_cache.is_cache_used.__closure__  # type: ignore[attr-defined]
    original = next(c.cell_contents for c in wrapped if callable(c.cell_contents))
    assert 'supported_platforms = ["tpu", "gpu", "cpu", "neuron"]' in inspect.getsource(original)


def test_cache_over_a_second_backend_is_its_own(tmp_path: Path) -> None:
    """Over the lammps CPU plugin (PJRT C API 0.115) the cache works the same, and its entries
    are never hit over the default backend: the platform version in the key names the backend."""
    lammps = pytest.importorskip("lammps_jax_pjrt_cpu")
    plugin = Path(lammps.__file__).parent / "pjrt_c_api_cpu_plugin.so"
    over_lammps = {**_PASSTHROUGH_4, "FLEXNPU_BACKEND": str(plugin),
                   "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=4",
                   "FLEXNPU_ALLOW_NEWER_BACKEND": "1"}
    names = ["single", "spmd", "donating"]
    written = _run("cache", tmp_path, over_lammps)
    _assert_results(written, names)
    assert "PJRT C API 0.115" in written["platform_version"]
    again = _run("cache", tmp_path, over_lammps)
    _assert_results(again, names)
    assert (again["hits"], again["compiles"], again["backend_loads"]) == (3, 0, 3)
    default = _run("cache", tmp_path, _PASSTHROUGH_4)
    _assert_results(default, names)
    assert default["platform_version"] != written["platform_version"]
    assert (default["hits"], default["backend_loads"]) == (0, 0), "another backend's entries"


# JAX's compilation_cache_test::test_dump_on_cache_hit: compiled with xla_dump_to=DIR1, then hit
# in the cache with xla_dump_to=DIR2 (protos too). Prints one JSON line: files per directory.
_DUMP_ON_CACHE_HIT = r"""
import json, os, sys, tempfile
import jax
cache, dir1, dir2 = sys.argv[1:4]
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
hits = []
HIT = "/jax/compilation_cache/cache_hits"
jax.monitoring.register_event_listener(lambda e, **kw: hits.append(e) if e == HIT else None)
first = jax.jit(lambda x: x + 1, compiler_options={"xla_dump_to": dir1})(1)
second = jax.jit(lambda x: x + 1, compiler_options={
    "xla_dump_to": dir2, "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True})(1)
def dumped(d):
    return sorted(f.split(".", 2)[2] for f in os.listdir(d) if "after_optimizations." in f)
print(json.dumps({"results": [int(first), int(second)], "hits": len(hits),
                  "dir1": dumped(dir1), "dir2": dumped(dir2)}))
"""


def _lammps_env() -> dict[str, str]:
    lammps = pytest.importorskip("lammps_jax_pjrt_cpu")
    plugin = Path(lammps.__file__).parent / "pjrt_c_api_cpu_plugin.so"
    return {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_BACKEND": str(plugin),
            "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=4", "FLEXNPU_ALLOW_NEWER_BACKEND": "1"}


@pytest.mark.parametrize("platform", ["flexnpu", "flexnpu_over_lammps", "cpu"])
def test_a_cache_hit_dumps_with_its_own_options_as_on_cpu(tmp_path: Path, platform: str) -> None:
    """The inner plugin dumps a loaded executable with the compile options it is loaded with:
    FlexNPU passes it the options of this load (rewritten to the physical devices), so a cache
    hit's dump lands in the hit's xla_dump_to, not in the first compile's, as on cpu."""
    dirs = [tmp_path / name for name in ("cache", "dump1", "dump2")]
    for d in dirs:
        d.mkdir()
    code = _DUMP_ON_CACHE_HIT.replace("sys.argv[1:4]", repr([str(d) for d in dirs]))
    env = _lammps_env() if platform == "flexnpu_over_lammps" else {"JAX_PLATFORMS": platform}
    proc = run_python(code, env={**env, **_PASSTHROUGH_4})
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["results"] == [2, 2]
    assert info["hits"] == 1
    # The first compile: the backend's own dump; the hit: the loaded module's, text and proto.
    assert info["dir1"] == ["cpu_after_optimizations.txt"], info
    assert info["dir2"] == ["after_optimizations.hlo.pb", "after_optimizations.txt"], info
