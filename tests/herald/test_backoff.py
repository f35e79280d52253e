"""Full-jitter backoff: bounds, Retry-After floor, deadlines, and no synchronized retry waves."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta

import pytest

from herald.backoff import BackoffPolicy, deadline_of, jitter_delay, next_attempt_at

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _offsets(times: list[datetime], origin: datetime) -> list[float]:
    return [(t - origin).total_seconds() for t in times]


def test_window_doubles_up_to_cap() -> None:
    policy = BackoffPolicy(base_s=0.5, cap_s=10.0)
    assert [policy.window(a) for a in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert policy.window(10_000) == 10.0  # no overflow on absurd attempt numbers


def test_full_jitter_covers_the_whole_window_and_never_exceeds_cap() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=30.0)
    rng = random.Random(7)
    for attempt in (1, 3, 5, 9, 50):
        delays = [jitter_delay(policy, attempt, rng=rng) for _ in range(5000)]
        window = policy.window(attempt)
        assert 0.0 <= min(delays) < 0.05 * window  # full jitter: down to ~0, not [w/2, w]
        assert 0.95 * window < max(delays) <= window <= policy.cap_s
        assert statistics.fmean(delays) == pytest.approx(window / 2, rel=0.05)


def test_retry_after_is_a_floor_with_jitter_on_top() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=60.0)
    rng = random.Random(1)
    delays = [jitter_delay(policy, 1, retry_after=5.0, rng=rng) for _ in range(5000)]
    assert min(delays) >= 5.0
    assert max(delays) <= 5.0 + policy.cap_s
    assert max(delays) - min(delays) > 4.5  # spread ≈ Retry-After itself, not a single instant


def test_gives_up_after_max_attempts() -> None:
    policy = BackoffPolicy(max_attempts=3, max_total_s=None)
    kwargs = {"now": T0, "first_attempt_at": T0, "rng": random.Random(0)}
    assert next_attempt_at(policy, attempt=1, **kwargs) is not None
    assert next_attempt_at(policy, attempt=2, **kwargs) is not None
    assert next_attempt_at(policy, attempt=3, **kwargs) is None


def test_never_schedules_at_or_after_the_deadline() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=120.0, max_attempts=100, max_total_s=300.0)
    expire_at = T0 + timedelta(seconds=200)
    rng = random.Random(3)
    now = T0 + timedelta(seconds=190)
    deadline = deadline_of(policy, T0, expire_at)
    assert deadline == expire_at
    for attempt in range(1, 12):
        at = next_attempt_at(
            policy, attempt=attempt, now=now, first_attempt_at=T0, expire_at=expire_at, rng=rng
        )
        assert at is not None and now <= at < expire_at


def test_total_deadline_from_first_attempt() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=60.0, max_attempts=100, max_total_s=100.0)
    late = T0 + timedelta(seconds=100)
    assert next_attempt_at(policy, attempt=2, now=late, first_attempt_at=T0) is None
    # A Retry-After whose floor lands past the deadline means: give up now.
    now = T0 + timedelta(seconds=90)
    assert next_attempt_at(policy, attempt=2, now=now, first_attempt_at=T0, retry_after=30) is None


def test_truncated_window_is_uniform_not_piled_on_the_deadline() -> None:
    policy = BackoffPolicy(base_s=64.0, cap_s=64.0, max_attempts=10, max_total_s=None)
    expire_at = T0 + timedelta(seconds=10)
    rng = random.Random(5)
    times = [
        next_attempt_at(
            policy, attempt=1, now=T0, first_attempt_at=T0, expire_at=expire_at, rng=rng
        )
        for _ in range(4000)
    ]
    offsets = _offsets([t for t in times if t is not None], T0)
    assert len(offsets) == 4000 and max(offsets) < 10.0
    last_second = sum(1 for o in offsets if o >= 9.0)
    assert last_second < 0.15 * len(offsets)  # ~10 %, no spike at the deadline


def test_a_429_storm_does_not_come_back_as_a_synchronized_wave() -> None:
    """10k messages throttled at the same instant with `Retry-After: 1` retry spread out."""
    policy = BackoffPolicy(base_s=1.0, cap_s=60.0)
    rng = random.Random(42)
    times = [
        next_attempt_at(policy, attempt=1, now=T0, first_attempt_at=T0, retry_after=1.0, rng=rng)
        for _ in range(10_000)
    ]
    offsets = sorted(_offsets([t for t in times if t is not None], T0))
    assert len(offsets) == 10_000
    assert offsets[0] >= 1.0 and offsets[-1] <= 2.0  # Retry-After honoured, window [1 s, 2 s]

    # Histogram over the window in 50 ms bins: uniform means every bin holds ~5 % of the
    # retries; a synchronized wave would put most of them in one bin.
    bins = [0] * 20
    for o in offsets:
        bins[min(int((o - 1.0) / 0.05), 19)] += 1
    assert max(bins) < 0.07 * len(offsets)
    assert min(bins) > 0.03 * len(offsets)
    # Coefficient of variation of the retry instants: uniform on [1, 2] → (1/√12)/1.5 ≈ 0.19;
    # "everyone at Retry-After" would be 0.
    cv = statistics.pstdev(offsets) / statistics.fmean(offsets)
    assert 0.15 < cv < 0.25
    # Gaps between consecutive retries: no hole in the window (mean gap is 0.1 ms).
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert max(gaps) < 0.01


def test_successive_storms_spread_wider_with_each_attempt() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=30.0)
    rng = random.Random(9)
    spreads = []
    for attempt in (1, 2, 3, 4):
        delays = [jitter_delay(policy, attempt, rng=rng) for _ in range(10_000)]
        spreads.append(statistics.pstdev(delays))
    assert spreads == sorted(spreads)
    assert spreads[-1] > 6 * spreads[0]


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(base_s=0)
    with pytest.raises(ValueError):
        BackoffPolicy(base_s=10, cap_s=1)
    with pytest.raises(ValueError):
        BackoffPolicy(max_attempts=0)
