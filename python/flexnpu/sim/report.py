"""The simulator's outputs: a markdown table and PNG plots (the JSON is experiments.run_all's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def settings(config: dict[str, Any]) -> str:
    """The run's cluster, model and workload in one line (the table's head, the plots' title)."""
    c = config
    return (
        f"{c['devices']} x {c['device']} ({c['units']} units of {c['parallel']}), "
        f"{c['model']}, workload {c['workload']} at {c['rate']:g} req/s for "
        f"{c['duration']:g} s"
    )


def _seeds(config: dict[str, Any]) -> str:
    first, n = config["seed"], config["seeds"]
    return f"seed {first}" if n == 1 else f"seeds {first}-{first + n - 1}"


def plot_title(config: dict[str, Any]) -> str:
    """Two lines over every plot: the settings, then the policies and seeds compared."""
    return f"{settings(config)}\n{', '.join(config['policies'])}; {_seeds(config)}"


def markdown_table(doc: dict[str, Any]) -> str:
    c = doc["config"]
    head = f"{settings(c)}, {c['seeds']} seeds (mean ± 95% CI)"
    rows = [
        "| policy | tok/s | tok/s/dev | goodput req/s | TTFT p50 s | TTFT p99 s | TPOT p50 ms "
        "| TPOT p99 ms | finished | dropped | KV moved GB | util |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in doc["policies"].items():
        ci = m["ci95"]
        label = name
        if "prefill_units" in m:
            label += f" ({m['prefill_units']}P:{m['decode_units']}D)"
        rows.append(
            f"| {label} | {m['throughput_tok_s']:.0f} ± {ci['throughput_tok_s']:.0f} "
            f"| {m['throughput_tok_s_per_device']:.1f} | {m['goodput_rps']:.2f} "
            f"| {m['ttft_s']['p50']:.3f} | {m['ttft_s']['p99']:.3f} "
            f"| {m['tpot_s']['p50'] * 1e3:.1f} | {m['tpot_s']['p99'] * 1e3:.1f} "
            f"| {m['requests_finished']} | {m['requests_dropped']} "
            f"| {_gb(m['kv_bytes_moved'])} | {m['utilisation']:.2f} |"
        )
    reasons = []
    for name, m in doc["policies"].items():
        nz = {k: v for k, v in m["decisions_by_reason"].items() if v}
        reasons.append(
            f"- {name} ({m['core_policy']}): " + ", ".join(f"{k} {v}" for k, v in nz.items())
        )
    hosts = []
    topo = c.get("topology")
    if topo is not None:
        hosts = ["", f"Hosts: {_hosts(topo)}; KV moved within hosts / between hosts (GB):"]
        hosts += [
            f"- {name}: {_gb(m['kv_bytes_within_hosts'])} / {_gb(m['kv_bytes_between_hosts'])}"
            for name, m in doc["policies"].items()
        ]
    return "\n".join([head, "", *rows, *hosts, "", "Placement decisions by reason:", *reasons])


def _link(x: Any) -> str:
    if x is None:
        return "unknown"
    if isinstance(x, str):
        return x
    return f"{x.get('name') or 'measured'} {x['bytes_per_s'] / 1e9:.3g} GB/s per device"


def _hosts(topo: dict[str, Any]) -> str:
    from flexnpu.serving.topology import Topology, hosts_devices

    t = Topology.from_json(topo)
    return (
        f"{hosts_devices(t.hosts)} (hosts x devices), {_link(topo['intra_host_link'])} within "
        f"a host, {_link(topo['inter_host_link'])} between hosts"
    )


def plots(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """ttft_cdf.png, tpot_cdf.png, goodput_vs_rate.png (with --goodput-search), timeline.png."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures(doc).items():
        p = out / name
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written.append(p)
    return written


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The plots as matplotlib figures by file name, each titled with the run's settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    title = plot_title(doc["config"])
    made: dict[str, Any] = {}
    samples = doc.get("_samples", {})
    for key, label, scale in (("ttft", "TTFT (s)", 1.0), ("tpot", "TPOT (ms)", 1e3)):
        fig, ax = plt.subplots(figsize=(6, 4.4))
        for name, s in samples.items():
            xs = np.sort(np.array(s[key]) * scale)
            if len(xs):
                ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.set_xscale("log")
        if samples:
            ax.legend()
        ax.grid(alpha=0.3)
        made[f"{key}_cdf.png"] = fig
    curves = {n: m["goodput_curve"] for n, m in doc["policies"].items() if "goodput_curve" in m}
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4.4))
        for name, c in curves.items():
            ax.plot([x["rate"] for x in c], [x["attainment"] for x in c], marker="o", label=name)
        ax.axhline(0.9, color="gray", ls="--", lw=1)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("SLO attainment")
        ax.legend()
        ax.grid(alpha=0.3)
        made["goodput_vs_rate.png"] = fig
    timelines = {n: m["timeline"] for n, m in doc["policies"].items() if m.get("timeline")}
    if timelines:
        fig, axes = plt.subplots(
            len(timelines), 1, figsize=(9, 0.5 + 2.2 * len(timelines)), squeeze=False
        )
        colors = {"prefill": "tab:red", "decode": "tab:blue", "small": "tab:gray"}
        for ax, (name, tl) in zip(axes[:, 0], timelines.items(), strict=True):
            units = sorted({t[0] for t in tl})[:16]
            pos = {u: i for i, u in enumerate(units)}
            for u, s, e, ph in tl:
                if u in pos:
                    ax.broken_barh([(s, e - s)], (pos[u] - 0.4, 0.8), color=colors[ph])
            ax.set_title(f"{name}: red prefill, blue decode", fontsize=9)
            ax.set_ylabel("unit")
            ax.set_yticks(range(len(units)), [str(u) for u in units], fontsize=6)
        axes[-1, 0].set_xlabel("simulated time (s)")
        made["timeline.png"] = fig
    for fig in made.values():
        fig.suptitle(title, fontsize=8)
        fig.tight_layout()
    return made
