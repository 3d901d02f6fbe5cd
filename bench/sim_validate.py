"""Validate the simulator against a real serve run on this machine: the same trace, side by side.

For each configuration: a fixed-seed trace (Poisson arrivals; log-normal prompt and output
lengths) is generated; `python -m flexnpu serve` (SmolLM2-135M-Instruct, one device of the
configured platform: its programs have the whole machine) is started and compiled; real
streaming HTTP clients send each request at its arrival time (the prompt as token ids, so its
length is exact; max_tokens = its output length with ignore_eos) and record TTFT (request sent ->
first chunk with a token) and TPOT ((last token - first token) / (tokens - 1)); the requests as
they were actually sent are written as the simulator's --trace CSV (timestamp, input_tokens,
output_tokens); `python -m flexnpu simulate --device cpu --model smollm2-135m --policies
chunked-colocate` (the engine's co-located layout: chunked prefill in mixed batches) runs that
trace with the server's engine settings; the table compares p50 / p90 TTFT and TPOT.

The step-time model is measured in the same window: bench/sim_calibrate.py times the engine's
own programs for these settings just before the serve runs (and again after them, to show the
drift), and the simulator reads that calibration (FLEXNPU_SIM_CPU_CALIBRATION). The machine is
shared by other users: the load average is printed with every phase; --write-calibration
stores the mean of every configuration's probes as the package's cpu preset, and the preset
as it was before the run is simulated too ("preset": a calibration from an earlier run, so an
out-of-sample check). The engine's steps during the load are recovered from the clients'
token arrival times (steps_from_tokens) and compared per program with the fitted model.

Run it at a priority that counts (root): `--nice -15` sets this process's and the server's
nice AND their autogroup's nice. With sched_autogroup_enabled=1 a plain `nice -n -15` orders a
process only within its own session; against other sessions the autogroup nice decides
(bench/sim_noise.py measures both).

    nice -n -15 python -m bench.sim_validate --nice -15 --platform cpu \
        --compilation-cache /tmp/cc --probe-repeats 3        # light and heavy, ~8 min
    python -m bench.sim_validate --nice -15 --platform cpu --devices 2 --configs heavy,double
    python -m bench.sim_validate --configs light --json /tmp/simval.json --keep DIR

Each configuration takes 1.5-2.5 min of compiling here (under load; with --compilation-cache
DIR the second one loads its programs in ~50 s), ~1 min of probes, --duration (default 100 s)
of load and the drain: the whole run about 12 min on 2 shared cores.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.common import REPO as ROOT
from bench.common import ServeProcess
from bench.common import start_server as start_server_process

CPU_CALIBRATION = ROOT / "python" / "flexnpu" / "sim" / "data" / "cpu_calibration.json"
ENGINE = {"max_num_seqs": 8, "max_model_len": 256, "max_num_batched_tokens": 128, "block_size": 16}


@dataclass(frozen=True)
class Config:
    name: str
    rate: float  # requests/s (Poisson)
    prompt_median: int
    output_median: int
    sigma: float = 0.6
    prompt_range: tuple[int, int] = (8, 160)
    output_range: tuple[int, int] = (4, 48)


CONFIGS = {
    "light": Config("light", rate=0.1, prompt_median=48, output_median=16),
    "heavy": Config("heavy", rate=0.4, prompt_median=48, output_median=16),
    "double": Config("double", rate=0.8, prompt_median=48, output_median=16),  # 2 devices
}


@dataclass
class Sent:
    rid: int
    prompt: int
    output: int
    planned: float  # seconds from the start of the run
    sent: float = -1.0
    ttft: float = -1.0
    tpot: float = -1.0
    tokens: int = 0
    error: str = ""
    times: list[float] = field(default_factory=list)


def make_trace(
    cfg: Config, duration: float, seed: int, max_model_len: int = ENGINE["max_model_len"]
) -> list[Sent]:
    rng = np.random.default_rng(seed)
    n = rng.poisson(cfg.rate * duration)
    t = np.sort(rng.uniform(0.0, duration, n))

    def lengths(median: int, lo_hi: tuple[int, int]) -> np.ndarray:
        x = rng.lognormal(np.log(median), cfg.sigma, n)
        return np.clip(np.round(x), *lo_hi).astype(int)

    p, o = (
        lengths(cfg.prompt_median, cfg.prompt_range),
        lengths(cfg.output_median, cfg.output_range),
    )
    o = np.minimum(o, max_model_len - p)
    return [Sent(i, int(p[i]), int(o[i]), float(t[i])) for i in range(n)]


def write_trace(reqs: list[Sent], path: Path) -> None:
    """The simulator's --trace CSV: the requests as they were sent (seconds)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "input_tokens", "output_tokens"])
        for r in sorted(reqs, key=lambda r: r.sent):
            w.writerow([f"{r.sent:.6f}", r.prompt, r.output])


def write_measured_trace(per_request: list[dict], path: Path) -> list[Sent]:
    """The trace CSV of measured requests (as they were sent); the requests."""
    reqs = [
        Sent(i, r["prompt"], r["output"], r["sent_s"], sent=r["sent_s"])
        for i, r in enumerate(per_request)
    ]
    write_trace(reqs, path)
    return reqs


def raise_priority(nice: int) -> str:
    """This process's nice and its autogroup's nice (the server inherits both). With
    sched_autogroup_enabled=1 a nice only orders processes of one session; against other
    sessions' work the autogroup nice decides (bench/sim_noise.py measures the difference)."""
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    group = Path("/proc/self/autogroup")
    try:
        group.write_text(str(nice))
        return f"nice {nice}; {group.read_text().strip()}"
    except OSError as e:
        return f"nice {nice}; autogroup nice not set ({e.strerror})"


def _load() -> float:
    return os.getloadavg()[0]


def _env(**extra: str) -> dict[str, str]:
    """The subprocesses' environment: this one's (so they import the flexnpu this process
    imports: PYTHONPATH=python runs this tree's build) plus `extra`."""
    return {**os.environ, **extra}


def start_server(
    args: argparse.Namespace,
    log: Path,
    engine: dict[str, int] = ENGINE,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> ServeProcess:
    serve_args = ["--devices", str(args.devices), *extra_args]
    for k, v in engine.items():
        serve_args += [f"--{k.replace('_', '-')}", str(v)]
    if args.model:
        serve_args += ["--model", args.model]
    if args.compilation_cache:
        serve_args += ["--compilation-cache", str(args.compilation_cache)]
    env = _env(JAX_PLATFORMS=args.platform) | (extra_env or {})
    if args.devices > 1 and "FLEXNPU_BACKEND" not in env:  # jaxlib's cpu: N devices, shared cores
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
        ).strip()
    return start_server_process(
        serve_args, env=env, log=log, cwd=ROOT, timeout_s=args.startup_timeout
    )


_SHORT = re.compile(r"\d+ tokens of \d+ \((finish_reason [^)]*)\)")


def failures(reqs: list[Sent]) -> str:
    """The failed requests by kind, each kind's count and its first request (its id, when it
    was sent, its error): one example alone read a server shut down mid-run (7 streams cut at
    its shutdown with finish_reason abort, 20 sent after it refused) as 27 truncated
    answers."""
    kinds: dict[str, list[Sent]] = {}
    for r in reqs:
        if r.error:
            short = _SHORT.fullmatch(r.error)
            kind = f"fewer tokens than asked, {short.group(1)}" if short else r.error[:80]
            kinds.setdefault(kind, []).append(r)
    return "; ".join(
        f"{len(rs)} x {kind} (first: request {rs[0].rid} sent at {rs[0].sent:.1f} s: "
        f"{rs[0].error[:120]})"
        for kind, rs in sorted(kinds.items(), key=lambda kv: kv[1][0].rid)
    )


def measured_requests(reqs: list[Sent], time_scale: float = 1.0) -> list[dict]:
    """The requests as measured (times in seconds / time_scale); an error if any failed."""
    bad = [r for r in reqs if r.error]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(reqs)} requests failed: {failures(reqs)}")
    k = time_scale
    return [
        {
            "prompt": r.prompt,
            "output": r.output,
            "sent_s": r.sent / k,
            "ttft_s": r.ttft / k,
            "tpot_s": r.tpot / k,
            "token_times_s": [(r.sent + t - r.times[0] + r.ttft) / k for t in r.times],
        }
        for r in reqs
    ]


async def _one(client, r: Sent, t0: float, vocab_ids: np.ndarray) -> None:
    await asyncio.sleep(max(0.0, t0 + r.planned - time.perf_counter()))
    body = {
        "prompt": vocab_ids[: r.prompt].tolist(),
        "max_tokens": r.output,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
        "logprobs": 1,  # a chunk for every token
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    r.sent = start - t0
    finish = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if "error" in d:
                    r.error = str(d["error"])
                    return
                if d.get("choices"):
                    r.times.append(time.perf_counter())
                    finish = d["choices"][0].get("finish_reason") or finish
                if d.get("usage"):
                    r.tokens = d["usage"]["completion_tokens"]
    except Exception as e:  # noqa: BLE001 - a failed request is reported, not hidden
        r.error = f"{type(e).__name__}: {e}"
        return
    if not r.times or r.tokens != r.output:
        r.error = f"{r.tokens} tokens of {r.output} (finish_reason {finish})"
        return
    r.ttft = r.times[0] - start
    if r.tokens > 1:
        r.tpot = (r.times[-1] - r.times[0]) / (r.tokens - 1)


async def drive(port: int, reqs: list[Sent], seed: int) -> None:
    import httpx

    rng = np.random.default_rng(seed + 1)
    # Ordinary vocabulary ids (no control tokens): every request's prompt is a prefix.
    ids = rng.integers(300, 40000, max(r.prompt for r in reqs))
    limits = httpx.Limits(max_connections=len(reqs) + 4)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits
    ) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(client, r, t0, ids) for r in reqs))


def bare_calibration(args: argparse.Namespace, out: Path) -> dict:
    """bench/sim_calibrate.py: the engine's programs timed bare, in a process of their own."""
    cmd = [
        sys.executable,
        "-m",
        "bench.sim_calibrate",
        "--out",
        str(out),
        "--repeats",
        str(args.calibrate_repeats),
    ]
    for k, v in ENGINE.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    subprocess.run(cmd, check=True, env=_env(JAX_PLATFORMS=args.platform), cwd=ROOT)
    return json.loads(out.read_text())


def probe_requests() -> list[tuple[int, int, int, int, str]]:
    """(prompt, output, chunk, width, what it times) of requests that, run alone, time one
    program each: a prompt of exactly one chunk bucket (TTFT: that mixed step), and for each
    decode width a request whose context stays within that width and above the narrower one
    (TPOT: that decode-only step)."""
    from flexnpu.sim.steptime import EngineShapes

    sh = EngineShapes.of_engine(**ENGINE)
    out = [(c, 4, c, sh.max_blocks, "ttft") for c in sh.chunk_buckets]
    lo = 0
    for w in sh.decode_widths:
        prompt = lo * sh.block_size + 8
        output = min(16, w * sh.block_size - prompt)
        if output >= 4:
            out.append((prompt, output, 0, w, "tpot"))
        lo = w
    return out


async def probe(port: int, repeats: int, seed: int) -> list[dict]:
    """Times every program inside the running server: the probe requests one at a time."""
    import httpx

    ids = np.random.default_rng(seed + 2).integers(300, 40000, ENGINE["max_model_len"])
    rows = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        for prompt, output, chunk, width, what in probe_requests():
            xs = []
            for _ in range(repeats):
                r = Sent(-1, prompt, output, 0.0)
                await _one(client, r, time.perf_counter(), ids)
                if r.error:
                    raise RuntimeError(f"probe request failed: {r.error}")
                xs.append(r.ttft if what == "ttft" else r.tpot)
            rows.append(
                {
                    "chunk": chunk,
                    "width": width,
                    "seconds": float(np.median(xs)),
                    "samples": xs,
                    "from": f"{what} of prompt {prompt}, {output} tokens",
                }
            )
    return rows


async def probe_rows(port: int, counts: tuple[int, ...], seed: int) -> list[dict]:
    """Decode step time with k identical requests decoding together (the narrow width), per k:
    the median gap between tokens once all k have their first token (the prompts' chunk steps
    excluded). The padded program is the same for every k, so what grows with k is the host's
    work per row (sampled rows, logprobs, detokenizing, one SSE chunk per row)."""
    import httpx

    ids = np.random.default_rng(seed + 3).integers(300, 40000, 8)
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        for k in counts:
            reqs = [Sent(-1, 8, 24, 0.0) for _ in range(k)]
            t0 = time.perf_counter()
            await asyncio.gather(*(_one(client, r, t0, ids) for r in reqs))
            bad = [r.error for r in reqs if r.error]
            if bad:
                raise RuntimeError(f"row probe failed: {bad[0]}")
            started = max(r.times[0] for r in reqs)
            gaps = [
                b - a
                for r in reqs
                for a, b in zip(r.times, r.times[1:], strict=False)
                if a >= started
            ]
            out.append({"rows": k, "step_s": float(np.median(gaps)), "gaps": len(gaps)})
    return out


def calibration_doc(rows: list[dict], label: str) -> dict:
    """The simulator's cpu calibration fitted to program times (sim_calibrate.fit)."""
    from bench import sim_calibrate
    from flexnpu.sim.steptime import EngineShapes

    ec, em, launch, rel = sim_calibrate.fit(EngineShapes.of_engine(**ENGINE), rows)
    for r, e in zip(rows, rel, strict=True):
        r["model_error"] = float(e)
    return {
        "eff_compute": ec,
        "eff_memory": em,
        "launch_s": launch,
        "engine": ENGINE,
        "programs": rows,
        "source": f"bench/sim_validate.py: {label}",
    }


def _mean_rows(a: list[dict], b: list[dict]) -> list[dict]:
    return [
        {"chunk": x["chunk"], "width": x["width"], "seconds": (x["seconds"] + y["seconds"]) / 2}
        for x, y in zip(a, b, strict=True)
    ]


def preset_calibration(results: list[dict], platform: str, nice: int | None) -> dict:
    """The cpu preset's calibration: fitted to the mean of every configuration's in-server
    probes (before and after each load), never to the loads themselves."""
    sets = [res["calibrations"][k]["programs"] for res in results for k in ("before", "after")]
    rows = [
        {
            "chunk": r["chunk"],
            "width": r["width"],
            "seconds": float(np.mean([s[i]["seconds"] for s in sets])),
            "samples": [x for s in sets for x in s[i].get("samples", [])],
        }
        for i, r in enumerate(sets[0])
    ]
    names = ", ".join(res["config"]["name"] for res in results)
    return calibration_doc(rows, f"mean of the in-server probes around the loads {names}") | {
        "platform": platform,
        "measured_at_unix": time.time(),
        "nice": nice,
        "load_average_1m": {res["config"]["name"]: res["load_average"] for res in results},
        "regenerate": "python -m bench.sim_validate --nice -15 --platform cpu "
        "--write-calibration (in-server probes), or JAX_PLATFORMS=cpu python -m "
        "bench.sim_calibrate (bare)",
    }


def run_simulate(
    trace: Path,
    duration: float,
    out: Path,
    *,
    devices: int,
    device: str,
    model: str,
    policy: str,
    engine: dict[str, int],
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> dict:
    """`flexnpu simulate` of a trace CSV with the server's engine settings; the policy's
    metrics."""
    cmd = [
        sys.executable,
        "-m",
        "flexnpu",
        "simulate",
        "--devices",
        str(devices),
        "--device",
        device,
        "--model",
        model,
        "--policies",
        policy,
        "--trace",
        str(trace),
        "--rate",
        "0",
        "--duration",
        f"{duration:.6f}",
        "--seeds",
        "1",
        "--max-prompt",
        str(engine["max_model_len"]),
        "--max-output",
        str(engine["max_model_len"]),
        "--json",
        str(out),
        "--no-progress",
        *extra,
    ]
    for k, v in engine.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    subprocess.run(cmd, check=True, env=_env(**(env or {})), cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["policies"][policy]


def simulate(trace: Path, duration: float, calibration: Path, out: Path, devices: int = 1) -> dict:
    """devices: independent cpu devices (each with the calibrated step times)."""
    return run_simulate(
        trace,
        duration,
        out,
        devices=devices,
        device="cpu",
        model="smollm2-135m",
        policy="chunked-colocate",
        engine=ENGINE,
        env={"FLEXNPU_SIM_CPU_CALIBRATION": str(calibration)},
    )


def _pct(xs: list[float]) -> dict[str, float]:
    p = np.percentile(np.array(xs), [50, 90]) if xs else [float("nan")] * 2
    return {"p50": float(p[0]), "p90": float(p[1])}


def measure_config(cfg: Config, args: argparse.Namespace, work: Path) -> dict:
    """The real side of one configuration: serve, probe, load, probe; stored at once as
    work/measured_<name>.json (--from-measured analyses such files again)."""
    reqs = make_trace(cfg, args.duration, args.seed)
    print(
        f"\n== {cfg.name} on {args.devices} device(s): {len(reqs)} requests over "
        f"{args.duration:.0f} s (rate {cfg.rate} req/s, prompt median {cfg.prompt_median}, "
        f"output median {cfg.output_median}); load average {_load():.1f}",
        flush=True,
    )
    t = time.time()
    server = start_server(args, work / f"server_{cfg.name}.log")
    port = server.port
    print(
        f"server up in {time.time() - t:.0f} s (compiled); load average {_load():.1f}", flush=True
    )
    loads = {}
    try:
        loads["probe_before"] = _load()
        before = asyncio.run(probe(port, args.probe_repeats, args.seed))
        t = time.time()
        loads["load_start"] = _load()
        asyncio.run(drive(port, reqs, args.seed))
        loads["load_end"] = _load()
        print(f"load done in {time.time() - t:.0f} s; load average {_load():.1f}", flush=True)
        after = asyncio.run(probe(port, args.probe_repeats, args.seed))
        loads["probe_after"] = _load()
        rows_tpot = asyncio.run(probe_rows(port, (1, 4, 8, 1), args.seed))
    finally:
        server.stop()
    per_request = measured_requests(reqs)
    doc = {
        "config": cfg.__dict__,
        "devices": args.devices,
        "platform": args.platform,
        "nice": args.nice,
        "seed": args.seed,
        "load_average": loads,
        "probes": {"before": before, "after": after},
        "tpot_by_rows": rows_tpot,
        "per_request": per_request,
    }
    (work / f"measured_{cfg.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def analyse_config(m: dict, work: Path, fixed: dict[str, Path]) -> dict:
    """One measured configuration against the simulator: each calibration's simulation of
    the trace as it was sent, the probe drift and the in-run steps."""
    from flexnpu.sim.steptime import EngineShapes

    name, before, after = m["config"]["name"], m["probes"]["before"], m["probes"]["after"]
    print(f"\n== {name} on {m['devices']} device(s), {len(m['per_request'])} requests")
    for b, a in zip(before, after, strict=True):
        xs = np.array(b["samples"] + a["samples"])
        print(
            f"program chunk={b['chunk']:3d} width={b['width']:2d} in the server: "
            f"{b['seconds'] * 1e3:6.0f} ms before the load, {a['seconds'] * 1e3:6.0f} ms "
            f"after ({(a['seconds'] / b['seconds'] - 1) * 100:+.0f}%); all {len(xs)} "
            f"samples {xs.min() * 1e3:.0f}-{xs.max() * 1e3:.0f} ms"
        )
    if m["tpot_by_rows"]:
        print(
            "decode step with k requests decoding together (width 4): "
            + ", ".join(f"k={x['rows']} {x['step_s'] * 1e3:.0f} ms" for x in m["tpot_by_rows"])
        )
    per_request = m["per_request"]
    trace = work / f"trace_{name}.csv"
    reqs = write_measured_trace(per_request, trace)
    cals = {
        "before": calibration_doc(before, f"in-server probes before the {name} load"),
        "after": calibration_doc(after, f"in-server probes after the {name} load"),
        "mean": calibration_doc(
            _mean_rows(before, after), f"mean of the in-server probes around the {name} load"
        ),
    }
    # Diagnostic, not a validation: the programs' times as they ran in this very load (in-run
    # step means; probes where a program did not run). What error remains with it is the
    # model's structure (queueing, pipelining, first-token path), not the calibration's drift.
    # One device's steps only: the completions of several devices interleave.
    steps = (
        steps_from_tokens(per_request, EngineShapes.of_engine(**ENGINE))
        if m["devices"] == 1
        else []
    )
    in_run = {
        (r["chunk"], r["width"]): r["mean_s"]
        for r in step_summary(steps, cals["mean"])
        if r["steps"] >= 3
    }
    rows = [
        {
            "chunk": r["chunk"],
            "width": r["width"],
            "seconds": in_run.get((r["chunk"], r["width"]), r["seconds"]),
        }
        for r in _mean_rows(before, after)
    ]
    if steps:
        cals["in-run"] = calibration_doc(
            rows, f"step times during the {name} load itself (diagnostic)"
        )
    paths = {}
    for k, doc in cals.items():
        paths[k] = work / f"calibration_{name}_{k}.json"
        paths[k].write_text(json.dumps(doc, indent=1) + "\n")
    paths.update(fixed)
    duration = max(r.sent for r in reqs) + 1.0
    sims = {
        k: simulate(trace, duration, path, work / f"sim_{name}_{k}.json", m["devices"])
        for k, path in paths.items()
    }
    real = {
        "ttft_s": _pct([r["ttft_s"] for r in per_request]),
        "tpot_s": _pct([r["tpot_s"] for r in per_request if r["tpot_s"] >= 0]),
    }
    return m | {
        "requests": len(per_request),
        "steps": step_summary(steps, cals["mean"]),
        "sim_requests_finished": {k: v["requests_finished"] for k, v in sims.items()},
        "real": real,
        "calibrations": cals,
        "sim": {k: {"ttft_s": v["ttft_s"], "tpot_s": v["tpot_s"]} for k, v in sims.items()},
        "trace": str(trace),
    }


def steps_from_tokens(per_request: list[dict], shapes, gap_s: float = 0.03) -> list[dict]:
    """The engine's steps as the clients saw them: every step streams one token to each of its
    sampling rows at once, so token arrivals closer than gap_s (steps take >= 90 ms here) are
    one step's completion. A step's time is the gap to the previous completion while the
    engine was busy throughout (a request sent before that completion is still unfinished),
    i.e. the steady-state time per step of the two-in-flight pipeline. Its program is what the
    runner would pick: the chunk bucket of the prompt whose first token it streams (one chunk
    per prompt: prompts <= the token budget), else the decode width holding the longest row."""
    events = sorted(
        (t, i, k) for i, r in enumerate(per_request) for k, t in enumerate(r["token_times_s"])
    )
    clusters: list[list[tuple[float, int, int]]] = []
    for ev in events:
        if clusters and ev[0] - clusters[-1][-1][0] < gap_s:
            clusters[-1].append(ev)
        else:
            clusters.append([ev])
    last = [r["token_times_s"][-1] if r["token_times_s"] else -1.0 for r in per_request]
    steps = []
    for prev, cur in zip(clusters, clusters[1:], strict=False):
        t0, t1 = prev[-1][0], cur[-1][0]
        busy = any(r["sent_s"] <= t0 and last[i] >= t1 for i, r in enumerate(per_request))
        if not busy:
            continue
        firsts = [per_request[i]["prompt"] for _, i, k in cur if k == 0]
        if firsts:
            chunk = sum(firsts)
            c = next((b for b in shapes.chunk_buckets if b >= chunk), shapes.chunk_buckets[-1])
            program = (c, shapes.max_blocks)
        else:
            blocks = max(-(-(per_request[i]["prompt"] + k) // shapes.block_size) for _, i, k in cur)
            program = (0, next(w for w in shapes.decode_widths if w >= blocks))
        steps.append(
            {
                "t_s": t1,
                "seconds": t1 - t0,
                "rows": len(cur),
                "first_tokens": len(firsts),
                "chunk": program[0],
                "width": program[1],
            }
        )
    return steps


def step_summary(steps: list[dict], calibration: dict) -> list[dict]:
    """Per program: the in-run step times against the calibration's (probe-fitted) model."""
    model = {
        (r["chunk"], r["width"]): r["seconds"] * (1 + r.get("model_error", 0.0))
        for r in calibration["programs"]
    }
    out = []
    for key in sorted({(s["chunk"], s["width"]) for s in steps}):
        xs = np.array([s["seconds"] for s in steps if (s["chunk"], s["width"]) == key])
        p10, p50, p90 = np.percentile(xs, [10, 50, 90])
        out.append(
            {
                "chunk": key[0],
                "width": key[1],
                "steps": len(xs),
                "mean_s": float(xs.mean()),
                "p10_s": float(p10),
                "p50_s": float(p50),
                "p90_s": float(p90),
                "model_s": model.get(key, float("nan")),
            }
        )
    return out


def print_steps(name: str, summary: list[dict]) -> None:
    print(f"\n{name}: steps in the run (from the clients' token times) vs the probe-fitted model")
    print(
        "| program | steps | p10 | p50 | p90 | mean | model | model/mean |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for r in summary:
        print(
            f"| chunk {r['chunk']} width {r['width']} | {r['steps']} | {r['p10_s'] * 1e3:.0f} | "
            f"{r['p50_s'] * 1e3:.0f} | {r['p90_s'] * 1e3:.0f} | {r['mean_s'] * 1e3:.0f} | "
            f"{r['model_s'] * 1e3:.0f} | {(r['model_s'] / r['mean_s'] - 1) * 100:+.0f}% |"
        )


def print_table(results: list[dict], which: str) -> None:
    if not any(which in res["sim"] for res in results):
        return
    print(f"\nsimulator calibrated on: {which}")
    print("| config | requests | metric | real | sim | error |\n|---|---|---|---|---|---|")
    for res in results:
        if which not in res["sim"]:
            continue
        c = res["config"]["name"]
        for metric in ("ttft_s", "tpot_s"):
            for p in ("p50", "p90"):
                real, sim = res["real"][metric][p], res["sim"][which][metric][p]
                err = (sim / real - 1) * 100 if real > 0 else float("nan")
                print(
                    f"| {c} | {res['requests']} | {metric[:4].upper()} {p} | "
                    f"{real * 1e3:.0f} ms | {sim * 1e3:.0f} ms | {err:+.1f}% |"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--configs", default="light,heavy", help=f"comma-separated, of {', '.join(CONFIGS)}"
    )
    p.add_argument("--duration", type=float, default=100.0, help="arrival window, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--platform",
        default="flexnpu",
        help="JAX_PLATFORMS of the server, or emulate:<preset> (the flexnpu platform over "
        "emulated devices; bench/sim_validate_emulated.py)",
    )
    e = p.add_argument_group("emulated devices (--platform emulate:<preset>)")
    e.add_argument(
        "--time-scale",
        type=float,
        default=20.0,
        help="the backend's time_scale K: requests are sent at K x their trace times and "
        "latencies divided by K (device time; the host's time counts 1/K)",
    )
    e.add_argument(
        "--layout",
        default="colocated",
        choices=("colocated", "split", "static-colocate", "adaptive"),
    )
    e.add_argument(
        "--prefill-devices", type=int, default=1, help="split layout: prefill devices of --devices"
    )
    e.add_argument(
        "--split-colocate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="adaptive layout: serve --[no-]split-colocate (every device co-located while the "
        "needs fill the cluster; serve's default: on), and the simulator's advisor likewise",
    )
    p.add_argument("--model", default=None, help="serve --model (default: SmolLM2 GGUF)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument(
        "--compilation-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve --compilation-cache DIR (later configurations load the "
        "programs instead of compiling them)",
    )
    p.add_argument(
        "--probe-repeats", type=int, default=2, help="runs of each in-server probe request (median)"
    )
    p.add_argument(
        "--bare-calibration",
        action="store_true",
        help="also time the programs bare (bench/sim_calibrate.py, own process) "
        "before the runs and simulate with that calibration too",
    )
    p.add_argument("--calibrate-repeats", type=int, default=7)
    p.add_argument(
        "--write-calibration",
        action="store_true",
        help="store the last configuration's mean in-server calibration as the "
        "package's cpu preset (python/flexnpu/sim/data/cpu_calibration.json)",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="serve --devices N (cpu: N jaxlib devices on the shared cores) and "
        "simulate N independent devices",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=None,
        help="run this process and the server at this nice and autogroup nice (negative: root)",
    )
    p.add_argument(
        "--from-measured",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="no serving: analyse measured_<config>.json files of an earlier run",
    )
    p.add_argument("--keep", type=Path, default=None, help="keep traces, logs, JSON here")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    names = [x.strip() for x in args.configs.split(",") if x.strip()]
    if args.platform.startswith("emulate:"):
        from bench import sim_validate_emulated

        if not args.time_scale > 0:
            p.error("--time-scale must be > 0")
        work = args.keep or Path(tempfile.mkdtemp(prefix="sim_validate_"))
        work.mkdir(parents=True, exist_ok=True)
        return sim_validate_emulated.run(args, names, work)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        p.error(f"--configs: unknown {unknown} (known: {', '.join(CONFIGS)})")
    if args.devices < 1:
        p.error("--devices must be >= 1")
    if not args.duration > 0:
        p.error("--duration must be > 0")
    if args.nice is not None:
        print(f"priority: {raise_priority(args.nice)}", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="sim_validate_"))
    work.mkdir(parents=True, exist_ok=True)
    # Calibrations fixed before the runs: the package's cpu preset (fitted in an earlier run:
    # an out-of-sample check) and, if asked, the programs timed bare.
    fixed = {}
    if CPU_CALIBRATION.exists():
        fixed["preset"] = work / "calibration_preset.json"
        fixed["preset"].write_text(CPU_CALIBRATION.read_text())
    if args.bare_calibration:
        fixed["bare"] = work / "calibration_bare.json"
        print(f"timing the programs bare (load average {_load():.1f})", flush=True)
        bare_calibration(args, fixed["bare"])
    if args.from_measured:
        measured = [json.loads(f.read_text()) for f in args.from_measured]
    else:
        measured = [measure_config(CONFIGS[n], args, work) for n in names]
    results = [analyse_config(m, work, fixed) for m in measured]
    for res in results:
        if res["steps"]:
            print_steps(res["config"]["name"], res["steps"])
    for which in ("mean", "before", "after", *fixed, "in-run"):
        print_table(results, which)
    if args.write_calibration:
        doc = preset_calibration(results, args.platform, args.nice)
        CPU_CALIBRATION.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {CPU_CALIBRATION}")
    doc = {
        "engine": ENGINE,
        "platform": args.platform,
        "seed": args.seed,
        "devices": args.devices,
        "nice": args.nice,
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    print(f"work files in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
