"""Consent reported by receipts: an unsubscribe or a spam report opts the user out of marketing.

    ConsentSink(settings)                   Bytewax sink; items are herald.delivery_fold.OptOut
    PreferenceStore(client, topic_prefix)   .opt_out(user, entry, publish, now)

An email `unsubscribe`, `group_unsubscribe` or `spamreport` webhook (herald.receipts.opts_out)
says that the person does not want this kind of mail, not that the address is dead: their
password resets must still arrive. So it is a preference change, `marketing:<channel>` added to
`category_channel_opt_out`, made the way the API's PUT makes one: under `prefs:{user}:lock`, with
the next version of the hybrid clock (herald.versions, herald/keys.py `NEXT_VERSION`), the record
on herald.preferences (acked by Kafka), then the Redis copy (`COPY_IF_NEWER`). It shows in
GET /v1/users/{id}/preferences and in the compacted changelog, and plan and dispatch's
re-check honour it from then on.

A user without a copy has default preferences only once the copies hold every user
(`users:{<prefix>}:restored`); while they are being restored after a Redis loss the sink waits,
so the change starts from the user's real preferences and never erases them with defaults.

At-least-once: an opt-out written again after a restart finds its entry there and changes
nothing ("already"). A Redis or Kafka failure raises: the job stops and resumes from its
snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
import redis
from bytewax.outputs import DynamicSink

from herald import keys
from herald.config import HeraldSettings
from herald.delivery_fold import OptOut
from herald.topics import PREFERENCES
from herald.user_records import empty_preferences, with_opt_out
from schemas.registry import make_registry
from sinks.kafka import KafkaRecord, topic_serializer
from sinks.user_changes import UserChangePartition

__all__ = ["ConsentSink", "PreferenceStore"]

log = logging.getLogger(__name__)

PREFERENCES_TOPIC = PREFERENCES
OptOutResult = Literal["added", "already"]
Publish = Callable[[str, dict[str, Any]], None]


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


class PreferenceStore:
    """Read-modify-writes of a user's preferences outside the API (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        topic_prefix: str,
        *,
        lock_timeout_s: float = 30.0,
        restore_wait_s: float = 300.0,
    ) -> None:
        self.client = client
        self.restored = keys.users_restored(topic_prefix)
        self.lock_timeout_s = lock_timeout_s
        self.restore_wait_s = restore_wait_s
        self._next_version = client.register_script(keys.NEXT_VERSION)
        self._copy = client.register_script(keys.COPY_IF_NEWER)

    def opt_out(self, user_id: str, entry: str, publish: Publish, now: datetime) -> OptOutResult:
        """Add `entry` ("marketing:email") to the user's `category_channel_opt_out`."""
        lock = self.client.lock(
            keys.prefs_lock(user_id), timeout=self.lock_timeout_s,
            blocking_timeout=self.lock_timeout_s,
        )  # fmt: skip
        with lock:  # a LockError (Redis in trouble for longer than a lock lives) stops the job
            current = self._current(user_id, now)
            if entry in (current.get("category_channel_opt_out") or ()):
                return "already"
            held = self._next_version(
                keys=[keys.prefs_version(user_id)], args=[time.time_ns() // 1000]
            )
            version = int(held)
            record = with_opt_out(current, entry, version, _ms(now))
            assert record is not None  # the entry is not there (checked under the lock)
            publish(user_id, record)
            self._copy(keys=[keys.prefs(user_id)], args=[orjson.dumps(record), version])
            return "added"

    def _current(self, user_id: str, now: datetime) -> dict[str, Any]:
        """The user's preferences record: the copy, else the defaults once the copies hold
        every user."""
        since = time.monotonic()
        logged = 0.0
        while True:
            raw = self.client.get(keys.prefs(user_id))
            if raw is not None:
                record: dict[str, Any] = orjson.loads(raw)
                return record
            if self.client.exists(self.restored):
                return empty_preferences(user_id, _ms(now))
            waited = time.monotonic() - since
            if waited >= self.restore_wait_s:
                raise TimeoutError(f"the users' copies were not restored in {self.restore_wait_s}s")
            if waited >= logged:  # every 10 s, not every poll
                log.warning("consent.waiting_for_user_state waited_s=%.1f (being restored)", waited)
                logged += 10.0
            time.sleep(0.5)


class ConsentSink(DynamicSink[OptOut]):
    """Record opt-outs; one Redis client and one producer per worker."""

    def __init__(self, settings: HeraldSettings) -> None:
        self.settings = settings

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ConsentPartition:
        """Called once per worker."""
        return _ConsentPartition(self.settings, f"{step_id}/w{worker_index}")


class _ConsentPartition(UserChangePartition[OptOut]):
    def __init__(self, settings: HeraldSettings, name: str) -> None:
        super().__init__(settings, "consent", name)
        kafka = settings.kafka
        self.store = PreferenceStore(self.redis, kafka.topic_prefix)
        self.topic = kafka.topic(PREFERENCES_TOPIC)
        registry = make_registry(settings.registry)
        self.serialize = topic_serializer(kafka, registry, PREFERENCES_TOPIC)

    def write_batch(self, items: list[OptOut]) -> None:
        """Record each opt-out; returns after Kafka acked the changes."""
        now = datetime.now(UTC)
        for item in items:
            result = self.store.opt_out(item.user_id, item.entry, self._publish, now)
            log.info("receipts.opt_out entry=%s reason=%s result=%s",
                     item.entry, item.reason, result)  # fmt: skip

    def _publish(self, user_id: str, record: dict[str, Any]) -> None:
        """Produce the new preferences and wait for the ack (before the Redis copy)."""
        self.producer.submit([KafkaRecord(self.topic, user_id, self.serialize(record))])
        self.producer.flush()
