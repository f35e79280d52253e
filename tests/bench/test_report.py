"""`python -m bench --quick` end to end on real processes, and the report's pure parts.

No timing assertions: the runner must produce REPORT.md with numbers beside baselines, and
PNG plots; what the numbers are depends on the machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import bench.__main__ as runner
from bench._report import figure, per_second, percentile, ratio, render, result
from bench.smoothing import max_in_window

pytestmark = pytest.mark.integration  # a quick benchmark on real services

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(900)
def test_quick_run_writes_report_with_figures_and_plots(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "api_accept", "--quick", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = (tmp_path / "REPORT.md").read_text()
    section = report.split("## api_accept", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| latency p99 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Herald's p99, the raw produce p99 of the same run, and their ratio: all numbers
    assert re.fullmatch(r"[\d.,]+ ms", cells[1]), row
    assert re.match(r"[\d.,]+ ms \(plain acks=all produce", cells[2]), row
    assert re.match(r"[\d.]+(×|%)", cells[3]), row
    pngs = sorted(tmp_path.glob("api_accept_*.png"))
    assert [p.name for p in pngs] == ["api_accept_latency.png", "api_accept_throughput.png"]
    for png in pngs:
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5_000
        assert f"![{png.name}]({png.name})" in report
    assert (tmp_path / "api_accept.txt").exists()


def test_absent_optional_scenario_is_reported_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(runner.OPTIONAL, "recovery", "bench.no_such_module")
    assert runner.main(["recovery", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert "| [recovery](#recovery) | not run (bench.no_such_module is not present) |" in report


def test_a_partial_run_keeps_the_other_scenarios_earlier_figures_dated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m bench recovery` into a report directory that holds an earlier `plan` (ok, with
    a plot) and `digest` (failed): both stay in the report with their dates, the plan's plot is
    drawn again from its result, and the scenario run this time carries this run's date."""
    import json

    plot = {"kind": "lines", "name": "rate", "title": "t", "xlabel": "s", "ylabel": "rec/s",
            "data": {"plan": [[0, 1, 2], [5, 6, 7]]}}  # fmt: skip
    res = result(
        "Plan earlier",
        [figure("rate", 50.0, "rec/s", baseline=200.0, baseline_name="raw")],
        plots=[plot],
    )
    (tmp_path / ".plan.json").write_text(json.dumps(res))
    (tmp_path / ".plan.run.json").write_text(
        json.dumps({"status": "ok", "seconds": 94.0, "run_at": "2026-11-30 20:12", "error": ""})
    )
    (tmp_path / ".digest.run.json").write_text(json.dumps(
        {"status": "failed (exit 1)", "seconds": 3.0, "run_at": "2026-11-30 20:14", "error": "boom"}
    ))  # fmt: skip
    monkeypatch.setitem(runner.OPTIONAL, "recovery", "bench.no_such_module")
    assert runner.main(["recovery", "--out", str(tmp_path)]) == 0  # the earlier failure is not
    report = (tmp_path / "REPORT.md").read_text()
    assert "| [plan](#plan) | ok | 2026-11-30 20:12 | 94 |" in report
    assert "**Plan earlier** — ok (ran 2026-11-30 20:12 UTC)" in report
    assert "| rate | 50.0 rec/s | 200 rec/s (raw) |" in report
    assert "| [digest](#digest) | failed (exit 1) | 2026-11-30 20:14 | 3 |" in report
    assert "boom" in report
    assert "| [recovery](#recovery) | not run (bench.no_such_module is not present) |" in report
    assert report.index("## plan") < report.index("## digest") < report.index("## recovery")
    png = tmp_path / "plan_rate.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and "![plan_rate.png](plan_rate.png)" in report

    runner.main(["recovery", "--quick", "--out", str(tmp_path)])  # a smoke run keeps nothing
    assert "## plan" not in (tmp_path / "REPORT.md").read_text()


def test_render_puts_each_figure_beside_its_baseline_and_ratio() -> None:
    res = result(
        "t",
        [
            figure("p99", 30.0, "ms", baseline=10.0, baseline_name="raw", better="lower"),
            figure("rate", 50.0, "rec/s", baseline=200.0, baseline_name="raw"),
            figure("lost", None, ""),
        ],
        notes=["a note"],
    )
    runs = {"x": {"status": "ok", "seconds": 3.0, "result": res, "pngs": ["x_a.png"]}}
    text = render(runs, quick=False, started=datetime.now(UTC), cores=2)
    assert "| p99 | 30.0 ms | 10.0 ms (raw) | 3.00× (lower is better) | — |" in text
    assert "| rate | 50.0 rec/s | 200 rec/s (raw) | 25.0% (higher is better) | — |" in text
    assert "| lost | — | — | — | — |" in text
    assert "- a note" in text and "![x_a.png](x_a.png)" in text


def test_statistics_helpers() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile(list(map(float, range(1, 101))), 0.99) == 99.0
    assert percentile([], 0.5) is None
    assert ratio(1.0, 0.0) is None and ratio(3.0, 2.0) == 1.5
    assert per_second([0.0, 0.2, 1.5, 2.9], start=0.0) == [2.0, 1.0, 1.0]
    # a token bucket's sliding-window check: 3 sends within [1.0, 2.0), the 4th just outside
    assert max_in_window([0.0, 1.0, 1.5, 1.99, 2.0]) == 3
    assert max_in_window([]) == 0
