"""warehouse: every delivery event on Kafka into ClickHouse.

    herald.delivery-events (Avro delivery_event, every job's events)
        -> ClickHouse herald.delivery_events (and through its materialized views:
           delivery_state, funnel_minute, latency_samples)
    undecodable records -> herald.dead-letters with their reason; the job keeps going

Run: `python -m bytewax.run "dataflows.warehouse:build_flow()"` (settings from HERALD_* env;
/metrics on HERALD_METRICS_PORT when set).

Idempotency: at-least-once. A record re-read after a restart is inserted again with the same
event_id; delivery_events collapses it (ReplacingMergeTree keyed by event_id, read with FINAL)
and the views count distinct ids, so nothing is counted twice. This is the one loader of
delivery_events: jobs publish events to Kafka and need no ClickHouse client of their own.
"""

from __future__ import annotations

from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow

from dataflows._runtime import configure_process
from dataflows.accepted import event_columns
from herald.config import HeraldSettings
from herald.kafka_records import Decoded
from herald.metrics import JobMetrics
from herald.topics import DELIVERY_EVENTS
from schemas.registry import make_registry
from sinks.clickhouse import ClickHouseSink
from sinks.kafka import KafkaProducerSink, kafka_output, to_dead_letter_topic
from sources.kafka import kafka_avro_input

JOB = "warehouse"
EVENTS_TOPIC = DELIVERY_EVENTS
EVENTS_TABLE = "delivery_events"
# Each INSERT costs ClickHouse a part per table and per materialized view, whatever its size:
# the same events cost ~27 µs each in inserts of 1,800 (a batch as it comes while a campaign
# drains) and 11-14 µs in inserts of 6,000 (bench/results/clickhouse_views_session26.md). So
# a partition holds its records until it has LOAD_BATCH or the oldest has waited LOAD_LINGER_S:
# while a 50k push campaign drained on the whole stack, inserts of 1,850 rows on average
# became 12,000 and ClickHouse's CPU went from 31-35 % to 12-18 % of a core. An event reaches
# ClickHouse up to LOAD_LINGER_S later.
LOAD_BATCH = 8000
LOAD_LINGER_S = 1.0


class _Rows:
    """Decoded delivery_event -> ClickHouse row (the Avro record, same column names).

    Its timestamps stay the epoch milliseconds on the wire (`timestamps="millis"`): the
    DateTime64(3) columns take them as they are, where a datetime was built per field by the
    decoder and taken apart again by clickhouse-connect."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics

    def __call__(self, decoded: Decoded) -> dict[str, Any]:
        row = decoded.value
        self.metrics.event(str(row["state"]))
        return row


def build_flow(settings: HeraldSettings | None = None, *, bounded: bool = False) -> Dataflow:
    """The warehouse job. Without `settings` (entry point) it reads the environment, configures
    logging and serves /metrics when HERALD_METRICS_PORT is set.

    `bounded=True` stops at the current end of the topic (tests, backfills).
    """
    if settings is None:
        configure_process()
        settings = HeraldSettings()
    metrics = JobMetrics(JOB)
    registry = make_registry(settings.registry)
    flow = Dataflow(JOB)
    events = kafka_avro_input(
        "events_in", flow, settings=settings, topics=(EVENTS_TOPIC,), registry=registry,
        reader_schema="delivery_event", job=JOB, stop_at_end=bounded,
        batch_size=LOAD_BATCH, linger_s=LOAD_LINGER_S, timestamps="millis",
    )  # fmt: skip
    # oks: Decoded(delivery_event); errs: dead_letter dict
    rows = op.map("to_row", events.oks, _Rows(metrics))
    # delivery_event dict == delivery_events row
    op.output("clickhouse_out", rows, ClickHouseSink(settings.clickhouse, EVENTS_TABLE,
                                                     event_columns()))  # fmt: skip
    letters = to_dead_letter_topic(
        "dead_letters_out", events.errs, settings=settings, registry=registry
    )
    # KafkaRecord for herald.dead-letters
    kafka_output("produce", letters, KafkaProducerSink(settings.kafka))
    return flow
