"""FlexNPU's first-accelerator check: one command that builds FlexNPU from the working tree on a
bare GPU machine and runs, each part reporting passed / failed / skipped with its reason:

  build        pip install --no-deps --no-build-isolation . with the carried PJRT header
  conformance  `jax.devices()` over the GPU; parity programs of tests/python/
               test_plugin_programs.py on flexnpu vs JAX's own cuda backend, in one process
  dispatch     flexnpu/direct: a tiny op, a 256x256 matmul, the served decode step
  calibration  the decode and 2k-prefill steps of an 8B model (Llama-3-8B shapes) and an
               8192^3 bf16 matmul, measured on the GPU vs emulate:h200's prediction
  telemetry    NVML read live by FlexNPU's client while matmuls run, vs nvidia-smi
  export       a model exported on CPU (`serve --export`) served on the GPU: same greedy tokens

    python -m bench.device_check --prepare .device          # here: the files a device run carries
    python3 -m bench.device_check --carried .device --build --out "$OUT"   # on the GPU machine
    python -m bench.device_check --backend cpu --out /tmp/dc [--quick]     # dry run, no GPU

It writes device_check.json and device_check.md to --out after every part (a run stopped at
its limit still leaves what it did); the exit code is 1 when a part failed. docs/hardware.md
has the exact device command.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import REPO

CARRIED_ARCHIVE = "xla_cpu_pjrt.tar.xz"  # the XLA CPU plugin package: emulator, export, CPU side
UNPACK_DIR = Path("/tmp/flexnpu-device-check")
CARRY_LIMIT_BYTES = 60 * 2**20  # the device tool carries 64 MiB with the working tree
DEVICE_DEADLINE_S = 470  # the device command's timeout_s is 540: the report is written first


# --- preparing the carried files (here)


def _xla_cpu_pjrt_dir() -> Path:
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or spec.origin is None:
        raise SystemExit("--prepare needs the `xla-cpu-pjrt` package installed here")
    return Path(spec.origin).resolve().parent


def prepare(dest: Path) -> None:
    """Copies the PJRT C header (FlexNPU builds against it) and packs the xla-cpu-pjrt plugin,
    which the GPU image lacks (the emulator and the CPU side of the export need it), into
    `dest`, an ignored folder the device command carries. Never committed."""
    src = _xla_cpu_pjrt_dir()
    (dest / "include").mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "include" / "pjrt_c_api.h", dest / "include" / "pjrt_c_api.h")
    archive = dest / CARRIED_ARCHIVE
    if not archive.exists() or archive.stat().st_mtime < (src / "xla_cpu_pjrt.so").stat().st_mtime:
        _pack(src, archive)
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {total / 2**20:.1f} MiB to carry")
    if total > CARRY_LIMIT_BYTES:
        raise SystemExit(f"{dest} is {total / 2**20:.1f} MiB: over the device tool's carry limit")


def _pack(src: Path, archive: Path) -> None:
    """xla_plugins/xla_cpu_pjrt/ as tar.xz (xz -6 brings the 259 MB plugin to 40 MB, under the carry
    limit; the wheel's zip does not)."""
    tmp = archive.with_suffix(".partial")
    members = ["__init__.py", "xla_cpu_pjrt.so", "include/pjrt_c_api.h"]
    root = src.parent.parent  # the site-packages folder holding xla_plugins/
    names = [str(Path("xla_plugins/xla_cpu_pjrt") / m) for m in members]
    if shutil.which("xz"):
        with open(tmp, "wb") as out:
            tar = subprocess.Popen(
                ["tar", "-C", str(root), "-cf", "-", *names], stdout=subprocess.PIPE
            )
            subprocess.run(["xz", "-6", "-T0", "-c"], stdin=tar.stdout, stdout=out, check=True)
            if tar.wait() != 0:
                raise SystemExit("tar failed packing the xla-cpu-pjrt plugin")
    else:
        with tarfile.open(tmp, "w:xz", preset=6) as t:
            for name in names:
                t.add(root / name, arcname=name)
    tmp.replace(archive)


def unpack(carried: Path) -> dict[str, str]:
    """On the device: the carried plugin package into a folder of its own; the environment
    that puts it on the path and points the build at the carried header."""
    site = UNPACK_DIR / "site"
    if not (site / "xla_plugins" / "xla_cpu_pjrt" / "xla_cpu_pjrt.so").exists():
        site.mkdir(parents=True, exist_ok=True)
        with tarfile.open(carried / CARRIED_ARCHIVE) as t:
            t.extractall(site, filter="data")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "FLEXNPU_PJRT_INCLUDE_DIR": str((carried / "include").resolve())}


# --- the report


class Report:
    """device_check.json and device_check.md in `out`, rewritten after every part."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.data: dict[str, Any] = {"meta": meta, "parts": {}}
        out.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, part: dict[str, Any]) -> None:
        self.data["parts"][name] = part
        reason = part.get("reason", "")
        print(
            f"[{part['status']:>7}] {name} ({part.get('seconds', 0):.0f} s): {reason}", flush=True
        )
        self.write()

    def failed(self) -> list[str]:
        return [n for n, p in self.data["parts"].items() if p["status"] == "failed"]

    def write(self) -> None:
        (self.out / "device_check.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "device_check.md").write_text(markdown(self.data))


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        "# FlexNPU device check",
        "",
        f"{meta.get('started')}, backend `{meta.get('backend')}`"
        + (" (quick)" if meta.get("quick") else "")
        + f", jax {meta.get('jax')}, jaxlib {meta.get('jaxlib')}, python {meta.get('python')}",
        "",
        "| part | status | seconds | reason |",
        "|---|---|---|---|",
    ]
    for name, p in data["parts"].items():
        reason = str(p.get("reason", "")).replace("|", "/").replace("\n", " ")[:300]
        lines.append(f"| {name} | {p['status']} | {p.get('seconds', 0):.0f} | {reason} |")
    lines += _dispatch_table(data["parts"].get("dispatch"))
    lines += _calibration_table(data["parts"].get("calibration"))
    if meta.get("nvidia_smi"):
        lines += ["", "nvidia-smi: " + "; ".join(meta["nvidia_smi"])]
    return "\n".join(lines) + "\n"


def _dispatch_table(part: dict[str, Any] | None) -> list[str]:
    rows = (part or {}).get("details", {}).get("rows")
    if not rows:
        return []
    out = [
        "",
        "## Dispatch (flexnpu / direct, medians)",
        "",
        "| program | flexnpu µs | direct µs | ratio | p10 ratio |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        p10 = r.get("ratio_p10")
        out.append(
            f"| {r['name']} | {r['flexnpu_median_us']:.1f} | {r['direct_median_us']:.1f} | "
            f"{r['ratio']:.3f} | {'-' if p10 is None else f'{p10:.3f}'} |"
        )
    return out


def _calibration_table(part: dict[str, Any] | None) -> list[str]:
    rows = (part or {}).get("details", {}).get("rows")
    if not rows:
        return []
    out = [
        "",
        "## Calibration: H200 measured vs emulate:h200 predicted",
        "",
        "| program | measured ms | predicted ms | error % |",
        "|---|---|---|---|",
    ]
    for r in rows:
        measured = "-" if r["measured_s"] is None else f"{r['measured_s'] * 1e3:.3f}"
        error = "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        predicted = "-" if r["predicted_s"] is None else f"{r['predicted_s'] * 1e3:.3f}"
        out.append(f"| {r['program']} | {measured} | {predicted} | {error} |")
    return out


# --- running parts


class Runner:
    """Starts workers (`--part NAME`) with the backend's environment, each bounded by the
    run's deadline; a worker that crashes or overruns is a failed part with its output's end."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], work: Path) -> None:
        self.args = args
        self.env = env
        self.work = work
        # The device command's timeout_s is 540: the report is written before it.
        deadline_s = args.deadline_s or (DEVICE_DEADLINE_S if args.backend == "cuda" else 1200)
        self.deadline = time.monotonic() + deadline_s
        self._serial = itertools.count()  # result file names, unique across threads

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start(self, part: str, env: dict[str, str], **extra: str) -> tuple[subprocess.Popen, Path]:
        result = self.work / f"{part}-{next(self._serial)}.json"
        cmd = [
            sys.executable,
            "-m",
            "bench.device_check",
            "--part",
            part,
            "--backend",
            self.args.backend,
            "--result",
            str(result),
        ]
        cmd += ["--quick"] if self.args.quick else []
        for key, value in extra.items():
            cmd += [f"--{key.replace('_', '-')}", value]
        log = open(result.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            cmd, cwd=REPO, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        return proc, result

    def finish(self, proc: subprocess.Popen, result: Path, limit_s: float) -> dict[str, Any]:
        limit = max(1.0, min(limit_s, self.left()))
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {
                "status": "failed",
                "reason": f"no result within {limit:.0f} s (the part's limit or the deadline)",
                "details": {"log_tail": _tail(result)},
            }
        if result.exists():
            return json.loads(result.read_text())
        return {
            "status": "failed",
            "reason": f"the worker exited with code {proc.returncode} and no result (crashed?)",
            "details": {"log_tail": _tail(result)},
        }

    def run(self, part: str, env: dict[str, str], limit_s: float, **extra: str) -> dict[str, Any]:
        return self.finish(*self.start(part, env, **extra), limit_s)


def _tail(result: Path, chars: int = 3000) -> str:
    log = result.with_suffix(".log")
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def backend_env(backend: str, cuda_plugin: Path | None) -> dict[str, str]:
    """FlexNPU over the CUDA plugin beside JAX's own cuda client in one process: neither
    preallocates (two clients), and the plugin's newer PJRT C API minor is accepted."""
    if backend != "cuda":
        return {}
    return {
        "FLEXNPU_BACKEND": str(cuda_plugin),
        "FLEXNPU_ALLOW_NEWER_BACKEND": "1",
        "FLEXNPU_BACKEND_OPTIONS": "preallocate=false",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }


def cuda_plugin_path() -> Path | None:
    """The CUDA PJRT plugin of the installed jax-cuda13-pjrt (or -cuda12-) package, where JAX's
    own discovery (jax_plugins/cuda/__init__.py, _get_library_path) finds it."""
    for package in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        try:
            spec = importlib.util.find_spec(package)
        except ModuleNotFoundError:
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(folder) / "xla_cuda_plugin.so"
            if candidate.is_file():
                return candidate
    return None


# --- the parts as the driver runs them


def part_build(runner: Runner) -> dict[str, Any]:
    """pip install of the working tree (CMake + ninja through scikit-build-core), no network."""
    t0 = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--config-settings=build-dir=build/device",
        ".",
    ]
    env = {**runner.env, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 4)}
    code, output = run_command(cmd, env, min(360.0, runner.left()))
    seconds = time.monotonic() - t0
    if code != 0:
        why = "did not finish in time" if code is None else f"exited {code}"
        return {"status": "failed", "reason": f"pip install {why}", "details": {"log_tail": output}}
    check = subprocess.run(
        [sys.executable, "-c", "import flexnpu, os; print(os.path.dirname(flexnpu.__file__))"],
        cwd="/",
        env=runner.env,
        capture_output=True,
        text=True,
    )
    status = "passed" if check.returncode == 0 else "failed"
    return {
        "status": status,
        "reason": f"built and installed in {seconds:.0f} s: {check.stdout.strip()}"
        if status == "passed"
        else f"import flexnpu failed: {check.stderr[-1500:]}",
        "seconds": seconds,
        "details": {"log_tail": output[-1500:]},
    }


def part_calibration(runner: Runner, predict: tuple, gpu_env: dict[str, str]) -> dict[str, Any]:
    """Rows (measured, predicted, error %) from the emulator's prediction, started early, and
    the GPU's measurement (skipped without one)."""
    predicted = runner.finish(*predict, limit_s=300)
    if runner.args.backend == "cuda":
        measured = runner.run("measure", {**gpu_env, "JAX_PLATFORMS": "cuda"}, limit_s=240)
    else:
        measured = {"status": "skipped", "reason": "no GPU: the H200 side runs on the device only"}
    predicted_s = predicted.get("details", {}).get("predicted_s", {})
    rows = _calibration_rows(predicted_s, measured)
    if predicted["status"] != "passed":  # the GPU's timings stay in the report
        return {
            **predicted,
            "reason": f"emulate:h200 prediction: {predicted['reason']}",
            "details": {
                **predicted.get("details", {}),
                "rows": rows,
                "measured": measured.get("details", {}),
            },
        }
    status = measured["status"]
    if status == "skipped":
        measured["reason"] += f" (emulate:h200 predicted {len(rows)} programs)"
    reason = "; ".join(
        f"{r['program']}: {r['error_pct']:+.1f}%" for r in rows if r["error_pct"] is not None
    )
    return {
        "status": status,
        "reason": reason or measured["reason"],
        "details": {
            "rows": rows,
            "predicted": predicted["details"],
            "measured": measured.get("details", {}),
            "measured_reason": measured["reason"],
        },
    }


def _calibration_rows(
    predicted: dict[str, float], measured: dict[str, Any]
) -> list[dict[str, Any]]:
    times = (
        measured.get("details", {}).get("measured", {}) if measured["status"] == "passed" else {}
    )
    rows = []
    for program in dict.fromkeys([*predicted, *times]):  # either side may be missing
        pred, meas = predicted.get(program), times.get(program, {}).get("median_s")
        error = None if meas is None or pred is None else (pred / meas - 1) * 100
        rows.append(
            {"program": program, "measured_s": meas, "predicted_s": pred, "error_pct": error}
        )
    return rows


def run_command(cmd: list[str], env: dict[str, str], limit_s: float) -> tuple[int | None, str]:
    """(exit code or None when it overran `limit_s`, its output's end)."""
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(1.0, limit_s)
        )
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"") + (e.stderr or b"")
        return None, output.decode(errors="replace")[-4000:]
    return proc.returncode, (proc.stdout + proc.stderr)[-4000:]


def part_export(runner: Runner, gpu_env: dict[str, str]) -> dict[str, Any]:
    """`serve --export` over the CPU plugin, then the export served on jaxlib's cpu and on
    flexnpu over the backend: the same greedy tokens."""
    export_dir = runner.work / "export"
    chunks = "32" if runner.args.quick else "16,32"  # one prefill program fewer
    cli = [
        sys.executable,
        "-m",
        "flexnpu",
        "serve",
        "--model",
        "random:tiny",
        "--seed",
        "5",
        "--export",
        str(export_dir),
        "--max-num-seqs",
        "2",
        "--max-model-len",
        "64",
        "--max-num-batched-tokens",
        "32",
        "--block-size",
        "16",
        "--chunk-buckets",
        chunks,
    ]
    code, output = run_command(cli, runner.env, min(240.0, runner.left()))
    if code != 0:
        why = "did not finish in time" if code is None else f"exited {code}"
        return {
            "status": "failed",
            "reason": f"serve --export {why}",
            "details": {"log_tail": output},
        }
    served = runner.run("export_serve", gpu_env, 300, export_dir=str(export_dir))
    return {**served, "reason": f"exported on CPU, {served['reason']}"}


def environment(backend: str, cuda_plugin: Path | None, quick: bool) -> dict[str, Any]:
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    smi = shutil.which("nvidia-smi")
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "backend": backend,
        "quick": quick,
        "python": platform.python_version(),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "jax_cuda_pjrt": version("jax-cuda13-pjrt") or version("jax-cuda12-pjrt"),
        "cuda_plugin": str(cuda_plugin) if cuda_plugin else None,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "nvidia_smi": subprocess.run(
            [smi, "-L"], capture_output=True, text=True
        ).stdout.splitlines()
        if smi
        else None,
    }


PARTS = ("conformance", "telemetry", "export", "dispatch", "calibration")


def drive(args: argparse.Namespace) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.carried:
        env |= unpack(args.carried)
    cuda_plugin = cuda_plugin_path()
    if args.backend == "auto":
        args.backend = "cuda" if cuda_plugin else "cpu"
    if args.backend == "cuda" and cuda_plugin is None:
        raise SystemExit("--backend cuda: no jax-cuda13-pjrt / jax-cuda12-pjrt plugin installed")
    report = Report(args.out, environment(args.backend, cuda_plugin, args.quick))
    work = UNPACK_DIR / f"work-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(args, env, work)
    if args.build:
        report.add("build", timed(lambda: part_build(runner)))
        if report.failed():
            return 1
    parts = planned_parts(runner, backend_env(args.backend, cuda_plugin))
    if not args.quick:
        for name, part in parts:
            report.add(name, timed(part))
        return 1 if report.failed() else 0
    # Quick mode times nothing that matters: its parts side by side, for the test's wall time.
    with ThreadPoolExecutor(max(1, len(parts))) as pool:
        futures = [(name, pool.submit(timed, part)) for name, part in parts]
        for name, future in futures:
            report.add(name, future.result())
    return 1 if report.failed() else 0


def planned_parts(runner: Runner, gpu_env: dict[str, str]) -> list[tuple[str, Callable]]:
    """The parts --parts asks for, in the order they run: the emulator's prediction (CPU only)
    starts first, beside the parts that time nothing; the timed parts run after it is done."""
    wanted = runner.args.parts
    predict = None
    if "calibration" in wanted:
        emulator = {
            "FLEXNPU_BACKEND": "emulate:h200",
            "JAX_PLATFORMS": "flexnpu",
            "FLEXNPU_BACKEND_OPTIONS": "device_count=1;time_scale=0.001",
        }
        predict = runner.start("predict", emulator)
    conformance_env = {**gpu_env, "FLEXNPU_NUM_VIRTUAL_DEVICES": "2"} if gpu_env else {}
    parts: list[tuple[str, Callable]] = [
        ("conformance", lambda: runner.run("conformance", conformance_env, limit_s=240)),
        ("telemetry", lambda: runner.run("telemetry", gpu_env, limit_s=120)),
        ("export", lambda: part_export(runner, gpu_env)),
        ("calibration", lambda: part_calibration(runner, predict, gpu_env)),
        ("dispatch", lambda: runner.run("dispatch", gpu_env, limit_s=240)),
    ]
    return [(name, part) for name, part in parts if name in wanted]


def timed(part: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The part's result with the driver's wall time (worker start and JAX import included)."""
    t0 = time.monotonic()
    out = part()
    return {**out, "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepare", type=Path, help="write the files a device run carries here")
    ap.add_argument("--out", type=Path, help="folder for device_check.json / .md")
    ap.add_argument("--backend", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--quick", action="store_true", help="small programs (the pytest's mode)")
    ap.add_argument("--carried", type=Path, help="the folder --prepare wrote, carried here")
    ap.add_argument("--build", action="store_true", help="build and install FlexNPU first")
    ap.add_argument(
        "--deadline-s", type=float, help=f"default {DEVICE_DEADLINE_S} on cuda, 1200 on cpu"
    )
    ap.add_argument(
        "--parts",
        type=lambda v: tuple(p for p in v.split(",") if p),
        default=PARTS,
        help=f"comma-separated subset of {','.join(PARTS)} (default: all)",
    )
    ap.add_argument("--part", help=argparse.SUPPRESS)  # a worker: one part in this process
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--export-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        from bench.device_check_parts import run_part

        extra = {"export_dir": args.export_dir} if args.export_dir else {}
        run_part(args.part, args.backend, args.quick, args.result, **extra)
        return
    if args.prepare:
        prepare(args.prepare)
        return
    if args.out is None:
        ap.error("--out DIR (or --prepare DIR)")
    sys.exit(drive(args))


if __name__ == "__main__":
    main()
