"""accepted: record that every notification request entered the pipeline.

    herald.requests.{transactional,normal,bulk}  (Avro notification_request)
        -> one delivery_event per request, state ACCEPTED
        -> herald.delivery-events (Avro, key = delivery_id) and ClickHouse herald.delivery_events
        -> the request's header `notif:{nid}` in Redis where the API wrote none (a request from
           another producer): GET /v1/notifications/{id} shows it to its tenant
    undecodable records -> herald.dead-letters with their reason; the job keeps going

Run: `python -m bytewax.run "dataflows.accepted:build_flow()"` (settings from HERALD_* env vars;
/metrics on HERALD_METRICS_PORT when set: ACCEPTED events, dead letters).

Idempotency: the event id is `herald.ids.event_id(notification_id, "ACCEPTED", 0)` (the
request-level delivery_id is the notification_id), so a request re-read after a restart yields
the same event; the ClickHouse table and event consumers deduplicate by it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow

from dataflows._common import produce_with_dead_letters
from dataflows._metrics import CountOutputs
from dataflows._runtime import configure_process
from herald import ids, tracing
from herald.catalog import is_otp_type
from herald.config import HeraldSettings
from herald.kafka_records import Decoded
from herald.metrics import JobMetrics
from herald.status_keys import request_header
from herald.topics import DELIVERY_EVENTS
from schemas import schema_text
from schemas.registry import make_registry
from sinks.clickhouse import ClickHouseSink
from sinks.kafka import encode_avro, topic_serializer
from sinks.redis_status import HeaderSink
from sources.kafka import kafka_avro_input

JOB = "accepted"
REQUEST_TOPICS = ("herald.requests.transactional", "herald.requests.normal", "herald.requests.bulk")
EVENTS_TOPIC = DELIVERY_EVENTS
EVENTS_TABLE = "delivery_events"
STATE = "ACCEPTED"


def event_columns() -> list[str]:
    """ClickHouse columns of herald.delivery_events: the delivery_event schema's field names."""
    return [field["name"] for field in json.loads(schema_text("delivery_event"))["fields"]]


def accepted_event(request: Mapping[str, Any], recorded_at: datetime) -> dict[str, Any]:
    """The request-level ACCEPTED delivery_event of one notification_request (pure).

    `user_id` is the recipient when the request names exactly one user, else "" (several users
    or a segment); `channel` is "" (request level); `occurred_at` is the request's accepted_at.
    """
    recipients = request["recipients"]
    user_ids = recipients["user_ids"]
    attributes = {"request_id": request["request_id"], "source": request["source"]}
    if recipients.get("segment_id"):
        attributes["segment_id"] = recipients["segment_id"]
    else:
        attributes["recipient_count"] = str(len(user_ids))
    return {
        "event_id": ids.event_id(request["notification_id"], STATE, 0),
        "delivery_id": request["notification_id"],
        "notification_id": request["notification_id"],
        "user_id": user_ids[0] if len(user_ids) == 1 else "",
        "tenant_id": request["tenant_id"],
        "notification_type": request["notification_type"],
        "channel": "",
        "traffic_class": request["traffic_class"],
        "state": STATE,
        "reason": None,
        "provider": None,
        "provider_msg_id": None,
        "attempt": 0,
        "latency_ms": None,
        "occurred_at": request["accepted_at"],
        "recorded_at": recorded_at,
        "attributes": attributes,
        "generation": 0,
        "traceparent": request.get("traceparent"),
    }


def _to_event(decoded: Decoded) -> dict[str, Any]:
    request, headers = decoded.value, decoded.message.headers
    if headers:  # a producer's trace context may be a header (herald/tracing.py)
        request = {**request, "traceparent": tracing.of_request(request, headers)}
    return accepted_event(request, datetime.now(UTC))


def _delivery_id(event: Mapping[str, Any]) -> str:
    return str(event["delivery_id"])


class _CountAccepted:
    """herald_events_total{job="accepted",state="ACCEPTED"}, once per batch; passes it on."""

    def __init__(self) -> None:
        self.metrics = JobMetrics(JOB)

    def __call__(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.metrics.event("ACCEPTED", len(batch))
        return batch


def build_flow(settings: HeraldSettings | None = None, *, bounded: bool = False) -> Dataflow:
    """The accepted job. Without `settings` (entry point) it reads the environment, configures
    logging and serves /metrics when HERALD_METRICS_PORT is set.

    `bounded=True` stops at the current end of the request topics (tests, backfills).
    """
    if settings is None:  # called as the entry point: configure the process
        configure_process()
        settings = HeraldSettings()
    registry = make_registry(settings.registry)
    kafka = settings.kafka
    flow = Dataflow("accepted")
    requests = kafka_avro_input(
        "requests_in", flow, settings=settings, topics=REQUEST_TOPICS, registry=registry,
        reader_schema="notification_request", job=JOB, stop_at_end=bounded,
    )  # fmt: skip
    # oks: Decoded(KafkaMessage, notification_request dict); errs: dead_letter dict
    events = op.map("to_accepted_event", requests.oks, _to_event)
    events = op.flat_map_batch("count_accepted", events, _CountAccepted())
    # delivery_event dict (state ACCEPTED)
    encoded = encode_avro(
        "encode_events", events, serializer=topic_serializer(kafka, registry, EVENTS_TOPIC),
        topic=kafka.topic(EVENTS_TOPIC), key=_delivery_id, job=JOB,
    )  # fmt: skip
    # oks: KafkaRecord for herald.delivery-events; errs: dead_letter dict
    dead_letters = op.merge("dead_letters", requests.errs, encoded.errs)
    # dead_letter dict
    letters = op.flat_map_batch("count_dead_letters", dead_letters, CountOutputs(JOB))
    # the same dead_letter dicts
    produce_with_dead_letters(
        "kafka_out", encoded.oks, letters, settings=settings, registry=registry
    )
    sink = ClickHouseSink(settings.clickhouse, EVENTS_TABLE, event_columns())
    op.output("clickhouse_out", events, sink)
    headers = op.map("to_header", requests.oks, _header)
    # (notification_id, header): the status API's view of requests the API did not accept
    op.output("headers_out", headers, HeaderSink(settings.redis))
    return flow


def _header(decoded: Decoded) -> tuple[str, dict[str, str]]:
    """The `notif:{nid}` header of a request (written only where the API wrote none)."""
    rec = decoded.value
    recipients = rec["recipients"]
    accepted = rec["accepted_at"]
    header = request_header(
        rec["tenant_id"], rec["request_id"], rec["notification_type"], rec["traffic_class"],
        int(accepted.timestamp() * 1000), len(recipients.get("user_ids") or []),
        recipients.get("segment_id"), is_otp_type(str(rec["notification_type"])),
    )  # fmt: skip
    return rec["notification_id"], header
