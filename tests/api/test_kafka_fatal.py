"""The API producer survives a fatal librdkafka error (PRODUCER_FENCED on a starved broker)."""

from __future__ import annotations

import asyncio

from confluent_kafka import KafkaError

from api.kafka import AsyncProducer
from herald.config import HeraldSettings


def test_a_fatal_error_replaces_the_producer_and_later_records_are_acked(
    settings: HeraldSettings,
) -> None:
    topic = settings.kafka.topic("herald.requests.transactional")

    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        producer = AsyncProducer(settings.kafka)
        producer.start()
        try:
            first = await producer.produce(topic, "k", b"before")
            before = producer._producer
            # what librdkafka reports through error_cb when the broker fenced the producer
            producer._on_error(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
            for _ in range(100):
                if producer._producer is not before:
                    break
                await asyncio.sleep(0.05)
            assert producer._producer is not before
            return first, await producer.produce(topic, "k", b"after")
        finally:
            producer.close()

    first, second = asyncio.run(scenario())
    assert second[0] == first[0] and second[1] > first[1]
