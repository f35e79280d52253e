"""The structured result every scenario returns, and the Markdown report built from them.

A scenario's `result(quick=False) -> dict` returns a `Result` as a plain dict (JSON-safe, so
the runner can take it from a child process):

    {"title": "...", "figures": [Figure, ...], "notes": ["..."], "plots": [Plot, ...],
     "details": {...anything the scenario printed...}}

A `Figure` is one measured number with the raw baseline measured in the same run:

    {"name": "plan output records/s", "value": 21_000.0, "unit": "rec/s",
     "baseline": 250_000.0, "baseline_name": "Kafka consume->produce, same records",
     "better": "higher", "target": ">= 50k/s"}

`ratio` is always value / baseline (computed here, never by the scenario), so the reader sees
"Herald does 8 % of what raw Kafka does on this machine now" or "p99 is 6x the raw produce p99";
`better` says which direction is good. The absolute numbers move with the machine's load; the
ratio to a baseline measured minutes apart on the same machine is what compares across runs.

A `Plot` is data for bench/_plots.py: `{"kind": "hist" | "lines", "name", "title", "xlabel",
"ylabel", "data": {label: values | [xs, ys]}, "hlines": {label: y}}`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, TypedDict

__all__ = ["Figure", "figure", "fmt", "percentile", "per_second", "ratio", "render", "result"]


class Figure(TypedDict, total=False):
    """One figure beside its baseline (see the module docstring)."""

    name: str
    value: float | None
    unit: str
    baseline: float | None
    baseline_name: str
    better: str  # "higher" | "lower"
    target: str


def figure(
    name: str,
    value: float | None,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_name: str = "",
    better: str = "higher",
    target: str = "",
) -> Figure:
    """A Figure dict; `value`/`baseline` None mean "not measured" (shown as such)."""
    return Figure(
        name=name, value=value, unit=unit, baseline=baseline, baseline_name=baseline_name,
        better=better, target=target,
    )  # fmt: skip


def result(
    title: str,
    figures: list[Figure],
    *,
    notes: list[str] | None = None,
    plots: list[dict[str, Any]] | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A scenario result as the runner expects it."""
    return {
        "title": title,
        "figures": list(figures),
        "notes": list(notes or []),
        "plots": list(plots or []),
        "details": details or {},
    }


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, or None when either is missing or the baseline is 0."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank p-quantile (0 < p <= 1) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p * len(ordered)))
    return ordered[rank - 1]


def per_second(times: list[float], start: float | None = None, width: float = 1.0) -> list[float]:
    """Counts per `width`-second bucket from `start` (default: the first time), as rates/s."""
    if not times:
        return []
    t0 = min(times) if start is None else start
    counts = [0] * (int((max(times) - t0) / width) + 1)
    for t in times:
        if t >= t0:
            counts[int((t - t0) / width)] += 1
    return [c / width for c in counts]


def fmt(value: float | None) -> str:
    """A figure as people read it: thousands separators, 3 significant digits below 100."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _ratio_cell(fig: Figure) -> str:
    r = ratio(fig.get("value"), fig.get("baseline"))
    if r is None:
        return "—"
    shown = f"{r:.1%}" if r < 1 else f"{r:.2f}×"
    good = "higher" if fig.get("better", "higher") == "higher" else "lower"
    return f"{shown} ({good} is better)"


def _table(figures: list[Figure]) -> list[str]:
    lines = [
        "| figure | Herald | raw baseline, same run | ratio Herald / baseline | target |",
        "|---|---|---|---|---|",
    ]
    for fig in figures:
        unit = fig.get("unit", "")
        value = f"{fmt(fig.get('value'))} {unit}".strip()
        base = fig.get("baseline")
        base_cell = "—"
        if base is not None:
            base_cell = f"{fmt(base)} {unit}".strip() + f" ({fig.get('baseline_name', '')})"
        elif fig.get("baseline_name"):
            base_cell = f"— ({fig.get('baseline_name')})"
        lines.append(
            f"| {fig['name']} | {value} | {base_cell} | {_ratio_cell(fig)} | "
            f"{fig.get('target') or '—'} |"
        )
    return lines


def render(
    runs: dict[str, dict[str, Any]], *, quick: bool, started: datetime, cores: int | None
) -> str:
    """The whole REPORT.md from every scenario's run record.

    A run record is {"status": "ok" | "failed" | "not run", "seconds": float, "result": Result
    or None, "error": str, "pngs": [file names], "run_at": "YYYY-MM-DD HH:MM" (UTC) when the
    scenario ran}. A scenario run earlier than this run (bench/__main__.py keeps them) is
    dated in the table and its section.
    """
    lines = [
        "# Herald benchmark report",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC → {datetime.now(UTC):%H:%M} UTC on this machine "
        f"({cores or '?'} cores{', **quick volumes**' if quick else ''}). The machine is shared "
        "with other work, so absolute figures move with its load; each figure stands beside a raw "
        "baseline measured in the same run, and the ratio is what compares across runs. A "
        "scenario not run this time keeps the figures of its last run, dated in the table.",
        "",
        "Reproduce: `make bench` (all scenarios), `.venv/bin/python -m bench SCENARIO ...`, "
        "or one scenario alone: `.venv/bin/python -m bench.SCENARIO`.",
        "",
        "| scenario | status | ran (UTC) | seconds |",
        "|---|---|---|---|",
    ]
    for name, run in runs.items():
        lines.append(
            f"| [{name}](#{name}) | {run['status']} | {run.get('run_at') or '—'} "
            f"| {run.get('seconds', 0):.0f} |"
        )
    lines.append("")
    for name, run in runs.items():
        res = run.get("result")
        title = res["title"] if res else name
        ran = f" (ran {run['run_at']} UTC)" if run.get("run_at") else ""
        lines += [f"## {name}", "", f"**{title}** — {run['status']}{ran}", ""]
        if res:
            lines += _table(res["figures"])
            lines.append("")
            lines += [f"- {note}" for note in res.get("notes", [])]
            if res.get("notes"):
                lines.append("")
        if run.get("error"):
            lines += ["```", run["error"].strip()[-3000:], "```", ""]
        for png in run.get("pngs", []):
            lines += [f"![{png}]({png})", ""]
    return "\n".join(lines)
