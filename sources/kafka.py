"""Kafka input: partitions assigned without a consumer group, offsets kept in Bytewax snapshots.

    KafkaMessage                              raw record: coordinates, key/value bytes, timestamp
    KafkaSource(kafka, topics, ...)           Bytewax source, one partition per topic-partition
    decode_avro(step_id, up, deserializer, job)          operator -> DecodeOut(oks, errs)
    kafka_avro_input(step_id, flow, settings=..., ...)   operator: source + decode in one line

Positions: no group is joined and nothing is committed to Kafka (Tansu joins groups slowly and
Bytewax owns the position anyway). Each partition's snapshot is the next offset to read; a job
restarted with recovery resumes at the offset of its last committed epoch and re-reads what came
after it (at-least-once).

Errors: end of partition is not an error (it ends the partition only with `stop_at_end`, for
tests and bounded replays); fatal client errors and permanent ones (e.g. topic authorization)
raise `InfraError`; transient ones (broker down, leader moving) are logged and librdkafka
retries them. Undecodable records become dead letters in `decode_avro`, never exceptions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream, operator
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from herald.config import HeraldSettings, KafkaSettings
from herald.errors import InfraError, SerdeError
from herald.kafka_records import Decoded, KafkaMessage
from schemas.registry import SchemaRegistry, make_registry
from schemas.serde import AvroDeserializer
from sources.consumer import PERMANENT, SharedConsumer, worker_consumer

__all__ = [
    "DecodeOut",
    "KafkaPartition",
    "KafkaSource",
    "decode_avro",
    "kafka_avro_input",
]

log = logging.getLogger(__name__)

StartAt = Literal["earliest", "latest"]

_CONSUMER_DEFAULTS: dict[str, str | int | bool] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # Where to go when a resumed offset no longer exists (deleted by retention).
    "auto.offset.reset": "earliest",
    "queued.max.messages.kbytes": 16_384,
    "allow.auto.create.topics": False,
    # Every partition reports its end; sources that do not stop there ignore it. (One setting
    # for all sources, so that the partitions of a worker share one consumer.)
    "enable.partition.eof": True,
}


def consumer_config(kafka: KafkaSettings, step_id: str) -> dict[str, Any]:
    """The librdkafka settings of a source's consumer.

    `fetch.wait.max.ms` is `kafka.fetch_wait_ms`: how long the broker may hold an empty fetch.
    Tansu does not answer a waiting fetch as soon as data arrives (it looks again after half of
    the remaining wait): one record produced to an idle partition was consumed after 77 ms
    (p50; max 140) at 500, 12 ms (max 41) at 100, 4 ms at 10; a shorter wait costs the broker
    more looks per idle consumer. Under load, fetches return full.
    """
    return {
        **kafka.client_config(),
        **_CONSUMER_DEFAULTS,
        "fetch.wait.max.ms": kafka.fetch_wait_ms,
        # Required by librdkafka; never joined (partitions are assigned, nothing committed).
        "group.id": f"herald-{step_id}",
        "client.id": f"herald-{step_id}",
    }


class KafkaSource(FixedPartitionedSource[KafkaMessage, int | None]):
    """Read physical `topics`; every topic-partition is a Bytewax partition.

    `start_at` applies when a partition has no snapshot yet. `batch_size` bounds one
    `next_batch`. `linger_s` > 0 holds a partition's records until it has `batch_size` of them
    or its oldest has waited `linger_s`: fewer, larger batches for a sink with a cost per batch
    (the warehouse's ClickHouse inserts); records held are not read yet as far as the
    snapshot goes, so a restart reads them again. `stop_at_end` ends each partition at its end
    as seen by the consumer (tests, bounded replays; it never lingers). `consumer_config`
    overrides `consumer_config(kafka)`; partitions of sources with the same configuration on
    one worker share one consumer (sources/consumer.py).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: Sequence[str],
        *,
        start_at: StartAt = "earliest",
        batch_size: int = 1000,
        linger_s: float = 0.0,
        stop_at_end: bool = False,
        consumer_config: dict[str, str | int | bool] | None = None,
    ) -> None:
        if isinstance(topics, str) or not topics:
            raise ValueError("topics must be a non-empty sequence of topic names")
        if linger_s < 0:
            raise ValueError(f"linger_s must be >= 0, got {linger_s}")
        self.kafka = kafka
        self.topics = list(topics)
        self.start_at = start_at
        self.batch_size = batch_size
        self.linger_s = 0.0 if stop_at_end else linger_s
        self.stop_at_end = stop_at_end
        self.consumer_config = consumer_config or {}

    def list_parts(self) -> list[str]:
        """`"{partition}-{topic}"` for every partition of every topic; called on each worker."""
        admin = AdminClient(dict(self.kafka.client_config()))
        parts: list[str] = []
        for topic in self.topics:
            meta = admin.list_topics(topic, timeout=30).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                error = meta.error if meta is not None else "missing"
                raise InfraError(f"cannot list partitions of topic {topic!r}: {error}")
            parts.extend(f"{p}-{topic}" for p in sorted(meta.partitions))
        return parts

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> KafkaPartition:
        """Called once per partition per execution; `resume_state` is the next offset to read."""
        idx, topic = for_part.split("-", 1)
        if topic not in self.topics:
            raise InfraError(f"snapshot names topic {topic!r}, not one of {self.topics}")
        config = {**consumer_config(self.kafka, step_id), **self.consumer_config}
        return KafkaPartition(
            config, TopicPartition(topic, int(idx)), self._start_offset(resume_state), self
        )

    def _start_offset(self, resume_state: int | None) -> int:
        if resume_state is not None:
            return resume_state
        if self.start_at == "earliest":
            return OFFSET_BEGINNING
        return OFFSET_END  # pinned to a concrete offset by the partition (_resolve_latest)


class KafkaPartition(StatefulSourcePartition[KafkaMessage, int | None]):
    """One assigned topic-partition, read through the worker's shared consumer
    (sources/consumer.py)."""

    def __init__(
        self, config: dict[str, Any], tp: TopicPartition, start: int, source: KafkaSource
    ) -> None:
        self._name = f"{tp.topic}/{tp.partition}"
        shared = worker_consumer(config)
        if start == OFFSET_END:
            start = self._resolve_latest(shared, tp)
        self._feed = shared.attach(TopicPartition(tp.topic, tp.partition, start))
        # Next offset to read; None until known (logical start, nothing read yet).
        self._next: int | None = start if start >= 0 else None
        self._batch_size = source.batch_size
        self._linger_s = source.linger_s
        self._stop_at_end = source.stop_at_end
        self._eof = False
        # False while the caller has other work pending (a wrapping source): never block.
        self.may_block = True

    @staticmethod
    def _resolve_latest(shared: SharedConsumer, tp: TopicPartition) -> int:
        """Pin "latest" to an offset now, so a snapshot taken before any record resumes here.

        (Tansu 0.6 reports the base offset of the last batch + 1 as high watermark: the job may
        re-read the tail of that batch, which at-least-once allows.)
        """
        _low, high = shared.consumer.get_watermark_offsets(tp, timeout=30)
        return int(high)

    def next_batch(self) -> list[KafkaMessage]:
        """Called by Bytewax whenever `next_awake` has passed; blocks only while the worker
        is idle (sources/consumer.py)."""
        if self._eof:
            raise StopIteration
        if self._linger_s and not self._feed.ripe(self._batch_size, self._linger_s,
                                                  self.may_block):  # fmt: skip
            return []
        msgs = self._feed.take(self._batch_size, self.may_block)
        batch = [self._message(m) for m in msgs if m.error() is None]
        if len(batch) < len(msgs):
            self._handle_errors(msgs)
        fatal = self._feed.shared.fatal
        if fatal is not None:
            raise InfraError(f"kafka source {self._name}: {fatal}")
        if batch:
            self._next = batch[-1].offset + 1
        return batch

    def _handle_errors(self, msgs: list[Message]) -> None:
        for msg in msgs:
            err = msg.error()
            if err is None:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                self._eof = self._stop_at_end
            elif err.fatal() or err.code() in PERMANENT:
                raise InfraError(f"kafka source {self._name}: {err.name()}: {err.str()}")
            else:
                self._feed.shared.warn(err, self._name)

    @staticmethod
    def _message(msg: Message) -> KafkaMessage:
        ts_type, ts = msg.timestamp()
        return KafkaMessage(
            topic=cast(str, msg.topic()),
            partition=cast(int, msg.partition()),
            offset=cast(int, msg.offset()),
            key=cast(bytes | None, msg.key()),
            value=cast(bytes | None, msg.value()),
            timestamp_ms=ts if ts_type else None,
            headers=_headers(msg),
        )

    def next_awake(self) -> datetime | None:
        """Bytewax's default: at once after records, after its 1 ms cooldown after none (an
        idle worker then waits in the shared consumer's poll, not in Bytewax's loop).

        A lingering source's partitions, while one of them holds records: when the oldest has
        waited `linger_s`. (The empty ones too: a worker whose feeds hold records never
        blocks in the poll, so they would otherwise be called every 1 ms until then.)"""
        if not self._linger_s:
            return None
        since = self._feed.shared.lingering_since()
        if since is None:
            return None
        left = since + self._linger_s - time.monotonic()
        return datetime.now(UTC) + timedelta(seconds=max(left, 0.0))

    def snapshot(self) -> int | None:
        """The next offset to read (None: nothing read yet, start from `start_at` again)."""
        return self._next

    def close(self) -> None:
        """Called when a finite (stop_at_end) dataflow completes."""
        self._feed.close()


def _headers(msg: Message) -> tuple[tuple[str, bytes | None], ...] | None:
    headers = msg.headers()  # a list of (name, value) pairs as read, or None
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    return tuple((name, value.encode() if isinstance(value, str) else value)
                 for name, value in pairs)  # fmt: skip


@dataclass(frozen=True)
class DecodeOut:
    """Decoded records, and dead-letter dicts for records that could not be decoded."""

    oks: Stream[Decoded]
    errs: Stream[dict[str, Any]]


@dataclass(frozen=True)
class _Decoder:
    deserializer: Callable[[bytes | None], dict[str, Any]]
    job: str

    def __call__(self, msg: KafkaMessage) -> Decoded | dict[str, Any]:
        try:
            return Decoded(msg, self.deserializer(msg.value))
        except SerdeError as exc:
            log.warning(
                "decode.failed job=%s topic=%s partition=%d offset=%d reason=%s",
                self.job, msg.topic, msg.partition, msg.offset, exc.reason,
            )  # fmt: skip
            return msg.dead_letter(exc.reason, exc.detail, self.job)


@operator
def decode_avro(
    step_id: str,
    up: Stream[KafkaMessage],
    deserializer: Callable[[bytes | None], dict[str, Any]],
    job: str,
) -> DecodeOut:
    """Decode every message's value; `SerdeError`s become dead letters with the reason code.

    Registry outages (`RegistryError`) are infrastructure and propagate.
    """
    results = op.map("decode", up, _Decoder(deserializer, job))
    split = op.branch("split", results, lambda r: isinstance(r, Decoded))
    oks = cast(Stream[Decoded], split.trues)
    errs = cast(Stream[dict[str, Any]], split.falses)
    return DecodeOut(oks, errs)


@operator
def kafka_avro_input(
    step_id: str,
    flow: Dataflow,
    *,
    settings: HeraldSettings,
    topics: Sequence[str],
    reader_schema: str,
    job: str,
    registry: SchemaRegistry | None = None,
    timestamps: Literal["datetime", "millis"] = "datetime",
    skip: Callable[[KafkaMessage], bool] | None = None,
    **source_options: Any,
) -> DecodeOut:
    """Consume logical `topics` (prefix applied) and decode them to `reader_schema`.

    `timestamps="millis"` leaves timestamp fields as epoch milliseconds (AvroDeserializer).
    `skip(message)` True drops a record unread (by its headers, herald/kafka_records.py).
    `source_options` go to `KafkaSource` (start_at, batch_size, stop_at_end, ...).
    """
    registry = registry if registry is not None else make_registry(settings.registry)
    physical = [settings.kafka.topic(t) for t in topics]
    messages = op.input("read", flow, KafkaSource(settings.kafka, physical, **source_options))
    if skip is not None:
        messages = op.filter("unskipped", messages, lambda m: not skip(m))
    deserializer = AvroDeserializer(registry, reader_schema, timestamps=timestamps)
    return decode_avro("decode", messages, deserializer, job)


def partition_ends(
    consumer: Consumer, topic: str, partitions: Iterable[int], timeout: float = 30.0
) -> dict[int, int]:
    """One past the last offset of each partition of `topic` now (a partition that gave no end
    within `timeout` is missing). `consumer` must have `enable.partition.eof`; it is assigned
    to the partitions' tails.

    The high watermark is not enough: Tansu reports the base offset of the last record batch
    + 1, so the end is found by reading that last batch to its end-of-partition event.
    """
    ends: dict[int, int] = {}
    assignment = []
    for p in partitions:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=timeout, cached=False
        )
        ends[p] = high
        assignment.append(TopicPartition(topic, p, max(low, high - 1)))
    consumer.assign(assignment)
    todo = set(ends)
    deadline = time.monotonic() + timeout
    while todo and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            err, p, offset = msg.error(), msg.partition() or 0, msg.offset() or 0
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                ends[p] = max(ends[p], offset)
                todo.discard(p)
            elif err is None:
                ends[p] = max(ends[p], offset + 1)
    return {p: end for p, end in ends.items() if p not in todo}
