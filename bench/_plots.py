"""PNG plots of scenario results (matplotlib, Agg backend: no display needed).

Two kinds, enough for every SPEC §6 figure (see bench/_report.py for the Plot dict):

- "hist": latency histograms, one overlaid series per label (Herald beside its baseline), on a
  log x axis when the spread is wide (a p99 tail next to a sub-millisecond baseline);
- "lines": values over time, one line per label ([xs, ys]), plus horizontal lines (`hlines`)
  for a configured rate or a bound.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless, deterministic output

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["render_plot"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _hist(ax: Any, plot: dict[str, Any]) -> None:
    series = {label: [v for v in values if v is not None] for label, values in plot["data"].items()}
    series = {label: values for label, values in series.items() if values}
    if not series:
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        return
    positive = [x for v in series.values() for x in v if x > 0]
    low, high = (min(positive), max(positive)) if positive else (0.0, 0.0)
    log = low > 0 and high / low > 50
    if log:  # zeros are clipped into the first bin
        import numpy as np

        bins: Any = np.geomspace(low, high, 60)
        ax.set_xscale("log")
    else:
        bins = 60
    for label, values in series.items():
        values = [max(x, low) for x in values] if log else values
        ax.hist(values, bins=bins, alpha=0.55, label=f"{label} (n={len(values):,})")
    ax.set_ylabel(plot.get("ylabel", "requests"))


def _lines(ax: Any, plot: dict[str, Any]) -> None:
    for label, (xs, ys) in plot["data"].items():
        ax.plot(xs, ys, label=label, linewidth=1.4, marker="." if len(xs) < 40 else None)
    for label, y in (plot.get("hlines") or {}).items():
        if y is None:
            continue
        ax.axhline(y, linestyle="--", linewidth=1.0, color="grey" if "bound" in label else "red")
        ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=7,
                    va="bottom")  # fmt: skip
    tops = [y for _, ys in plot["data"].values() for y in ys if y is not None]
    tops += [y for y in (plot.get("hlines") or {}).values() if y is not None]
    ax.set_ylim(0, max(tops, default=1) * 1.15 or 1)  # room above the highest line and label
    ax.set_ylabel(plot.get("ylabel", ""))


def render_plot(plot: dict[str, Any], out_dir: Path, prefix: str) -> Path:
    """Write one plot as `<out_dir>/<prefix>_<name>.png`; returns the path."""
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    try:
        if plot["kind"] == "hist":
            _hist(ax, plot)
        else:
            _lines(ax, plot)
        ax.set_title(plot.get("title", plot["name"]), fontsize=10)
        ax.set_xlabel(plot.get("xlabel", ""))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{prefix}_{_slug(plot['name'])}.png"
        fig.savefig(path)
        return path
    finally:
        plt.close(fig)
