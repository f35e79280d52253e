"""Kafka helpers for job tests: produce Avro records, read topics to their end or until enough."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from herald.config import HeraldSettings
from herald.kafka_records import Headers
from herald.sealing import Sealer, is_sealed
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.kafka import topic_serializer

Record = tuple[bytes | None, bytes | None]


def produce(
    settings: HeraldSettings, logical_topic: str, records: list[Record],
    headers: list[Headers | None] | None = None,
) -> None:  # fmt: skip
    """Produce raw (key, value) pairs (each with its `headers`, when given) and wait until the
    broker acknowledged all of them."""
    producer = Producer({**settings.kafka.client_config(), "acks": "all"})
    for i, (key, value) in enumerate(records):
        extra = headers[i] if headers is not None else None
        producer.produce(settings.kafka.topic(logical_topic), value, key, headers=extra)
    assert producer.flush(30) == 0


def encoder(settings: HeraldSettings, logical_topic: str) -> Callable[[Mapping[str, Any]], bytes]:
    """The Avro serializer for a topic, registered in the test's own registry."""
    return topic_serializer(settings.kafka, make_registry(settings.registry), logical_topic)


def decoder(settings: HeraldSettings) -> AvroDeserializer:
    return AvroDeserializer(make_registry(settings.registry))


def _consumer(settings: HeraldSettings, topic: str) -> tuple[Consumer, int]:
    conf = {**settings.kafka.client_config(), "group.id": "test", "enable.partition.eof": True}
    consumer = Consumer(conf)
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return consumer, len(partitions)


def consume(
    settings: HeraldSettings,
    logical_topic: str,
    *,
    at_least: int | None = None,
    timeout: float = 20.0,
) -> list[Record]:
    """Records of a topic: all up to its current end, or (with `at_least`) wait until that many.

    With `at_least`, returns as soon as that many records were read, or after `timeout`.
    """
    topic = settings.kafka.topic(logical_topic)
    consumer, n_parts = _consumer(settings, topic)
    out: list[Record] = []
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is None:
                    out.append((msg.key(), msg.value()))
                elif err.code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition() or 0)
            if at_least is None and len(ended) == n_parts:
                break
            if at_least is not None and len(out) >= at_least:
                break
    finally:
        consumer.close()
    return out


def opened(settings: HeraldSettings, value: bytes) -> bytes:
    """A dead letter's value as the replay tools read it: sealed (herald/sealing.py), opened
    with its hour's key from Redis."""
    assert is_sealed(value), f"a dead letter's value is kept sealed: {value[:16]!r}"
    plain = Sealer(settings.redis.client()).open(value)
    assert plain is not None, "the value's key is already gone"
    return plain
