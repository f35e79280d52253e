"""Exponential backoff with full jitter, under a max attempt count and a total deadline.

Pure functions, no I/O. The delay before the retry that follows failed attempt `attempt`
(1-based: 1 = the first attempt failed) is drawn as in AWS's "full jitter":

    window = min(cap_s, base_s * 2 ** (attempt - 1))
    delay  = floor + uniform(0, spread)

- without Retry-After: `floor = 0`, `spread = window`, so `0 <= delay <= cap_s`;
- with Retry-After `ra` (a 429 or 503 told us when to come back): `floor = ra` and
  `spread = min(cap_s, max(window, ra * retry_after_spread))`, so `ra <= delay <= ra + cap_s`.
  Retry-After is a floor, never a target: 10k messages throttled by one 429 storm with the same
  `Retry-After: 1` come back spread over `[1 s, 2 s]`, not as a second synchronized wave.

The retry time is then bounded by the delivery's deadline, the earlier of `expire_at` and
`first_attempt_at + max_total_s`. If even the floor lands at or after the deadline, or
`attempt >= max_attempts`, `next_attempt_at` returns None: give up (dead-letter, or EXPIRED
when `expire_at` is what ran out). Otherwise the draw is truncated to the deadline — uniform over
what is left, never clamped onto it (clamping would pile retries up at the deadline).

Retries also pass through the provider's token bucket (`herald.shaping`), so a recovering
provider is fed at its configured rate: backoff spreads the retries, shaping caps them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

__all__ = [
    "BackoffPolicy",
    "Rng",
    "deadline_of",
    "jitter_delay",
    "next_attempt_at",
]


class Rng(Protocol):
    """What backoff needs from a random source (`random.Random` satisfies it)."""

    def uniform(self, a: float, b: float) -> float: ...


_SYSTEM_RNG: Rng = random.SystemRandom()


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Retry budget of one delivery type.

    `base_s` is the first retry's window, `cap_s` the largest window, `max_attempts` counts every
    attempt including the first, `max_total_s` bounds the whole retry life from the first attempt
    (None = only `expire_at` bounds it), `retry_after_spread` sizes the jitter added on top of a
    Retry-After floor as a fraction of it (1.0 = retry within `[ra, 2 ra]` at least).
    """

    base_s: float = 1.0
    cap_s: float = 300.0
    max_attempts: int = 8
    max_total_s: float | None = 3600.0
    retry_after_spread: float = 1.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s:
            raise ValueError("backoff needs 0 < base_s <= cap_s")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_total_s is not None and self.max_total_s <= 0:
            raise ValueError("max_total_s must be positive")
        if self.retry_after_spread < 0:
            raise ValueError("retry_after_spread must be >= 0")

    def window(self, attempt: int) -> float:
        """Jitter window after failed attempt `attempt` (1-based), before any Retry-After."""
        exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base is far beyond any cap
        return min(self.cap_s, self.base_s * (2.0**exponent))


def jitter_delay(
    policy: BackoffPolicy,
    attempt: int,
    retry_after: float | None = None,
    rng: Rng | None = None,
) -> float:
    """Seconds to wait after failed attempt `attempt`: `floor + uniform(0, spread)` (see module)."""
    floor, spread = _floor_and_spread(policy, attempt, retry_after)
    return floor + (rng or _SYSTEM_RNG).uniform(0.0, spread)


def deadline_of(
    policy: BackoffPolicy,
    first_attempt_at: datetime,
    expire_at: datetime | None,
) -> datetime | None:
    """The last moment a retry may start: min(expire_at, first_attempt_at + max_total_s)."""
    candidates = [d for d in (expire_at,) if d is not None]
    if policy.max_total_s is not None:
        candidates.append(first_attempt_at + timedelta(seconds=policy.max_total_s))
    return min(candidates) if candidates else None


def next_attempt_at(
    policy: BackoffPolicy,
    *,
    attempt: int,
    now: datetime,
    first_attempt_at: datetime,
    expire_at: datetime | None = None,
    retry_after: float | None = None,
    rng: Rng | None = None,
) -> datetime | None:
    """When to retry after failed attempt `attempt` (1-based), or None to give up.

    None when `attempt >= max_attempts` or when the earliest allowed retry (now + Retry-After
    floor) is not before the deadline. A returned time is always `> now` unless the floor is 0,
    and always strictly before the deadline. All datetimes must be timezone-aware.
    """
    if attempt >= policy.max_attempts:
        return None
    floor, spread = _floor_and_spread(policy, attempt, retry_after)
    earliest = now + timedelta(seconds=floor)
    deadline = deadline_of(policy, first_attempt_at, expire_at)
    if deadline is not None:
        if earliest >= deadline:
            return None
        spread = min(spread, (deadline - earliest).total_seconds())
    # uniform(0, spread) may return spread itself; keep the result strictly before the deadline.
    draw = (rng or _SYSTEM_RNG).uniform(0.0, spread)
    at = earliest + timedelta(seconds=draw)
    if deadline is not None and at >= deadline:
        at = earliest + timedelta(seconds=draw / 2)
    return at


def _floor_and_spread(
    policy: BackoffPolicy, attempt: int, retry_after: float | None
) -> tuple[float, float]:
    window = policy.window(attempt)
    if retry_after is None or retry_after <= 0:
        return 0.0, window
    spread = min(policy.cap_s, max(window, retry_after * policy.retry_after_spread))
    return float(retry_after), spread
