"""Side by side: Vidur (PyPI `vidur`) and `flexnpu simulate` on one trace, one replica, TP1.

Both simulators get the same requests (arrival time, prompt tokens, output tokens) and the same
engine settings: --scheduler vllm (default): whole-prompt prefill steps and decode steps (Vidur's
`vllm` replica scheduler, this simulator's `passthrough` policy); --scheduler sarathi: chunked
prefill in mixed batches (Vidur's `sarathi`, this simulator's `chunked-colocate`); a batch cap, a
token budget per step, 16-token KV blocks. Vidur predicts each step from its measured
per-operator GPU profiles (random-forest fits); this simulator from the HLO-derived cost model x
the device preset. The table gives TTFT, TPOT ((finish - first token) / (output tokens - 1), the
same per-request definition on both sides) and E2E p50/p90/p99 and the ratio ours / Vidur; a
first table times single steps (whole prompts, decode batches, a mixed chunk) with Vidur's own
predictor and this simulator's StepTimer, attention parts apart.

    python -m bench.sim_vidur_compare --vidur-profiles DIR \
        --vidur-python /tmp/vidur-venv/bin/python [--device a100] [--rates 2,6,9]

DIR is a Vidur data/profiling directory (compute/<device>/meta-llama/Meta-Llama-3-8B/{mlp,
attention}.csv; not part of this project). PyPI vidur 0.0.26 downloads its profiles from
HuggingFace datasets; this script runs it with those two files instead (a small driver replaces
the predictor's input files, nothing else), in the interpreter given (a separate venv: Vidur's
dependencies stay out of this project's). Vidur caches its trained models by configuration
only, not by data, so the cache lives in --work-dir under a hash of the profile files.

Vidur settings that are not its defaults: one pipeline stage (0.26 defaults to 2), the vllm
scheduler, TP1, the trace as given (scale factors 1), and a one-point forest grid (Forest; its
default 3 x 3 x 3 grid with 10-fold CV takes tens of minutes on two cores). Left at Vidur's
defaults: decode contexts rounded up to 256 tokens, a 10% decode batching overhead, no
embedding / LM head / KV-cache-save time in a step.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flexnpu.sim.experiments import SimSpec, simulate_once
from flexnpu.sim.hardware import StepTimer, get_preset
from flexnpu.sim.models import get_model

VIDUR_MODELS = {"llama-3-8b": ("meta-llama/Llama-3-8B", "meta-llama/Meta-Llama-3-8B")}
VIDUR_NODES = {"a100": "a100_pairwise_nvlink", "h100": "h100_pairwise_nvlink"}
VIDUR_TRACE_DATE = "2023-08-21"
METRICS = ("ttft_s", "tpot_s", "e2e_s")
QUANTILES = ("p50", "p90", "p99")

# Runs inside Vidur's interpreter: argv = [driver, mlp.csv, attention.csv, STEPS, vidur args].
# STEPS "-": simulate. Otherwise a JSON file of steps, each [[q tokens, kv tokens] per sequence]
# (kv includes the step's own tokens, as Vidur's schedulers count): print one JSON line of
# {"total", "attention"} seconds per step from Vidur's own predictor, and do not simulate.
VIDUR_DRIVER = """\
import json
import sys
import vidur.execution_time_predictor.sklearn_execution_time_predictor as etp
files = (sys.argv[1], sys.argv[2], "", "")  # no network profiles: TP1, one pipeline stage
steps = sys.argv[3]


def offline(self):
    raise RuntimeError("predictions are trained here from the given profiles")


etp.SklearnExecutionTimePredictor._get_input_files = lambda self: files
etp.SklearnExecutionTimePredictor._load_predictions_from_hf = offline
sys.argv = [sys.argv[0]] + sys.argv[4:]
if steps == "-":
    from vidur.main import main
    main()
else:
    from vidur.config import SimulationConfig
    from vidur.entities import Batch
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry
    config = SimulationConfig.create_from_cli_args()
    cluster = config.cluster_config
    predictor = ExecutionTimePredictorRegistry.get(
        config.execution_time_predictor_config.get_type(),
        predictor_config=config.execution_time_predictor_config,
        replica_config=cluster.replica_config, cache_config=cluster.cache_config)
    layers = cluster.replica_config.model_config.num_layers
    out = []
    for seqs in json.load(open(steps)):
        batch = Batch(0, [None] * len(seqs), [q for q, _ in seqs], [kv for _, kv in seqs])
        t = predictor.get_execution_time(batch, 0)
        # Vidur's step leaves the KV-cache save kernel out (its ExecutionTime comments it out).
        attn = (t.attention_decode_execution_time + t.attention_prefill_execution_time
                ) * layers * 1e-3
        out.append({"total": t.total_time, "attention": attn})
    print("STEPS " + json.dumps(out))
"""


@dataclass(frozen=True)
class Trace:
    arrivals: np.ndarray  # seconds from the first request
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.arrivals)


SCHEDULERS = {  # --scheduler: (Vidur's replica scheduler, this simulator's policy)
    "vllm": ("vllm", "passthrough"),  # whole-prompt prefill steps, then decode steps
    "sarathi": ("sarathi", "chunked-colocate"),  # chunked prefill in mixed batches
}


@dataclass(frozen=True)
class Engine:
    """The engine settings both simulators get."""

    batch_cap: int = 64
    max_tokens_in_batch: int = 4096  # vllm: prompt tokens of one prefill step
    block_size: int = 16
    max_model_len: int = 4096
    scheduler: str = "vllm"
    chunk_size: int = 512  # sarathi: tokens of one step, decodes included

    @property
    def step_tokens(self) -> int:
        """This simulator's max_num_batched_tokens."""
        return self.chunk_size if self.scheduler == "sarathi" else self.max_tokens_in_batch


@dataclass(frozen=True)
class Forest:
    """Vidur's random-forest grid (its defaults search 3 x 3 x 3 with 10-fold CV)."""

    estimators: int = 250
    max_depth: int = 32
    min_samples_split: int = 2
    cv_splits: int = 2


def make_trace(
    n: int, rate: float, seed: int, prompt: tuple[int, int], output: tuple[int, int]
) -> Trace:
    """Poisson arrivals at `rate` requests/s, uniform prompt and output lengths (inclusive)."""
    if n < 1 or rate <= 0:
        raise ValueError(f"need n >= 1 and rate > 0, got n={n}, rate={rate}")
    for name, (lo, hi) in (("prompt", prompt), ("output", output)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} range {lo}:{hi} must satisfy 1 <= lo <= hi")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n)
    t = np.cumsum(gaps) - gaps[0]
    p = rng.integers(prompt[0], prompt[1] + 1, n)
    o = rng.integers(output[0], output[1] + 1, n)
    return Trace(t, p.astype(np.int64), o.astype(np.int64))


def write_flexnpu_trace(trace: Trace, path: Path) -> None:
    """The CSV `flexnpu simulate --trace` reads (flexnpu.sim.workload.load_trace)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "input_tokens", "output_tokens"])
        for t, p, o in zip(trace.arrivals, trace.prompt_tokens, trace.output_tokens, strict=True):
            w.writerow([f"{t:.6f}", int(p), int(o)])


def write_vidur_trace(trace: Trace, path: Path) -> None:
    """The CSV Vidur's trace_replay request generator reads (one Date; Time in seconds)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for t, p, o in zip(trace.arrivals, trace.prompt_tokens, trace.output_tokens, strict=True):
            w.writerow([VIDUR_TRACE_DATE, f"{t:.6f}", int(p), int(o)])


def percentiles(xs: np.ndarray) -> dict[str, float]:
    if len(xs) == 0:
        return dict.fromkeys(QUANTILES, float("nan"))
    p = np.percentile(xs, [50, 90, 99])
    return dict(zip(QUANTILES, (float(v) for v in p), strict=True))


def summarize(ttft: np.ndarray, e2e: np.ndarray, n_out: np.ndarray) -> dict[str, dict]:
    """Per-request TTFT, TPOT ((e2e - ttft) / (n_out - 1), requests with n_out > 1), E2E."""
    multi = n_out > 1
    tpot = (e2e[multi] - ttft[multi]) / (n_out[multi] - 1)
    return {
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles(e2e),
        "requests": int(len(e2e)),
    }


def read_vidur_requests(path: Path) -> dict[str, dict]:
    """Vidur's request_metrics.csv -> summarize() of its requests."""
    need = ("prefill_e2e_time", "request_e2e_time", "request_num_decode_tokens")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{path}: no column {', '.join(missing)} (not Vidur's request_metrics.csv?)"
            )
        rows = list(reader)
    ttft = np.array([float(r["prefill_e2e_time"]) for r in rows])
    e2e = np.array([float(r["request_e2e_time"]) for r in rows])
    n_out = np.array([int(float(r["request_num_decode_tokens"])) for r in rows])
    return summarize(ttft, e2e, n_out)


def find_request_metrics(out_dir: Path) -> Path:
    """Vidur writes into a timestamped subdirectory of its output dir."""
    found = sorted(out_dir.glob("**/request_metrics.csv"))
    if not found:
        raise FileNotFoundError(f"Vidur wrote no request_metrics.csv under {out_dir}")
    return found[-1]


def comparison_table(rate: float, vidur: dict[str, dict], ours: dict[str, dict]) -> str:
    """Markdown: one row per metric x quantile, Vidur | ours | ours / Vidur (ms)."""
    lines = [
        f"\nrate {rate:g} req/s: {vidur['requests']} requests finished in Vidur, "
        f"{ours['requests']} here",
        "\n| metric | Vidur ms | flexnpu ms | flexnpu / Vidur |",
        "|---|---|---|---|",
    ]
    for m in METRICS:
        for q in QUANTILES:
            v = vidur[m][q] * 1e3
            o = ours[m][q] * 1e3
            lines.append(
                f"| {m[:-2].upper()} {q} | {v:.1f} | {o:.1f} | "
                f"{o / v if v > 0 else float('nan'):.2f} |"
            )
    return "\n".join(lines)


def profile_files(profiles: Path, device: str, model: str) -> tuple[Path, Path]:
    base = profiles / "compute" / device / VIDUR_MODELS[model][1]
    mlp, attn = base / "mlp.csv", base / "attention.csv"
    for p in (mlp, attn):
        if not p.exists():
            raise FileNotFoundError(
                f"{p} does not exist (--vidur-profiles is Vidur's data/profiling directory)"
            )
    return mlp, attn


def cache_key(files: tuple[Path, ...], forest: Forest) -> str:
    h = hashlib.sha256(repr(forest).encode())
    for p in files:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def vidur_args(
    *,
    trace: Path,
    out_dir: Path,
    cache_dir: Path,
    device: str,
    model: str,
    engine: Engine,
    forest: Forest,
) -> list[str]:
    """Vidur 0.0.26 flags: one replica, TP1, one pipeline stage, the engine's scheduler."""
    rf = "--random_forrest_execution_time_predictor_config_"
    tr = "--trace_request_generator_config_"
    if engine.scheduler == "sarathi":
        sched = [
            "--sarathi_scheduler_config_batch_size_cap",
            str(engine.batch_cap),
            "--sarathi_scheduler_config_chunk_size",
            str(engine.chunk_size),
        ]
    else:
        sched = [
            "--vllm_scheduler_config_batch_size_cap",
            str(engine.batch_cap),
            "--vllm_scheduler_config_max_tokens_in_batch",
            str(engine.max_tokens_in_batch),
        ]
    return [
        "--replica_config_model_name",
        VIDUR_MODELS[model][0],
        "--replica_config_device",
        device,
        "--replica_config_network_device",
        VIDUR_NODES[device],
        "--replica_config_tensor_parallel_size",
        "1",
        "--replica_config_num_pipeline_stages",
        "1",
        "--cluster_config_num_replicas",
        "1",
        "--replica_scheduler_config_type",
        SCHEDULERS[engine.scheduler][0],
        *sched,
        "--cache_config_block_size",
        str(engine.block_size),
        "--request_generator_config_type",
        "trace_replay",
        tr + "trace_file",
        str(trace),
        tr + "date",
        VIDUR_TRACE_DATE,
        tr + "prefill_scale_factor",
        "1",
        tr + "decode_scale_factor",
        "1",
        tr + "time_scale_factor",
        "1",
        tr + "max_tokens",
        str(engine.max_model_len),
        "--execution_time_predictor_config_type",
        "random_forrest",
        rf + "cache_dir",
        str(cache_dir),
        rf + "prediction_max_tokens_per_request",
        str(engine.max_model_len),
        rf + "num_estimators",
        str(forest.estimators),
        rf + "max_depth",
        str(forest.max_depth),
        rf + "min_samples_split",
        str(forest.min_samples_split),
        rf + "k_fold_cv_splits",
        str(forest.cv_splits),
        rf + "num_training_job_threads",
        "2",
        "--metrics_config_output_dir",
        str(out_dir),
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
    ]


def run_vidur(
    python: str,
    files: tuple[Path, Path],
    args: list[str],
    log: Path,
    timeout_s: float,
    steps: Path | None = None,
) -> str:
    """Runs Vidur (simulation, or step predictions with `steps`); returns its output."""
    driver = log.parent / "vidur_driver.py"
    driver.write_text(VIDUR_DRIVER)
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    cmd = [python, str(driver), str(files[0]), str(files[1]), str(steps or "-"), *args]
    with log.open("w") as f:
        rc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False
        ).returncode
    text = log.read_text()
    if rc != 0:
        tail = text.splitlines()[-15:]
        raise RuntimeError(f"Vidur exited {rc}; last lines of {log}:\n" + "\n".join(tail))
    return text


def step_cases(max_batch: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """Steps both simulators time: (label, [(new tokens, kv tokens incl. them)] per sequence).
    Whole prompts (one, and several in one step as vLLM batches them) and decode batches."""
    cases: list[tuple[str, list[tuple[int, int]]]] = [
        (f"prefill 1 x {p}", [(p, p)]) for p in (128, 512, 1024, 1536, 2048, 4096)
    ]
    cases.append(("prefill 4 x 1024", [(1024, 1024)] * 4))
    for ctx in (256, 1024, 2048):
        for b in sorted({1, 16, 32, max_batch}):
            cases.append((f"decode {b} x ctx {ctx}", [(1, ctx + 1)] * b))
    # A Sarathi step: a 448-token chunk after 1024 prompt tokens, with 64 decodes at 1024.
    cases.append(("chunk 448 @1024 + 64 decodes", [(448, 1472)] + [(1, 1025)] * 64))
    return cases


def parse_vidur_steps(text: str) -> list[dict[str, float]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("STEPS ")]
    if not lines:
        raise ValueError("Vidur printed no STEPS line")
    return json.loads(lines[-1][len("STEPS ") :])


def our_step_seconds(timer: StepTimer, seqs: list[tuple[int, int]]) -> tuple[float, float]:
    """(step seconds, the part the attention terms add) from this simulator's cost model."""
    entries = [(kv - q, q, True) for q, kv in seqs]
    feats = timer.features(entries)
    total = timer.seconds(*timer.flops_bytes(feats))
    no_attention = feats.copy()
    no_attention[2] = no_attention[3] = 0.0  # the attended pairs and the KV positions read
    return total, total - timer.seconds(*timer.flops_bytes(no_attention))


def step_table(
    labels: list[str], vidur: list[dict[str, float]], ours: list[tuple[float, float]]
) -> str:
    """Markdown of step times."""
    lines = [
        "\nstep times (ms; attention: Vidur's prefill/decode attention kernels, ours the "
        "time its attention terms add)",
        "\n| step | Vidur | Vidur attention | flexnpu | flexnpu attention | flexnpu / Vidur |",
        "|---|---|---|---|---|---|",
    ]
    for label, v, (o, oa) in zip(labels, vidur, ours, strict=True):
        lines.append(
            f"| {label} | {v['total'] * 1e3:.2f} | {v['attention'] * 1e3:.2f} "
            f"| {o * 1e3:.2f} | {oa * 1e3:.2f} | {o / v['total']:.2f} |"
        )
    return "\n".join(lines)


def run_ours(
    trace_csv: Path, trace: Trace, device: str, model: str, engine: Engine
) -> dict[str, dict]:
    policy = SCHEDULERS[engine.scheduler][1]
    spec = SimSpec(
        devices=1,
        device=device,
        model=model,
        parallel=1,
        trace=str(trace_csv),
        workload="trace",
        rate=0.0,
        duration=float(trace.arrivals[-1]) + 1.0,
        policies=(policy,),
        seeds=1,
        max_num_seqs=engine.batch_cap,
        max_num_batched_tokens=engine.step_tokens,
        block_size=engine.block_size,
        max_model_len=engine.max_model_len,
        max_prompt=engine.max_model_len,
        max_output=engine.max_model_len,
    ).resolved()
    r = simulate_once(spec, policy, 0)
    fin = [q for q in r.requests if q.finish >= 0]
    return summarize(
        np.array([q.first_token - q.arrival for q in fin]),
        np.array([q.finish - q.arrival for q in fin]),
        np.array([q.n_out for q in fin]),
    )


def _rate(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--rates: {text!r} is not a number of requests/s") from None


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO:HI") from None
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vidur-profiles", type=Path, required=True, metavar="DIR")
    p.add_argument("--vidur-python", required=True, help="interpreter with vidur installed")
    p.add_argument("--device", default="a100", choices=sorted(VIDUR_NODES))
    p.add_argument("--model", default="llama-3-8b", choices=sorted(VIDUR_MODELS))
    p.add_argument("--rates", default="2,6,9", help="requests/s, comma-separated")
    p.add_argument("--requests", type=int, default=200, help="requests per trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", type=_range, default=(128, 1536), metavar="LO:HI")
    p.add_argument("--output", type=_range, default=(32, 512), metavar="LO:HI")
    p.add_argument(
        "--scheduler",
        default="vllm",
        choices=sorted(SCHEDULERS),
        help="vllm: Vidur's vllm vs passthrough; sarathi: Vidur's sarathi vs chunked-colocate",
    )
    p.add_argument("--batch-cap", type=int, default=Engine.batch_cap)
    p.add_argument(
        "--max-tokens-in-batch",
        type=int,
        default=Engine.max_tokens_in_batch,
        help="vllm: prompt tokens per prefill step",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=Engine.chunk_size,
        help="sarathi: tokens per step, decodes included",
    )
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sim_vidur_compare"))
    p.add_argument("--vidur-timeout", type=float, default=1200.0, help="seconds per Vidur run")
    p.add_argument("--json", type=Path, help="write both sides' percentiles here")
    args = p.parse_args(argv)
    try:
        rates = [_rate(r) for r in args.rates.split(",")]
        files = profile_files(args.vidur_profiles, args.device, args.model)
        engine = Engine(
            args.batch_cap,
            args.max_tokens_in_batch,
            scheduler=args.scheduler,
            chunk_size=args.chunk_size,
        )
        if args.prompt[1] + args.output[1] > engine.max_model_len:
            raise ValueError(
                f"prompt + output may reach {args.prompt[1] + args.output[1]} "
                f"tokens, over max_model_len {engine.max_model_len}"
            )
        traces = [make_trace(args.requests, r, args.seed, args.prompt, args.output) for r in rates]
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return compare(args, rates, files, engine, traces)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def compare(
    args: argparse.Namespace,
    rates: list[float],
    files: tuple[Path, Path],
    engine: Engine,
    traces: list[Trace],
) -> int:
    forest = Forest()
    cache_dir = args.work_dir / f"vidur_cache_{cache_key(files, forest)}"
    print(
        f"{args.model} on {args.device}, 1 replica, TP1; engine {engine}; Vidur forest "
        f"{forest}; profiles {files[0].parent}"
    )
    args.work_dir.mkdir(parents=True, exist_ok=True)
    common = {
        "cache_dir": cache_dir,
        "device": args.device,
        "model": args.model,
        "engine": engine,
        "forest": forest,
    }
    # Step times first (this also trains Vidur's models into the cache on a cold start).
    cases = step_cases(engine.batch_cap)
    steps_json, steps_trace = args.work_dir / "steps.json", args.work_dir / "steps_trace.csv"
    steps_json.write_text(json.dumps([seqs for _, seqs in cases]))
    write_vidur_trace(traces[0], steps_trace)
    t0 = time.monotonic()
    vidur_steps = parse_vidur_steps(
        run_vidur(
            args.vidur_python,
            files,
            vidur_args(trace=steps_trace, out_dir=args.work_dir / "steps_out", **common),
            args.work_dir / "vidur_steps.log",
            args.vidur_timeout,
            steps=steps_json,
        )
    )
    timer = StepTimer.create(get_model(args.model), get_preset(args.device), 1)
    ours_steps = [our_step_seconds(timer, seqs) for _, seqs in cases]
    print(step_table([label for label, _ in cases], vidur_steps, ours_steps))
    print(
        f"(wall: Vidur {time.monotonic() - t0:.0f} s, with its training when {cache_dir} was cold)"
    )
    results = []
    for rate, trace in zip(rates, traces, strict=True):
        run_dir = args.work_dir / f"rate_{rate:g}"
        run_dir.mkdir(parents=True, exist_ok=True)
        ours_csv, vidur_csv = run_dir / "trace.csv", run_dir / "vidur_trace.csv"
        write_flexnpu_trace(trace, ours_csv)
        write_vidur_trace(trace, vidur_csv)
        t0 = time.monotonic()
        run_vidur(
            args.vidur_python,
            files,
            vidur_args(trace=vidur_csv, out_dir=run_dir / "vidur_out", **common),
            run_dir / "vidur.log",
            args.vidur_timeout,
        )
        t1 = time.monotonic()
        vidur = read_vidur_requests(find_request_metrics(run_dir / "vidur_out"))
        ours = run_ours(ours_csv, trace, args.device, args.model, engine)
        t2 = time.monotonic()
        print(comparison_table(rate, vidur, ours))
        print(f"(wall: Vidur {t1 - t0:.0f} s, flexnpu {t2 - t1:.1f} s)")
        results.append({"rate": rate, "vidur": vidur, "flexnpu": ours})
    if args.json:
        steps = [
            {"step": label, "vidur_s": v, "flexnpu_s": {"total": o, "attention": oa}}
            for (label, _), v, (o, oa) in zip(cases, vidur_steps, ours_steps, strict=True)
        ]
        args.json.write_text(
            json.dumps(
                {
                    "engine": engine.__dict__,
                    "forest": forest.__dict__,
                    "steps": steps,
                    "results": results,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
