"""Hot status output: `StatusUpdate`s compare-and-set into Redis (herald.status_keys).

    StatusSink(redis_settings)      Bytewax sink; items are herald.status_keys.StatusUpdate
    HeaderSink(redis_settings)      Bytewax sink; items are (notification_id, header fields):
                                    `notif:{nid}` where the API wrote none (herald.status_keys)

Guarantee: at-least-once, harmless. `write_batch` returns only after Redis answered the
pipelined compare-and-set of the whole batch, so an epoch never commits with writes in flight;
a batch written again after a restart changes nothing (same state: no-op; older state: refused
by the transition table). Connection failures are retried with backoff for `retry_for` seconds,
then raise (the job stops and resumes from its last snapshot).
"""

from __future__ import annotations

import logging
import time

import redis
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from herald.config import RedisSettings
from herald.status_keys import StatusUpdate, write_headers, write_statuses

__all__ = ["HeaderSink", "StatusSink"]

log = logging.getLogger(__name__)


class StatusSink(DynamicSink[StatusUpdate]):
    """Write hot delivery status; one Redis client per worker."""

    def __init__(self, settings: RedisSettings, *, retry_for: float = 30.0) -> None:
        self.settings = settings
        self.retry_for = retry_for

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _StatusPartition:
        """Called once per worker."""
        client = redis.Redis.from_url(self.settings.url, socket_timeout=10)
        return _StatusPartition(client, self.retry_for)


class _StatusPartition(StatelessSinkPartition[StatusUpdate]):
    def __init__(self, client: redis.Redis, retry_for: float) -> None:
        self._client = client
        self._retry_for = retry_for

    def write_batch(self, items: list[StatusUpdate]) -> None:
        """One pipelined round trip per batch; retried on connection errors (idempotent)."""
        deadline = time.monotonic() + self._retry_for
        delay = 0.1
        while True:
            try:
                write_statuses(self._client, items)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("sink.redis_status_retry n=%d error=%s", len(items),
                            type(exc).__name__)  # fmt: skip
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def close(self) -> None:
        self._client.close()


class HeaderSink(DynamicSink[tuple[str, dict[str, str]]]):
    """Write the header of every notification that has none yet; one Redis client per worker."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _HeaderPartition:
        """Called once per worker."""
        return _HeaderPartition(redis.Redis.from_url(self.settings.url, socket_timeout=10))


class _HeaderPartition(StatelessSinkPartition[tuple[str, dict[str, str]]]):
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def write_batch(self, items: list[tuple[str, dict[str, str]]]) -> None:
        write_headers(self.client, items)  # at-least-once: a header is written once

    def close(self) -> None:
        self.client.close()
