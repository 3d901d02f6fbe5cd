"""What a new user meets first (issue 26): a busy port fails before any loading, naming the port;
`serve --policy`; a bad configuration is one line `flexnpu <sub>: ...` and exit code 2, not a
JAX traceback; `devices` lists the CPU devices of the CPU backend; simulate plots carry a title
with the run's settings."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _serving import require

REPO = Path(__file__).resolve().parents[2]
TINY_SERVE = (
    "--model random:tiny --max-model-len 128 --max-num-seqs 2 --max-num-batched-tokens 32 "
    "--chunk-buckets 32 --devices 1"
).split()


def _run(
    args: list[str], env: dict[str, str] | None = None, jax_platforms: str | None = "flexnpu"
) -> subprocess.CompletedProcess:
    """`args` in a fresh interpreter without the caller's FLEXNPU_* settings, under
    JAX_PLATFORMS=`jax_platforms` (None: unset, as a new user starts)."""
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLEXNPU_") and k not in ("TF_CPP_MIN_LOG_LEVEL", "JAX_PLATFORMS")
    }
    if jax_platforms is not None:
        full["JAX_PLATFORMS"] = jax_platforms
    full.update(env or {})
    return subprocess.run(
        [sys.executable, *args], env=full, capture_output=True, text=True, timeout=300, cwd=REPO
    )


def _one_error_line(proc: subprocess.CompletedProcess, sub: str) -> str:
    """The one `flexnpu <sub>: ...` line of a run that exited 2 with no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "JAX_PLATFORMS=''" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"flexnpu {sub}: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("entry", [["-m", "flexnpu", "serve"], ["examples/serve.py"]])
def test_busy_port_fails_before_loading_naming_the_port(entry: list[str]) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        t0 = time.perf_counter()
        proc = _run([*entry, *TINY_SERVE, "--port", str(port)])
        took = time.perf_counter() - t0
    line = _one_error_line(proc, "serve")
    assert line == f"flexnpu serve: cannot listen on 127.0.0.1:{port}: address already in use"
    assert "serving" not in proc.stdout and "JAX platform" not in proc.stdout, proc.stdout
    print(f"busy port reported after {took:.2f} s")  # no timing assert: a loaded machine varies


def test_serve_help_offers_policy() -> None:
    proc = _run(["-m", "flexnpu", "serve", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "--policy POLICY" in proc.stdout and "FLEXNPU_POLICY" in proc.stdout


def test_bad_policy_is_one_line_naming_it() -> None:
    flag = _run(["-m", "flexnpu", "serve", *TINY_SERVE, "--port", "0", "--policy", "bogus"])
    line = _one_error_line(flag, "serve")
    assert "unknown placement policy 'bogus'" in line, line
    assert "known: passthrough, static-pd, static-colocate, dynamic" in line
    env = _run(["-m", "flexnpu", "serve", *TINY_SERVE, "--port", "0"], {"FLEXNPU_POLICY": "bogus"})
    assert _one_error_line(env, "serve") == line
    out_of_range = _run(
        [
            "-m",
            "flexnpu",
            "serve",
            *TINY_SERVE,
            "--port",
            "0",
            "--policy",
            "static-pd:prefill=0|decode=9",
        ]
    )
    assert "device 9 does not exist" in _one_error_line(out_of_range, "serve")


def test_policy_needs_the_flexnpu_platform() -> None:
    proc = _run(
        ["-m", "flexnpu", "serve", *TINY_SERVE, "--port", "0", "--policy", "dynamic"],
        {"JAX_PLATFORMS": "cpu"},
    )
    line = _one_error_line(proc, "serve")
    assert (
        line == "flexnpu serve: --policy dynamic: JAX's platform is cpu, not flexnpu "
        "(JAX_PLATFORMS=cpu)"
    )


def test_missing_backend_library_is_one_line() -> None:
    proc = _run(["-m", "flexnpu", "devices"], {"FLEXNPU_BACKEND": "/nonexistent.so"})
    line = _one_error_line(proc, "devices")
    assert line.startswith("flexnpu devices: cannot load physical backend '/nonexistent.so': ")
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        (
            ["serve", "--port", "0"],  # the default model: the backend fails before it loads
            {"FLEXNPU_BACKEND_OPTIONS": "garbage"},
            "malformed backend option 'garbage': expected key=value",
        ),
        (
            ["stats", "examples/quickstart.py"],
            {"FLEXNPU_POLICY": "bogus"},
            "unknown placement policy 'bogus'",
        ),
        (
            ["devices"],
            {"FLEXNPU_BACKEND": "/nonexistent.so"},
            "cannot load physical backend '/nonexistent.so': ",
        ),
        (
            ["daemon", "--socket", "/tmp/flexnpu-unserved.sock", "--backend", "/nonexistent.so"],
            {},
            "cannot load physical backend '/nonexistent.so': ",
        ),
    ],
)
def test_bad_configuration_without_jax_platforms_is_only_one_line(
    command: list[str], env: dict[str, str], message: str
) -> None:
    # No JAX_PLATFORMS, as a new user starts: the commands ask for flexnpu themselves.
    proc = _run(["-m", "flexnpu", *command], env, jax_platforms=None)
    line = _one_error_line(proc, command[0])
    assert message in line, line
    assert proc.stderr == line + "\n"  # no JAX warning, no backend log line
    assert proc.stdout == ""


def test_quickstart_prints_only_its_own_output() -> None:
    proc = _run(["examples/quickstart.py"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""  # no backend log line (E0000 ... Unsupported fusion), no JAX warning
    lines = proc.stdout.splitlines()
    assert lines[0] == "platform: flexnpu, 4 devices", lines
    assert lines[6].startswith("grad norm: ") and lines[7].startswith("sharded over 4 devices: ")


def test_the_physical_backends_log_lines_show_when_asked_for() -> None:
    # The lines the quickstart no longer shows exist: the CPU plugin logs them while compiling.
    code = (
        "import jax, jax.numpy as jnp; x, w = jnp.ones((64, 256)), jnp.ones((256, 1024)); "
        "print(jax.jit(lambda x, w: jax.nn.gelu(x @ w).sum())(x, w))"
    )
    proc = _run(["-c", code], {"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Unsupported fusion type" in proc.stderr, proc.stderr[-3000:]


def test_devices_lists_the_cpu_backends_devices() -> None:
    proc = _run(["-m", "flexnpu", "devices"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("flexnpu ") and " over cpu " in lines[0], lines
    assert lines[0].endswith(": 4 physical devices, 4 virtual, policy passthrough"), lines
    cpu_rows = [line.split() for line in lines if line.split()[1:2] == ["pjrt"]]
    assert [r[2] for r in cpu_rows] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert [r[-1] for r in cpu_rows] == ["0", "1", "2", "3"]
    assert lines[-1] == (
        "virtual devices: flexnpu:0 over cpu:0, flexnpu:1 over cpu:1, "
        "flexnpu:2 over cpu:2, flexnpu:3 over cpu:3"
    )


def test_devices_json_follows_the_cpu_device_count() -> None:
    proc = _run(
        ["-m", "flexnpu", "devices", "--json"],
        {"FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2", "FLEXNPU_NUM_VIRTUAL_DEVICES": "3"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(proc.stdout) if r["source"] == "pjrt"]
    assert rows == [
        {
            "index": p,
            "source": "pjrt",
            "name": f"cpu:{p}",
            "preset": "cpu",
            "memory_total_bytes": None,
            "memory_free_bytes": None,
            "utilization": {"compute": None, "memory": None},
            "pjrt_device": p,
        }
        for p in range(2)
    ]


def test_backend_error_is_unwrapped_and_other_errors_keep_their_traceback(capsys) -> None:
    from flexnpu.cli.errors import CliError, backend_error, run_subcommand

    for hint in (
        "(set JAX_PLATFORMS='' to automatically choose an available backend)",
        "(you may need to uninstall the failing plugin package, or set "
        "JAX_PLATFORMS=cpu to skip this backend.)",
    ):
        jax_error = RuntimeError(
            f"Unable to initialize backend 'flexnpu': INVALID_ARGUMENT: "
            f"FlexNPU option 'x' is bad (known: a, b) {hint}"
        )
        assert backend_error(jax_error) == "FlexNPU option 'x' is bad (known: a, b)"
    assert backend_error(RuntimeError("Unable to initialize backend 'cuda': no GPU")) is None
    assert backend_error(ValueError("Unable to initialize backend 'flexnpu': x")) is None

    def refuse() -> int:
        raise CliError("no good")

    assert run_subcommand("serve", refuse) == 2
    assert capsys.readouterr().err == "flexnpu serve: no good\n"

    def crash() -> int:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_subcommand("serve", crash)


SERVE_TINY_APP = """
import socket
from flexnpu.cli.serve import bind_listening_socket
from flexnpu.serving.server import InFlight
from flexnpu.serving.shutdown import serve

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

sock = bind_listening_socket("127.0.0.1", 0)
port = sock.getsockname()[1]

def listening():
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it listens already
    print("listening", port, flush=True)

serve(app, InFlight(), 0, sockets=[sock], on_listening=listening, log_level="warning")
"""


def test_serve_says_listening_once_it_listens_on_the_bound_socket() -> None:
    require("uvicorn", "httpx")
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_TINY_APP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening "), (line, proc.stderr and proc.stderr.read())
        port = int(line.split()[1])
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).text == "ok"
    finally:
        proc.kill()
        proc.wait(30)


def test_simulate_plots_are_titled_with_the_run_settings(tmp_path: Path) -> None:
    require("matplotlib")
    from flexnpu.__main__ import main as flexnpu_main
    from flexnpu.sim import report

    out = tmp_path / "r.json"
    args = [
        "simulate",
        "--devices",
        "4",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--workload",
        "sharegpt",
        "--rate",
        "4",
        "--duration",
        "1",
        "--seeds",
        "2",
        "--seed",
        "5",
        "--policies",
        "dynamic,passthrough",
        "--no-progress",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "plots"),
    ]
    assert flexnpu_main(args) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "timeline.png",
        "tpot_cdf.png",
        "ttft_cdf.png",
    ]
    doc = json.loads(out.read_text())
    figures = report.figures(doc)
    try:
        titles = {name: fig.get_suptitle() for name, fig in figures.items()}
    finally:
        import matplotlib.pyplot as plt

        for fig in figures.values():
            plt.close(fig)
    expected = (
        "4 x cpu (4 units of 1), smollm2-135m, workload sharegpt at 4 req/s for 1 s\n"
        "dynamic, passthrough; seeds 5-6"
    )
    assert {"ttft_cdf.png", "tpot_cdf.png", "timeline.png"} <= set(titles)
    assert set(titles.values()) == {expected}
