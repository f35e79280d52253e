"""users: the compacted user changelogs -> the Redis copies every stage reads.

    herald.preferences, herald.devices --changelog_in--> to_copies
        -> copies_out: `prefs:{user}` / `cp:{user}` (JSON, timestamps as epoch ms; herald/keys.py),
           written only over an older version; a tombstone deletes the copy
        -> users:{<prefix>}:pos (next offset per changelog partition), :ready, :restored
    records that cannot be decoded or validated (bad time zone, quiet hours, locale)
        -> herald.dead-letters with their reason; the copy keeps what it held

Run: `python -m bytewax.run "dataflows.users:build_flow()"` (settings from HERALD_* env).

Why: the API writes a user's copy after Kafka acknowledged the change, and the plan job, dispatch
(the opt-out re-check, address lookups, token cleanup) and the API's own read-modify-writes of
contact points read those copies. Two things broke that: users published straight to the
changelog (a bulk import) had no copy, and a Redis that lost its data (flushed, or restarted
empty after a failover) left every user without one, so the next device registration started
from an empty record and the user lost the devices registered before. The compacted changelogs
are the durable form of this state; this job keeps the copies equal to them.

Positions: the copies are the job's state. The next offset of every changelog partition is
kept in Redis beside them (`users:{<prefix>}:pos`, written after the batch's copies), so a
restart resumes where the copies are; with Redis emptied the positions are gone with the copies
and the job reads every partition from the beginning (dataflows/_changelog.py notices a loss
within a second even while idle, and reads again). `users:{<prefix>}:restored` exists only
while the copies hold every user up to the end each partition had when it was read; the API
waits for it before a contact-points change of a user without a copy (api/routes/devices.py),
instead of starting that user from an empty record.

Guarantee: at-least-once and harmless, like every copy write: a record written again changes
nothing (`COPY_IF_NEWER` keeps the newer version). Versions come from herald.versions, so a copy
rebuilt from an old record is never newer than a change made after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeGuard

import bytewax.operators as op
import orjson
import redis
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from dataflows._changelog import CaughtUp, ChangelogSource
from dataflows._redis import redis_client
from dataflows._settings import entry_settings
from dataflows._user_copies import RedisHeld
from herald import keys
from herald.config import HeraldSettings
from herald.errors import InvalidLocale, InvalidTimeOfDay, InvalidTimezone, SerdeError
from herald.kafka_records import KafkaMessage
from herald.policy import ContactPoints, Preferences
from herald.topics import DEVICES, PREFERENCES
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.kafka import KafkaProducerSink, kafka_output, to_dead_letter_topic
from sources.kafka import partition_ends

__all__ = ["ChangelogDecoder", "CopyWrite", "build_flow", "wait_copied"]

log = logging.getLogger(__name__)

JOB = "users"
PREFERENCES_TOPIC = PREFERENCES
DEVICES_TOPIC = DEVICES

# KEYS: ready hash, restored marker; ARGV: part, number of parts, restored value
_READY = """
redis.call('HSET', KEYS[1], ARGV[1], '1')
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[3])
  return 1
end
return 0
"""


class CopyWrite(NamedTuple):
    """One changelog record as a copy write: `value` None deletes the copy (tombstone)."""

    part: str
    offset: int
    key: str
    value: bytes | None
    version: int


class Skipped(NamedTuple):
    """A record that was dead-lettered: only its position moves."""

    part: str
    offset: int


@dataclass(frozen=True)
class ChangelogDecoder:
    """Decode and validate a preferences or contact-points record (the checks the API makes:
    time zone, quiet hours, locale), or give its dead letter: a copy is only written from a
    record the plan job can plan with."""

    deserializer: Callable[[bytes | None], dict[str, Any]]
    preferences_topic: str

    def record(
        self, item: KafkaMessage
    ) -> tuple[dict[str, Any], Preferences | ContactPoints] | dict[str, Any]:
        """A record with a value: (decoded record, validated state), or its dead letter."""
        try:
            rec = self.deserializer(item.value)
        except SerdeError as exc:
            return item.dead_letter(exc.reason, exc.detail, JOB)
        try:
            value: Preferences | ContactPoints = (
                Preferences.from_record(rec)
                if item.topic == self.preferences_topic
                else ContactPoints.from_record(rec)
            )
        except (InvalidTimezone, InvalidTimeOfDay, InvalidLocale) as exc:
            log.warning("users.bad_record topic=%s offset=%d reason=%s",
                        item.topic, item.offset, exc.code)  # fmt: skip
            return item.dead_letter(exc.code, str(exc), JOB)
        return rec, value


@dataclass(frozen=True)
class ToCopies:
    """Changelog items -> `CopyWrite`s and `CaughtUp`s in order, and dead letters (a
    `flat_map_batch` mapper)."""

    decoder: ChangelogDecoder

    def __call__(self, batch: list[KafkaMessage | CaughtUp]) -> list[Any]:
        out: list[Any] = []
        for item in batch:
            if isinstance(item, CaughtUp):
                out.append(item)
                continue
            result = self._one(item)
            out.append(result)
            if isinstance(result, dict):  # a dead letter: the record is read all the same
                out.append(Skipped(f"{item.partition}-{item.topic}", item.offset))
        return out

    def _one(self, item: KafkaMessage) -> CopyWrite | dict[str, Any]:
        prefs = item.topic == self.decoder.preferences_topic
        part = f"{item.partition}-{item.topic}"
        if item.value is None:
            if not item.key:
                return item.dead_letter("tombstone_without_key", "null value and no key", JOB)
            user = item.key.decode(errors="replace")
            key = keys.prefs(user) if prefs else keys.contact_points(user)
            return CopyWrite(part, item.offset, key, None, 0)
        parsed = self.decoder.record(item)
        if isinstance(parsed, dict):
            return parsed
        rec, state = parsed
        user = state.user_id
        key = keys.prefs(user) if prefs else keys.contact_points(user)
        return CopyWrite(part, item.offset, key, orjson.dumps(_as_ms(rec)), state.version)


def _as_ms(value: Any) -> Any:
    """The record with its timestamps as epoch ms (the copies' convention, herald/keys.py)."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, dict):
        return {k: _as_ms(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_ms(v) for v in value]
    return value


Item = CopyWrite | Skipped | CaughtUp


class CopySink(DynamicSink[Item]):
    """Write copies, then positions, then readiness; one Redis client per worker."""

    def __init__(self, held: RedisHeld, parts: int, *, retry_for: float = 30.0) -> None:
        self.held = held
        self.parts = parts
        self.retry_for = retry_for

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CopyPartition:
        """Called once per worker."""
        return _CopyPartition(self.held, self.parts, self.retry_for)


class _CopyPartition(StatelessSinkPartition[Item]):
    def __init__(self, held: RedisHeld, parts: int, retry_for: float) -> None:
        self._client = client = redis_client(held.settings)
        self._held = held
        self._parts = parts
        self._retry_for = retry_for
        self._copy = client.register_script(keys.COPY_IF_NEWER)
        self._ready = client.register_script(_READY)

    def write_batch(self, items: list[Item]) -> None:
        """Copies (one pipelined round trip), then the batch's positions, then the partitions
        that reached their end: a position is never ahead of the copies it stands for."""
        deadline = time.monotonic() + self._retry_for
        delay = 0.1
        while True:
            try:
                self._write(items)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("users.redis_retry n=%d error=%s", len(items), type(exc).__name__)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _write(self, items: list[Item]) -> None:
        positions: dict[str, int] = {}
        pipe = self._client.pipeline(transaction=False)
        for item in items:
            if type(item) is CopyWrite:
                if item.value is None:
                    pipe.delete(item.key)
                else:
                    self._copy(keys=[item.key], args=[item.value, item.version], client=pipe)
                positions[item.part] = item.offset + 1
            elif type(item) is Skipped:
                positions[item.part] = item.offset + 1
        if positions:
            pipe.execute()
            self._client.hset(self._held.positions, mapping=positions)  # type: ignore[arg-type]
        for item in items:
            if type(item) is CaughtUp:
                restored = self._ready(
                    keys=[self._held.ready, self._held.restored],
                    args=[item.part, self._parts, int(time.time() * 1000)],
                )
                log.info("users.caught_up part=%s restored=%s", item.part, bool(restored))

    def close(self) -> None:
        self._client.close()


def _is_write(item: Any) -> TypeGuard[Item]:
    return not isinstance(item, dict)


def build_flow(settings: HeraldSettings | None = None, *, bounded: bool = False) -> Dataflow:
    """The users job. Without `settings` (entry point) it reads the environment, configures
    logging and serves /metrics. `bounded=True` stops at the current end of the changelogs."""
    settings = entry_settings(settings)
    kafka = settings.kafka
    registry = make_registry(settings.registry)
    flow = Dataflow(JOB)
    topics = [kafka.topic(PREFERENCES_TOPIC), kafka.topic(DEVICES_TOPIC)]
    held = RedisHeld(settings.redis, kafka.topic_prefix)
    source = ChangelogSource(kafka, topics, bounded=bounded, held=held)
    parts = len(source.list_parts())
    changes = op.input("changelog_in", flow, source)
    # KafkaMessage | CaughtUp
    copies = op.flat_map_batch(
        "to_copies",
        changes,
        ToCopies(ChangelogDecoder(AvroDeserializer(registry), kafka.topic(PREFERENCES_TOPIC))),
    )
    # CopyWrite | Skipped | CaughtUp | dead_letter dict
    split = op.branch("split", copies, _is_write)
    op.output("copies_out", split.trues, CopySink(held, parts))
    letters = to_dead_letter_topic(
        "dead_letters_out", split.falses, settings=settings, registry=registry
    )
    kafka_output("kafka_out", letters, KafkaProducerSink(kafka))
    return flow


def wait_copied(settings: HeraldSettings, timeout: float, poll_s: float = 0.2) -> float:
    """Wait until the users job holds both changelogs up to their current end (its positions,
    `RedisHeld`), so every user published so far has its Redis copy and the plan jobs plan them
    with their state; seconds waited. For bulk imports straight onto the changelog (the API's
    writes have their copy before it answers). Raises TimeoutError."""
    from confluent_kafka import Consumer

    kafka = settings.kafka
    held = RedisHeld(settings.redis, kafka.topic_prefix)
    config = {**kafka.client_config(), "group.id": "herald-wait-copied"}
    consumer = Consumer({**config, "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    started = time.monotonic()
    try:
        ends: dict[str, int] = {}
        for topic in (kafka.topic(PREFERENCES_TOPIC), kafka.topic(DEVICES_TOPIC)):
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            found = partition_ends(consumer, topic, sorted(partitions))
            if len(found) < len(partitions):
                raise TimeoutError(f"no end of every partition of {topic}")
            ends.update({f"{p}-{topic}": end for p, end in found.items()})
        while True:
            if held.holds() and all((held.position(part) or 0) >= end
                                    for part, end in ends.items() if end > 0):  # fmt: skip
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"the users job did not copy the changelogs in {timeout} s")
            time.sleep(poll_s)
    finally:
        consumer.close()
