"""Kafka output: an idempotent producer sink that never loses a record silently.

    KafkaRecord(topic, key, value)          what flows into the sink
    RecordBatch(key, records)               many records as one dataflow item (batch_records)
    KafkaProducerSink(kafka, parts=1)       Bytewax sink; items are (routing_key, record or batch)
    kafka_output(step_id, up, sink)         operator: key by record (or batch) key, then produce
    encode_avro(step_id, up, ...)           operator: dict -> KafkaRecord | dead-letter dict
    to_dead_letter_topic(step_id, up, ...)  operator: dead-letter dict -> KafkaRecord, its value
                                            sealed until its message expires (herald/sealing.py)

Guarantee (see sinks/base.py for the Bytewax ordering it relies on): at-least-once. Records are
handed to librdkafka (acks=all, idempotence on) without waiting; every epoch boundary
(`snapshot()`) and `close()` block until all of them are acknowledged. A record the broker
refused or that timed out (`message.timeout.ms`) makes the sink raise `DeliveryError` from the
next `write_batch`, `snapshot` or `close`: the worker fails, the epoch is not committed, and a
restart with recovery re-reads and re-produces it. Duplicates after a restart are expected;
consumers deduplicate by the record's id. Without recovery configured, a failure still stops
the job loudly; nothing is acknowledged that was not written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple, cast

import bytewax.operators as op
import orjson
from bytewax.dataflow import Stream, operator
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from herald.config import HeraldSettings, KafkaSettings
from herald.dead_letters import DETAIL_MAX, dead_letter
from herald.errors import DeliveryError, SealUnavailable, SerdeError
from herald.kafka_records import Headers
from herald.sealing import Sealer, is_sealed
from herald.topics import DEAD_LETTERS, load_topics, physical_subject
from schemas.registry import SchemaRegistry
from schemas.serde import AvroSerializer
from sinks.base import DeliveryTracker, EpochFlushPartition, EpochFlushSink, retry_while_full

__all__ = [
    "DEAD_LETTER_TOPIC",
    "DeadLetterSealer",
    "EncodeOut",
    "KafkaProducerSink",
    "KafkaRecord",
    "RecordBatch",
    "SinkItem",
    "batch_records",
    "encode_avro",
    "kafka_output",
    "to_dead_letter_topic",
    "topic_serializer",
]

log = logging.getLogger(__name__)

DEAD_LETTER_TOPIC = DEAD_LETTERS
# Below the broker's default message.max.bytes (1 MiB) with room for headers and framing.
MAX_RECORD_BYTES = 1_000_000

DEFAULT_PRODUCER_CONFIG: dict[str, str | int | bool] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "batch.num.messages": 10_000,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 200_000,
    "queue.buffering.max.kbytes": 262_144,
    "message.timeout.ms": 120_000,
    "allow.auto.create.topics": False,
    # Delivery reports only for records that failed: a success costs no Python callback (about
    # 1 µs a record), and `len(producer)` already counts what is not acknowledged yet.
    "delivery.report.only.error": True,
}


class KafkaRecord(NamedTuple):
    """One record to produce. `topic` is the physical name (prefix applied). A NamedTuple: the
    plan job makes two per delivery, and a frozen dataclass costs 3x as much to build."""

    topic: str
    key: str | None
    value: bytes | None
    headers: Headers | None = None  # herald/kafka_records.py names Herald's


class RecordBatch(NamedTuple):
    """Records that travel through the dataflow as one item and are produced in their order.

    A step that makes thousands of records at once (the plan job: about two per delivery) pays
    Bytewax's per-item cost once per batch instead of once per record: the routing to a sink
    partition takes the GIL and calls Python for every item (Bytewax 0.21's `PartitionAssigner`),
    and each item crosses the Python/Rust boundary once per step; between processes each item
    is a pickled message. Measured in the plan job (`bench/plan.py`): with a no-op planner the
    job ran 1.6-2.4x faster with batches, the real job ~1.2x, and with 2 processes 2.5x.

    `key` routes the batch (as a record's key does); records with the same key keep their order
    only within one batch, so batch records whose order matters only among themselves.
    """

    key: str
    records: list[KafkaRecord]


SinkItem = KafkaRecord | RecordBatch


def batch_records(items: list[Any]) -> list[Any]:
    """The `KafkaRecord`s of `items` as one `RecordBatch` (routed by its first record's key),
    then the other items (dead letters...) unchanged. A `flat_map_batch` mapper."""
    records = [item for item in items if type(item) is KafkaRecord]
    if not records:
        return items
    out: list[Any] = [RecordBatch(_routing_key(records[0]), records)]
    if len(records) < len(items):
        out.extend(item for item in items if type(item) is not KafkaRecord)
    return out


class KafkaProducerSink(EpochFlushSink[SinkItem]):
    """Produce `KafkaRecord`s and `RecordBatch`es; items are `(routing_key, record or batch)`
    (see `kafka_output`).

    Each of the `parts` partitions owns one `confluent_kafka.Producer` (acks=all, idempotent).
    `producer_config` overrides `DEFAULT_PRODUCER_CONFIG`. `flush_timeout` bounds how long an
    epoch boundary may wait for acknowledgements (default: message.timeout.ms + 10 s, after which
    librdkafka has reported every record either way); `max_block` bounds backpressure waits.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        parts: int = 1,
        producer_config: Mapping[str, str | int | bool] | None = None,
        flush_timeout: float | None = None,
        max_block: float = 60.0,
        warm: bool = False,
    ) -> None:
        super().__init__(parts)
        self.config: dict[str, str | int | bool] = {
            **kafka.client_config(),
            **DEFAULT_PRODUCER_CONFIG,
            **(producer_config or {}),
        }
        timeout_ms = int(self.config["message.timeout.ms"])
        self.flush_timeout = flush_timeout if flush_timeout else timeout_ms / 1000 + 10
        self.max_block = max_block
        # Producers made now for the partitions Bytewax builds on their first record: an
        # idempotent producer's first record waits for its producer id (~0.5 s on the embedded
        # broker), which a job on the OTP path would otherwise add to its first OTP after
        # every start. One per partition; those this process does not host stay unused.
        self._warm = (
            {part: _WarmProducer(self.config) for part in self.list_parts()} if warm else {}
        )

    def build_writer(self, step_id: str, part: str) -> _ProducerPartition:
        """Called by Bytewax once per partition on its primary worker."""
        warm = self._warm.pop(part, None)
        config = {**self.config, "client.id": f"herald-{step_id}-{part}"}
        return _ProducerPartition(
            f"{step_id}/{part}", config, self.flush_timeout, self.max_block, warm
        )


class _WarmProducer:
    """A producer made before its partition, whose callbacks reach the partition once built."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.partition: _ProducerPartition | None = None
        self.producer = Producer(
            {**config, "error_cb": self._on_error, "on_delivery": self._on_delivery}
        )

    def _on_error(self, err: KafkaError) -> None:
        if self.partition is not None:
            self.partition._on_error(err)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if self.partition is not None:
            self.partition._on_delivery(err, msg)


class _ProducerPartition(EpochFlushPartition[SinkItem]):
    """Owns one Producer; see the module docstring for the guarantee."""

    def __init__(
        self,
        name: str,
        config: dict[str, Any],
        flush_timeout: float,
        max_block: float,
        warm: _WarmProducer | None = None,
    ) -> None:
        self._name = name
        self._tracker = DeliveryTracker(name)
        if warm is not None:
            warm.partition = self
            self._producer = warm.producer
        else:
            self._producer = Producer(
                {**config, "error_cb": self._on_error, "on_delivery": self._on_delivery}
            )
        self._flush_timeout = flush_timeout
        self._max_block = max_block
        self._last_warning = 0.0

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("kafka_sink.fatal sink=%s code=%s", self._name, err.name())
            self._tracker.fail(f"fatal producer error {err.name()}: {err.str()}")
        elif time.monotonic() - self._last_warning > 10:  # librdkafka retries these itself
            self._last_warning = time.monotonic()
            log.warning("kafka_sink.client_error sink=%s code=%s", self._name, err.name())

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        """Called for failed records only (`delivery.report.only.error`)."""
        if err is not None:
            self._tracker.fail(f"topic={msg.topic()} {err.name()}")

    def _produce(self, record: KafkaRecord) -> None:
        self._producer.produce(record.topic, record.value, record.key, headers=record.headers)

    def submit(self, items: Sequence[SinkItem]) -> None:
        """Hand every record to librdkafka; waits (bounded) only while its queue is full."""
        self._tracker.raise_if_failed()
        produce = self._producer.produce
        record = None
        try:
            for record in _records(items):
                try:
                    produce(record.topic, record.value, record.key, headers=record.headers)
                except BufferError:  # queue full: serve callbacks until there is room
                    retry_while_full(
                        partial(self._produce, record),
                        self._producer.poll,
                        max_block=self._max_block,
                        what=f"kafka sink {self._name}",
                    )
        except KafkaException as exc:  # refused locally: too large, unknown partition...
            err = exc.args[0] if exc.args else exc
            code = err.name() if isinstance(err, KafkaError) else str(err)
            topic = record.topic if record is not None else "?"
            raise DeliveryError(f"{self._name}: topic={topic} {code}") from exc
        self._producer.poll(0)

    def flush(self) -> None:
        """Block until librdkafka has acknowledged or failed every record; raise on failures.

        `flush` returns the records (and delivery reports) still queued: 0 means every failure
        has been reported to `_on_delivery`.
        """
        deadline = time.monotonic() + self._flush_timeout
        while (left := self._producer.flush(1.0)) > 0:
            if time.monotonic() > deadline:
                raise DeliveryError(
                    f"{self._name}: {left} record(s) unacknowledged "
                    f"after {self._flush_timeout:.0f}s"
                )
        self._tracker.raise_if_failed()

    def release(self) -> None:
        """Close the producer; after a failure, drop what is queued (re-produced on resume)."""
        if self._failed:
            self._producer.purge()
        self._producer.close()


def _records(items: Sequence[SinkItem]) -> Sequence[KafkaRecord]:
    """The records of `items` in order, batches unpacked."""
    if not any(type(item) is RecordBatch for item in items):
        return cast(Sequence[KafkaRecord], items)
    out: list[KafkaRecord] = []
    for item in items:
        if type(item) is RecordBatch:
            out.extend(item.records)
        else:
            out.append(cast(KafkaRecord, item))
    return out


def _routing_key(item: SinkItem) -> str:
    return item.key if item.key is not None else cast(KafkaRecord, item).topic


@operator
def kafka_output(step_id: str, up: Stream[SinkItem], sink: KafkaProducerSink) -> None:
    """Produce every record of `up` (batches unpacked in order); records with the same key go
    through the same producer."""
    keyed = op.key_on("route", up, _routing_key)
    op.output("produce", keyed, sink)


def topic_serializer(
    kafka: KafkaSettings, registry: SchemaRegistry, logical_topic: str
) -> AvroSerializer:
    """The serializer for a topic of herald/topics.toml (its schema, its prefixed subject)."""
    spec = load_topics()[logical_topic]
    return AvroSerializer(registry, physical_subject(spec, kafka), spec.schema)


@dataclass(frozen=True)
class EncodeOut:
    """Records ready to produce, and dead letters for values that could not be encoded."""

    oks: Stream[KafkaRecord]
    errs: Stream[dict[str, Any]]


@dataclass(frozen=True)
class _Encoder:
    serializer: Callable[[Mapping[str, Any]], bytes]
    topic: str
    key: Callable[[Mapping[str, Any]], str | None]
    job: str
    max_record_bytes: int

    def __call__(self, value: Mapping[str, Any]) -> KafkaRecord | dict[str, Any]:
        key = self.key(value)
        try:
            data = self.serializer(value)
        except SerdeError as exc:
            log.warning("encode.failed job=%s topic=%s reason=%s", self.job, self.topic, exc.reason)
            body = orjson.dumps(value, default=str)
            return dead_letter(
                source_topic=self.topic, reason="encode_failed", job=self.job, key=key,
                value=body, detail=f"{exc.reason}: {exc.detail}",
            )  # fmt: skip
        if len(data) > self.max_record_bytes:
            log.warning(
                "encode.too_large job=%s topic=%s bytes=%d", self.job, self.topic, len(data)
            )
            return dead_letter(
                source_topic=self.topic, reason="record_too_large", job=self.job, key=key,
                detail=f"{len(data)} bytes > {self.max_record_bytes}",
            )  # fmt: skip
        return KafkaRecord(self.topic, key, data)


@operator
def encode_avro(
    step_id: str,
    up: Stream[Mapping[str, Any]],
    *,
    serializer: Callable[[Mapping[str, Any]], bytes],
    topic: str,
    key: Callable[[Mapping[str, Any]], str | None],
    job: str,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> EncodeOut:
    """Encode dicts for physical `topic`; values that don't fit become dead letters.

    A schema violation yields reason `encode_failed` with the record as JSON in `value` (for
    inspection; not replayable as is); an oversized record yields `record_too_large`.
    """
    encoder = _Encoder(serializer, topic, key, job, max_record_bytes)
    results = op.map("encode", up, encoder)
    split = op.branch("split", results, lambda r: isinstance(r, KafkaRecord))
    oks = cast(Stream[KafkaRecord], split.trues)
    errs = cast(Stream[dict[str, Any]], split.falses)
    return EncodeOut(oks, errs)


class DeadLetterSealer:
    """Seals each dead letter's value (herald/sealing.py) until its message expires, or for
    the replay window when it has no expiry; a value that cannot be sealed is not kept. Redis
    (the keys' home) is connected on the first letter: a job that writes none opens nothing."""

    def __init__(self, settings: HeraldSettings, sealer: Sealer | None = None) -> None:
        self.redis_settings, self._sealer = settings.redis, sealer
        self.replay = timedelta(days=settings.pii.dead_letter_replay_days)

    def __call__(self, letter: dict[str, Any]) -> dict[str, Any]:
        value = letter.get("value")
        if value is None or is_sealed(value):
            return letter
        shred_at = letter.get("expire_at") or letter["failed_at"] + self.replay
        try:
            sealed = self.sealer.seal(value, shred_at)
        except SealUnavailable as exc:
            log.error("dead_letter.unsealed job=%s reason=%s: %s", letter["job"],
                      letter["reason"], exc)  # fmt: skip
            sealed, why = None, "could not be sealed"
        else:
            why = "its message had expired"
        if sealed is None:
            detail = f"{letter['detail']} (value not kept: {why})"
            return {**letter, "value": None, "detail": detail[:DETAIL_MAX]}
        return {**letter, "value": sealed}

    @property
    def sealer(self) -> Sealer:
        if self._sealer is None:
            self._sealer = Sealer(self.redis_settings.client(socket_timeout=5))
        return self._sealer


def _dead_letter_record(
    serializer: AvroSerializer, topic: str, seal: DeadLetterSealer, letter: dict[str, Any]
) -> KafkaRecord:
    letter = seal(letter)
    log.warning(
        "dead_letter.emitted job=%s reason=%s source_topic=%s partition=%s offset=%s",
        letter["job"], letter["reason"], letter["source_topic"], letter["partition"],
        letter["offset"],
    )  # fmt: skip
    data = serializer(letter)  # a dead letter that cannot be encoded is a bug: raise
    if len(data) > MAX_RECORD_BYTES and letter.get("value") is not None:
        size = len(letter["value"])
        detail = f"{letter['detail']} (value dropped: {size} B)"
        letter = {**letter, "value": None, "detail": detail}
        data = serializer(letter)
    return KafkaRecord(topic, letter["source_topic"], data)


@operator
def to_dead_letter_topic(
    step_id: str,
    up: Stream[dict[str, Any]],
    *,
    settings: HeraldSettings,
    registry: SchemaRegistry,
) -> Stream[KafkaRecord]:
    """Encode dead-letter dicts for herald.dead-letters (key = source topic), each value sealed
    until its message expires (`DeadLetterSealer`)."""
    serializer = topic_serializer(settings.kafka, registry, DEAD_LETTER_TOPIC)
    topic = settings.kafka.topic(DEAD_LETTER_TOPIC)
    seal = DeadLetterSealer(settings)
    return op.map("encode", up, partial(_dead_letter_record, serializer, topic, seal))
