"""KafkaSource and decode_avro against the real embedded broker (Tansu), run with run_main."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, run_main
from confluent_kafka import Producer

from herald.config import HeraldSettings
from herald.kafka_records import Decoded, KafkaMessage
from schemas.registry import make_registry
from sinks.kafka import topic_serializer
from sources.kafka import KafkaSource, kafka_avro_input
from tests.schemas.examples import example

pytestmark = pytest.mark.integration

TOPIC = "herald.requests.normal"


def produce(settings: HeraldSettings, records: Sequence[tuple[str | None, bytes | None]]) -> None:
    """Produce (key, value) pairs to TOPIC, acknowledged before returning."""
    producer = Producer({**settings.kafka.client_config(), "acks": "all"})
    for key, value in records:
        producer.produce(settings.kafka.topic(TOPIC), value, key)
    assert producer.flush(30) == 0


def read_all(
    settings: HeraldSettings, recovery: RecoveryConfig | None = None, **options: Any
) -> list[KafkaMessage]:
    """Run a flow that reads TOPIC to its end and return what it saw."""
    out: list[KafkaMessage] = []
    flow = Dataflow("source_test")
    source = KafkaSource(settings.kafka, [settings.kafka.topic(TOPIC)], stop_at_end=True, **options)
    messages = op.input("read", flow, source)
    op.output("out", messages, TestingSink(out))
    run_main(flow, epoch_interval=timedelta(milliseconds=200), recovery_config=recovery)
    return out


def test_reads_every_record_with_coordinates(settings: HeraldSettings) -> None:
    records = [(f"k{i}", f"v{i}".encode()) for i in range(50)] + [(None, None)]
    produce(settings, records)

    seen = read_all(settings, batch_size=7)

    expected = [(k.encode() if k else None, v) for k, v in records]
    assert sorted(((m.key, m.value) for m in seen), key=repr) == sorted(expected, key=repr)
    by_partition: dict[int, list[int]] = {}
    for m in seen:
        assert m.topic == settings.kafka.topic(TOPIC)
        assert m.timestamp is not None and m.timestamp.tzinfo is not None
        by_partition.setdefault(m.partition, []).append(m.offset)
    assert len(by_partition) > 1  # keys spread over the topic's 4 partitions
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))  # in order, none skipped


def test_empty_topic_ends(settings: HeraldSettings) -> None:
    assert read_all(settings) == []


def test_restart_resumes_after_last_snapshot(settings: HeraldSettings, tmp_path: Path) -> None:
    init_db_dir(tmp_path, 1)
    recovery = RecoveryConfig(tmp_path)
    produce(settings, [(f"a{i}", b"first") for i in range(20)])
    first = read_all(settings, recovery)

    produce(settings, [(f"b{i}", b"second") for i in range(10)])
    second = read_all(settings, recovery)

    assert len(first) == 20
    assert sorted(m.key or b"" for m in second) == sorted(f"b{i}".encode() for i in range(10))


def test_start_at_latest_skips_existing_records(settings: HeraldSettings) -> None:
    produce(settings, [("old", b"old")])
    assert read_all(settings, start_at="latest") == []


def test_decode_dead_letters_bad_records_and_keeps_good_ones(settings: HeraldSettings) -> None:
    registry = make_registry(settings.registry)
    encode = topic_serializer(settings.kafka, registry, TOPIC)
    good = encode(example("notification_request"))
    produce(
        settings,
        [("p", good), ("p", b"garbage"), ("p", b"\x00\x00\x00\x03\xe7\x01"), ("p", good)]
        + [("p", b""), ("p", good[:-3]), ("p", good)],
    )

    oks: list[Decoded] = []
    errs: list[dict[str, Any]] = []
    flow = Dataflow("decode_test")
    decoded = kafka_avro_input(
        "requests_in", flow, settings=settings, topics=[TOPIC], registry=registry,
        reader_schema="notification_request", job="test", stop_at_end=True,
    )  # fmt: skip
    op.output("oks", decoded.oks, TestingSink(oks))
    op.output("errs", decoded.errs, TestingSink(errs))
    run_main(flow, epoch_interval=timedelta(milliseconds=200))

    assert [d.message.offset for d in oks] == [0, 3, 6]
    assert all(d.value["notification_id"] == "n-1" for d in oks)
    reasons = {e["offset"]: e["reason"] for e in errs}
    expected = {1: "bad_magic_byte", 2: "unknown_schema_id", 4: "empty_record", 5: "truncated"}
    assert reasons == expected
    letter = next(e for e in errs if e["offset"] == 1)
    assert letter["value"] == b"garbage" and letter["key"] == b"p"
    assert letter["source_topic"] == settings.kafka.topic(TOPIC)
    assert letter["job"] == "test" and letter["dead_letter_id"].endswith(":1")


def test_partition_ends_reads_past_the_brokers_watermark(settings: HeraldSettings) -> None:
    """Tansu's high watermark is the last batch's base offset + 1: the end is read instead."""
    from confluent_kafka import Consumer, TopicPartition

    from sources.kafka import partition_ends

    topic = settings.kafka.topic(TOPIC)
    for n in (10, 5):  # two acknowledged batches on partition 0
        producer = Producer({**settings.kafka.client_config(), "linger.ms": 50})
        for i in range(n):
            producer.produce(topic, f"v{i}".encode(), partition=0)
        assert producer.flush(30) == 0
    config = {**settings.kafka.client_config(), "group.id": "t", "enable.partition.eof": True}
    consumer = Consumer(config)
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 10, cached=False)
        ends = partition_ends(consumer, topic, [0])
    finally:
        consumer.close()
    assert ends == {0: 15}
    assert high <= 15  # 11 on Tansu 0.6; a broker that reports 15 needs no reading


def test_a_lingering_partition_holds_its_records_until_its_batch_or_its_linger(
    settings: HeraldSettings,
) -> None:
    """The warehouse's source (dataflows/warehouse.py): a partition gives its records in one
    batch once its oldest has waited `linger_s` (and tells Bytewax when to wake for them), or
    at once when it holds `batch_size`."""
    topic = settings.kafka.topic(TOPIC)
    producer = Producer({**settings.kafka.client_config(), "acks": "all"})
    for n in range(5):
        producer.produce(topic, f"slow-{n}".encode(), partition=1)
    for n in range(5):
        producer.produce(topic, f"full-{n}".encode(), partition=2)
    assert producer.flush(30) == 0

    def batches(
        part: Any, want: int, other: Any = None
    ) -> tuple[list[list[bytes]], float | None, list[float]]:
        """Call it as Bytewax does until `want` records came: the non-empty batches, seconds
        from the first call that held records to the batch, and each wake-up asked for (the
        `other` partition of the source asks for the same one)."""
        out: list[list[bytes]] = []
        held_at: float | None = None
        waits: list[float] = []
        deadline = time.monotonic() + 30
        while sum(map(len, out)) < want:
            assert time.monotonic() < deadline, out
            batch = part.next_batch()
            if batch:
                out.append([m.value for m in batch])
                continue
            awake = part.next_awake()
            if awake is not None:
                held_at = held_at or time.monotonic()
                waits.append((awake - datetime.now(UTC)).total_seconds())
                if other is not None:
                    assert abs((other.next_awake() - awake).total_seconds()) < 0.05
        took = None if held_at is None else time.monotonic() - held_at
        return out, took, waits

    slow = KafkaSource(settings.kafka, [topic], batch_size=100, linger_s=0.5)
    part = slow.build_part("linger-slow", f"1-{topic}", None)
    empty = slow.build_part("linger-slow", f"3-{topic}", None)  # same worker, nothing to read
    try:
        assert empty.next_batch() == [] and empty.next_awake() is None
        # while one partition holds records, the empty one sleeps until they are due (not
        # Bytewax's 1 ms cooldown), and neither does once they were given
        got, took, waits = batches(part, 5, other=empty)
        assert part.next_awake() is None and empty.next_awake() is None
    finally:
        part.close()
        empty.close()
    assert got == [[f"slow-{n}".encode() for n in range(5)]]  # one batch, in order
    assert took is not None and 0.4 <= took < 5
    # Bytewax wakes it for them (at "now" once they are due: read a moment later, just past)
    assert waits and all(-0.05 <= w <= 0.5 for w in waits)

    full = KafkaSource(settings.kafka, [topic], batch_size=5, linger_s=60)
    part = full.build_part("linger-full", f"2-{topic}", None)
    started = time.monotonic()
    try:
        got, _took, _waits = batches(part, 5)
    finally:
        part.close()
    assert got == [[f"full-{n}".encode() for n in range(5)]]
    assert time.monotonic() - started < 10  # not the 60 s linger: its batch was full
