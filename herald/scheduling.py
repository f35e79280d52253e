"""Scheduling: when a held delivery is released, and the time buckets that hold it. Pure.

    local_send_at(now, send_at, "09:00", tz)  local-time campaigns: the user's next 09:00
    release_at(not_before, delivery_id, ...)   not_before + a deterministic jitter
    bucket_key(release, delivery_id, ...)      the schedule job's state key: "<bucket>:<shard>"
    Bucket                                     the deliveries of one key, earliest release first

DST (via `herald.quiet_hours.next_local_time`): a local time that does not exist that day (spring
forward) moves to the next valid instant, the end of the gap; a local time that exists twice
(fall back) is used at its first occurrence only, so a local-time campaign reaches a user at most
once per local day.

Jitter: a release of a normal or bulk delivery is spread over `[not_before, not_before + jitter)`
by a hash of its delivery_id, so "09:00 local for 50M users" does not hit the providers in one
second and a replayed delivery gets the same release instant. Transactional deliveries are never
jittered, and jitter never pushes a release past the delivery's expiry.
"""

from __future__ import annotations

import heapq
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from herald.quiet_hours import next_local_time

__all__ = [
    "Bucket",
    "ScheduledEntry",
    "bucket_key",
    "jitter_fraction",
    "local_send_at",
    "release_at",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NO_JITTER = frozenset({"transactional"})


def local_send_at(
    now: datetime, send_at: datetime | None, wall: str, tz: str | ZoneInfo
) -> datetime:
    """The first instant at or after `max(now, send_at)` when `tz`'s clock reads `wall` (HH:MM)."""
    base = now if send_at is None or send_at < now else send_at
    return next_local_time(base, wall, tz)


def jitter_fraction(delivery_id: str) -> float:
    """A stable number in [0, 1) derived from the delivery id."""
    return zlib.crc32(delivery_id.encode()) / 2**32


def release_at(
    not_before: datetime,
    delivery_id: str,
    traffic_class: str,
    jitter: timedelta,
    expire_at: datetime | None = None,
) -> datetime:
    """When the schedule job releases a delivery held until `not_before` (see module doc)."""
    if traffic_class in _NO_JITTER or jitter <= timedelta(0):
        return not_before
    at = not_before + jitter * jitter_fraction(delivery_id)
    if expire_at is not None and at >= expire_at:
        return not_before
    return at


def bucket_key(release: datetime, delivery_id: str, bucket_seconds: int, shards: int) -> str:
    """`"<bucket index>:<shard>"`: releases in one bucket-length slot, spread over shards."""
    index = int((release - _EPOCH).total_seconds()) // bucket_seconds
    return f"{index}:{zlib.crc32(delivery_id.encode()) % shards}"


@dataclass(frozen=True, slots=True, order=True)
class ScheduledEntry:
    """A held delivery: released to `topic` with Kafka key `delivery_id` and value `value`.

    `value` is the record exactly as read from herald.scheduled (Confluent-framed Avro Delivery;
    schema ids are global, so the bytes are valid on the deliveries topics too). The remaining
    fields are what the EXPIRED event needs. Ordered by release instant, then delivery id.
    """

    release: datetime
    delivery_id: str
    topic: str = field(compare=False)
    value: bytes = field(compare=False, repr=False)
    expire_at: datetime | None = field(compare=False, default=None)
    notification_id: str = field(compare=False, default="")
    user_id: str = field(compare=False, default="")
    tenant_id: str = field(compare=False, default="")
    notification_type: str = field(compare=False, default="")
    channel: str = field(compare=False, default="")
    traffic_class: str = field(compare=False, default="")
    generation: int = field(compare=False, default=0)  # DLQ replays of the delivery (infra.dlq)
    traceparent: str | None = field(compare=False, default=None)  # herald/tracing.py

    def expired(self, now: datetime) -> bool:
        """True when the delivery may no longer be attempted."""
        return self.expire_at is not None and now >= self.expire_at


@dataclass
class Bucket:
    """The held deliveries of one bucket key, as a heap by release instant.

    The same delivery added twice (a replayed scheduled record) is kept once.
    """

    heap: list[ScheduledEntry] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    def add(self, entry: ScheduledEntry) -> None:
        """Hold `entry` (ignored when this delivery is already held)."""
        if entry.delivery_id in self.ids:
            return
        self.ids.add(entry.delivery_id)
        heapq.heappush(self.heap, entry)

    def due(self, now: datetime) -> list[ScheduledEntry]:
        """Remove and return every entry whose release instant is at or before `now`."""
        out: list[ScheduledEntry] = []
        while self.heap and self.heap[0].release <= now:
            entry = heapq.heappop(self.heap)
            self.ids.discard(entry.delivery_id)
            out.append(entry)
        return out

    def next_release(self) -> datetime | None:
        """The earliest pending release, None when empty."""
        return self.heap[0].release if self.heap else None

    def __len__(self) -> int:
        return len(self.heap)
