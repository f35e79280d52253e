"""Wiring shared by the dataflows: the Kafka output with its dead-letter branch, and the
consumer settings of a traffic class."""

from __future__ import annotations

from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Stream, operator

from herald.config import KafkaSettings
from schemas.registry import SchemaRegistry
from sinks.kafka import KafkaProducerSink, KafkaRecord, kafka_output, to_dead_letter_topic

# The transactional path (requests -> plan -> dispatch, and its retries) waits at most 50 ms in an
# empty fetch instead of 500 (sources.kafka.DEFAULT_CONSUMER_CONFIG), because Tansu answers a
# waiting fetch late. Measured on the embedded stack: in the e2e 429/5xx test, released retries
# reached dispatch 36-97 ms after their scheduled time (median of the first 25, 3 runs) instead
# of 144-223 ms; bench.otp_latency's idle-pipeline p99 was 585-589 ms instead of 798-829 (2 runs
# each). The cost: these 24 partitions' extra fetches take Tansu from 14% to 25% of a core on an
# idle `herald up`. A real Kafka broker answers a waiting fetch when data arrives, so there the
# setting only adds empty fetches on idle transactional partitions.
TRANSACTIONAL_CONSUMER_CONFIG: dict[str, str | int | bool] = {"fetch.wait.max.ms": 50}


def class_consumer_config(traffic_class: str) -> dict[str, str | int | bool] | None:
    """Consumer overrides for the sources of a job of `traffic_class` (None: the defaults)."""
    return TRANSACTIONAL_CONSUMER_CONFIG if traffic_class == "transactional" else None


@operator
def produce_with_dead_letters(
    step_id: str,
    records: Stream[KafkaRecord],
    dead_letters: Stream[dict[str, Any]],
    *,
    kafka: KafkaSettings,
    registry: SchemaRegistry,
    sink: KafkaProducerSink | None = None,
) -> None:
    """Produce `records`, and `dead_letters` to herald.dead-letters, through one producer sink."""
    letters = to_dead_letter_topic("dead_letters_out", dead_letters, kafka=kafka, registry=registry)
    # KafkaRecord for herald.dead-letters (key = source topic)
    merged = op.merge("merge", records, letters)
    # KafkaRecord
    kafka_output("produce", merged, sink if sink is not None else KafkaProducerSink(kafka))
