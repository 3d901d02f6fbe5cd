"""Placement policies side by side: the same seeded serving workloads against `examples/serve.py`
on `flexnpu` with each placer policy, on the xla-cpu-pjrt plugin directly (the very XLA build
FlexNPU forwards to, loaded by JAX as its own platform) and on jaxlib's cpu, in one run.

    python -m bench.policies --num-prompts 16 --request-rate 0.5 --seeds 0,1,2 --out-dir /tmp/p

For each configuration (xla-cpu-pjrt direct with 4 devices; flexnpu + passthrough, static-pd
prefill=0,1 decode=2,3, static-colocate, dynamic; plain `JAX_PLATFORMS=cpu` with 4 CPU devices) a
server is started on a free loopback port with the same model and flags, a few unmeasured warm-up
requests are sent, then the workload of bench/serving.py is run once per seed (same seed, same
prompts, lengths and arrival times in every configuration), then a fixed set of greedy prompts is
sent one at a time and their tokens (completions logprobs' `tokens`) are kept, and the server is
stopped (SIGINT, by PID). Prints one table (rows = configurations; metrics averaged over the
seeds, with the ratio of mean TTFT/TPOT to the direct plugin), the greedy comparison (tokens of
every prompt identical to the direct plugin's, token by token) and a placement table; writes a
JSON (per-seed summaries, per-request TTFT/TPOT, greedy tokens, placement stats) and a PNG with
the TTFT and TPOT CDFs (all seeds pooled).

Engine mode: co-located over all 4 devices (the serving CLI's default): every virtual device both
prefills and decodes (mixed steps), so the policy alone decides where each execution runs
(passthrough keeps virtual i on physical i; static-pd sends prefills to 0,1 and decodes to 2,3,
moving the KV; static-colocate balances prefills; dynamic uses the cost model). A split engine
(`--layout split`) would already separate the phases by virtual device.

Placement stats: the server's /metrics carries the serving metrics only, so the server is run
through a thin wrapper (`_serve` below, the unchanged serving CLI in the same process) that
also answers GET / on a second loopback port with `flexnpu.stats.clients()` as JSON; it is
read after warm-up and after the workload (the difference is the workload's placement).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from bench import serving
from bench.common import HOST, REPO, ServeProcess, free_port

SERVE = REPO / "examples" / "serve.py"


@dataclass
class Config:
    name: str
    env: dict[str, str]

    @property
    def flexnpu(self) -> bool:
        return self.env.get("JAX_PLATFORMS") == "flexnpu"


DIRECT = "xla-cpu-pjrt (direct)"
CONFIGS = [
    Config(DIRECT, {"FLEXNPU_BENCH_DIRECT_PLUGIN": "4"}),
    Config("flexnpu/passthrough", {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "passthrough"}),
    Config(
        "flexnpu/static-pd",
        {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "static-pd:prefill=0,1;decode=2,3"},
    ),
    Config(
        "flexnpu/static-colocate", {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "static-colocate"}
    ),
    Config("flexnpu/dynamic", {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "dynamic"}),
    Config("cpu (plain)", {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}),
]


@dataclass
class Outcome:
    config: str
    summary: dict[str, Any] = field(default_factory=dict)  # averaged over the seeds
    per_seed: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    greedy_tokens: list[list[str]] = field(default_factory=list)
    placement: dict[str, Any] | None = None
    startup_s: float = 0.0
    error: str = ""


# --- the server side: the serving CLI plus a read-only stats endpoint -------------------------


def _serve(stats_port: int, argv: list[str]) -> int:
    """Runs examples/serve.py in this process; on flexnpu also serves the placement state;
    with FLEXNPU_BENCH_DIRECT_PLUGIN=N it serves on the xla-cpu-pjrt plugin loaded directly
    (N devices) instead."""
    direct = os.environ.pop("FLEXNPU_BENCH_DIRECT_PLUGIN", "")
    if direct:
        import jax
        from jax._src import xla_bridge

        import flexnpu

        xla_bridge.register_plugin(
            "xlacpu",
            library_path=str(flexnpu.cpu_plugin_path()),
            options={"cpu_device_count": int(direct)},
        )
        jax.config.update("jax_platforms", "xlacpu")
    if os.environ.get("JAX_PLATFORMS") == "flexnpu" and stats_port:
        from flexnpu import stats

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = json.dumps(stats.clients()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        httpd = ThreadingHTTPServer((HOST, stats_port), Handler)
        threading.Thread(target=httpd.serve_forever, name="stats", daemon=True).start()
    import runpy

    sys.argv = [str(SERVE), *argv]
    runpy.run_path(str(SERVE), run_name="__main__")
    return 0


# --- the client side ---------------------------------------------------------------------------


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


# SIGINT first: uvicorn shuts down and the engine stops, as at a terminal.
STOP_SIGNALS = ((signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))


def workload_args(
    a: argparse.Namespace, base_url: str, num_prompts: int, seed: int, rate: float
) -> argparse.Namespace:
    """The Namespace bench/serving.py's functions read."""
    return argparse.Namespace(
        base_url=base_url,
        endpoint="/v1/completions",
        model=None,
        num_prompts=num_prompts,
        request_rate=rate,
        burstiness=a.burstiness,
        max_concurrency=None,
        length_scale=a.length_scale,
        min_len=a.min_len,
        max_prompt_len=a.max_prompt_len,
        max_output_len=a.max_output_len,
        goodput=a.goodput,
        seed=seed,
        timeout=a.timeout,
        label="",
        no_progress=True,
    )


async def run_workload(args: argparse.Namespace) -> tuple[list[serving.Result], float]:
    """bench/serving.py's open loop (same draws in the same order), keeping every Result."""
    import httpx

    rng = np.random.default_rng(args.seed)
    lengths = serving.sample_lengths(args.num_prompts, rng, args)
    prompts = [(serving.make_prompt(p, rng), o) for p, o in lengths]
    gaps = serving.arrival_gaps(args.num_prompts, args.request_rate, args.burstiness, rng)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=args.base_url, timeout=httpx.Timeout(args.timeout), limits=limits
    ) as c:
        model = (await c.get("/v1/models")).json()["data"][0]["id"]
        tasks = []
        t0 = time.perf_counter()
        for (prompt, out_len), gap in zip(prompts, gaps, strict=True):
            tasks.append(asyncio.create_task(serving.one_request(c, args, model, prompt, out_len)))
            await asyncio.sleep(float(gap))
        results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - t0


def tpot(r: serving.Result) -> float | None:
    return (r.latency - r.ttft) / (r.output_tokens - 1) if r.ok and r.output_tokens > 1 else None


def placement_delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """What the placer did during the workload: per physical device executions by phase and
    decisions by reason, migrations, compiles (after - before), and the final busy fractions."""
    if not after:
        return {}
    b, a = (before[0] if before else {}), after[0]
    bdev = {d["device"]: d for d in b.get("placement", {}).get("physical", [])}
    physical = []
    for d in a["placement"]["physical"]:
        old = bdev.get(d["device"], {})
        physical.append(
            {
                "device": d["device"],
                "executions": {
                    k: v - old.get("executions", {}).get(k, 0) for k, v in d["executions"].items()
                },
                "decisions": {
                    k: v - old.get("decisions", {}).get(k, 0)
                    for k, v in d.get("decisions", {}).items()
                },
                "bytes_migrated_in": d["bytes_migrated_in"] - old.get("bytes_migrated_in", 0),
                "busy_fraction": d["busy_fraction"],
            }
        )
    return {
        "policy": a["policy"],
        "physical": physical,
        **{
            k: a[k] - b.get(k, 0)
            for k in ("executions", "migrations", "bytes_migrated", "compiles")
        },
    }


def average_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over seeds of every number (nested dicts too) of bench/serving.py's summary."""
    first = summaries[0]
    out: dict[str, Any] = {}
    for k, v in first.items():
        if isinstance(v, dict):
            out[k] = average_summaries([s[k] for s in summaries])
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = float(np.mean([s[k] for s in summaries]))
        else:
            out[k] = v
    return out


GREEDY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time,",
    "The three primary colours are",
    "Water boils at",
    "import numpy as np\n",
    "A haiku about the sea:",
    "The largest planet in the solar system is",
]


def greedy_tokens(base: str, count: int, max_tokens: int) -> list[list[str]]:
    """Greedy completions of fixed prompts, one request at a time: their tokens, in order."""
    out = []
    for prompt in GREEDY_PROMPTS[:count]:
        body = json.dumps(
            {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "logprobs": 0,
            }
        ).encode()
        req = urllib.request.Request(
            base + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 - loopback only
            choice = json.loads(r.read())["choices"][0]
        out.append(list(choice["logprobs"]["tokens"]))
    return out


def compare_greedy(outcomes: list[Outcome]) -> dict[str, Any]:
    """Per configuration: prompts whose greedy tokens equal the reference's token by token, and
    the first differing (prompt, position) otherwise. Reference: the direct plugin (or the
    first configuration that ran)."""
    ran = [o for o in outcomes if o.greedy_tokens]
    if not ran:
        return {}
    ref = next((o for o in ran if o.config == DIRECT), ran[0])
    report: dict[str, Any] = {"reference": ref.config}
    for o in ran:
        same, first_diff = 0, None
        for i, (a, b) in enumerate(zip(o.greedy_tokens, ref.greedy_tokens, strict=False)):
            if a == b:
                same += 1
            elif first_diff is None:
                pos = next(
                    (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)),
                )
                first_diff = {"prompt": i, "token": pos}
        report[o.config] = {
            "identical": same,
            "prompts": len(ref.greedy_tokens),
            "first_difference": first_diff,
        }
    return report


def run_config(cfg: Config, a: argparse.Namespace, log_dir: Path) -> Outcome:
    out = Outcome(cfg.name)
    stats_port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_", "XLA_FLAGS"))
    } | cfg.env
    launcher = [sys.executable, "-m", "bench.policies", "_serve", str(stats_port), "--"]
    log = log_dir / (cfg.name.replace("/", "_").replace(" ", "_") + ".log")
    t0 = time.monotonic()
    server = ServeProcess(a.server_args, env=env, log=log, launcher=launcher, cwd=REPO)
    base = server.base_url
    print(f"[{cfg.name}] starting server on {base} (log {log})", flush=True)
    try:
        server.wait_ready(a.startup_timeout)
        out.startup_s = time.monotonic() - t0
        print(
            f"[{cfg.name}] ready in {out.startup_s:.0f}s; warm-up {a.warmup_prompts} requests",
            flush=True,
        )
        if a.warmup_prompts:
            asyncio.run(
                run_workload(workload_args(a, base, a.warmup_prompts, a.seed + 1, float("inf")))
            )
        before = get_json(f"http://{HOST}:{stats_port}/") if cfg.flexnpu else []
        for seed in a.seeds:
            wargs = workload_args(a, base, a.num_prompts, seed, a.request_rate)
            results, duration = asyncio.run(run_workload(wargs))
            out.per_seed[seed] = serving.summarize(results, duration, wargs)
            out.requests += [
                {
                    "seed": seed,
                    "ok": r.ok,
                    "prompt_tokens": r.prompt_tokens,
                    "output_tokens": r.output_tokens,
                    "ttft_s": r.ttft,
                    "tpot_s": tpot(r),
                    "e2e_s": r.latency,
                    "error": r.error,
                }
                for r in results
            ]
            s = out.per_seed[seed]
            print(
                f"[{cfg.name}] seed {seed}: {s['completed']}/{a.num_prompts} done in "
                f"{duration:.1f}s",
                flush=True,
            )
        after = get_json(f"http://{HOST}:{stats_port}/") if cfg.flexnpu else []
        out.summary = average_summaries(list(out.per_seed.values()))
        out.placement = placement_delta(before, after) if cfg.flexnpu else None
        out.greedy_tokens = greedy_tokens(base, a.greedy_prompts, a.greedy_tokens)
    except Exception as e:  # noqa: BLE001 - one failed configuration is a result
        out.error = f"{type(e).__name__}: {e}"
        print(f"[{cfg.name}] FAILED: {out.error}", flush=True)
    finally:
        server.stop(STOP_SIGNALS)
    return out


# --- report ------------------------------------------------------------------------------------


def print_table(outcomes: list[Outcome], a: argparse.Namespace) -> None:
    slo = " ".join(a.goodput or [])
    head = (
        f"{'config':<24}{'done':>6}{'req/s':>7}{'out tok/s':>10}"
        f"{'TTFT mean':>10}{'p50':>8}{'p99':>8}{'TPOT mean':>10}{'p50':>8}{'p99':>8}"
        f"{'goodput':>9}"
    )
    print(
        f"\nTTFT/TPOT in ms, means over seeds {a.seeds}; goodput = req/s meeting "
        f"{slo or '(no SLO)'}; x direct = mean TTFT, mean TPOT / the direct plugin's"
    )
    print(head + f"{'x direct':>14}")
    print("-" * (len(head) + 14))
    ref = next((o for o in outcomes if o.config == DIRECT and o.summary), None)
    for o in outcomes:
        if o.error or not o.summary:
            print(f"{o.config:<24}  failed: {o.error}")
            continue
        s, t, p = o.summary, o.summary["ttft_ms"], o.summary["tpot_ms"]
        done = f"{s['completed']:.0f}/{s['completed'] + s['failed']:.0f}"
        rel = (
            (
                f"{t['mean'] / ref.summary['ttft_ms']['mean']:>7.2f}"
                f"{p['mean'] / ref.summary['tpot_ms']['mean']:>7.2f}"
            )
            if ref
            else ""
        )
        print(
            f"{o.config:<24}{done:>6}{s['request_throughput']:>7.2f}"
            f"{s['output_throughput']:>10.2f}{t['mean']:>10.0f}{t['p50']:>8.0f}{t['p99']:>8.0f}"
            f"{p['mean']:>10.1f}{p['p50']:>8.1f}{p['p99']:>8.1f}"
            f"{s.get('request_goodput', float('nan')):>9.2f}{rel}"
        )
    cmp = compare_greedy(outcomes)
    if cmp:
        print(f"\ngreedy tokens, token by token, against {cmp['reference']}:")
        for name, r in cmp.items():
            if name != "reference":
                diff = (
                    f", first difference {r['first_difference']}" if r["first_difference"] else ""
                )
                print(f"{name:<24}{r['identical']}/{r['prompts']} prompts identical{diff}")
    print("\nplacement during the workload (executions prefill/decode/small per physical device)")
    for o in outcomes:
        pl = o.placement
        if not pl:
            continue
        per = "  ".join(
            f"{d['device']}:{d['executions'].get('prefill', 0)}/"
            f"{d['executions'].get('decode', 0)}/{d['executions'].get('small', 0)}"
            for d in pl["physical"]
        )
        print(
            f"{o.config:<24}{per}  migrations {pl['migrations']} "
            f"({pl['bytes_migrated'] / 1e6:.1f} MB), compiles {pl['compiles']}"
        )


def plot(outcomes: list[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "ttft_s", "TTFT (ms)"), (axes[1], "tpot_s", "TPOT (ms)")):
        for o in outcomes:
            xs = np.sort([r[key] * 1000.0 for r in o.requests if r["ok"] and r[key] is not None])
            if len(xs):
                ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=o.config)
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.set_title(f"{label.split()[0]} CDF")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    try:
        import jax

        info["jax"] = jax.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:  # the server subprocess: _serve STATS_PORT -- SERVE_ARGS...
        return _serve(int(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:])
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--configs",
        default=",".join(c.name for c in CONFIGS),
        help="comma-separated subset of the configuration names",
    )
    p.add_argument(
        "--server-args",
        default="--max-model-len 256 --max-num-seqs 4 "
        "--max-num-batched-tokens 64 --chunk-buckets 32,64",
        help="examples/serve.py flags, the same for every configuration "
        "(default model: SmolLM2-135M-Instruct)",
    )
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--warmup-prompts", type=int, default=4, help="unmeasured, before each run")
    p.add_argument("--request-rate", type=float, default=0.5)
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--length-scale", type=float, default=0.3)
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-prompt-len", type=int, default=120)
    p.add_argument("--max-output-len", type=int, default=32)
    p.add_argument("--goodput", nargs="*", default=["ttft:5000", "tpot:500"], metavar="KEY:MS")
    p.add_argument("--seeds", default="0,1,2", help="one workload per seed (comma-separated)")
    p.add_argument(
        "--greedy-prompts",
        type=int,
        default=8,
        help=f"fixed greedy prompts compared token by token (<= {len(GREEDY_PROMPTS)})",
    )
    p.add_argument("--greedy-tokens", type=int, default=24)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--startup-timeout", type=float, default=300)
    p.add_argument("--out-dir", default="bench_policies_out")
    a = p.parse_args(argv)
    a.server_args = a.server_args.split()
    a.seeds = [int(x) for x in a.seeds.split(",")]
    a.seed = a.seeds[0]  # the warm-up draws
    wanted = [n.strip() for n in a.configs.split(",")]
    configs = [c for c in CONFIGS if c.name in wanted]
    if len(configs) != len(wanted):
        p.error(f"unknown configuration in {wanted}; known: {[c.name for c in CONFIGS]}")
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = machine()
    t0 = time.monotonic()
    outcomes = [run_config(c, a, out_dir) for c in configs]
    info["loadavg_end"] = os.getloadavg()
    info["wall_s"] = time.monotonic() - t0
    print_table(outcomes, a)
    print(
        f"\nmachine: {info.get('cpu', '?')}, {info['cpu_count']} cores, load "
        f"{info['loadavg_start'][0]:.1f} -> {info['loadavg_end'][0]:.1f}; "
        f"whole run {info['wall_s']:.0f}s"
    )
    workload = {
        k: getattr(a, k)
        for k in (
            "num_prompts",
            "warmup_prompts",
            "request_rate",
            "burstiness",
            "length_scale",
            "min_len",
            "max_prompt_len",
            "max_output_len",
            "goodput",
            "seeds",
        )
    }
    with open(out_dir / "policies.json", "w") as f:
        json.dump(
            {
                "machine": info,
                "server_args": a.server_args,
                "workload": workload,
                "configs": [{"name": c.name, "env": c.env} for c in configs],
                "greedy": compare_greedy(outcomes),
                "results": [o.__dict__ for o in outcomes],
            },
            f,
            indent=2,
            default=str,
        )
    title = (
        f"{' '.join(a.server_args)}; {a.num_prompts} prompts at {a.request_rate} req/s, "
        f"seeds {a.seeds}; "
        f"{info['cpu_count']} CPU cores ({info.get('cpu', '?')})"
    )
    plot(outcomes, out_dir / "policies.png", title)
    print(f"wrote {out_dir / 'policies.json'} and {out_dir / 'policies.png'}")
    return 0 if all(o.summary.get("completed") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
