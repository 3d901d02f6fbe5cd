"""Server start-up with a cold vs a warm persistent compilation cache.

    python -m bench.startup_cache                      # SmolLM2-135M on all flexnpu devices
    python -m bench.startup_cache --repeats 2 -- --devices 1

Starts `python -m flexnpu serve --compilation-cache DIR` (JAX_PLATFORMS=flexnpu by default) and
times it until /health answers 200: once with an empty DIR (cold: every step program compiled and
written) and once again with the DIR the cold run filled (warm: loaded through FlexNPU's
PJRT_Executable_DeserializeAndLoad). --repeats alternates cold and warm pairs, each cold run with
a fresh DIR. Prints per run the time to healthy and the server's own "compiled in" line, then
the medians and warm / cold. Arguments after `--` go to `flexnpu serve`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def start_once(
    cache_dir: Path, port: int, serve_args: list[str], platform: str, timeout_s: float
) -> tuple[float, float | None, int]:
    """Seconds until /health is 200, the server's 'compiled in' seconds and the cache entries."""
    log = cache_dir.parent / f"serve-{port}.log"
    env = {**os.environ, "JAX_PLATFORMS": platform}
    command = [
        sys.executable,
        "-m",
        "flexnpu",
        "serve",
        "--port",
        str(port),
        "--compilation-cache",
        str(cache_dir),
        *serve_args,
    ]
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()}")
                if time.perf_counter() - start > timeout_s:
                    raise SystemExit(
                        f"server not healthy after {timeout_s:.0f}s:\n{log.read_text()}"
                    )
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            healthy = time.perf_counter() - start
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    compiled = re.search(r"compiled in ([0-9.]+)s", log.read_text())
    entries = sum(1 for _ in cache_dir.iterdir()) if cache_dir.exists() else 0
    return healthy, float(compiled.group(1)) if compiled else None, entries


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=1, help="cold/warm pairs (default 1)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--platform", default="flexnpu", help="JAX_PLATFORMS of the server")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per start-up")
    parser.add_argument("serve_args", nargs="*", help="after --: options of `flexnpu serve`")
    args = parser.parse_args()

    cold, warm = [], []
    with tempfile.TemporaryDirectory(prefix="flexnpu-startup-") as root:
        for r in range(args.repeats):
            cache = Path(root) / f"cache{r}"
            for label, times in (("cold", cold), ("warm", warm)):
                healthy, compiled, entries = start_once(
                    cache, args.port, args.serve_args, args.platform, args.timeout
                )
                times.append(healthy)
                shown = f"{compiled:.1f}s" if compiled is not None else "n/a"
                print(
                    f"run {r} {label}: healthy after {healthy:.1f}s (server 'compiled in' "
                    f"{shown}; {entries} cache entries)",
                    flush=True,
                )
    c, w = statistics.median(cold), statistics.median(warm)
    print(
        f"\nstart-up until /health 200 (median of {args.repeats}): cold {c:.1f}s, "
        f"warm {w:.1f}s, warm/cold {w / c:.2f} ({c / w:.2f}x faster)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
