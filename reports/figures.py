"""matplotlib figures for the report. Each returns a Figure with a title and axes with units;
the caption (what it shows) is returned beside it by `page.py`."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GIB = 2**30
TIERS = ("vram", "ram", "nvme")


def memory_map(memory: dict, title: str):
    """Stacked bars: what each tier holds, against its capacity (GiB)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    caps = {"vram": memory.get("vram_capacity", 0), "ram": memory.get("ram_capacity", 0), "nvme": 0}
    for i, tier in enumerate(TIERS):
        bottom = 0.0
        for name, b in memory[tier].items():
            if b:
                ax.bar(i, b / GIB, bottom=bottom, label=f"{tier.upper()}: {name}")
                ax.text(i, bottom + b / GIB / 2, name, ha="center", va="center", fontsize=7)
                bottom += b / GIB
        if caps[tier]:
            ax.hlines(caps[tier] / GIB, i - 0.45, i + 0.45, colors="k", linestyles="--")
    ax.set_xticks(range(len(TIERS)), [t.upper() for t in TIERS])
    ax.set_xlabel("memory tier")
    ax.set_ylabel("bytes (GiB)")
    ax.set_yscale("symlog", linthresh=16)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def ceilings(rows: list[dict], title: str):
    """Horizontal bars: decode tok/s ceiling of the routed experts on each tier (tok/s)."""
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    labels = [f"{r['tier']} ({r['bandwidth_gbs']:.0f} GB/s)" for r in rows]
    vals = [r["tok_s"] for r in rows]
    ax.barh(labels, vals)
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.1f}", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("decode ceiling, experts only (tok/s)")
    ax.set_ylabel("expert source tier")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def sweep(xs, ys, bounds, xlabel: str, ylabel: str, title: str, marker_x=None):
    """A line of predictions with each point coloured by the resource that bounds it."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, ys, color="0.7", zorder=1)
    for b in sorted(set(bounds)):
        pts = [(x, y) for x, y, bb in zip(xs, ys, bounds) if bb == b]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=f"bound by {b}", zorder=2)
    if marker_x is not None:
        ax.axvline(marker_x, color="k", linestyle=":", label="this machine / plan")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def predicted_vs_measured(rows: list[dict], title: str):
    """Scatter of predicted against measured values with the y = x line (same units)."""
    fig, ax = plt.subplots(figsize=(5, 5))
    xs = [r["measured"] for r in rows]
    ys = [r["predicted"] for r in rows]
    ax.scatter(xs, ys)
    for r in rows:
        ax.annotate(r["case"], (r["measured"], r["predicted"]), fontsize=7)
    lim = max(xs + ys) * 1.1 if rows else 1
    ax.plot([0, lim], [0, lim], "k--", lw=0.8, label="predicted = measured")
    ax.set_xlabel("measured (tok/s)")
    ax.set_ylabel("predicted (tok/s)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
