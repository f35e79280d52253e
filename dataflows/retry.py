"""retry: deliveries waiting for another attempt -> back to their deliveries topic when due.

    herald.retry.{class}  (Avro delivery, next_attempt_at = when the next attempt is due;
                           written by dispatch after a retryable outcome, a breaker refusal,
                           a platform pause, a shaping deferral or a send guard held elsewhere)
        -> time buckets keyed "<second>:<shard>" (1 s x 8 shards by default)
        -> when due: the record, unchanged, on herald.deliveries.{channel}.{class};
           past its expire_at instead: an EXPIRED delivery_event on herald.delivery-events
    undecodable records, unknown channels -> herald.dead-letters

Run: `python -m bytewax.run "dataflows.retry:build_flow(traffic_class='transactional')"`
(one job per class, so a bulk retry storm never delays an OTP retry; add `-r DIR -s 1` for
recovery snapshots; /metrics on HERALD_METRICS_PORT when set: EXPIRED events, dead letters).

Why a job of its own: no dispatch worker ever sleeps on a retry. Held retries are Bytewax state
with timers (`dataflows.schedule.BucketLogic`: each bucket's `notify_at` is its earliest due
instant; due entries are emitted and empty buckets discarded), so the dispatch jobs stay
stateless and busy sending, and the hold survives restarts in the recovery snapshots. The
backoff jitter is already in `next_attempt_at` (herald.backoff, full jitter), so nothing is
added here; the released retries still pass the provider's token bucket in dispatch.

Restart safety: a bucket released in an epoch that did not commit is released again after a
restart; the second copy has the same delivery_id and is stopped by dispatch's send guard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, cast

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream

from dataflows._common import produce_with_dead_letters
from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._runtime import configure_process
from dataflows._settings import Clock
from dataflows.schedule import BucketLogic, Release, is_keyed, is_record
from herald.catalog import CHANNELS, TRAFFIC_CLASSES
from herald.config import HeraldSettings
from herald.kafka_records import Decoded
from herald.plan_records import deliveries_topic
from herald.scheduling import ScheduledEntry, bucket_key
from schemas.registry import make_registry
from sinks.kafka import KafkaRecord
from sources.kafka import kafka_avro_input

__all__ = ["RetryParser", "build_flow", "retry_topic"]

log = logging.getLogger(__name__)

JOB = "retry"


def retry_topic(traffic_class: str) -> str:
    """The logical retry topic of a traffic class."""
    return f"herald.retry.{traffic_class}"


class RetryParser:
    """`Decoded` Delivery -> `(bucket key, ScheduledEntry)` due at `next_attempt_at`, or a dead
    letter."""

    def __init__(self, clock: Clock, bucket_seconds: int, shards: int) -> None:
        self.clock = clock
        self.bucket_seconds = bucket_seconds
        self.shards = shards

    def __call__(self, decoded: Decoded) -> tuple[str, ScheduledEntry] | dict[str, Any]:
        d, msg = decoded.value, decoded.message
        did = d["delivery_id"]
        if d["channel"] not in CHANNELS or d["traffic_class"] not in TRAFFIC_CLASSES:
            detail = f"no deliveries topic for {d['channel']!r} x {d['traffic_class']!r}"
            return msg.dead_letter("unknown_channel", detail, JOB, delivery_id=did)
        due: datetime = max(
            t for t in (d["next_attempt_at"], d["not_before"], self.clock.now()) if t
        )
        entry = ScheduledEntry(
            due, did, deliveries_topic(d["channel"], d["traffic_class"]), msg.value or b"",
            d["expire_at"], d["notification_id"], d["user_id"], d["tenant_id"],
            d["notification_type"], d["channel"], d["traffic_class"], int(d.get("generation") or 0),
        )  # fmt: skip
        return bucket_key(due, did, self.bucket_seconds, self.shards), entry


def build_flow(
    settings: HeraldSettings | None = None,
    *,
    traffic_class: str = "transactional",
    bounded: bool = False,
    bucket_seconds: int = 1,
    shards: int = 8,
) -> Dataflow:
    """The retry job of one traffic class. Without `settings` (entry point) it reads the
    environment and configures logging. `bounded=True` stops at the end of the input (tests)."""
    if traffic_class not in TRAFFIC_CLASSES:
        raise ValueError(f"traffic_class must be one of {TRAFFIC_CLASSES}")
    if settings is None:
        configure_process()
        settings = HeraldSettings()
    clock = Clock()
    registry = make_registry(settings.registry)
    flow = Dataflow(f"retry_{traffic_class}")
    held = kafka_avro_input(
        "retry_in", flow, settings=settings, topics=[retry_topic(traffic_class)],
        registry=registry, reader_schema="delivery", job=JOB, stop_at_end=bounded,
    )  # fmt: skip
    # oks: Decoded(KafkaMessage, delivery dict); errs: dead_letter dict
    parsed = op.map("to_entries", held.oks, RetryParser(clock, bucket_seconds, shards))
    # (bucket key, ScheduledEntry) | dead_letter dict
    split = op.branch("split_entries", parsed, is_keyed)
    entries = cast(Stream[tuple[str, ScheduledEntry]], split.trues)
    due = op.stateful_batch("buckets", entries, partial(BucketLogic, clock))
    # (bucket key, ScheduledEntry) when due
    release = Release(settings, clock, expired_attributes={"while": "retry_wait"})
    released = op.flat_map_batch("release", due, release)
    # KafkaRecord (the held bytes, deliveries topic) | Output(EXPIRED delivery_event)
    counted = op.flat_map_batch("count_events", released, CountOutputs(JOB, dead_letters=False))
    # the same items (EXPIRED events counted)
    encoder = cast(Callable[[list[Any]], list[Any]], Encoder(settings, registry, JOB))
    records = op.flat_map_batch("encode", counted, encoder)
    # KafkaRecord | dead_letter dict
    encoded = op.branch("split_records", records, is_record)
    dead_letters = op.merge("dead_letters", held.errs, split.falses, encoded.falses)
    # dead_letter dict
    letters = op.flat_map_batch("count_dead_letters", dead_letters, CountOutputs(JOB))
    # the same dead_letter dicts
    produce_with_dead_letters(
        "kafka_out", cast(Stream[KafkaRecord], encoded.trues), letters,
        settings=settings, registry=registry,
    )  # fmt: skip
    return flow
