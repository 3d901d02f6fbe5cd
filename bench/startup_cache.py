"""Server start-up with a cold vs a warm persistent compilation cache.

    python -m bench.startup_cache                      # SmolLM2-135M on the default layout
    python -m bench.startup_cache --repeats 2 -- --devices 1
    python -m bench.startup_cache --no-cache           # cold only, no persistent cache at all

Starts `python -m flexnpu serve --compilation-cache DIR` (JAX_PLATFORMS=flexnpu by default) and
times it from launch until /health answers 200 and until the first /v1/chat/completions answer
is complete: once with an empty DIR (cold: every step program compiled and written) and once
again with the DIR the cold run filled (warm: loaded through FlexNPU's
PJRT_Executable_DeserializeAndLoad). --repeats alternates cold and warm pairs, each cold run with
a fresh DIR. Prints per run both times, the server's own "compiled in" / "loaded in" line and the
load average, then the medians and warm / cold. Arguments after `--` go to `flexnpu serve`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import ServeProcess, ServerStartError

CHAT = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 16,
}


@dataclass
class Start:
    healthy_s: float  # launch until /health is 200
    answered_s: float  # launch until the first chat completion is complete
    warmup_s: float | None  # the server's own "compiled in" / "loaded in" seconds
    entries: int  # cache entries after the run
    load_average: float  # 1-minute load average when the answer came


def start_once(
    cache_dir: Path | None,
    log: Path,
    port: int,
    serve_args: list[str],
    platform: str,
    timeout_s: float,
) -> Start:
    env = {**os.environ, "JAX_PLATFORMS": platform}
    cache = ["--compilation-cache", str(cache_dir)] if cache_dir else ["--no-compilation-cache"]
    start = time.perf_counter()
    server = ServeProcess([*cache, *serve_args], env=env, log=log, port=port)
    try:
        try:
            server.wait_ready(timeout_s, poll_s=0.05)
        except ServerStartError as e:
            raise SystemExit(str(e)) from None
        healthy = time.perf_counter() - start
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=timeout_s)
        r.raise_for_status()
        answered = time.perf_counter() - start
        load_average = os.getloadavg()[0]
    finally:
        server.stop()
    warmup = re.search(
        r"(?:compiled|loaded from the compilation cache) in ([0-9.]+)s", log.read_text()
    )
    entries = sum(1 for _ in cache_dir.iterdir()) if cache_dir and cache_dir.exists() else 0
    return Start(
        healthy, answered, float(warmup.group(1)) if warmup else None, entries, load_average
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=1, help="cold/warm pairs (default 1)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--platform", default="flexnpu", help="JAX_PLATFORMS of the server")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per start-up")
    parser.add_argument(
        "--no-cache", action="store_true", help="serve --no-compilation-cache: cold runs only"
    )
    parser.add_argument("serve_args", nargs="*", help="after --: options of `flexnpu serve`")
    args = parser.parse_args()

    runs: dict[str, list[Start]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="flexnpu-startup-") as root:
        for r in range(args.repeats):
            cache = None if args.no_cache else Path(root) / f"cache{r}"
            for label in ("cold",) if args.no_cache else ("cold", "warm"):
                log = Path(root) / f"serve-{r}-{label}.log"
                s = start_once(cache, log, args.port, args.serve_args, args.platform, args.timeout)
                runs[label].append(s)
                shown = f"{s.warmup_s:.1f}s" if s.warmup_s is not None else "n/a"
                print(
                    f"run {r} {label}: healthy after {s.healthy_s:.1f}s, first chat answer after "
                    f"{s.answered_s:.1f}s (server's warm-up {shown}; {s.entries} cache entries; "
                    f"load average {s.load_average:.1f})",
                    flush=True,
                )
    summary = []
    for label, starts in runs.items():
        if starts:
            summary.append(f"{label} {statistics.median(s.answered_s for s in starts):.1f}s")
    print(f"\nlaunch until the first chat answer (median of {args.repeats}): " + ", ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
