"""digest: social events -> one notification request per closed (recipient, type, object) window.

    herald.social-events (Avro social_event, key = recipient_id)
        -> decoded (dataflows/digest_decode.py), grouped per batch into SHARDS recipient shards
        -> per shard (herald/digest_shard.py): keyed by (recipient, catalog digest type,
           object), windows per herald.digest
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
(timer), so idle recipients cost nothing; an event after that opens a fresh state. A shard left
without keys is discarded too.

Throughput: Bytewax state is per shard, not per key, so the per-item costs of Bytewax (a call
into the key's logic, its timer, its snapshot each epoch) are paid per shard per batch; the
per-event path is one generated decoder call and one `DigestState.fold`, with times as epoch
milliseconds. A snapshot holds a shard's keys (only shards touched in the epoch are written).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, TypeGuard, cast
from zlib import crc32

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream

from dataflows._common import produce_with_dead_letters
from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._settings import Clock, PlanningSettings, entry_settings
from dataflows.digest_decode import Decoded, SocialEventDecoder
from herald.catalog import Catalog, load_catalog
from herald.config import HeraldSettings
from herald.digest import DigestWindow, from_ms, notification_request, to_ms
from herald.digest_shard import DigestShard, EventItem
from herald.errors import SerdeError
from herald.kafka_records import KafkaMessage
from herald.plan_records import Output
from herald.topics import SOCIAL_EVENTS
from schemas.registry import make_registry
from sinks.kafka import KafkaProducerSink, KafkaRecord
from sources.kafka import KafkaSource

__all__ = ["DigestLogic", "EventParser", "build_flow"]

log = logging.getLogger(__name__)

JOB = "digest"
EVENTS_TOPIC = SOCIAL_EVENTS
# Recipients are spread over this many shards (Bytewax state keys). Changing it moves keys
# between shards: a state migration, like renaming the `shard_windows` step.
SHARDS = 64


class EventParser:
    """A batch of raw records -> `(shard, [EventItem, ...])` groups, or dead letters.

    Decoding, validation, keying and sharding in one batch step: Bytewax then handles one
    item per shard per batch instead of one per event. A recipient's shard is a stable hash
    of its id (the same in every process), so all its keys live in one shard wherever the
    record was read. Reasons: the serde codes, and `unknown_event_type` for an event type no
    catalog digest handles.
    """

    def __init__(
        self,
        catalog: Catalog,
        decoder: Callable[[bytes | None], Decoded],
        shards: int = SHARDS,
    ) -> None:
        self.decoder = decoder
        self.types = {
            nt.digest.event_type: nt.name for nt in catalog.types.values() if nt.digest is not None
        }
        self.shards = shards
        self.names = [shard_name(i) for i in range(shards)]

    def __call__(
        self, batch: list[KafkaMessage]
    ) -> list[tuple[str, list[EventItem]] | dict[str, Any]]:
        out: list[tuple[str, list[EventItem]] | dict[str, Any]] = []
        groups: dict[int, list[EventItem]] = {}
        decode, types, shards = self.decoder, self.types, self.shards
        for msg in batch:
            try:
                event_id, kind, actor, name, recipient, obj, obj_type, at, tenant = decode(
                    msg.value
                )
            except SerdeError as exc:
                out.append(msg.dead_letter(exc.reason, exc.detail, JOB))
                continue
            type_name = types.get(kind)
            if type_name is None:
                log.warning("digest.unknown_event_type offset=%d", msg.offset)
                out.append(
                    msg.dead_letter("unknown_event_type", f"no digest type for {kind!r}", JOB)
                )
                continue
            item = (
                (recipient, type_name, obj or ""),
                event_id,
                actor,
                name or actor,
                at,
                tenant,
                obj_type,
            )
            shard = crc32(recipient.encode()) % shards
            group = groups.get(shard)
            if group is None:
                groups[shard] = [item]
            else:
                group.append(item)
        out.extend((self.names[shard], group) for shard, group in groups.items())
        return out


def shard_name(index: int) -> str:
    """The Bytewax state key of shard `index`."""
    return f"shard-{index:03d}"


class DigestLogic(op.StatefulBatchLogic[list[EventItem], DigestWindow, bytes]):
    """One shard of digest keys (herald.digest_shard): fold event groups, close on the timer."""

    def __init__(
        self, catalog: Catalog, clock: Clock, grace: float, ttl: float, resume: bytes | None
    ) -> None:
        self.clock = clock
        grace_ms, ttl_ms = round(grace * 1000), round(ttl * 1000)
        if resume is None:
            self.shard = DigestShard(catalog, grace_ms, ttl_ms)
        else:
            self.shard = DigestShard.restore(resume, catalog, grace_ms, ttl_ms)

    def on_batch(self, values: list[list[EventItem]]) -> tuple[list[DigestWindow], bool]:
        """Fold the groups in order (an event past its window's end closes it); the timer does
        the rest. The job clock is read once per batch: it only dates arrivals."""
        now = to_ms(self.clock.now())
        out: list[DigestWindow] = []
        for events in values:
            out.extend(self.shard.add(events, now))
        _log_closed(out)
        return out, op.StatefulBatchLogic.RETAIN

    def on_notify(self) -> tuple[list[DigestWindow], bool]:
        """The timer: close due windows, forget idle keys; an empty shard is discarded."""
        out = self.shard.close_due(to_ms(self.clock.now()))
        _log_closed(out)
        return out, len(self.shard) == 0

    def notify_at(self) -> datetime | None:
        """The shard's earliest timer (window end + grace, settling, or idle TTL)."""
        due = self.shard.next_due()
        return None if due is None else from_ms(due)

    def snapshot(self) -> bytes:
        """The shard's states, pickled now (later folds cannot leak into the snapshot)."""
        return self.shard.snapshot()


def _log_closed(windows: list[DigestWindow]) -> None:
    for window in windows:
        log.info(
            "digest.window_closed type=%s events=%d total=%d window_id=%s",
            window.key.notification_type, window.events, window.total, window.window_id,
        )  # fmt: skip


class ToRequest:
    """A closed window as an `Output` for herald.requests.{class of the digest type}."""

    def __init__(self, catalog: Catalog, clock: Clock) -> None:
        self.catalog = catalog
        self.clock = clock

    def __call__(self, item: tuple[str, DigestWindow]) -> Output:
        record = notification_request(item[1], self.catalog, self.clock.now())
        topic = f"herald.requests.{record['traffic_class']}"
        return Output(topic, record["notification_id"], record)


def _is_keyed(item: Any) -> TypeGuard[tuple[str, list[EventItem]]]:
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
    parser = EventParser(catalog, SocialEventDecoder(registry))
    parsed = op.flat_map_batch("parse", messages, parser)
    # (shard, [EventItem]) | dead_letter dict
    split = op.branch("split_events", parsed, _is_keyed)
    logic = partial(
        DigestLogic, catalog, clock, planning.digest_grace_seconds, planning.digest_idle_ttl_seconds
    )
    windows = op.stateful_batch("shard_windows", split.trues, logic)
    # (shard, DigestWindow)
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
        "kafka_out", encoded.trues, letters, settings=settings, registry=registry,
        sink=KafkaProducerSink(settings.kafka, parts=2),
    )  # fmt: skip
    return flow
