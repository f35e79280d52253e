"""Frequency caps: one counter per user × cap bucket × user-local day. Key names and TTLs only.

- Key: `cap:{<user_id>}:<bucket>:<YYYY-MM-DD>`. The braces are a Redis Cluster hash tag, so all
  of a user's keys share a slot (use `user_tag` for other per-user keys). Braces and `%` inside a
  user id are percent-escaped so the tag is always the whole user id.
- Day: the user's local calendar day in their IANA zone (catalog default zone when unset), so a
  New York user's "3 a day" resets at New York midnight; DST days last 23 or 25 hours.
- TTL: until the end of that local day plus a margin (default 1 h): the key outlives its day a
  little (late reads, clock skew) and then disappears; no cleanup job.
- Unit: one notification per user and bucket, whatever the number of channels it goes out on.
  Transactional types have no bucket (`cap_bucket` returns None) and are never capped.
- Use: the plan job reads the count for `herald.policy.decide` and, after a Send, runs
  `CAP_INCR_SCRIPT` (atomic increment-if-below-limit; it also sets the TTL on first use).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from math import ceil
from zoneinfo import ZoneInfo

from herald.catalog import NotificationType
from herald.quiet_hours import end_of_local_day, local_day

__all__ = [
    "CAP_INCR_SCRIPT",
    "CapBucket",
    "cap_bucket",
    "cap_key",
    "ttl_seconds",
    "user_tag",
]

DEFAULT_MARGIN = timedelta(hours=1)

CAP_INCR_SCRIPT = """
-- KEYS[1] = cap key; ARGV[1] = daily limit; ARGV[2] = TTL seconds.
-- Returns the new count, or -1 (and changes nothing) when the limit is already reached.
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return -1 end
n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return n
"""


def user_tag(user_id: str) -> str:
    """The Redis Cluster hash tag of a user: `{user_id}` with braces and `%` escaped."""
    escaped = user_id.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return "{" + escaped + "}"


def cap_key(user_id: str, bucket: str, day: date) -> str:
    """`cap:{u42}:marketing:2026-03-08`."""
    return f"cap:{user_tag(user_id)}:{bucket}:{day.isoformat()}"


def ttl_seconds(now_utc: datetime, tz: str | ZoneInfo, margin: timedelta = DEFAULT_MARGIN) -> int:
    """Whole seconds from `now_utc` to the end of the user's local day plus `margin` (>= 1)."""
    remaining = end_of_local_day(now_utc, tz) - now_utc + margin
    return max(1, ceil(remaining.total_seconds()))


@dataclass(frozen=True, slots=True)
class CapBucket:
    """Where and how a user's notification of one type is counted today."""

    key: str
    bucket: str
    daily_limit: int
    local_date: date
    ttl_seconds: int

    def allows(self, count: int) -> bool:
        """True when one more notification fits (`count` = sent so far today)."""
        return count < self.daily_limit


def cap_bucket(
    user_id: str,
    nt: NotificationType,
    now_utc: datetime,
    tz: str | ZoneInfo,
    margin: timedelta = DEFAULT_MARGIN,
) -> CapBucket | None:
    """The bucket counting `nt` for this user today; None when the type is not capped."""
    if nt.cap is None or nt.transactional:
        return None
    day = local_day(now_utc, tz)
    return CapBucket(
        key=cap_key(user_id, nt.cap.bucket, day),
        bucket=nt.cap.bucket,
        daily_limit=nt.cap.daily_limit,
        local_date=day,
        ttl_seconds=ttl_seconds(now_utc, tz, margin),
    )
