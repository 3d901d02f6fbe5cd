"""flexnpu.hardware and `flexnpu devices` against the fake AscendCL / NVML libraries (built by
the fixture from tests/fakes/): discovery, presets, visible devices, binding, telemetry refresh,
and every failure as a clear error or a documented fallback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import build_fakes
from flexnpu import hardware

FOUR_NPUS = (
    "devices=4;soc=Ascend910B2;memory_total=68719476736;memory_free=60000000000;"
    "memory_free.2=0;cube=30;vector=10;memutil=40;cube.3=-1;vector.3=-1;memutil.3=-1"
)
TWO_GPUS = (
    "devices=2;name.0=NVIDIA H100 80GB HBM3;bus.0=00000000:3B:00.0;"
    "name.1=NVIDIA H200;bus.1=00000000:1A:00.0;cuda_order=1,0;"
    "memory_total=150000000000;memory_free.0=1000;gpu_util.0=55;mem_util.0=20;gpu_util.1=-1"
)


@pytest.fixture(scope="session")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_fakes(tmp_path_factory.mktemp("fakes"))


@pytest.fixture
def npus(monkeypatch: pytest.MonkeyPatch, fakes: dict[str, Path]) -> dict[str, Path]:
    monkeypatch.setenv("FLEXNPU_FAKE_ACL", FOUR_NPUS)
    monkeypatch.delenv("FLEXNPU_FAKE_ACL_FILE", raising=False)
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("FLEXNPU_ASCENDCL_LIBRARY", str(fakes["ascendcl"]))
    return fakes


def test_discovers_npus_with_presets_memory_and_utilisation(npus: dict[str, Path]) -> None:
    devices = hardware.discover("ascendcl")
    assert [d.index for d in devices] == [0, 1, 2, 3]
    d0 = devices[0]
    assert (d0.source, d0.name, d0.preset) == ("ascendcl", "Ascend910B2", "ascend910b")
    assert (d0.memory_total_bytes, d0.memory_free_bytes) == (68719476736, 60000000000)
    assert d0.utilization == hardware.Utilization(compute=30, memory=40, cube=30, vector=10)
    assert devices[2].memory_free_bytes == 0
    # -1 from aclrtGetDeviceUtilizationRate: unsupported, not an error.
    assert devices[3].utilization == hardware.Utilization(None, None, None, None)


def test_visible_devices_remap(npus: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,3")
    devices = hardware.discover("ascendcl")
    assert [(d.index, d.physical_index) for d in devices] == [(0, 2), (1, 3)]
    assert devices[0].memory_free_bytes == 0  # physical NPU 2's memory
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,two")
    with pytest.raises(ValueError, match=r"ASCEND_RT_VISIBLE_DEVICES='2,two': 'two' is not"):
        hardware.discover("ascendcl")


def test_binding_holds_the_device(npus: dict[str, Path]) -> None:
    source = hardware.open_source("ascendcl")
    assert source is not None
    with source:
        source.bind(1)
        assert source.bound(1) and not source.bound(0)
        source.unbind(1)
        assert not source.bound(1)
        with pytest.raises(ValueError, match=r"AscendCL device 7 out of range \[0, 4\)"):
            source.bind(7)


def test_acl_init_error_has_library_call_code_and_message(
    npus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "FLEXNPU_FAKE_ACL", FOUR_NPUS + ";error.aclInit=500002;message.aclInit=EH9999 not ready"
    )
    with pytest.raises(hardware.HardwareError) as e:
        hardware.discover("ascendcl")
    assert f"libascendcl.so at {npus['ascendcl']}" in str(e.value)
    assert "aclInit failed with ACL error 500002: EH9999 not ready" in str(e.value)
    # auto never raises: it falls back and says why, once.
    assert hardware.discover("auto") == []
    assert "aclInit failed with ACL error 500002" in hardware.last_fallback


def test_missing_library_and_missing_symbol(
    npus: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(hardware.HardwareError, match="could not be loaded"):
        hardware.discover("ascendcl", ascendcl_library=str(tmp_path / "libascendcl.so"))
    with pytest.raises(hardware.HardwareError, match=r"missing symbol\(s\) aclrtGetMemInfo"):
        hardware.discover("ascendcl", ascendcl_library=str(npus["ascendcl_no_meminfo"]))


def test_old_cann_without_utilisation_uses_dcmi(
    npus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEXNPU_FAKE_ACL", FOUR_NPUS + ";dcmi_aicore.0=64")
    old = str(npus["ascendcl_no_util"])
    source = hardware.open_source("ascendcl", ascendcl_library=old, dcmi_library=str(npus["dcmi"]))
    assert source is not None
    with source:
        assert source.devices()[0].utilization.compute == 64
    source = hardware.open_source("ascendcl", ascendcl_library=old, dcmi_library="/nonexistent")
    assert source is not None
    with source:
        assert source.devices()[0].utilization.compute is None
        assert any("no aclrtGetDeviceUtilizationRate" in n for n in source.notes)


def test_zero_devices(npus: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXNPU_FAKE_ACL", "devices=0;soc=Ascend910B2")
    assert hardware.discover("ascendcl") == []
    assert hardware.discover("auto") == []
    assert "AscendCL sees no devices" in hardware.last_fallback


def test_nvml_matches_cuda_ordinals_by_bus_id(
    fakes: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEXNPU_FAKE_NVML", TWO_GPUS)
    devices = hardware.discover(
        "nvml", nvml_library=str(fakes["nvml"]), cuda_library=str(fakes["cuda"])
    )
    ids = [(d.index, d.physical_index, d.preset) for d in devices]
    assert ids == [(0, 1, "h200"), (1, 0, "h100")]  # CUDA ordinal 0 is NVML index 1
    assert devices[0].pci_bus_id == "00000000:1A:00.0"
    assert devices[0].utilization.compute is None  # NOT_SUPPORTED
    assert (devices[1].memory_free_bytes, devices[1].utilization.compute) == (1000, 55)


def test_unknown_source_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="auto, ascendcl, nvml or none, got 'cuda'"):
        hardware.open_source("cuda")


def test_preset_table() -> None:
    assert hardware.preset_for_name("Ascend910B4") == "ascend910b"
    assert hardware.preset_for_name("Ascend910_9391") == "ascend910c"
    assert hardware.preset_for_name("NVIDIA A100-SXM4-40GB") == "a100"
    assert hardware.preset_for_name("Ascend310P3") is None


def test_sampler_refreshes_from_the_script_file(
    npus: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS.replace(";", "\n"))
    monkeypatch.setenv("FLEXNPU_FAKE_ACL_FILE", str(script))
    source = hardware.open_source("ascendcl")
    assert source is not None
    sampler = source.sampler(period_s=3600)  # only the rounds asked for
    try:
        assert sampler.rounds == 1
        assert sampler.latest()[1]["memory_free_bytes"] == 60000000000
        script.write_text(FOUR_NPUS.replace(";", "\n") + "\nmemory_free.1=123\ncube.1=99\n")
        sampler.refresh()
        latest = sampler.latest()
        assert latest[1]["memory_free_bytes"] == 123
        assert latest[1]["utilization"]["compute"] == 99
        assert sampler.errors == 0
    finally:
        sampler.close()
        source.close()


def _devices_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    import os

    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "flexnpu", "devices", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_devices_json_without_client(npus: dict[str, Path]) -> None:
    out = _devices_cli({}, "--json", "--no-client", "--source", "ascendcl")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 4
    assert list(rows[0]) == [
        "index", "source", "name", "preset", "memory_total_bytes",
        "memory_free_bytes", "utilization", "pjrt_device",
    ]  # fmt: skip
    assert rows[0] == {
        "index": 0,
        "source": "ascendcl",
        "name": "Ascend910B2",
        "preset": "ascend910b",
        "memory_total_bytes": 68719476736,
        "memory_free_bytes": 60000000000,
        "utilization": {"compute": 30, "memory": 40},
        "pjrt_device": None,
    }
    assert rows[3]["utilization"] == {"compute": None, "memory": None}


def test_cli_devices_table_and_errors(npus: dict[str, Path]) -> None:
    out = _devices_cli({}, "--no-client", "--source", "ascendcl")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "index", "source", "name", "preset", "total", "GiB", "free", "GiB", "compute", "memory",
        "pjrt",
    ]  # fmt: skip
    assert lines[1].split() == ["0", "ascendcl", "Ascend910B2", "ascend910b", "64.0", "55.9",
                                "30%", "40%", "-"]  # fmt: skip
    assert lines[4].split()[-3:] == ["n/a", "n/a", "-"]
    bad = _devices_cli({"FLEXNPU_FAKE_ACL": "devices=2;error.aclInit=100000"}, "--no-client",
                       "--source", "ascendcl")  # fmt: skip
    assert bad.returncode == 1
    assert "aclInit failed with ACL error 100000" in bad.stderr
    none = _devices_cli({"FLEXNPU_ASCENDCL_LIBRARY": "/nonexistent/libascendcl.so"}, "--no-client")
    assert none.returncode == 0
    assert none.stdout.startswith("no physical devices through AscendCL or NVML (telemetry auto")
