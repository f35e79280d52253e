"""warehouse: every delivery event on Kafka into ClickHouse.

    herald.delivery-events (Avro delivery_event, every job's events)
        -> ClickHouse herald.delivery_events (and through its materialized views:
           delivery_state, funnel_minute, latency_samples)
    records without an Avro frame, or that no one can decode -> herald.dead-letters with their
    reason; the job keeps going

Run: `python -m bytewax.run "dataflows.warehouse:build_flow()"` (settings from HERALD_* env;
/metrics on HERALD_METRICS_PORT when set).

Loading: with a schema registry URL (HERALD_REGISTRY_URL, as `herald up` and production run)
each batch's values go to ClickHouse as Kafka holds them (`FORMAT AvroConfluent`, ClickHouse
fetching the writer schemas from the registry): no decoding in Python, which cost a third of a
core while a push campaign drained (sinks/clickhouse.py `AvroLoader`). A batch ClickHouse
refuses, and every batch with a file-backed registry, is decoded here record by record: the
undecodable ones become dead letters, the rest are inserted as rows.

Idempotency: at-least-once. A record re-read after a restart is inserted again with the same
event_id; delivery_events collapses it (ReplacingMergeTree keyed by event_id, read with FINAL)
and the views count distinct ids, so nothing is counted twice. This is the one loader of
delivery_events: jobs publish events to Kafka and need no ClickHouse client of their own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.outputs import StatelessSinkPartition
from clickhouse_connect.driver.exceptions import DatabaseError

from dataflows._runtime import configure_process
from dataflows.accepted import event_columns
from herald.config import HeraldSettings, RegistrySettings
from herald.errors import SerdeError
from herald.kafka_records import KafkaMessage
from herald.metrics import JobMetrics
from herald.topics import DELIVERY_EVENTS
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer, parse_header
from sinks.clickhouse import AvroLoader, ClickHouseSink
from sinks.kafka import KafkaProducerSink, kafka_output, to_dead_letter_topic
from sources.kafka import kafka_input

JOB = "warehouse"
EVENTS_TOPIC = DELIVERY_EVENTS
EVENTS_TABLE = "delivery_events"

log = logging.getLogger(__name__)


class _Loader:
    """A batch of raw delivery_event records -> ClickHouse; the dead letters of those that
    could not be loaded (dicts for herald.dead-letters)."""

    def __init__(self, settings: HeraldSettings, metrics: JobMetrics) -> None:
        url = registry_url(settings.registry)
        self.avro = AvroLoader(settings.clickhouse, EVENTS_TABLE, url) if url else None
        self.decode = AvroDeserializer(
            make_registry(settings.registry), "delivery_event", timestamps="millis"
        )
        self.sink = ClickHouseSink(settings.clickhouse, EVENTS_TABLE, event_columns())
        self._rows: StatelessSinkPartition[Mapping[str, Any]] | None = None  # on first use
        self._lock = threading.Lock()  # the row writer's insert context is not shared
        self.metrics = metrics

    def __call__(self, batch: list[KafkaMessage]) -> list[dict[str, Any]]:
        letters: list[dict[str, Any]] = []
        framed: list[KafkaMessage] = []
        for msg in batch:
            try:
                parse_header(msg.value)
                framed.append(msg)
            except SerdeError as exc:
                letters.append(self._letter(msg, exc))
        if self.avro is not None and framed:
            try:
                self.avro.load([m.value for m in framed if m.value is not None])
                self.metrics.loaded(EVENTS_TABLE, "avro", len(framed))
                return letters
            except DatabaseError as exc:
                log.warning("warehouse.avro_refused records=%d error=%s; decoding them here",
                            len(framed), str(exc).splitlines()[0][:300])  # fmt: skip
        rows: list[Mapping[str, Any]] = []
        for msg in framed:
            try:
                rows.append(self.decode(msg.value))
            except SerdeError as exc:
                letters.append(self._letter(msg, exc))
        if rows:
            with self._lock:
                if self._rows is None:
                    self._rows = self.sink.build(JOB, 0, 1)
                self._rows.write_batch(rows)
            self.metrics.loaded(EVENTS_TABLE, "rows", len(rows))
        return letters

    def _letter(self, msg: KafkaMessage, exc: SerdeError) -> dict[str, Any]:
        log.warning("decode.failed job=%s topic=%s partition=%d offset=%d reason=%s",
                    JOB, msg.topic, msg.partition, msg.offset, exc.reason)  # fmt: skip
        self.metrics.dead_letter(exc.reason)
        return msg.dead_letter(exc.reason, exc.detail, JOB)


def registry_url(settings: RegistrySettings) -> str | None:
    """The registry URL ClickHouse reads schemas from (credentials in it), or None for a
    file-backed registry."""
    if not settings.url:
        return None
    if settings.basic_auth_user_info is None:
        return settings.url
    user, _, password = settings.basic_auth_user_info.get_secret_value().partition(":")
    parts = urlsplit(settings.url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


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
    events = kafka_input(
        "events_in", flow, settings=settings, topics=(EVENTS_TOPIC,), stop_at_end=bounded
    )
    # KafkaMessage (a framed delivery_event, undecoded)
    letters = op.flat_map_batch("load", events, _Loader(settings, metrics))
    # dead_letter dict of a record that could not be loaded
    records = to_dead_letter_topic(
        "dead_letters_out", letters, settings=settings, registry=registry
    )
    # KafkaRecord for herald.dead-letters
    kafka_output("produce", records, KafkaProducerSink(settings.kafka))
    return flow
