"""Versions of a user's preferences and contact points: a hybrid logical clock.

    next_version(held)   max(now in microseconds, held + 1)

Every consumer keeps the record with the higher `version` (plan, the API's and dispatch's Redis
copies), so a version must never go backwards, whatever Redis loses. A counter kept in Redis
(`INCR`) restarts at 1 after a failover that lost it, and a new opt-out would then look older
than the record it replaces. A version taken from the clock and kept above the version it
replaces (`held`: the record being changed, as read from its copy or rebuilt from the durable
changelog, dataflows/users.py) is larger than every version written before, also after such a
loss, as long as the writers' clocks are within the time between two changes of one user.
Records written before (small counter values: 1, 2, ...) are older than every new one.

Microseconds since the epoch stay below 2^53 until the year 2255: exact in JSON readers that
hold numbers as doubles (Redis' cjson, JavaScript).
"""

from __future__ import annotations

import time

__all__ = ["next_version"]


def next_version(held: int, now_us: int | None = None) -> int:
    """The version of a change to a record whose version is `held` (0: none)."""
    now = time.time_ns() // 1000 if now_us is None else now_us
    return max(now, held + 1)
