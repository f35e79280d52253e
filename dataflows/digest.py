"""digest: social events -> one notification request per closed (recipient, type, object) window.

    herald.social-events (Avro social_event, key = recipient_id)
        -> keyed by (recipient, catalog digest type, object), windows per herald.digest
        -> one notification_request per closed window on herald.requests.{class of the type}
           (source "digest", request_id = window id, notification_id = f(tenant, window id))
    undecodable records and unknown event types -> herald.dead-letters; the job keeps going

Run: `python -m bytewax.run "dataflows.digest:build_flow()"` (add `-r DIR -s 1` for recovery).

Time: windows are assigned in **event time** (`occurred_at`, rules in herald/digest.py: a window
opens at its first event and lasts the type's `window_seconds`: likes 600 s, follows 300 s,
comments 30 s, Q&A invites 0 = direct). A window is a latency budget: it is closed by the job
clock (processing time) at `window_end + digest_grace_seconds` through a Bytewax timer
(`notify_at`), or earlier when an event at or after its end arrives. An event for a window
already closed joins the next window of its key: late events are never lost, never reopen a
window, and every window has its own id. A window that is already overdue when its events come
in (a backlog after downtime) closes `digest_grace_seconds` after its key's last event arrived,
so a backlog read in many batches still becomes one notification per window.

Idempotency: the window id derives from (recipient, type, object, window start), so a window
re-emitted after a crash (closed in an epoch that did not commit) carries the same
notification_id, and the plan job's request dedup drops the copy. Upstream event ids are
deduplicated per key (`DigestState.seen_events`), across restarts too: the state is snapshotted.

State TTL: a key's state is discarded `digest_idle_ttl_seconds` after its last window closed
(timer), so idle recipients cost nothing; an event after that opens a fresh state.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeGuard, cast

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream

from dataflows._common import produce_with_dead_letters
from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._settings import Clock, PlanningSettings, entry_settings
from herald.catalog import Catalog, load_catalog
from herald.config import HeraldSettings
from herald.digest import (
    DigestKey,
    DigestState,
    DigestWindow,
    SocialEvent,
    notification_request,
    step,
)
from herald.errors import SerdeError
from herald.plan_records import Output
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.kafka import KafkaProducerSink, KafkaRecord
from sources.kafka import KafkaMessage, KafkaSource

__all__ = ["DigestLogic", "EventParser", "build_flow"]

log = logging.getLogger(__name__)

JOB = "digest"
EVENTS_TOPIC = "herald.social-events"


class EventParser:
    """A batch of raw records -> `(digest key, SocialEvent)` items, or dead letters.

    Decoding, validation and keying in one batch step (one Python call per batch, not three
    per event). Reasons: the serde codes, and `unknown_event_type` for an event type no
    catalog digest handles.
    """

    def __init__(self, catalog: Catalog, deserializer: Callable[[bytes | None], dict[str, Any]]):
        self.deserializer = deserializer
        self.types = {
            nt.digest.event_type: nt.name for nt in catalog.types.values() if nt.digest is not None
        }

    def __call__(self, batch: list[KafkaMessage]) -> list[tuple[str, SocialEvent] | dict[str, Any]]:
        out: list[tuple[str, SocialEvent] | dict[str, Any]] = []
        decode, types = self.deserializer, self.types
        for msg in batch:
            try:
                rec = decode(msg.value)
            except SerdeError as exc:
                out.append(msg.dead_letter(exc.reason, exc.detail, JOB))
                continue
            type_name = types.get(rec["event_type"])
            if type_name is None:
                log.warning("digest.unknown_event_type offset=%d", msg.offset)
                detail = f"no digest type for {rec['event_type']!r}"
                out.append(msg.dead_letter("unknown_event_type", detail, JOB))
                continue
            event = SocialEvent.from_record(rec)
            key = DigestKey(event.recipient_id, type_name, event.object_id or "")
            out.append((key.as_str(), event))
        return out


class DigestLogic(op.StatefulBatchLogic[SocialEvent, DigestWindow, bytes]):
    """One digest key: fold events (herald.digest.step), close windows on the timer, expire."""

    def __init__(
        self, catalog: Catalog, clock: Clock, grace: float, ttl: float, resume: bytes | None
    ) -> None:
        self.catalog = catalog
        self.clock = clock
        self.grace = timedelta(seconds=grace)
        self.ttl = timedelta(seconds=ttl)
        self.state = _restore(resume, catalog) if resume else None
        self.seen_at: datetime | None = None  # job time of the last event (not snapshotted)

    def on_batch(self, values: list[SocialEvent]) -> tuple[list[DigestWindow], bool]:
        """Fold the events in order (an event past the window's end closes it); the timer does
        the rest, so no clock is read here."""
        out: list[DigestWindow] = []
        state = self.state
        for event in values:
            state, closed = step(state, event, self.catalog)
            out.extend(closed)
        self.state = state
        self.seen_at = self.clock.now()
        _log_closed(out)
        return out, op.StatefulBatchLogic.RETAIN

    def on_notify(self) -> tuple[list[DigestWindow], bool]:
        """The timer: close the open window if due, discard the state if idle long enough."""
        state = self.state
        if state is None:
            return [], op.StatefulBatchLogic.DISCARD
        now = self.clock.now()
        out: list[DigestWindow] = []
        if state.should_close(now - self.grace) and not self._settling(now):
            window = state.close()
            if window is not None:
                out.append(window)
        _log_closed(out)
        return out, state.idle(now, self.ttl)

    def _settling(self, now: datetime) -> bool:
        """True while events of an overdue window are still arriving (a backlog replay)."""
        return self.seen_at is not None and now < self.seen_at + self.grace

    def notify_at(self) -> datetime | None:
        """Window end + grace while a window is open (for an overdue window: `grace` after its
        last event arrived); else when the idle TTL runs out."""
        state = self.state
        if state is None:
            return None
        if state.window_end is not None:
            if self.seen_at is not None and self.seen_at > state.window_end:
                return self.seen_at + self.grace
            return state.window_end + self.grace
        if state.closed_until is not None:
            return state.closed_until + self.ttl
        return None

    def snapshot(self) -> bytes:
        """The state, pickled now (later mutations cannot leak into the snapshot)."""
        return _freeze(self.state)


def _log_closed(windows: list[DigestWindow]) -> None:
    for window in windows:
        log.info(
            "digest.window_closed type=%s events=%d total=%d window_id=%s",
            window.key.notification_type, window.events, window.total, window.window_id,
        )  # fmt: skip


# Snapshot format: (version, key fields, {field: value} of DigestState minus key and config).
# The config is the catalog's and is looked up again on restore (a catalog change applies to
# restored windows); leaving it out makes a snapshot ~3x cheaper to write.
_SNAPSHOT_VERSION = 1
_STATE_FIELDS = tuple(f.name for f in fields(DigestState) if f.name not in ("key", "config"))


def _freeze(state: DigestState | None) -> bytes:
    if state is None:
        return pickle.dumps(None)
    key = (state.key.recipient_id, state.key.notification_type, state.key.object_id)
    values = {name: getattr(state, name) for name in _STATE_FIELDS}
    return pickle.dumps((_SNAPSHOT_VERSION, key, values), protocol=pickle.HIGHEST_PROTOCOL)


def _restore(blob: bytes, catalog: Catalog) -> DigestState | None:
    frozen = pickle.loads(blob)
    if frozen is None:
        return None
    _version, key, values = frozen
    config = catalog.get(key[1]).digest
    assert config is not None, f"{key[1]} is no longer a digest type"
    state = DigestState(DigestKey(*key), config)
    for name, value in values.items():
        if name in _STATE_FIELDS:
            setattr(state, name, value)
    return state


class ToRequest:
    """A closed window as an `Output` for herald.requests.{class of the digest type}."""

    def __init__(self, catalog: Catalog, clock: Clock) -> None:
        self.catalog = catalog
        self.clock = clock

    def __call__(self, item: tuple[str, DigestWindow]) -> Output:
        record = notification_request(item[1], self.catalog, self.clock.now())
        topic = f"herald.requests.{record['traffic_class']}"
        return Output(topic, record["notification_id"], record)


def _is_keyed(item: Any) -> TypeGuard[tuple[str, SocialEvent]]:
    return isinstance(item, tuple)


def _is_record(item: Any) -> TypeGuard[KafkaRecord]:
    return isinstance(item, KafkaRecord)


def build_flow(
    settings: HeraldSettings | None = None,
    *,
    planning: PlanningSettings | None = None,
    bounded: bool = False,
) -> Dataflow:
    """The digest job. Without `settings` (entry point) it reads the environment and configures
    logging. `bounded=True` stops at the current end of the input (benchmarks)."""
    settings = entry_settings(settings)
    planning = planning if planning is not None else PlanningSettings()
    catalog = load_catalog(planning.catalog_path)
    clock = planning.clock()
    registry = make_registry(settings.registry)
    flow = Dataflow("digest")
    source = KafkaSource(settings.kafka, [settings.kafka.topic(EVENTS_TOPIC)], stop_at_end=bounded)
    messages = op.input("events_in", flow, source)
    # KafkaMessage
    parser = EventParser(catalog, AvroDeserializer(registry, "social_event"))
    parsed = op.flat_map_batch("parse", messages, parser)
    # (digest key, SocialEvent) | dead_letter dict
    split = op.branch("split_events", parsed, _is_keyed)
    logic = partial(
        DigestLogic, catalog, clock, planning.digest_grace_seconds, planning.digest_idle_ttl_seconds
    )
    windows = op.stateful_batch("windows", split.trues, logic)
    # (digest key, DigestWindow)
    requests = op.map("to_request", windows, ToRequest(catalog, clock))
    # Output(herald.requests.{class}, notification_id, notification_request dict)
    records = op.flat_map_batch("encode", requests, Encoder(settings, registry, JOB))
    # KafkaRecord | dead_letter dict
    encoded = op.branch("split_records", records, _is_record)
    dead_letters = op.merge(
        "dead_letters", *(cast(Stream[dict[str, Any]], s.falses) for s in (split, encoded))
    )
    # dead_letter dict
    letters = op.flat_map_batch("count_dead_letters", dead_letters, CountOutputs(JOB))
    # the same dead_letter dicts
    produce_with_dead_letters(
        "kafka_out", encoded.trues, letters, kafka=settings.kafka, registry=registry,
        sink=KafkaProducerSink(settings.kafka, parts=2),
    )  # fmt: skip
    return flow
