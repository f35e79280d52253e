"""receipts: provider receipts → delivery state that never goes backwards.

    herald.receipts.raw (raw_receipt)  -> normalize per provider (herald.receipts; each
        provider's format in its folder, sinks/providers/<vendor>/receipts.py)
        hinted (delivery id in payload) ─────────────────────────────┐
        by provider_msg_id -> join_msg_id (MsgJoin: held until the   │
            PROVIDER_ACCEPTED record names the delivery, TTL)        ├─> fold_delivery
    herald.delivery-events (every job's events, this one's too) ─────┘   (DeliveryFold, key
        (a push's events: hot status only, no fold state, `_STATUS_ONLY`;   delivery_id)
         those dispatch marks superseded are dropped unread)
    fold_delivery -> new delivery_events (DELIVERED, READ, OPENED, CLICKED, FAILED_PERMANENT,
                     DELIVERY_UNKNOWN ...) -> herald.delivery-events
                  -> hot status, compare-and-set in Redis (herald.status_keys)
                  -> dead addresses (hard bounce, carrier "dead number") -> the phone or
                     email disabled in the user's contact points (sinks/addresses.py)
                  -> opt-outs (email unsubscribe, spam report) -> `marketing:email` added to the
                     user's preferences (sinks/consent.py)
                  -> late failures (a receipt failed an accepted delivery) -> the type's
                     fallback, as dispatch runs it at send time (sinks/late_fallback.py)
                  -> every receipt event with its outcome -> ClickHouse receipt_events
                  -> receipts no delivery claimed within the TTL -> herald.dead-letters
                     (reason receipt_unmatched; `herald replay` re-drives them)
    unparseable raw receipts -> herald.dead-letters; the job keeps going

Run: `python -m bytewax.run "dataflows.receipts:build_flow()"` (HERALD_* env; tuning in
HERALD_RECEIPTS_*; /metrics on HERALD_METRICS_PORT when set).

At-least-once everywhere: emitted events have deterministic ids (`ids.event_id(delivery_id,
state, attempt, "", generation)`), receipt rows dedupe on provider_event_id, Redis writes are
compare-and-set. A receipt joined by message id belongs to the generation (DLQ replays) of the
PROVIDER_ACCEPTED event that named the message (herald.delivery_fold).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulLogic
from pydantic_settings import BaseSettings, SettingsConfigDict

from dataflows._common import produce_with_dead_letters
from dataflows._runtime import configure_process
from herald.config import HeraldSettings
from herald.dead_letters import dead_letter
from herald.delivery_fold import (
    DeadAddress,
    DeliveryFold,
    Emit,
    Fact,
    FoldConfig,
    LateFailure,
    MsgJoin,
    OptOut,
    Unmatched,
    event_generation,
)
from herald.kafka_records import SUPERSEDED, Decoded, KafkaMessage
from herald.metrics import JobMetrics
from herald.receipts import (
    BadReceipt,
    ReceiptEvent,
    join_key,
    joins_by_message_id,
    normalize,
)
from herald.status_keys import StatusUpdate
from herald.topics import DELIVERY_EVENTS, RECEIPTS_RAW
from schemas.registry import make_registry
from sinks.addresses import AddressSink
from sinks.clickhouse import ClickHouseSink
from sinks.consent import ConsentSink
from sinks.kafka import encode_avro, topic_serializer
from sinks.late_fallback import LateFallbackSink
from sinks.provider_registry import register_receipt_formats
from sinks.redis_status import StatusSink
from sources.kafka import kafka_avro_input

JOB = "receipts"
RAW_TOPIC = RECEIPTS_RAW
EVENTS_TOPIC = DELIVERY_EVENTS
FACTS_TABLE = "receipt_events"
FACT_COLUMNS = (
    "provider_event_id", "provider", "receipt_id", "provider_msg_id", "delivery_id",
    "notification_id", "tenant_id", "channel", "status", "state", "reason", "outcome",
    "occurred_at", "received_at", "recorded_at", "attributes", "version",
)  # fmt: skip

log = logging.getLogger(__name__)


class ReceiptsSettings(BaseSettings):
    """Tuning of the receipts job (env HERALD_RECEIPTS_*)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_RECEIPTS_")

    hold_ttl_s: float = 3600.0  # a receipt waits this long for its send record
    state_ttl_s: float = 7 * 86400.0  # per-delivery state kept this long after its last event
    final_ttl_s: float = 86400.0  # ... and this long once its state can no longer change
    # Per-channel observation window overrides in seconds, e.g. {"sms": 259200}.
    observation_windows_s: dict[str, float] = {}

    def fold_config(self) -> FoldConfig:
        base = FoldConfig()
        windows = dict(base.windows)
        windows.update({c: timedelta(seconds=s) for c, s in self.observation_windows_s.items()})
        return FoldConfig(
            hold_ttl=timedelta(seconds=self.hold_ttl_s),
            state_ttl=timedelta(seconds=self.state_ttl_s),
            final_ttl=timedelta(seconds=self.final_ttl_s),
            windows=windows,
        )


def _now() -> datetime:
    return datetime.now(UTC)


class _JoinLogic(StatefulLogic[tuple[str, Any], Any, MsgJoin]):
    """Bytewax adapter of `MsgJoin`; items ("pa", (delivery_id, generation)) | ("rc",
    ReceiptEvent)."""

    def __init__(self, cfg: FoldConfig, state: MsgJoin | None) -> None:
        self.cfg = cfg
        self.state = state or MsgJoin()

    def on_item(self, value: tuple[str, Any]) -> tuple[list[Any], bool]:
        kind, item = value
        now = _now()
        if kind == "pa":
            delivery_id, generation = item
            out = self.state.on_accepted(delivery_id, generation, now, self.cfg)
        else:
            out = self.state.on_receipt(item, now, self.cfg)
        return [("route", d, ev) for d, ev in out], self.RETAIN

    def on_notify(self) -> tuple[list[Any], bool]:
        now = _now()
        gone = self.state.on_timer(now)
        return [("unmatched", u) for u in gone], self.state.expired(now)

    def notify_at(self) -> datetime | None:
        return self.state.next_at()

    def snapshot(self) -> MsgJoin:
        return self.state.snapshot()


class _FoldLogic(StatefulLogic[tuple[str, Any], Any, DeliveryFold]):
    """Bytewax adapter of `DeliveryFold`; items ("ev", delivery_event) | ("rc", ReceiptEvent)."""

    def __init__(self, cfg: FoldConfig, state: DeliveryFold | None) -> None:
        self.cfg = cfg
        self.state = state or DeliveryFold()

    def on_item(self, value: tuple[str, Any]) -> tuple[list[Any], bool]:
        kind, item = value
        if kind == "ev":
            return self.state.on_event(item, _now(), self.cfg), self.RETAIN
        return self.state.on_receipt(item, _now(), self.cfg), self.RETAIN

    def on_notify(self) -> tuple[list[Any], bool]:
        now = _now()
        out = self.state.on_timer(now, self.cfg)
        return out, self.state.expired(now)

    def notify_at(self) -> datetime | None:
        return self.state.next_at()

    def snapshot(self) -> DeliveryFold:
        return self.state.snapshot()


class _Normalizer:
    """Decoded raw receipt -> list of ReceiptEvent | dead-letter dict (counted)."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics

    def __call__(self, decoded: Decoded) -> list[Any]:
        msg = decoded.message
        try:
            events = normalize(decoded.value)
        except BadReceipt as exc:
            log.warning("receipts.unparseable provider=%s reason=%s offset=%d",
                        decoded.value.get("provider"), exc.reason, msg.offset)  # fmt: skip
            self.metrics.dead_letter(exc.reason)
            return [msg.dead_letter(exc.reason, exc.detail, JOB)]
        except Exception as exc:  # noqa: BLE001 - no receipt may stop the job (a parser's bug)
            log.exception("receipts.normalize_failed provider=%s offset=%d",
                          decoded.value.get("provider"), msg.offset)  # fmt: skip
            self.metrics.dead_letter("normalize_failed")
            detail = f"{type(exc).__name__}: {exc}"[:500]
            return [msg.dead_letter("normalize_failed", detail, JOB)]
        ref = f"{msg.topic}/{msg.partition}/{msg.offset}"
        return [_with_ref(ev, ref) for ev in events]


def _with_ref(ev: ReceiptEvent, ref: str) -> ReceiptEvent:
    from dataclasses import replace

    return replace(ev, attributes={**ev.attributes, "raw_ref": ref})


def _route(ev: ReceiptEvent) -> tuple[str, str]:
    """("hint", delivery_id) | ("msg", join key) | ("none", "")."""
    if ev.delivery_hint:
        return "hint", ev.delivery_hint
    if ev.provider_msg_id:
        return "msg", join_key(ev.provider, ev.provider_msg_id)
    return "none", ""


class _Unmatcher:
    """An unmatched receipt -> its dead letter (the event's own raw_receipt, re-drivable)."""

    def __init__(self, settings: HeraldSettings, metrics: JobMetrics) -> None:
        registry = make_registry(settings.registry)
        self.serializer = topic_serializer(settings.kafka, registry, RAW_TOPIC)
        self.topic = settings.kafka.topic(RAW_TOPIC)
        self.metrics = metrics

    def __call__(self, ev: ReceiptEvent) -> dict[str, Any]:
        self.metrics.receipt(ev.provider, "unmatched")
        log.info("receipts.unmatched provider=%s provider_event_id=%s",
                 ev.provider, ev.provider_event_id)  # fmt: skip
        value = self.serializer({
            "receipt_id": ev.receipt_id, "provider": ev.provider, "received_at": ev.received_at,
            "content_type": ev.content_type, "headers": dict(ev.headers), "body": ev.payload,
            "signature_valid": True, "remote_addr": None,
        })  # fmt: skip
        return dead_letter(
            source_topic=self.topic, reason="receipt_unmatched", job=JOB, key=ev.provider,
            value=value, detail=f"no delivery for {ev.provider} message within the hold TTL",
            delivery_id=ev.delivery_hint,
        )  # fmt: skip


def _count(metrics: JobMetrics):  # type: ignore[no-untyped-def]
    def inspect(_step: str, item: Any) -> None:
        if isinstance(item, Emit):
            metrics.event(item.event["state"])
        elif isinstance(item, Fact):
            metrics.receipt(item.row["provider"], item.row["outcome"])

    return inspect


def build_flow(
    settings: HeraldSettings | None = None,
    *,
    bounded: bool = False,
    receipts: ReceiptsSettings | None = None,
) -> Dataflow:
    """The receipts job. Without `settings` (entry point) it reads the environment, configures
    logging and serves /metrics when HERALD_METRICS_PORT is set.

    `bounded=True` stops at the current end of both input topics (tests, backfills).
    """
    if settings is None:
        configure_process()
        settings = HeraldSettings()
    cfg = (receipts or ReceiptsSettings()).fold_config()
    register_receipt_formats()  # they live in their providers' folders
    metrics = JobMetrics(JOB)
    registry = make_registry(settings.registry)
    kafka = settings.kafka
    flow = Dataflow(JOB)

    raw = kafka_avro_input(
        "receipts_in", flow, settings=settings, topics=(RAW_TOPIC,), registry=registry,
        reader_schema="raw_receipt", job=JOB, stop_at_end=bounded,
    )  # fmt: skip
    # oks: Decoded(raw_receipt); errs: dead_letter dict
    normalized = op.flat_map("normalize", raw.oks, _Normalizer(metrics))
    # ReceiptEvent | dead_letter dict
    parsed = op.branch("parsed", normalized, lambda x: isinstance(x, ReceiptEvent))
    routed = op.map("route", parsed.trues, lambda ev: (_route(ev), ev))
    # ((route kind, key), ReceiptEvent)
    hinted = op.filter("hinted", routed, lambda r: r[0][0] == "hint")
    by_msg = op.filter("by_msg_id", routed, lambda r: r[0][0] == "msg")
    keyless = op.filter_map("keyless", routed, lambda r: r[1] if r[0][0] == "none" else None)
    # ReceiptEvent without delivery hint nor message id: unmatched at once

    events_in = kafka_avro_input(
        "events_in", flow, settings=settings, topics=(EVENTS_TOPIC,), registry=registry,
        reader_schema="delivery_event", job=JOB, stop_at_end=bounded, skip=_superseded,
    )  # fmt: skip
    delivery_level = op.filter_map(
        "delivery_level", events_in.oks, lambda d: d.value if d.value["channel"] else None
    )
    # delivery_event dict of one delivery (request-level ACCEPTED events skipped)
    unfolded = op.branch("unfolded", delivery_level, _status_only)
    events = unfolded.falses
    # delivery_event dict the fold needs
    passing = op.map("passing_status", unfolded.trues, _passing_status)
    # StatusUpdate of a push delivery on its way to the provider (no fold state)
    accepted = op.filter_map("provider_accepted", events, _accepted_key)
    # (join key, ("pa", (delivery_id, generation)))
    receipts_by_msg = op.map("tag_by_msg", by_msg, lambda r: (r[0][1], ("rc", r[1])))
    joined = op.stateful(
        "join_msg_id", op.merge("join_in", accepted, receipts_by_msg),
        lambda state: _JoinLogic(cfg, state),
    )  # fmt: skip
    # (join key, ("route", delivery_id, ReceiptEvent) | ("unmatched", Unmatched))
    join_out = op.branch("join_routed", op.key_rm("join_unkey", joined), lambda x: x[0] == "route")
    receipts_joined = op.map("tag_joined", join_out.trues, lambda x: (x[1], ("rc", x[2])))
    receipts_hinted = op.map("tag_hinted", hinted, lambda r: (r[0][1], ("rc", r[1])))
    events_keyed = op.map("tag_events", events, lambda e: (e["delivery_id"], ("ev", e)))
    folded = op.stateful(
        "fold_delivery",
        op.merge("fold_in", events_keyed, receipts_hinted, receipts_joined),
        lambda state: _FoldLogic(cfg, state),
    )  # fmt: skip
    # (delivery_id, Emit | StatusUpdate | Fact | Unmatched | DeadAddress | LateFailure | OptOut)
    outputs = op.key_rm("fold_unkey", folded)
    op.inspect("count", outputs, _count(metrics))

    emitted = op.filter_map("emitted", outputs, lambda o: o.event if isinstance(o, Emit) else None)
    encoded = encode_avro(
        "encode_events", emitted, serializer=topic_serializer(kafka, registry, EVENTS_TOPIC),
        topic=kafka.topic(EVENTS_TOPIC), key=lambda e: str(e["delivery_id"]), job=JOB,
    )  # fmt: skip
    statuses = op.filter("statuses", outputs, lambda o: isinstance(o, StatusUpdate))
    op.output("status_out", op.merge("all_statuses", passing, statuses), StatusSink(settings.redis))
    dead_addresses = op.filter("dead_addresses", outputs, lambda o: isinstance(o, DeadAddress))
    op.output("addresses_out", dead_addresses, AddressSink(settings))
    opt_outs = op.filter("opt_outs", outputs, lambda o: isinstance(o, OptOut))
    op.output("consent_out", opt_outs, ConsentSink(settings))
    late = op.filter("late_failures", outputs, lambda o: isinstance(o, LateFailure))
    op.output("late_fallback_out", late, LateFallbackSink(settings))
    facts = op.filter_map("facts", outputs, lambda o: o.row if isinstance(o, Fact) else None)

    unmatched = op.merge(
        "unmatched",
        keyless,
        op.map("join_unmatched", join_out.falses, lambda x: x[1].event),
        op.filter_map(
            "fold_unmatched", outputs, lambda o: o.event if isinstance(o, Unmatched) else None
        ),  # fmt: skip
    )
    # ReceiptEvent nobody claimed
    unmatched_rows = op.map("unmatched_rows", unmatched, _unmatched_row)
    op.output("facts_out", op.merge("all_facts", facts, unmatched_rows),
              ClickHouseSink(settings.clickhouse, FACTS_TABLE, FACT_COLUMNS))  # fmt: skip
    letters = op.map("unmatched_letters", unmatched, _Unmatcher(settings, metrics))
    dead = op.merge("dead_letters", raw.errs, parsed.falses, events_in.errs, encoded.errs, letters)
    # dead_letter dict
    produce_with_dead_letters("kafka_out", encoded.oks, dead, settings=settings, registry=registry)
    return flow


# Channels whose deliveries hold no fold state: every event of theirs only moves the hot
# status. A push gets no provider receipt: APNs and FCM answer the send, which dispatch records,
# and the app reports an open through the push's signed `herald_opened` URL (POST /t/p/{token},
# api/routes/tracking.py), which records READ on the topic with the delivery's whole context.
# So the fold has nothing to join, hold or emit for a push; its events are written as they are
# (the compare-and-set in Redis keeps the order and the generations, and an open that arrives
# before the send's answer stays, herald.status_keys `status_sources`). The job then keeps no
# state per push sent: before, it kept one for days per delivery from the provider's answer
# on, and its timers and snapshots cost a little of a core per million deliveries sent, for as
# long as they were kept.
_STATUS_ONLY = frozenset({"push"})


# ... and of their events, those dispatch marks superseded (herald/kafka_records.py: produced
# with a later event of the delivery that takes the hot status from wherever they would, such as
# a push's SENDING with its PROVIDER_ACCEPTED) are dropped unread: a third of a push campaign's
# events, which would only have written a status overwritten within the same batch.
_SKIPPED = tuple(f"{channel}/".encode() for channel in sorted(_STATUS_ONLY))


def _superseded(message: KafkaMessage) -> bool:
    if message.headers is None:
        return False
    marked = message.header(SUPERSEDED)
    return marked is not None and marked.startswith(_SKIPPED)


def _status_only(event: dict[str, Any]) -> bool:
    return event["channel"] in _STATUS_ONLY


def _passing_status(event: dict[str, Any]) -> StatusUpdate:
    """The hot status of an event the fold skips, as the fold writes it for a topic event."""
    return StatusUpdate(
        event["notification_id"], event["delivery_id"], event["state"], event["channel"],
        event["user_id"], event["occurred_at"], event.get("reason"), event.get("provider"),
        event_generation(event),
    )  # fmt: skip


def _accepted_key(event: dict[str, Any]) -> tuple[str, tuple[str, tuple[str, int]]] | None:
    if event["state"] != "PROVIDER_ACCEPTED" or not joins_by_message_id(
        event.get("provider") or ""
    ):
        return None  # push (no receipts), inbox and app (receipts name the delivery): no join
    if not event.get("provider_msg_id"):
        return None
    sent = (event["delivery_id"], event_generation(event))
    return join_key(event["provider"], event["provider_msg_id"]), ("pa", sent)


def _unmatched_row(ev: ReceiptEvent) -> dict[str, Any]:
    from herald.delivery_fold import fact_row

    return fact_row(ev, "unmatched", _now())
