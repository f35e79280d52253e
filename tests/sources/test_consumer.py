"""The worker's shared consumer (sources/consumer.py) against the real embedded broker."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from herald.config import HeraldSettings
from sources import consumer as shared_consumer
from sources.consumer import IDLE_BLOCK_S, Feed, worker_consumer
from sources.kafka import consumer_config

pytestmark = pytest.mark.integration

TOPIC = "herald.requests.normal"


def feeds(settings: HeraldSettings, step_id: str = "t") -> list[Feed]:
    """A feed of every partition of TOPIC (4), from this thread's shared consumer."""
    shared = worker_consumer(consumer_config(settings.kafka, step_id))
    topic = settings.kafka.topic(TOPIC)
    return [shared.attach(TopicPartition(topic, p, OFFSET_BEGINNING)) for p in range(4)]


def records(msgs: list) -> list[bytes]:
    return [m.value() for m in msgs if m.error() is None]


def drain(parts: list[Feed], want: int, timeout: float = 30) -> dict[int, list[bytes]]:
    """Take from every feed, as Bytewax's activations do, until `want` records were seen and
    every partition has reported its end (the consumer is fetching all of them)."""
    seen: dict[int, list[bytes]] = {i: [] for i in range(len(parts))}
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    while sum(map(len, seen.values())) < want or len(ended) < len(parts):
        assert time.monotonic() < deadline, (seen, ended)
        for i, feed in enumerate(parts):
            msgs = feed.take(100, may_block=False)
            seen[i] += records(msgs)
            ended.update(i for m in msgs if m.error() is not None)
    return seen


def test_partitions_of_a_worker_share_one_consumer_and_get_their_own_records(
    settings: HeraldSettings,
) -> None:
    producer = Producer(settings.kafka.client_config())
    for p in range(4):
        for n in range(5):
            producer.produce(settings.kafka.topic(TOPIC), f"{p}-{n}".encode(), partition=p)
    assert producer.flush(30) == 0
    parts = feeds(settings)
    assert len({id(f.shared) for f in parts}) == 1
    seen = drain(parts, 20)
    assert seen == {p: [f"{p}-{n}".encode() for n in range(5)] for p in range(4)}
    for feed in parts:
        feed.close()
    assert not shared_consumer._local.consumers  # the last feed closed the consumer


def test_an_idle_worker_blocks_once_per_activation_and_wakes_when_a_record_arrives(
    settings: HeraldSettings,
) -> None:
    kafka = settings.kafka.model_copy(update={"fetch_wait_ms": 20})
    parts = feeds(settings.model_copy(update={"kafka": kafka}))
    producer = Producer(settings.kafka.client_config())
    try:
        producer.produce(settings.kafka.topic(TOPIC), b"warm", partition=2)
        assert producer.flush(30) == 0
        assert drain(parts, 1)[2] == [b"warm"]
        for feed in parts:  # an empty activation: the worker is idle afterwards
            feed.take(100, may_block=False)
        time.sleep(0.002)  # Bytewax's cooldown between activations
        started = time.monotonic()
        for feed in parts:
            feed.take(100)
        # one block (the first feed of the activation), not one per feed
        assert IDLE_BLOCK_S * 0.8 <= time.monotonic() - started < IDLE_BLOCK_S * 3

        def produce_later() -> None:
            time.sleep(0.05)
            producer.produce(settings.kafka.topic(TOPIC), b"wake", partition=2)
            producer.flush(30)

        # with a short fetch wait the broker answers within the block: the record wakes it
        # (it is read in the activation that was blocked, not after the block's timeout)
        waker = threading.Thread(target=produce_later)
        time.sleep(0.002)
        waker.start()
        got: list[bytes] = []
        activations = 0
        while not got and activations < 100:
            time.sleep(0.002)
            activations += 1
            for feed in parts:
                got += records(feed.take(100))
        waker.join()
        assert got == [b"wake"]
        assert activations <= 2
    finally:
        for feed in parts:
            feed.close()


def test_other_work_pending_never_blocks(settings: HeraldSettings) -> None:
    parts = feeds(settings)
    try:
        drain(parts, 0)
        parts[0].take(100)
        time.sleep(0.002)
        started = time.monotonic()
        assert parts[0].take(100, may_block=False) == []
        assert time.monotonic() - started < IDLE_BLOCK_S / 2
    finally:
        for feed in parts:
            feed.close()
