"""KafkaProducerSink, encode_avro and to_dead_letter_topic against the real embedded broker."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main

from herald.config import HeraldSettings
from herald.errors import DeliveryError
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.base import EpochFlushPartition, EpochFlushSink
from sinks.kafka import (
    DEAD_LETTER_TOPIC,
    KafkaProducerSink,
    KafkaRecord,
    RecordBatch,
    batch_records,
    encode_avro,
    kafka_output,
    to_dead_letter_topic,
    topic_serializer,
)
from tests.dataflows.helpers import consume
from tests.schemas.examples import example

pytestmark = pytest.mark.integration

TOPIC = "herald.delivery-events"
FAST_FAIL = {"message.timeout.ms": 5000, "topic.metadata.propagation.max.ms": 1000}


def run_records(records: list[Any], sink: KafkaProducerSink) -> None:
    flow = Dataflow("sink_test")
    stream = op.input("in", flow, TestingSource(records, batch_size=50))
    kafka_output("kafka_out", stream, sink)
    run_main(flow, epoch_interval=timedelta(milliseconds=100))


def raised_delivery_error(exc: BaseException) -> bool:
    """Whether `exc` (as re-raised by Bytewax) was caused by a DeliveryError."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DeliveryError) or "DeliveryError" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def test_records_arrive(settings: HeraldSettings) -> None:
    topic = settings.kafka.topic(TOPIC)
    records = [KafkaRecord(topic, f"d{i % 13}", f"v{i}".encode()) for i in range(500)]
    records.append(KafkaRecord(topic, None, b"keyless"))

    run_records(records, KafkaProducerSink(settings.kafka, parts=2))

    got = consume(settings, TOPIC)
    assert sorted(got, key=repr) == sorted(
        ((r.key.encode() if r.key else None, r.value) for r in records), key=repr
    )


def test_warm_producers_serve_their_partitions(settings: HeraldSettings) -> None:
    """Producers made with the sink (`warm=True`, for jobs on the OTP path) are the ones the
    partitions use: the records arrive, and a refused record still fails the job."""
    topic = settings.kafka.topic(TOPIC)
    records = [KafkaRecord(topic, f"w{i}", f"v{i}".encode()) for i in range(100)]
    sink = KafkaProducerSink(settings.kafka, parts=2, warm=True)
    warm = {part: w.producer for part, w in sink._warm.items()}
    assert sorted(warm) == ["part-0", "part-1"]
    writer = sink.build_writer("t", "part-1")
    assert writer._producer is warm["part-1"] and "part-1" not in sink._warm
    writer.release()

    run_records(records, KafkaProducerSink(settings.kafka, parts=2, warm=True))
    assert len(consume(settings, TOPIC)) == 100
    missing = [KafkaRecord(settings.kafka.topic("no-such-topic"), "k", b"v")]
    with pytest.raises(Exception) as info:
        run_records(
            missing, KafkaProducerSink(settings.kafka, producer_config=FAST_FAIL, warm=True)
        )
    assert raised_delivery_error(info.value)  # the warm producer's reports reach its partition


def test_same_key_keeps_its_order(settings: HeraldSettings) -> None:
    topic = settings.kafka.topic(TOPIC)
    records = [KafkaRecord(topic, "same", f"{i:04d}".encode()) for i in range(300)]

    run_records(records, KafkaProducerSink(settings.kafka, parts=3))

    assert [v for _k, v in consume(settings, TOPIC)] == [r.value for r in records]


def test_backpressure_waits_instead_of_dropping(settings: HeraldSettings) -> None:
    topic = settings.kafka.topic(TOPIC)
    records = [KafkaRecord(topic, f"k{i}", b"x" * 100) for i in range(2000)]
    sink = KafkaProducerSink(settings.kafka, producer_config={"queue.buffering.max.messages": 10})

    run_records(records, sink)

    assert len(consume(settings, TOPIC)) == 2000


def test_broker_refusal_raises_delivery_error(settings: HeraldSettings) -> None:
    missing = settings.kafka.topic("no-such-topic")
    records = [KafkaRecord(missing, "k", b"v")]

    with pytest.raises(Exception) as info:
        run_records(records, KafkaProducerSink(settings.kafka, producer_config=FAST_FAIL))

    assert raised_delivery_error(info.value)


def test_local_refusal_raises_delivery_error(settings: HeraldSettings) -> None:
    records = [KafkaRecord(settings.kafka.topic(TOPIC), "k", b"x" * 2_000_000)]

    with pytest.raises(Exception) as info:
        run_records(records, KafkaProducerSink(settings.kafka))

    assert raised_delivery_error(info.value)


def test_snapshot_returns_only_once_everything_is_acknowledged(settings: HeraldSettings) -> None:
    """The epoch-boundary contract, on one partition: write_batch does not wait, snapshot does."""
    topic = settings.kafka.topic(TOPIC)
    sink = KafkaProducerSink(settings.kafka, producer_config={"linger.ms": 3000})
    part = sink.build_part("epoch_test", sink.list_parts()[0], None)

    started = time.monotonic()
    part.write_batch([KafkaRecord(topic, f"k{i}", b"v") for i in range(20)])
    assert time.monotonic() - started < 1.0  # handed over, not waited for
    assert consume(settings, TOPIC) == []  # still lingering in the producer

    part.snapshot()
    assert len(consume(settings, TOPIC)) == 20
    part.close()


def test_snapshot_raises_for_failed_records(settings: HeraldSettings) -> None:
    sink = KafkaProducerSink(settings.kafka, producer_config=FAST_FAIL)
    part = sink.build_part("epoch_test", sink.list_parts()[0], None)
    part.write_batch([KafkaRecord(settings.kafka.topic("no-such-topic"), "k", b"v")])

    with pytest.raises(DeliveryError, match="UNKNOWN_TOPIC"):
        part.snapshot()
    part.close()  # after a failure: releases the producer without raising again


def test_batch_records_groups_the_records_and_passes_the_rest() -> None:
    records = [KafkaRecord("t", f"d{i}", b"v") for i in range(3)]
    letter = {"reason": "bad"}

    assert batch_records([records[0], letter, *records[1:]]) == [RecordBatch("d0", records), letter]
    assert batch_records([letter]) == [letter]
    assert batch_records([KafkaRecord("t", None, b"v")])[0].key == "t"


def test_batches_arrive_in_order_beside_single_records(settings: HeraldSettings) -> None:
    topic = settings.kafka.topic(TOPIC)
    batches = [
        RecordBatch(f"b{b}", [KafkaRecord(topic, "same", f"{b}:{i:03d}".encode())
                              for i in range(100)])
        for b in range(5)
    ]  # fmt: skip
    single = KafkaRecord(topic, "other", b"single")

    run_records([*batches, single], KafkaProducerSink(settings.kafka, parts=3))

    got = consume(settings, TOPIC)
    assert (b"other", b"single") in got
    for batch in batches:  # each batch's records arrive in the batch's order
        values = [r.value for r in batch.records]
        assert [v for _k, v in got if v in values] == values
    assert len(got) == 501


def test_encode_and_dead_letter_routing(settings: HeraldSettings) -> None:
    registry = make_registry(settings.registry)
    topic = settings.kafka.topic(TOPIC)
    good = example("delivery_event")
    bad = {**good, "attempt": "not-an-int"}
    out: list[KafkaRecord] = []

    flow = Dataflow("encode_test")
    events = op.input("in", flow, TestingSource([good, bad]))
    encoded = encode_avro(
        "encode", events, serializer=topic_serializer(settings.kafka, registry, TOPIC),
        topic=topic, key=lambda e: e["delivery_id"], job="test",
    )  # fmt: skip
    letters = to_dead_letter_topic("dead", encoded.errs, settings=settings, registry=registry)
    op.output("out", op.merge("all", encoded.oks, letters), TestingSink(out))
    run_main(flow)

    decode = AvroDeserializer(registry)
    by_topic = {r.topic: r for r in out}
    assert decode(by_topic[topic].value)["event_id"] == good["event_id"]
    assert by_topic[topic].key == good["delivery_id"]
    letter_record = by_topic[settings.kafka.topic(DEAD_LETTER_TOPIC)]
    letter: dict[str, Any] = decode(letter_record.value)
    assert letter_record.key == topic
    assert (letter["reason"], letter["job"], letter["partition"]) == ("encode_failed", "test", -1)
    assert letter["key"] == good["delivery_id"].encode()
    assert "schema_violation" in letter["detail"]


class _Recording(EpochFlushPartition[int]):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def submit(self, items: list[int]) -> None:
        self.calls.extend("write" for _ in items)

    def flush(self) -> None:
        self.calls.append("flush")


class _RecordingSink(EpochFlushSink[int]):
    def __init__(self, calls: list[str]) -> None:
        super().__init__(parts=1)
        self.calls = calls

    def build_writer(self, step_id: str, part: str) -> _Recording:
        return _Recording(self.calls)


def _slowly(x: int) -> int:
    time.sleep(0.02)
    return x


def test_bytewax_flushes_sink_partitions_at_every_epoch_boundary() -> None:
    """What the sink's guarantee rests on: Bytewax 0.21 calls snapshot() when an epoch closes."""
    calls: list[str] = []
    flow = Dataflow("epoch_order")
    items = op.input("in", flow, TestingSource(range(12)))
    slow = op.map("slow", items, _slowly)
    keyed = op.key_on("key", slow, str)
    op.output("out", keyed, _RecordingSink(calls))

    run_main(flow, epoch_interval=timedelta(milliseconds=60))

    assert calls.count("write") == 12
    assert calls.count("flush") >= 3  # once per epoch (at least two here) and once in close()
    assert calls[-2:] == ["flush", "flush"]  # the last epoch's snapshot, then close()
    last_write = max(i for i, c in enumerate(calls) if c == "write")
    assert "flush" in calls[last_write:]
