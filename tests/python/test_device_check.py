"""bench/device_check.py, the first-accelerator check, dry-run on the CPU plugin in its quick
mode (small programs; the GPU-only halves report skipped with a reason) so that the script the
device session runs in one command cannot rot here: every part it runs passes, and its report
has the structure the device session reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import device_check

REPO = Path(__file__).resolve().parents[2]
# The cheapest parts that still run the driver, the workers, the report and the emulator's
# prediction; dispatch, export and telemetry run in the full dry run (docs/hardware.md).
PARTS = ("conformance", "calibration")


def _dry_run(out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_PLATFORMS"))}
    cmd = [sys.executable, "-m", "bench.device_check", "--backend", "cpu", "--quick",
           "--parts", ",".join(PARTS), "--out", str(out)]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_dry_run_on_cpu_passes_with_its_report(tmp_path: Path) -> None:
    proc = _dry_run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "device_check.json").read_text())
    assert data["meta"]["backend"] == "cpu" and data["meta"]["jax"]
    assert list(data["parts"]) == list(PARTS)
    for name, part in data["parts"].items():
        assert part["status"] in ("passed", "skipped"), (name, part)
        assert part["reason"] and part["seconds"] >= 0, name
    conformance = data["parts"]["conformance"]["details"]
    assert conformance["devices"]["over_the_backend"]
    assert all(p["equal"] for p in conformance["programs"].values())
    calibration = data["parts"]["calibration"]
    assert calibration["status"] == "skipped" and "no GPU" in calibration["reason"]
    rows = calibration["details"]["rows"]
    assert len(rows) == 3 and all(r["predicted_s"] > 0 and r["measured_s"] is None for r in rows)
    md = (tmp_path / "device_check.md").read_text()
    assert "| conformance | passed |" in md and "## Calibration" in md


def test_calibration_rows_give_the_error_of_the_prediction() -> None:
    measured = {"status": "passed", "details": {"measured": {"a": {"median_s": 0.002}}}}
    rows = device_check._calibration_rows({"a": 0.0025, "b": 0.001}, measured)
    assert rows[0] == {"program": "a", "measured_s": 0.002, "predicted_s": 0.0025,
                       "error_pct": rows[0]["error_pct"]}  # fmt: skip
    assert abs(rows[0]["error_pct"] - 25.0) < 1e-9
    assert rows[1]["measured_s"] is None and rows[1]["error_pct"] is None
    # a failed prediction keeps the GPU's timings in the table
    (only,) = device_check._calibration_rows({}, measured)
    assert only["measured_s"] == 0.002 and only["predicted_s"] is None
    assert "| a | 2.000 | - | - |" in "\n".join(
        device_check._calibration_table({"details": {"rows": [only]}})
    )


def test_cuda_environment_lets_two_clients_share_the_gpu() -> None:
    env = device_check.backend_env("cuda", Path("/x/xla_cuda_plugin.so"))
    assert env["FLEXNPU_BACKEND"] == "/x/xla_cuda_plugin.so"
    assert env["FLEXNPU_ALLOW_NEWER_BACKEND"] == "1"  # the image's plugin is newer than 0.81
    assert "preallocate=false" in env["FLEXNPU_BACKEND_OPTIONS"]
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert device_check.backend_env("cpu", None) == {}


def test_prepare_packs_what_the_device_run_unpacks(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "site" / "xla_plugins" / "xla_cpu_pjrt"
    (package / "include").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "xla_cpu_pjrt.so").write_bytes(b"\0" * 1000)
    (package / "include" / "pjrt_c_api.h").write_text("// the PJRT C API")
    monkeypatch.setattr(device_check, "_xla_cpu_pjrt_dir", lambda: package)
    monkeypatch.setattr(device_check, "UNPACK_DIR", tmp_path / "device")
    carried = tmp_path / "carried"
    device_check.prepare(carried)
    assert (carried / "include" / "pjrt_c_api.h").read_text() == "// the PJRT C API"
    env = device_check.unpack(carried)
    site = tmp_path / "device" / "site"
    assert (site / "xla_plugins" / "xla_cpu_pjrt" / "xla_cpu_pjrt.so").stat().st_size == 1000
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(site)
    assert env["FLEXNPU_PJRT_INCLUDE_DIR"] == str((carried / "include").resolve())
