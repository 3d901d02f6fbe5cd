#!/usr/bin/env python3
"""Run a slice of JAX's own test suite on `flexnpu` and on its physical backend directly.

JAX's tests are not part of this repository: check out jax-ml/jax at the tag of the installed jax
(e.g. `git archive jax-v0.10.2 tests | tar -x -C /somewhere`) and pass its `tests/` folder.

Every test file runs in its own pytest process per platform and writes JUnit XML; a small plugin
also records each test's outcome as it ends. A test that kills its process (abort, segfault) is
recorded as failed with the signal (its core dump kept next to the log, one per signal) and the
rest of the file runs in a new process. The script then prints a table of
passed/failed/skipped/errors per file and platform, totals, and every test that passes on the
baseline but not on flexnpu, and writes all of it (per-test outcomes included) as JSON.

Platforms (`--platforms`; the flexnpu ones are under test, every other one is a baseline):
  flexnpu       JAX_PLATFORMS=flexnpu (FlexNPU over the `xla-cpu-pjrt` plugin, 4 devices).
  flexnpu_dynamic  the same with FLEXNPU_POLICY=dynamic and twice as many virtual devices
                (FLEXNPU_NUM_VIRTUAL_DEVICES): SPMD groups collide, buffers move.
  xla_cpu_pjrt  the very plugin FlexNPU loads (`xla_cpu_pjrt.so`, cpu_device_count=4), registered
                with JAX under its own name via PJRT_NAMES_AND_LIBRARY_PATHS. It reports platform
                "cpu", so JAX uses its cpu lowerings (LAPACK/FFI custom calls this .so lacks).
  cpu           jaxlib's built-in XLA CPU client (JAX_NUM_CPU_DEVICES=4): not the same binary.

Device under test: jax's test_util decides skips with `jtu.device_under_test()`, i.e. the
`jax_test_dut` flag or else the backend's platform name. `flexnpu` is unknown to the tests, so by
default a small pytest plugin (written to the output folder, loaded with `-p`) sets
`jax_test_dut=cpu` on every platform: flexnpu then runs exactly the cases the CPU backends run
(same skips, same dtypes, same generated cases). `--dut ''` turns that off.

Example:
  python tools/jax_conformance.py --tests-dir /work/jax-tests/tests --out /tmp/jaxconf \\
      api_test.py "lax_test.py:testAdd or testDot"
(`FILE:EXPR` passes EXPR to pytest -k; `--sample K/N` runs the tests whose node id hashes to K
modulo N, the same ones on every platform.) With `--reuse`, a file whose JUnit XML is already in the
output folder is read instead of run again, and a file interrupted mid-run (no XML yet) continues
after its last finished test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

OUTCOMES = ("passed", "failed", "skipped", "errors")

_PYTEST_PLUGIN = '''\
"""Written by flexnpu tools/jax_conformance.py: sets jax_test_dut to $JAXCONF_DUT, records
every test's start and outcome in $JAXCONF_PROGRESS, keeps the sample $JAXCONF_SAMPLE, deselects
the tests in $JAXCONF_DESELECT."""
import hashlib
import json
import os


def pytest_configure(config):
    dut = os.environ.get("JAXCONF_DUT", "")
    if dut:
        import jax
        from jax._src import test_util  # noqa: F401  (defines the jax_test_dut flag)

        jax.config.update("jax_test_dut", dut)


def _record(entry):
    """One JSON line per event, written unbuffered: it survives the process crashing."""
    path = os.environ.get("JAXCONF_PROGRESS", "")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\\n").encode())
        finally:
            os.close(fd)


def in_sample(nodeid, sample):
    """`sample` "K/N": the tests whose node id hashes to K modulo N (stable on every platform)."""
    k, n = (int(x) for x in sample.split("/"))
    return int(hashlib.sha1(nodeid.encode()).hexdigest(), 16) % n == k


def pytest_collection_modifyitems(config, items):
    """Keeps the tests of $JAXCONF_SAMPLE (if set); deselects the tests listed in
    $JAXCONF_DESELECT (done before a crash, or the crasher)."""
    sample = os.environ.get("JAXCONF_SAMPLE", "")
    if sample:
        dropped = [item for item in items if not in_sample(item.nodeid, sample)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if in_sample(item.nodeid, sample)]
    path = os.environ.get("JAXCONF_DESELECT", "")
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        done = set(f.read().splitlines())
    dropped = [item for item in items if item.nodeid in done]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in done]


def pytest_runtest_logstart(nodeid, location):
    _record({"start": nodeid, "name": nodeid_to_junit(nodeid)})


def pytest_runtest_logreport(report):
    """The outcome as pytest's JUnit XML would give it (message included)."""
    if report.passed and report.when != "call":
        return
    if report.skipped:
        outcome = "skipped"
        if hasattr(report, "wasxfail"):
            message = report.wasxfail.removeprefix("reason: ")
        else:
            message = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        outcome = "failed" if report.when == "call" else "errors"
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
    else:
        outcome, message = "passed", ""
    _record({"test": nodeid_to_junit(report.nodeid), "outcome": outcome, "message": message[:500]})


def pytest_runtest_logfinish(nodeid, location):
    _record({"finish": nodeid})


def nodeid_to_junit(nodeid):
    """`classname::name` as pytest's JUnit XML names a test (its mangle_test_address)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    names[-1] += bracket + params
    return ".".join(names[:-1]) + "::" + names[-1]
'''

_PYTEST_INI = """\
[pytest]
markers =
    multiaccelerator: may use several accelerators
    SlurmMultiNodeGpuTest: multinode GPU
addopts = --import-mode=importlib -p no:cacheprovider
"""


@dataclass
class FileResult:
    """Outcome counts and per-test outcomes of one test file on one platform."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    tests: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    returncode: int = 0
    note: str = ""


def _xla_cpu_pjrt_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("jax_conformance: package xla-cpu-pjrt is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "xla_cpu_pjrt.so"


def platform_env(platform: str, out: Path, devices: int) -> dict[str, str]:
    """Environment that makes JAX run on `platform` with `devices` devices."""
    env: dict[str, str] = {}
    if platform in ("flexnpu", "flexnpu_dynamic"):
        env["JAX_PLATFORMS"] = "flexnpu"
        env["FLEXNPU_BACKEND_OPTIONS"] = f"cpu_device_count={devices}"
        if platform == "flexnpu_dynamic":
            env["FLEXNPU_POLICY"] = "dynamic"
            env["FLEXNPU_NUM_VIRTUAL_DEVICES"] = str(2 * devices)
    elif platform == "xla_cpu_pjrt":
        config = out / "xla_cpu_pjrt.json"
        config.write_text(
            json.dumps(
                {
                    "library_path": str(_xla_cpu_pjrt_path()),
                    "create_options": {"cpu_device_count": devices},
                }
            )
        )
        env["PJRT_NAMES_AND_LIBRARY_PATHS"] = f"xla_cpu_pjrt:{config}"
        env["JAX_PLATFORMS"] = "xla_cpu_pjrt"
    elif platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
    else:
        raise SystemExit(f"jax_conformance: unknown platform {platform!r}")
    return env


def _add_outcome(result: FileResult, name: str, outcome: str, message: str) -> None:
    if name in result.tests and result.tests[name] != "passed":
        return  # an error in teardown after a pass or failure: keep the first bad one
    if name in result.tests:
        result.counts[result.tests[name]] -= 1
    result.tests[name] = outcome
    result.counts[outcome] += 1
    if message and outcome != "passed":
        result.messages[name] = message[:500]


def parse_junit(path: Path, result: FileResult) -> None:
    """Fills `result` from a pytest JUnit XML file."""
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "").strip()
                break
        _add_outcome(result, name, outcome, message)


def write_junit(path: Path, result: FileResult) -> None:
    """`result` as JUnit XML that parse_junit reads back (a run pieced together after crashes)."""
    suite = ET.Element("testsuite", name="pytest")
    tag = {"failed": "failure", "errors": "error", "skipped": "skipped"}
    for name, outcome in result.tests.items():
        classname, _, test = name.partition("::")
        case = ET.SubElement(suite, "testcase", classname=classname, name=test)
        if outcome in tag:
            ET.SubElement(case, tag[outcome], message=result.messages.get(name, ""))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


@dataclass
class Progress:
    """What the plugin recorded (and the crashes the tool added): outcomes, the test started but
    never finished (JUnit name and node id), and the node ids of the tests started and finished."""

    outcomes: list[dict[str, str]] = field(default_factory=list)
    running: str | None = None
    running_id: str = ""
    started: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)


def read_progress(path: Path) -> Progress:
    progress = Progress()
    if not path.exists():
        return progress
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut off by the crash
        if "start" in entry:
            progress.running, progress.running_id = entry["name"], entry["start"]
            progress.started.add(entry["start"])
        elif "finish" in entry:
            progress.running = None
            progress.finished.add(entry["finish"])
        elif "test" in entry:
            progress.outcomes.append(entry)
    return progress


def _crash_description(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"the test process died of {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    return f"the test process exited with {returncode} in this test"


def _move_core_file(cwd: Path, dest: Path, keep: bool) -> str:
    """A core dump the crash left in pytest's cwd (core_pattern 'core' or 'core.PID') is moved to
    `dest`, or deleted if not `keep` (one per signal and file: an abort's core is over 1 GB)."""
    for core in sorted(cwd.glob("core*")):
        if core.is_file() and (core.name == "core" or core.name[5:].isdigit()):
            if not keep:
                core.unlink()
                return ""
            core.replace(dest)
            return f" (core: {dest})"
    return ""


def parse_sample(text: str) -> str:
    """`--sample K/N` checked: 0 <= K < N ('' = every test)."""
    if not text:
        return ""
    k, slash, n = text.partition("/")
    if not (slash and k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--sample {text!r}: expected K/N with 0 <= K < N")
    return f"{int(k)}/{int(n)}"


def output_stem(spec: str, sample: str = "") -> str:
    """Name of a spec's JUnit XML and log: parts of one file split with -k or sampled with
    --sample get their own."""
    file, _, kexpr = spec.partition(":")
    stem = Path(file).stem
    if kexpr:
        stem += f"-k{hashlib.sha1(kexpr.encode()).hexdigest()[:8]}"
    if sample:
        stem += "-s{}of{}".format(*sample.split("/"))
    return stem


def run_file(
    tests_dir: Path,
    spec: str,
    platform: str,
    out: Path,
    args: argparse.Namespace,
) -> FileResult:
    """Runs one test file (optionally `FILE:K_EXPR`) on one platform.

    A test that kills its pytest process (abort, segfault, a timeout that exits) is recorded as
    failed with the signal, and pytest runs again over the tests not yet run, up to
    --max-crashes times: a crash loses one test, not the rest of the file.
    """
    file, _, kexpr = spec.partition(":")
    sample = getattr(args, "sample", "")
    stem = output_stem(spec, sample)
    folder = out / platform
    junit = folder / f"{stem}.xml"
    log = folder / f"{stem}.log"
    progress = folder / f"{stem}.progress.jsonl"
    deselect = folder / f"{stem}.deselect"
    folder.mkdir(parents=True, exist_ok=True)
    result = FileResult()
    if args.reuse and junit.exists():
        try:
            parse_junit(junit, result)
            result.note = "reused"
            return result
        except ET.ParseError:
            result = FileResult()  # a file cut off mid-write: run it again
    # An interrupted run's records (no JUnit XML yet): with --reuse the tests they finished are
    # not run again; the one that was running when it stopped is.
    finished = read_progress(progress).finished if args.reuse else set()
    resumed = bool(finished)
    if resumed:
        deselect.write_text("\n".join(sorted(finished)) + "\n")
        junit.unlink(missing_ok=True)
    else:
        for stale in (junit, progress, deselect):
            stale.unlink(missing_ok=True)
    env = dict(os.environ)
    for key in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME", "PJRT_NAMES_AND_LIBRARY_PATHS"):
        env.pop(key, None)
    env.update(platform_env(platform, out, args.devices))
    env["JAX_NUM_GENERATED_CASES"] = str(args.generated_cases)
    env["JAXCONF_DUT"] = args.dut
    env["JAXCONF_PROGRESS"] = str(progress)
    env["JAXCONF_DESELECT"] = str(deselect)
    env["JAXCONF_SAMPLE"] = sample
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(out), env.get("PYTHONPATH", "")]))
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-rN", "-c", str(out / "pytest.ini"),
        "--rootdir", str(tests_dir.parent), "-p", "jaxconf_dut", f"--junitxml={junit}",
        f"--timeout={args.test_timeout}", str(tests_dir / file),
    ]  # fmt: skip
    if kexpr:
        cmd += ["-k", kexpr]
    if args.workers > 1:
        cmd += ["-n", str(args.workers)]
    start = time.monotonic()
    crashes: dict[str, str] = {}  # junit name -> what killed the process
    signals: set[str] = set()
    with open(log, "a" if resumed else "w") as log_file:
        while True:
            try:
                proc = subprocess.run(
                    cmd, env=env, cwd=tests_dir.parent, stdout=log_file, stderr=subprocess.STDOUT,
                    timeout=max(1.0, args.file_timeout - (time.monotonic() - start)), check=False,
                )  # fmt: skip
                result.returncode = proc.returncode
            except subprocess.TimeoutExpired:
                result.returncode = -1
                result.note = f"file timed out after {args.file_timeout}s"
                break
            if proc.returncode in (0, 1, 5) and junit.exists():
                break
            state = read_progress(progress)
            running = state.running
            if running is None or len(crashes) >= args.max_crashes or args.workers > 1:
                break  # not one test's crash (collection error, ...) or too many: stop here
            why = _crash_description(proc.returncode)
            core = folder / f"{stem}.core{len(crashes)}"
            crashes[running] = why + _move_core_file(tests_dir.parent, core, why not in signals)
            signals.add(why)
            # recorded like any outcome: a resumed run does not run the crasher again
            message = f"crashed: {crashes[running]}"
            crash = {"test": running, "outcome": "failed", "message": message}
            with open(progress, "a") as records:
                records.write(f"{json.dumps(crash)}\n{json.dumps({'finish': state.running_id})}\n")
            deselect.write_text("\n".join(sorted(state.started)) + "\n")
            log_file.write(f"\n[jax_conformance] {running}: crashed, running the rest\n")
            log_file.flush()
    result.seconds = round(time.monotonic() - start, 1)
    if crashes or resumed:
        for entry in read_progress(progress).outcomes:
            _add_outcome(result, entry["test"], entry["outcome"], entry["message"])
        # pytest's JUnit XML holds only the tests after the last crash or the resumption: the
        # whole file replaces it
        if result.returncode in (0, 1, 5) and not result.note:
            write_junit(junit, result)
        if resumed:
            result.note = (result.note + " resumed").strip()
        if crashes:
            names = ", ".join(sorted(crashes))
            result.note = (result.note + f" {len(crashes)} crashed: {names}").strip()
    elif junit.exists():
        try:
            parse_junit(junit, result)
        except ET.ParseError as exc:
            result.note = f"bad junit xml: {exc}"
    if result.returncode not in (0, 1, 5) and not result.note:
        result.note = f"pytest exited with {result.returncode} (see {log})"
    if result.note and not result.tests:
        result.counts["errors"] += 1
    return result


def format_table(
    specs: list[str], platforms: list[str], results: dict[str, dict[str, FileResult]]
) -> str:
    """One row per file: passed/failed/skipped/errors for every platform, then totals."""
    width = max([len("file"), len("TOTAL")] + [len(s.partition(":")[0]) for s in specs])
    head = f"{'file':<{width}}" + "".join(f" | {p + ' p/f/s/e':>26}" for p in platforms)
    lines = [head, "-" * len(head)]
    totals = {p: dict.fromkeys(OUTCOMES, 0) for p in platforms}
    for spec in specs:
        row = f"{spec.partition(':')[0]:<{width}}"
        for p in platforms:
            c = results[p][spec].counts
            for k in OUTCOMES:
                totals[p][k] += c[k]
            row += f" | {'/'.join(str(c[k]) for k in OUTCOMES):>26}"
        lines.append(row)
    lines.append("-" * len(head))
    lines.append(
        f"{'TOTAL':<{width}}"
        + "".join(f" | {'/'.join(str(totals[p][k]) for k in OUTCOMES):>26}" for p in platforms)
    )
    return "\n".join(lines)


def differences(
    specs: list[str], dut: str, base: str, results: dict[str, dict[str, FileResult]]
) -> list[dict[str, str]]:
    """Tests that pass on `base` but not on `dut` (with dut's message)."""
    diffs: list[dict[str, str]] = []
    for spec in specs:
        b, d = results[base][spec], results[dut][spec]
        for name, outcome in sorted(b.tests.items()):
            got = d.tests.get(name, "missing")
            if outcome == "passed" and got != "passed":
                diffs.append(
                    {"test": name, "outcome": got, "message": d.messages.get(name, d.note)}
                )
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="test files in --tests-dir; FILE:K_EXPR")
    parser.add_argument("--tests-dir", type=Path, required=True, help="jax checkout's tests/")
    parser.add_argument("--out", type=Path, default=Path("/tmp/jax_conformance"))
    parser.add_argument("--platforms", default="flexnpu,xla_cpu_pjrt,cpu")
    parser.add_argument("--dut", default="cpu", help="jax_test_dut for all platforms ('' = off)")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--generated-cases", type=int, default=2, help="JAX_NUM_GENERATED_CASES")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers per file")
    parser.add_argument("--jobs", type=int, default=1, help="pytest processes at once")
    parser.add_argument("--test-timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--file-timeout", type=int, default=1800, help="seconds per file")
    parser.add_argument(
        "--max-crashes", type=int, default=20, help="crashed tests per file before giving up"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="read files whose JUnit XML is in --out, run the rest"
    )
    parser.add_argument(
        "--sample",
        type=parse_sample,
        default="",
        help="K/N: run only the tests whose node id hashes to K mod N (a documented part of "
        "files too big for the time at hand; the same tests on every platform)",
    )
    args = parser.parse_args(argv)

    tests_dir: Path = args.tests_dir.resolve()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "jaxconf_dut.py").write_text(_PYTEST_PLUGIN)
    (out / "pytest.ini").write_text(_PYTEST_INI)
    platforms = [p for p in args.platforms.split(",") if p]
    results: dict[str, dict[str, FileResult]] = {p: {} for p in platforms}

    def one(spec: str, p: str) -> None:
        r = run_file(tests_dir, spec, p, out, args)
        results[p][spec] = r
        c = r.counts
        print(
            f"[{p}] {spec}: {c['passed']} passed, {c['failed']} failed, "
            f"{c['skipped']} skipped, {c['errors']} errors ({r.seconds}s) {r.note}",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in [pool.submit(one, s, p) for s in args.files for p in platforms]:
            future.result()
    print()
    print(format_table(args.files, platforms, results))
    report: dict[str, object] = {
        "platforms": platforms,
        "dut": args.dut,
        "generated_cases": args.generated_cases,
        "sample": args.sample,
        "files": args.files,
        "results": {p: {s: asdict(r) for s, r in results[p].items()} for p in platforms},
    }
    under_test = [p for p in platforms if p.startswith("flexnpu")]
    for base in [p for p in platforms if p not in under_test]:
        for dut in under_test:
            diffs = differences(args.files, dut, base, results)
            report[f"pass_on_{base}_not_on_{dut}"] = diffs
            print(f"\n{len(diffs)} tests pass on {base} but not on {dut}:")
            missing: dict[str, int] = {}
            for d in diffs:
                if d["outcome"] == "missing":  # the file crashed or timed out: one line per file
                    key = f"{d['test'].split('::')[0]}: {d['message']}"
                    missing[key] = missing.get(key, 0) + 1
                else:
                    print(f"  {d['outcome']:>7}  {d['test']}  {d['message'][:160]!r}")
            for key, count in missing.items():
                print(f"  missing  {count} tests of {key}")
    (out / "results.json").write_text(json.dumps(report, indent=1))
    print(f"\nJSON: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
