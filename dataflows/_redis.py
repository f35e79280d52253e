"""Redis state of the plan job: request dedup and frequency-cap charges, one round trip per batch.

    RequestGate.admit(requests)   drops second copies of a request (same notification_id)
    CapCounter.charge(charges)    atomic increment-if-below of each user's daily cap counter

Both are crash-safe under Bytewax's at-least-once replays:

- The gate remembers, per notification_id, the *origin* (topic:partition:offset) of the first
  record admitted. A record replayed after a crash has the same origin and is admitted again (its
  outputs are re-emitted with the same ids and deduplicated downstream); another record of the
  same notification (an upstream retry, a DLQ replay) has a different origin and is dropped. TTL:
  until the request expires (a later copy would only be planned as EXPIRED), at least a minute
  and at most `request_dedup_ttl_seconds`, so OTP floods do not fill Redis for a week.
  Key: `plan:req:{<notification_id>}`.
- A cap charge writes a marker per user × bucket × notification next to the counter (same hash
  slot), so charging the same notification again (a replay) is allowed without counting twice.
  The counter key and TTL come from `herald.caps`; the marker lives as long as the counter.

On Redis Cluster every key is touched by one script call with keys of one hash slot, and the
calls of a batch go through one pipeline. On a single Redis the cap charges of a batch are one
call of a script per 256 charges that loops over them (same logic, same keys), all in one
pipeline: thousands of single-charge script calls cost the job more client CPU than the rest
of the cap work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from math import ceil
from typing import NamedTuple

import redis

from herald.caps import CapBucket, user_tag
from herald.config import RedisSettings
from herald.planning import PlanRequest

__all__ = ["CapCharge", "CapCounter", "RequestGate", "marker_key", "redis_client"]

_GATE_SCRIPT = """
-- KEYS[1] = dedup key; ARGV[1] = origin; ARGV[2] = TTL seconds. 1 = admit, 0 = duplicate.
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
if held == ARGV[1] then return 1 end
return 0
"""

_CAP_SCRIPT = """
-- KEYS[1] = cap counter, KEYS[2] = marker of this notification; ARGV[1] = limit, ARGV[2] = TTL.
-- 1 = charged (or already charged for this notification), 0 = limit reached (nothing changed).
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return 0 end
n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[2])
return 1
"""

_CAP_BATCH_SCRIPT = """
-- _CAP_SCRIPT for many charges: KEYS = counter1, marker1, counter2, marker2, ...;
-- ARGV = limit1, ttl1, limit2, ttl2, ... Returns one 1/0 per charge, in order.
local out = {}
for i = 1, #KEYS, 2 do
  local limit, ttl = tonumber(ARGV[i]), ARGV[i + 1]
  local ok = 1
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    local n = tonumber(redis.call('GET', KEYS[i]) or '0')
    if n >= limit then
      ok = 0
    else
      n = redis.call('INCR', KEYS[i])
      if n == 1 then redis.call('EXPIRE', KEYS[i], ttl) end
      redis.call('SET', KEYS[i + 1], '1', 'EX', ttl)
    end
  end
  out[#out + 1] = ok
end
return out
"""


# Charges per call of the batch script: short enough that Redis is never blocked for long.
_CHUNK = 256


def redis_client(settings: RedisSettings) -> redis.Redis | redis.RedisCluster:
    """A client for `settings` (Redis Cluster when `settings.cluster`)."""
    client: redis.Redis | redis.RedisCluster = settings.client(socket_timeout=None)
    return client


class RequestGate:
    """Request-level dedup by notification_id (see the module docstring)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, max_ttl_seconds: int) -> None:
        self._client = client
        self._script = client.register_script(_GATE_SCRIPT)
        self._max_ttl = max_ttl_seconds

    def admit(self, requests: Sequence[tuple[PlanRequest, datetime]], now: datetime) -> list[bool]:
        """For each (request, its expiry), True unless another record of its notification was
        admitted."""
        if not requests:
            return []
        pipe = self._client.pipeline(transaction=False)
        for req, expires in requests:
            key = f"plan:req:{user_tag(req.notification_id)}"
            ttl = min(self._max_ttl, max(60, ceil((expires - now).total_seconds()) + 60))
            self._script(keys=[key], args=[req.origin, ttl], client=pipe)
        return [bool(r) for r in pipe.execute()]


class CapCharge(NamedTuple):
    """Charge counter `key` once per `marker` (one per user x bucket x notification), up to
    `daily_limit`; both keys expire after `ttl_seconds`. A NamedTuple made by `of` (or, for
    users planned alike, from a template's key parts: dataflows/plan/planned_alike.py)."""

    key: str
    marker: str
    daily_limit: int
    ttl_seconds: int

    @classmethod
    def of(cls, bucket: CapBucket, user_id: str, notification_id: str) -> CapCharge:
        """Charge `bucket` once for `notification_id` (the user is the bucket key's hash tag)."""
        return cls(bucket.key, marker_key(bucket, user_id, notification_id), bucket.daily_limit,
                   bucket.ttl_seconds)  # fmt: skip


def marker_key(bucket: CapBucket, user_id: str, notification_id: str) -> str:
    """The marker of a charge: same hash slot as the counter."""
    b = bucket
    return f"capm:{user_tag(user_id)}:{b.bucket}:{b.local_date}:{notification_id}"


class CapCounter:
    """Atomic daily cap counters (see the module docstring)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster) -> None:
        self._client = client
        self._script = client.register_script(_CAP_SCRIPT)
        self._batch = (
            None if isinstance(client, redis.RedisCluster) else client.register_script(
                _CAP_BATCH_SCRIPT
            )
        )  # fmt: skip

    def charge(self, charges: Sequence[CapCharge]) -> list[bool]:
        """For each charge, True when the notification may be emitted (counted once)."""
        if not charges:
            return []
        pipe = self._client.pipeline(transaction=False)
        if self._batch is not None:
            for start in range(0, len(charges), _CHUNK):
                keys: list[str] = []
                args: list[int] = []
                for c in charges[start : start + _CHUNK]:
                    keys += (c.key, c.marker)
                    args += (c.daily_limit, c.ttl_seconds)
                self._batch(keys=keys, args=args, client=pipe)
            return [bool(r) for chunk in pipe.execute() for r in chunk]
        for c in charges:
            self._script(keys=[c.key, c.marker], args=[c.daily_limit, c.ttl_seconds], client=pipe)
        return [bool(r) for r in pipe.execute()]
