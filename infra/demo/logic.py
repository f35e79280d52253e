"""Pure pieces of `herald demo`: scene results, the quiet-hours window, the like storm.

Kept apart from the I/O so they are unit-tested without a stack (tests/infra/test_demo.py).
No clock is faked anywhere: the demo gives its user a quiet-hours window that ends a minute or
two from now in the user's own time zone, which is what a real user's "22:00-07:00" looks like
at 06:59, so production code runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

__all__ = [
    "SceneResult",
    "QuietPlan",
    "like_storm",
    "quiet_window_ending_soon",
    "rate_per_second",
]


@dataclass
class SceneResult:
    """What one scene set out to show, what it observed, and whether that is what was promised."""

    number: int
    title: str
    passed: bool = False
    observed: str = "not run"
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, observed: str) -> SceneResult:
        self.passed, self.observed = False, observed
        return self

    def ok(self, observed: str) -> SceneResult:
        self.passed, self.observed = True, observed
        return self


@dataclass(frozen=True)
class QuietPlan:
    """A quiet-hours window, as the preferences API takes it, and when it ends (UTC)."""

    start: str  # "HH:MM" local
    end: str  # "HH:MM" local
    ends_at: datetime  # the window's end instant, UTC


def quiet_window_ending_soon(now: datetime, tz: str, min_lead_s: float = 45.0) -> QuietPlan:
    """A quiet window that started an hour ago (local) and ends at the first whole local minute
    at least `min_lead_s` from `now`; a message sent now is held until that minute.

    The lead leaves the plan job time to decide while the window is still open. Windows are
    "HH:MM" wall-clock times, so the end is a minute boundary, 45-105 s away by default.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    local = now.astimezone(ZoneInfo(tz))
    end = (local + timedelta(seconds=min_lead_s)).replace(second=0, microsecond=0)
    end += timedelta(minutes=1)
    start = local - timedelta(hours=1)
    return QuietPlan(start.strftime("%H:%M"), end.strftime("%H:%M"), end.astimezone(UTC))


def like_storm(
    recipient: str, post_id: str, count: int, now: datetime, window_s: int, run_id: str
) -> list[dict[str, Any]]:
    """`count` like events on one post by distinct actors user1..userN, as social_event records.

    The likes are stamped (event time) inside one digest window that ended a minute ago, so
    the digest job closes the window a grace period after the last like arrives instead of
    making the demo wait the full window (likes: 10 minutes). Event ids are unique per run so
    a second demo run on the same stack is a new storm, not deduplicated copies.
    """
    if count < 1:
        raise ValueError("count must be at least 1")
    first = now - timedelta(seconds=window_s + 60)
    spread_ms = max(1, (window_s - 30) * 1000 // count)
    return [
        {
            "event_id": f"{run_id}-like-{i}",
            "event_type": "like",
            "actor_id": f"{run_id}-user{i}",
            "actor_name": f"user{i}",
            "recipient_id": recipient,
            "object_id": post_id,
            "object_type": "post",
            "occurred_at": first + timedelta(milliseconds=(i - 1) * spread_ms),
        }
        for i in range(1, count + 1)
    ]


def rate_per_second(samples: list[tuple[float, int]]) -> float:
    """Mean rate of a monotonic counter sampled as (monotonic seconds, count); 0 if flat."""
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return 0.0
    return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
