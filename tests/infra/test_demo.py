"""`herald demo`: its pure parts, and its clear error when it cannot start a stack. The whole
demo runs on tests/infra/test_scaleout.py's stack (two processes per job)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from herald.catalog import load_catalog
from herald.digest import SocialEvent, step, summarize
from herald.quiet_hours import QuietWindow, quiet_until
from infra.demo.loader import campaign_user
from infra.demo.logic import SceneResult, like_storm, quiet_window_ending_soon, rate_per_second

REPO = Path(__file__).resolve().parents[2]


# -- pure parts --------------------------------------------------------------------------------


@pytest.mark.parametrize("tz", ["Asia/Tokyo", "America/New_York", "UTC", "Asia/Kolkata"])
@pytest.mark.parametrize("second", [0, 14, 15, 16, 59])
def test_quiet_window_holds_now_and_ends_within_two_minutes(tz: str, second: int) -> None:
    now = datetime(2026, 6, 1, 23, 58, second, 500_000, tzinfo=UTC)
    plan = quiet_window_ending_soon(now, tz, min_lead_s=45)
    # the production rule (herald.quiet_hours) says: quiet now, until exactly plan.ends_at
    until = quiet_until(now, QuietWindow.parse(plan.start, plan.end), ZoneInfo(tz))
    assert until == plan.ends_at
    assert timedelta(seconds=45) <= plan.ends_at - now <= timedelta(seconds=105)
    assert plan.ends_at.astimezone(ZoneInfo(tz)).strftime("%H:%M") == plan.end


def test_quiet_window_needs_an_aware_instant() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        quiet_window_ending_soon(datetime(2026, 6, 1, 12, 0), "UTC")


def test_like_storm_is_one_overdue_window_with_the_expected_line() -> None:
    """The storm falls in one digest window that has already ended, so it closes at once."""
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    records = like_storm("poster", "post-1", 1200, now, 600, "run1")
    assert len({r["event_id"] for r in records}) == len({r["actor_id"] for r in records}) == 1200
    assert all(r["occurred_at"] < now - timedelta(seconds=60) for r in records)
    assert records[-1]["occurred_at"] - records[0]["occurred_at"] < timedelta(seconds=600)

    catalog = load_catalog()
    state, closed = None, []
    for r in records:
        state, windows = step(state, SocialEvent.from_record({**r, "tenant_id": "dev"}), catalog)
        closed += windows
    assert state is not None and not closed  # one window, still open when the storm ends
    # the job clock is past the window's end: the digest job closes it (after its grace)
    assert state.should_close(int(now.timestamp() * 1000))
    window = state.close()
    assert window is not None and window.total == 1200
    line = summarize(window, "en", catalog)
    assert line == "user1, user2, user3 and 1,197 others liked your post"


def test_like_storm_rejects_an_empty_storm() -> None:
    with pytest.raises(ValueError):
        like_storm("p", "o", 0, datetime.now(UTC), 600, "r")


def test_rate_of_a_sampled_counter() -> None:
    assert rate_per_second([(0.0, 0), (2.0, 1000), (4.0, 2000)]) == 500.0
    assert rate_per_second([(1.0, 5)]) == 0.0
    assert rate_per_second([(1.0, 5), (1.0, 9)]) == 0.0


def test_campaign_users_sort_in_numeric_order() -> None:
    users = [campaign_user("r", i) for i in (9, 10, 999, 1000, 1_000_000)]
    assert users == sorted(users)


def test_scene_result_verdicts() -> None:
    result = SceneResult(3, "failover")
    assert not result.passed and result.observed == "not run"
    assert result.ok("via sms_b").passed
    assert not result.fail("stuck").passed and result.observed == "stuck"


# -- the real thing ----------------------------------------------------------------------------


def herald(
    *args: str, run_dir: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},  # one table row per line
    )


def test_demo_without_a_stack_says_how_to_start_one(tmp_path: Path) -> None:
    """A stack that cannot start is a clear error, not a traceback (here: the run dir is a
    file, so `herald up` fails)."""
    run_dir = tmp_path / "not-a-dir"
    run_dir.write_text("")
    out = herald("demo", run_dir=run_dir, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "make run" in out.stderr and "Traceback" not in out.stderr
