"""What several benchmarks share: FlexNPU beside its physical backend in one process, a free
loopback port and `flexnpu serve` as a subprocess (start_server), the serving engine's SmolLM2
programs timed bare, and the fake vendor libraries of tests/fakes/ (the hardware tests build
them with the same function)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# --- Token timings -------------------------------------------------------------------------------


def steady_gaps(token_times: list[list[float]]) -> list[float]:
    """The gaps between consecutive tokens of concurrent requests while all of them decode:
    from the last first token to the first last token (the steady inter-token latency)."""
    start = max(times[0] for times in token_times)
    end = min(times[-1] for times in token_times)
    return [
        b - a
        for times in token_times
        for a, b in zip(times, times[1:], strict=False)
        if a >= start and b <= end
    ]


# --- FlexNPU and its physical backend side by side ----------------------------------------------

# The `xla-cpu-pjrt` plugin loaded a second time by JAX directly, under this platform name, so
# benchmarks compare FlexNPU with its physical backend under identical conditions.
DIRECT_PLATFORM = "xlacpu"


def setup_side_by_side(num_physical: int = 4) -> tuple[list[Any], list[Any]]:
    """Returns (flexnpu devices, direct physical devices)."""
    import jax
    from jax._src import xla_bridge

    import flexnpu

    xla_bridge.register_plugin(
        DIRECT_PLATFORM,
        library_path=str(flexnpu.cpu_plugin_path()),
        options={"cpu_device_count": num_physical},
    )
    jax.config.update("jax_platforms", f"flexnpu,{DIRECT_PLATFORM}")
    return jax.devices("flexnpu"), jax.devices(DIRECT_PLATFORM)


# --- servers ------------------------------------------------------------------------------------

HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class ServerStartError(RuntimeError):
    """The server exited, or did not answer /health in time; the message ends with the tail of
    its output."""


# SIGTERM drains (the requests in flight get the server's --shutdown-grace-s), SIGKILL ends it.
DEFAULT_STOP_SIGNALS: tuple[tuple[signal.Signals, float], ...] = (
    (signal.SIGTERM, 30.0),
    (signal.SIGKILL, 10.0),
)


class ServeProcess:
    """`python -m flexnpu serve` (or `launcher`, which takes serve's options) as a subprocess on
    127.0.0.1 at a free port, its output in `log` (a temporary file if None). start_server()
    launches one and waits for /health; stop() ends it. A context manager that stops it."""

    def __init__(
        self,
        serve_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        port: int | None = None,
        launcher: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        if log is None:
            fd, name = tempfile.mkstemp(prefix="flexnpu-serve-", suffix=".log")
            os.close(fd)
            log = Path(name)
        self.log = log
        launcher = list(launcher or (sys.executable, "-m", "flexnpu", "serve"))
        self.command = [*launcher, "--host", HOST, "--port", str(self.port), *serve_args]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether /health answers 200 now."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=timeout_s) as r:  # noqa: S310 - loopback
                return r.status == 200
        except OSError:  # refused, reset, timed out, or an HTTP error status
            return False

    def wait_ready(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> float:
        """Waits until /health answers 200; returns the seconds waited. ServerStartError at
        once if the process exits, or after timeout_s (the process is then stopped)."""
        start = time.monotonic()
        while True:
            if not self.alive():
                raise ServerStartError(
                    f"the server exited with {self.proc.returncode} before /health "
                    f"({' '.join(self.command)}); log {self.log}:\n{self.output_tail()}"
                )
            if self.healthy():
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                self.stop()
                raise ServerStartError(
                    f"no /health from {self.base_url} in {timeout_s:.0f}s; log {self.log}:\n"
                    f"{self.output_tail()}"
                )
            time.sleep(poll_s)

    def stop(
        self, signals: Sequence[tuple[signal.Signals, float]] = DEFAULT_STOP_SIGNALS
    ) -> int | None:
        """Sends each signal in turn until the process exits (waiting the given seconds after
        each); returns its exit status."""
        for sig, wait_s in signals:
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    serve_args: Sequence[str],
    *,
    timeout_s: float = 600.0,
    poll_s: float = 1.0,
    **launch: Any,
) -> ServeProcess:
    """Launches the server (ServeProcess(serve_args, **launch)) and waits for its /health;
    ServerStartError (with the output's tail) if it exits first or does not answer in time."""
    server = ServeProcess(serve_args, **launch)
    try:
        server.wait_ready(timeout_s, poll_s)
    except BaseException:
        server.stop()
        raise
    return server


# --- the serving engine's programs, bare ----------------------------------------------------------


def smollm2_engine(**engine_config: Any) -> Any:
    """The serving engine over SmolLM2-135M shapes with random float32 weights (the programs'
    times do not depend on the values) on the first JAX device; EngineConfig(**engine_config),
    one device."""
    import jax
    import jax.numpy as jnp

    from flexnpu.serving import model
    from flexnpu.serving.config import SMOLLM2_135M
    from flexnpu.serving.engine import Engine, EngineConfig

    ec = EngineConfig(num_devices=1, **engine_config)
    params = model.random_params(SMOLLM2_135M, dtype=jnp.float32)
    return Engine(
        None, params, ec, devices=[jax.devices()[0]], model_config=SMOLLM2_135M, eos_ids=()
    )


def time_program(runner: Any, chunk: int, width: int) -> float:
    """Seconds of one call of the runner's program (prompt chunk, block-table width) on padded
    inputs, as the engine's loop calls it: inputs put on the device, sampled ids read back."""
    import numpy as np

    inp = runner._padding_inputs(chunk, width)
    t = time.perf_counter()
    out = runner.steps.step(runner.params, runner.ck, runner.cv, runner.device_inputs(inp))
    runner.ck, runner.cv = out[4], out[5]
    np.asarray(out[0])
    return time.perf_counter() - t


def decode_inputs(runner: Any, rows: int, position: int) -> dict:
    """Decode-only inputs: `rows` sequences at `position`, each with its own blocks."""
    import numpy as np

    from flexnpu.serving import kvcache

    sh = runner.shapes
    need = -(-(position + 1) // sh.block_size)
    inp = runner._padding_inputs(0, sh.decode_width(need))  # as the engine's runner picks it
    for r in range(rows):
        blocks = list(range(r * need, (r + 1) * need))
        inp["tokens"][r] = 100 + r
        inp["positions"][r] = position
        inp["slots"][r] = kvcache.slots_of(blocks, position, 1, sh.block_size)[0]
        inp["dec_tables"][r, :need] = blocks
    inp["sample_pos"][:rows] = position + 1
    return {k: np.asarray(v) for k, v in inp.items()}


# --- the fake vendor libraries ------------------------------------------------------------------

FAKES = REPO / "tests" / "fakes"

# variant folder -> (file name, source, defines)
FAKE_VARIANTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "ascendcl": ("libascendcl.so", "fake_ascendcl.c", ()),
    "ascendcl_no_util": ("libascendcl.so", "fake_ascendcl.c", ("FAKE_OMIT_UTILIZATION",)),
    "ascendcl_no_meminfo": ("libascendcl.so", "fake_ascendcl.c", ("FAKE_OMIT_MEMINFO",)),
    "dcmi": ("libdcmi.so", "fake_dcmi.c", ()),
    "nvml": ("libnvidia-ml.so.1", "fake_nvml.c", ()),
    "cuda": ("libcuda.so.1", "fake_cuda.c", ()),
}


def build_fakes(out: Path) -> dict[str, Path]:
    """Compiles every variant of tests/fakes/ with the system C compiler (CMake builds the same
    sources for the C++ tests) into out/<variant>/<file name>; returns variant -> path."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) to build the fake vendor libraries")
    paths = {}
    for variant, (file_name, source, defines) in FAKE_VARIANTS.items():
        target = out / variant / file_name
        target.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            compiler, "-shared", "-fPIC", "-O1", "-fvisibility=hidden",
            f"-I{REPO}", f"-I{FAKES}",
            *(f"-D{d}" for d in defines),
            "-o", str(target), str(FAKES / source), str(FAKES / "fake_script.c"),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        paths[variant] = target
    return paths
