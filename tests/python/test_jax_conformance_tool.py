"""tools/jax_conformance.py: the dynamic configuration, -k parts of one file, resuming a run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "jax_conformance.py"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.x_test.T" name="test_ok" />
<testcase classname="tests.x_test.T" name="test_bad"><failure message="boom">tb</failure></testcase>
<testcase classname="tests.x_test.T" name="test_skip"><skipped message="no" /></testcase>
</testsuite></testsuites>
"""


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jax_conformance", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["jax_conformance"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_dynamic_configuration_has_twice_the_virtual_devices(tool: ModuleType, tmp_path: Path):
    env = tool.platform_env("flexnpu_dynamic", tmp_path, 4)
    assert env == {
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=4",
        "FLEXNPU_POLICY": "dynamic",
        "FLEXNPU_NUM_VIRTUAL_DEVICES": "8",
    }
    assert "FLEXNPU_POLICY" not in tool.platform_env("flexnpu", tmp_path, 4)
    with pytest.raises(SystemExit, match="unknown platform 'tpu'"):
        tool.platform_env("tpu", tmp_path, 4)


def test_parts_of_one_file_have_their_own_outputs(tool: ModuleType):
    a = tool.output_stem("lax_test.py:testAdd")
    b = tool.output_stem("lax_test.py:not testAdd")
    assert tool.output_stem("lax_test.py") == "lax_test"
    assert a.startswith("lax_test-k") and b.startswith("lax_test-k") and a != b
    assert tool.output_stem("lax_test.py:testAdd") == a


def test_reuse_reads_the_junit_xml_instead_of_running(tool: ModuleType, tmp_path: Path):
    (tmp_path / "flexnpu").mkdir()
    (tmp_path / "flexnpu" / "x_test.xml").write_text(JUNIT)
    args = argparse.Namespace(reuse=True)  # nothing else is read: no pytest is started
    result = tool.run_file(tmp_path / "no-tests", "x_test.py", "flexnpu", tmp_path, args)
    assert result.note == "reused"
    assert result.counts == {"passed": 1, "failed": 1, "skipped": 1, "errors": 0}
    assert result.tests["tests.x_test.T::test_bad"] == "failed"
    assert result.messages["tests.x_test.T::test_bad"] == "boom"


def test_every_flexnpu_configuration_is_compared_with_the_baseline(
    tool: ModuleType, tmp_path: Path
):
    passing = JUNIT.replace('<failure message="boom">tb</failure>', "")
    for platform, xml in (
        ("xla_cpu_pjrt", passing),
        ("flexnpu", passing),
        ("flexnpu_dynamic", JUNIT),
    ):
        (tmp_path / platform).mkdir()
        (tmp_path / platform / "x_test.xml").write_text(xml)
    argv = ["--tests-dir", str(tmp_path), "--out", str(tmp_path), "--reuse", "x_test.py"]
    assert tool.main(argv + ["--platforms", "flexnpu,flexnpu_dynamic,xla_cpu_pjrt"]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["pass_on_xla_cpu_pjrt_not_on_flexnpu"] == []
    assert report["pass_on_xla_cpu_pjrt_not_on_flexnpu_dynamic"] == [
        {"test": "tests.x_test.T::test_bad", "outcome": "failed", "message": "boom"}
    ]
    assert "pass_on_flexnpu_not_on_flexnpu_dynamic" not in report


CRASHING_TESTS = """
import ctypes
import os


def test_a():
    pass


def test_abort():
    with open("core", "w") as f:  # stands in for the kernel's core dump (core_pattern "core")
        f.write("x")
    os.abort()


def test_b():
    assert 1 == 2, "bad"


def test_abort_again():
    with open("core.123", "w") as f:  # core_pattern "core.%p"; a second abort's core is removed
        f.write("y")
    os.abort()


def test_segfault():
    ctypes.string_at(0)


def test_c():
    pass
"""


def test_a_crashing_test_is_recorded_and_the_rest_of_the_file_still_runs(
    tool: ModuleType, tmp_path: Path
):
    import resource

    tests = tmp_path / "jax" / "tests"
    tests.mkdir(parents=True)
    (tests / "x_test.py").write_text(CRASHING_TESTS)
    out = tmp_path / "out"
    argv = ["--tests-dir", str(tests), "--out", str(out), "--platforms", "cpu", "--dut", ""]
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))  # no real core dumps from the crashes
    try:
        assert tool.main(argv + ["x_test.py"]) == 0
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    result = json.loads((out / "results.json").read_text())["results"]["cpu"]["x_test.py"]
    assert result["tests"] == {
        "tests.x_test::test_a": "passed",
        "tests.x_test::test_abort": "failed",
        "tests.x_test::test_b": "failed",
        "tests.x_test::test_abort_again": "failed",
        "tests.x_test::test_segfault": "failed",
        "tests.x_test::test_c": "passed",
    }
    core = out / "cpu" / "x_test.core0"
    assert result["messages"] == {
        "tests.x_test::test_abort": f"crashed: the test process died of SIGABRT (core: {core})",
        "tests.x_test::test_b": "AssertionError: bad\nassert 1 == 2",
        "tests.x_test::test_abort_again": "crashed: the test process died of SIGABRT",
        "tests.x_test::test_segfault": "crashed: the test process died of SIGSEGV",
    }
    assert core.read_text() == "x"
    assert list(tests.parent.glob("core*")) == []  # no core left behind
    assert sorted(p.name for p in core.parent.glob("*.core*")) == ["x_test.core0"]
    assert result["note"] == (
        "3 crashed: tests.x_test::test_abort, tests.x_test::test_abort_again, "
        "tests.x_test::test_segfault"
    )
    # A crash is recorded like an outcome, so a resumed run would not run the crasher again.
    progress = tool.read_progress(out / "cpu" / "x_test.progress.jsonl")
    assert "tests/x_test.py::test_segfault" in progress.finished
    assert progress.running is None
    # The pieced-together JUnit XML is what --reuse reads back.
    assert tool.main(argv + ["--reuse", "x_test.py"]) == 0
    reused = json.loads((out / "results.json").read_text())["results"]["cpu"]["x_test.py"]
    assert reused["note"] == "reused"
    assert reused["tests"] == result["tests"]
    assert reused["counts"] == {"passed": 2, "failed": 4, "skipped": 0, "errors": 0}


MARKING_TESTS = """
def test_a():
    with open("ran.txt", "a") as f:
        f.write("a")


def test_b():
    with open("ran.txt", "a") as f:
        f.write("b")
    assert False, "b fails"
"""


def test_reuse_continues_an_interrupted_file_after_its_last_finished_test(
    tool: ModuleType, tmp_path: Path
):
    tests = tmp_path / "jax" / "tests"
    tests.mkdir(parents=True)
    (tests / "m_test.py").write_text(MARKING_TESTS)
    out = tmp_path / "out"
    argv = ["--tests-dir", str(tests), "--out", str(out), "--platforms", "cpu", "--dut", ""]
    assert tool.main(argv + ["m_test.py"]) == 0
    ran = tests.parent / "ran.txt"
    assert ran.read_text() == "ab"
    # Interrupted after test_a: no JUnit XML, the records stop after test_a's.
    folder = out / "cpu"
    (folder / "m_test.xml").unlink()
    records = (folder / "m_test.progress.jsonl").read_text().splitlines()
    cut = next(i for i, line in enumerate(records) if '"finish"' in line)
    (folder / "m_test.progress.jsonl").write_text("\n".join(records[: cut + 1]) + "\n")
    ran.unlink()
    assert tool.main(argv + ["--reuse", "m_test.py"]) == 0
    assert ran.read_text() == "b"  # test_a did not run again
    result = json.loads((out / "results.json").read_text())["results"]["cpu"]["m_test.py"]
    assert result["note"] == "resumed"
    assert result["tests"] == {"tests.m_test::test_a": "passed", "tests.m_test::test_b": "failed"}
    assert result["messages"] == {"tests.m_test::test_b": "AssertionError: b fails\nassert False"}
    assert tool.main(argv + ["--reuse", "m_test.py"]) == 0  # now from the whole JUnit XML
    reused = json.loads((out / "results.json").read_text())["results"]["cpu"]["m_test.py"]
    assert (reused["note"], reused["tests"]) == ("reused", result["tests"])


SAMPLED_TESTS = """
import pytest


@pytest.mark.parametrize("i", range(40))
def test_p(i):
    assert i % 10 != 7, "seven"
"""


def test_sample_runs_the_tests_whose_node_id_hashes_to_k_and_the_parts_cover_the_file(
    tool: ModuleType, tmp_path: Path
):
    import hashlib

    tests = tmp_path / "jax" / "tests"
    tests.mkdir(parents=True)
    (tests / "s_test.py").write_text(SAMPLED_TESTS)
    out = tmp_path / "out"
    argv = ["--tests-dir", str(tests), "--out", str(out), "--platforms", "cpu", "--dut", ""]
    seen: dict[str, str] = {}
    for k in range(3):
        assert tool.main(argv + ["--sample", f"{k}/3", "s_test.py"]) == 0
        assert (out / "cpu" / f"s_test-s{k}of3.xml").exists()  # each part its own output
        report = json.loads((out / "results.json").read_text())
        assert report["sample"] == f"{k}/3"
        tests_run = report["results"]["cpu"]["s_test.py"]["tests"]
        for name in tests_run:
            node = f"tests/s_test.py::{name.partition('::')[2]}"
            assert int(hashlib.sha1(node.encode()).hexdigest(), 16) % 3 == k
        assert not seen.keys() & tests_run.keys()
        seen.update(tests_run)
    assert len(seen) == 40
    assert sorted(n for n, o in seen.items() if o == "failed") == [
        "tests.s_test::test_p[17]", "tests.s_test::test_p[27]", "tests.s_test::test_p[37]",
        "tests.s_test::test_p[7]",
    ]  # fmt: skip
    with pytest.raises(SystemExit):
        tool.main(argv + ["--sample", "3/3", "s_test.py"])
    with pytest.raises(argparse.ArgumentTypeError, match="expected K/N with 0 <= K < N"):
        tool.parse_sample("1-3")
