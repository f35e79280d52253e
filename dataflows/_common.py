"""Wiring shared by the dataflows: the Kafka output with its dead-letter branch."""

from __future__ import annotations

from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Stream, operator

from herald.config import HeraldSettings
from schemas.registry import SchemaRegistry
from sinks.kafka import KafkaProducerSink, SinkItem, kafka_output, to_dead_letter_topic


@operator
def produce_with_dead_letters(
    step_id: str,
    records: Stream[SinkItem],
    dead_letters: Stream[dict[str, Any]],
    *,
    settings: HeraldSettings,
    registry: SchemaRegistry,
    sink: KafkaProducerSink | None = None,
) -> None:
    """Produce `records`, and `dead_letters` to herald.dead-letters (values sealed), through one
    producer sink."""
    letters = to_dead_letter_topic(
        "dead_letters_out", dead_letters, settings=settings, registry=registry
    )
    # KafkaRecord for herald.dead-letters (key = source topic)
    merged = op.merge("merge", records, letters)
    # KafkaRecord | RecordBatch
    sink = sink if sink is not None else KafkaProducerSink(settings.kafka)
    kafka_output("produce", merged, sink)
