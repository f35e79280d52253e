"""schedule: held deliveries -> released to their deliveries topic when due.

    herald.scheduled (Avro delivery, not_before = send_at, quiet-hours end, local-time campaign)
        -> time buckets keyed "<bucket index>:<shard>" (schedule_bucket_seconds x schedule_shards)
        -> at release time: the record, unchanged, on herald.deliveries.{channel}.{class};
           past its expire_at instead: an EXPIRED delivery_event on herald.delivery-events
    undecodable records, unknown channels, holds beyond the schedule horizon -> dead letters
        (herald.config.ScheduleSettings: the API refuses a send_at beyond it, so only records
        produced around the API get there)

Run: `python -m bytewax.run "dataflows.schedule:build_flow()"` (add `-r DIR -s 1` for recovery).

Release instant: `not_before` plus a jitter in `[0, schedule_jitter_seconds)` derived from the
delivery id (normal and bulk only, never past the expiry; herald/scheduling.py), so a campaign
aimed at "09:00 local" or the end of everybody's quiet hours is spread instead of released in
one second. Local times are resolved by the plan job in each user's zone with the DST rule of
herald.quiet_hours (a nonexistent time moves to the next valid instant, an ambiguous one is used
once), so every held delivery has one UTC `not_before` and is released once.

Timers: each bucket key sets `notify_at` to its earliest release; Bytewax calls `on_notify` when
it passes, the due entries are emitted and an empty bucket is discarded (its state is gone:
state never outlives the last release of its bucket, at most the hold limit).

Restart safety: buckets are in the recovery snapshots. A bucket released in an epoch that did not
commit is released again after a restart: the second copy has the same delivery_id and is
dropped by dispatch's send guard (`guard:{delivery_id}` in Redis, herald/guard.py) — the same
dedup that covers every at-least-once replay. Preferences are re-checked there too (an opt-out
after the hold applies).
"""

from __future__ import annotations

import logging
import pickle
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeGuard, cast

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream

from dataflows._common import produce_with_dead_letters
from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._settings import Clock, PlanningSettings, entry_settings
from herald import ids
from herald.catalog import CHANNELS, TRAFFIC_CLASSES
from herald.config import HeraldSettings
from herald.kafka_records import Decoded
from herald.plan_records import EVENTS_TOPIC, Output, deliveries_topic
from herald.scheduling import Bucket, ScheduledEntry, bucket_key, release_at
from herald.states import State
from herald.topics import SCHEDULED
from schemas.registry import make_registry
from sinks.kafka import KafkaProducerSink, KafkaRecord
from sources.kafka import kafka_avro_input

__all__ = ["BucketLogic", "EntryParser", "build_flow", "expired_event"]

log = logging.getLogger(__name__)

JOB = "schedule"
SCHEDULED_TOPIC = SCHEDULED


class EntryParser:
    """`Decoded` Delivery -> `(bucket key, ScheduledEntry)`, or a dead letter."""

    def __init__(self, planning: PlanningSettings, clock: Clock, hold_limit: timedelta) -> None:
        self.clock = clock
        self.jitter = timedelta(seconds=planning.schedule_jitter_seconds)
        self.horizon = hold_limit
        self.bucket_seconds = planning.schedule_bucket_seconds
        self.shards = planning.schedule_shards

    def __call__(self, decoded: Decoded) -> tuple[str, ScheduledEntry] | dict[str, Any]:
        d, msg = decoded.value, decoded.message
        did = d["delivery_id"]
        if d["channel"] not in CHANNELS or d["traffic_class"] not in TRAFFIC_CLASSES:
            detail = f"no deliveries topic for {d['channel']!r} x {d['traffic_class']!r}"
            return msg.dead_letter("unknown_channel", detail, JOB, delivery_id=did)
        now = self.clock.now()
        not_before: datetime = d["not_before"] or now
        if not_before - now > self.horizon:
            detail = f"held {(not_before - now).days} days, more than {self.horizon.days}"
            return msg.dead_letter("schedule_too_far", detail, JOB, delivery_id=did)
        release = release_at(not_before, did, d["traffic_class"], self.jitter, d["expire_at"])
        entry = ScheduledEntry(
            release, did, deliveries_topic(d["channel"], d["traffic_class"]), msg.value or b"",
            d["expire_at"], d["notification_id"], d["user_id"], d["tenant_id"],
            d["notification_type"], d["channel"], d["traffic_class"], int(d.get("generation") or 0),
            d.get("traceparent"),
        )  # fmt: skip
        return bucket_key(release, did, self.bucket_seconds, self.shards), entry


class BucketLogic(op.StatefulBatchLogic[ScheduledEntry, ScheduledEntry, bytes]):
    """One time bucket: hold entries, release the due ones, disappear when empty."""

    def __init__(self, clock: Clock, resume: bytes | None) -> None:
        self.clock = clock
        self.bucket: Bucket = pickle.loads(resume) if resume else Bucket()

    def on_batch(self, values: list[ScheduledEntry]) -> tuple[list[ScheduledEntry], bool]:
        """Hold new entries (a replayed one is kept once); release what is already due."""
        for entry in values:
            self.bucket.add(entry)
        return self._release()

    def on_notify(self) -> tuple[list[ScheduledEntry], bool]:
        """The earliest release instant has passed."""
        return self._release()

    def _release(self) -> tuple[list[ScheduledEntry], bool]:
        due = self.bucket.due(self.clock.now())
        if due:
            log.info("schedule.released count=%d held=%d", len(due), len(self.bucket))
        return due, len(self.bucket) == 0

    def notify_at(self) -> datetime | None:
        """The earliest pending release, on the system clock: Bytewax compares it with the
        system time, the bucket holds job-clock instants (they differ by the test-only offset)."""
        release = self.bucket.next_release()
        return None if release is None else release - self.clock.offset

    def snapshot(self) -> bytes:
        """The bucket, pickled now."""
        return pickle.dumps(self.bucket, protocol=pickle.HIGHEST_PROTOCOL)


def expired_event(entry: ScheduledEntry, now: datetime) -> dict[str, Any]:
    """The EXPIRED delivery_event of an entry that reached its expiry while held, of the
    delivery's generation (an entry restored from a snapshot taken before generations existed
    has none: 0)."""
    generation = getattr(entry, "generation", 0)
    return {
        "event_id": ids.event_id(entry.delivery_id, State.EXPIRED.value, 0, "", generation),
        "delivery_id": entry.delivery_id,
        "notification_id": entry.notification_id,
        "user_id": entry.user_id,
        "tenant_id": entry.tenant_id,
        "notification_type": entry.notification_type,
        "channel": entry.channel,
        "traffic_class": entry.traffic_class,
        "state": State.EXPIRED.value,
        "reason": "expired",
        "provider": None,
        "provider_msg_id": None,
        "attempt": 0,
        "latency_ms": None,
        "occurred_at": now,
        "recorded_at": now,
        "attributes": {"held_until": entry.release.isoformat()},
        "traceparent": getattr(entry, "traceparent", None),  # None in an older snapshot's
        "generation": generation,
    }


class Release:
    """A due entry -> its record on the deliveries topic, or an EXPIRED event (`Output`)."""

    def __init__(
        self,
        settings: HeraldSettings,
        clock: Clock,
        expired_attributes: dict[str, str] | None = None,
    ) -> None:
        self.kafka = settings.kafka
        self.clock = clock
        # replaces the EXPIRED event's attributes (the retry job says what was waiting)
        self.expired_attributes = expired_attributes

    def __call__(self, batch: list[tuple[str, ScheduledEntry]]) -> list[KafkaRecord | Output]:
        now = self.clock.now()
        out: list[KafkaRecord | Output] = []
        for _key, entry in batch:
            if entry.expired(now):
                event = expired_event(entry, now)
                if self.expired_attributes is not None:
                    event = {**event, "attributes": self.expired_attributes}
                out.append(Output(EVENTS_TOPIC, entry.delivery_id, event))
            else:
                out.append(
                    KafkaRecord(self.kafka.topic(entry.topic), entry.delivery_id, entry.value)
                )
        return out


def is_keyed(item: Any) -> TypeGuard[tuple[str, ScheduledEntry]]:
    return isinstance(item, tuple)


def is_record(item: Any) -> TypeGuard[KafkaRecord]:
    return isinstance(item, KafkaRecord)


def build_flow(
    settings: HeraldSettings | None = None, *, planning: PlanningSettings | None = None
) -> Dataflow:
    """The schedule job. Without `settings` (entry point) it reads the environment and
    configures logging."""
    settings = entry_settings(settings)
    planning = planning if planning is not None else PlanningSettings()
    clock = planning.clock()
    registry = make_registry(settings.registry)
    flow = Dataflow("schedule")
    held = kafka_avro_input(
        "scheduled_in", flow, settings=settings, topics=[SCHEDULED_TOPIC], registry=registry,
        reader_schema="delivery", job=JOB,
    )  # fmt: skip
    # oks: Decoded(KafkaMessage, delivery dict); errs: dead_letter dict
    entries = EntryParser(planning, clock, settings.schedule.hold_limit())
    parsed = op.map("to_entries", held.oks, entries)
    # (bucket key, ScheduledEntry) | dead_letter dict
    split = op.branch("split_entries", parsed, is_keyed)
    due = op.stateful_batch("buckets", split.trues, partial(BucketLogic, clock))
    # (bucket key, ScheduledEntry) when due
    released = op.flat_map_batch("release", due, Release(settings, clock))
    # KafkaRecord (the held bytes, deliveries topic) | Output(EXPIRED delivery_event)
    counted = op.flat_map_batch("count_events", released, CountOutputs(JOB, dead_letters=False))
    # the same items
    records = op.flat_map_batch("encode", counted, Encoder(settings, registry, JOB))
    # KafkaRecord | dead_letter dict
    encoded = op.branch("split_records", records, is_record)
    falses = (cast(Stream[dict[str, Any]], s.falses) for s in (split, encoded))
    dead_letters = op.merge("dead_letters", held.errs, *falses)
    # dead_letter dict
    letters = op.flat_map_batch("count_dead_letters", dead_letters, CountOutputs(JOB))
    # the same dead_letter dicts
    produce_with_dead_letters(
        "kafka_out", encoded.trues, letters, settings=settings, registry=registry,
        sink=KafkaProducerSink(settings.kafka, parts=2),
    )  # fmt: skip
    return flow
