"""The receipts job's keyed state, as plain classes (no Bytewax): join, fold, timers, TTLs.

    MsgJoin         one provider message (key `provider|provider_msg_id`): which delivery and
                    generation it belongs to (from dispatch's PROVIDER_ACCEPTED event), and
                    receipts that came before that record, held until `hold_ttl`, then given up
                    as unmatched
    DeliveryFold    one delivery (key delivery_id): its context, current state folded through
                    herald.states, receipts already seen (idempotent append by
                    provider_event_id), premature engagement events, the observation timer
                    (DELIVERY_UNKNOWN), and receipts held until the delivery is known

Generations (DLQ replays, infra.dlq): the fold follows the latest generation of a delivery. An
event of a later one starts the delivery over from ACCEPTED (a replay may follow
FAILED_PERMANENT); events of an earlier one change nothing, and receipts answering an earlier
generation's send are kept as `stale` facts. Emitted events and status updates carry the
generation. State restored from a snapshot taken before generations existed is generation 0.

Every method takes `now` (tz-aware UTC) and returns what to emit; `next_at()` is the next time
the owner must call `on_timer(now)`; `expired(now)` says the state may be discarded. Outputs:

    Emit(event)             a new delivery_event (receipt-driven transition) for Kafka
    StatusUpdate            the delivery's new current state for the hot status (Redis)
    Fact(row)               one normalized receipt and what it did (ClickHouse receipt_events)
    Unmatched(event)        a receipt no delivery claimed within its TTL (kept, re-drivable)
    DeadAddress(...)        a receipt said the phone/email the delivery went to is dead
                            (herald.receipts.kills_address): disable that address
    LateFailure(...)        a receipt failed the delivery after the provider accepted it:
                            the type's fallback may follow (sinks/late_fallback.py)
    OptOut(...)             an unsubscribe or spam report (herald.receipts.opts_out): the
                            user opts out of marketing on that channel
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from herald import ids, states
from herald.receipts import ReceiptEvent, kills_address, opts_out
from herald.status_keys import StatusUpdate

__all__ = [
    "Context",
    "DeadAddress",
    "LateFailure",
    "OptOut",
    "DeliveryFold",
    "Emit",
    "Fact",
    "FoldConfig",
    "MsgJoin",
    "Output",
    "Unmatched",
    "event_generation",
    "fact_row",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# receipt_events.version: the most informative outcome of one provider event wins.
OUTCOME_RANK = {"unmatched": 0, "unmappable": 1, "duplicate": 2, "stale": 3, "premature": 4,
                "applied": 5}  # fmt: skip


@dataclass(frozen=True, slots=True)
class FoldConfig:
    """TTLs and observation windows (None window: the channel has no delivered signal)."""

    hold_ttl: timedelta = timedelta(hours=1)
    state_ttl: timedelta = timedelta(days=7)
    # Kept this long once nothing can change the state (SendGrid retries webhooks for 24 h).
    final_ttl: timedelta = timedelta(hours=24)
    windows: Mapping[str, timedelta | None] = field(
        default_factory=lambda: {
            c: caps.observation_window for c, caps in states.CAPABILITIES.items()
        }  # fmt: skip
    )


@dataclass(frozen=True, slots=True)
class Emit:
    """A delivery_event dict to append to herald.delivery-events."""

    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Fact:
    """A receipt_events row."""

    row: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A receipt that no delivery claimed in time."""

    event: ReceiptEvent


@dataclass(frozen=True, slots=True)
class DeadAddress:
    """Disable `user_id`'s address on `channel` if it still has the tag the message went to."""

    user_id: str
    channel: str
    address_tag: str
    reason: str


@dataclass(frozen=True, slots=True)
class LateFailure:
    """A receipt failed the delivery after its provider had accepted it (an SMS DLR
    "undelivered", an email bounce): its type's fallback may take over (sinks/late_fallback.py)."""

    delivery_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class OptOut:
    """Add `entry` ("marketing:email") to `user_id`'s category × channel opt-outs
    (herald.receipts.opts_out: an unsubscribe or a spam report; sinks/consent.py)."""

    user_id: str
    entry: str
    reason: str


Output = Emit | StatusUpdate | Fact | Unmatched | DeadAddress | LateFailure | OptOut


@dataclass(slots=True)
class Context:
    """What the delivery events told us about one delivery."""

    delivery_id: str
    notification_id: str
    user_id: str
    tenant_id: str
    notification_type: str
    channel: str
    traffic_class: str
    provider: str | None = None
    provider_msg_id: str | None = None
    attempt: int = 0
    accepted_at: datetime | None = None
    provider_accepted_at: datetime | None = None
    address_tag: str | None = None  # of the address the accepted attempt went to
    generation: int = 0  # DLQ replays of the delivery (the latest generation seen)
    traceparent: str | None = None  # herald/tracing.py

    @classmethod
    def of(cls, event: Mapping[str, Any]) -> Context:
        """The context of the delivery (generation) a delivery_event belongs to."""
        ctx = cls(
            delivery_id=str(event["delivery_id"]),
            notification_id=str(event["notification_id"]),
            user_id=str(event["user_id"]),
            tenant_id=str(event["tenant_id"]),
            notification_type=str(event["notification_type"]),
            channel=str(event["channel"]),
            traffic_class=str(event["traffic_class"]),
            generation=event_generation(event),
            traceparent=event.get("traceparent"),
        )
        ctx.learn(event)
        return ctx

    def learn(self, event: Mapping[str, Any]) -> None:
        """Take provider, message id, attempt and timings from a later event."""
        attempt = int(event.get("attempt") or 0)
        if event.get("traceparent") and not getattr(self, "traceparent", None):
            self.traceparent = event["traceparent"]
        if event.get("provider") and attempt >= self.attempt:
            self.provider = event["provider"]
            self.provider_msg_id = event.get("provider_msg_id") or self.provider_msg_id
        self.attempt = max(self.attempt, attempt)
        occurred: datetime = event["occurred_at"]
        if event.get("latency_ms") is not None and self.accepted_at is None:
            self.accepted_at = occurred - timedelta(milliseconds=int(event["latency_ms"]))
        if event.get("state") == states.State.PROVIDER_ACCEPTED:
            self.provider_accepted_at = occurred
            tag = (event.get("attributes") or {}).get("address_tag")
            self.address_tag = tag or getattr(self, "address_tag", None)


def event_generation(event: Mapping[str, Any]) -> int:
    """The generation of a delivery_event (0 when absent: before any replay)."""
    return int(event.get("generation") or 0)


def _generation(state: Context | MsgJoin) -> int:
    """Its generation; 0 for state restored from a snapshot taken before generations existed."""
    return int(getattr(state, "generation", 0))


def _answers(ev: ReceiptEvent) -> int | None:
    """The generation of the send a receipt answers (None: unknown, the delivery's latest)."""
    return getattr(ev, "generation", None)  # absent on receipts held in an older snapshot


def _ms(value: datetime) -> int:
    return (value - _EPOCH) // timedelta(milliseconds=1)


def fact_row(
    ev: ReceiptEvent, outcome: str, now: datetime, ctx: Context | None = None
) -> dict[str, Any]:
    """The receipt_events row of one receipt event (migration 0003)."""
    return {
        "provider_event_id": ev.provider_event_id, "provider": ev.provider,
        "receipt_id": ev.receipt_id, "provider_msg_id": ev.provider_msg_id,
        "delivery_id": ctx.delivery_id if ctx else "",
        "notification_id": ctx.notification_id if ctx else "",
        "tenant_id": ctx.tenant_id if ctx else "", "channel": ctx.channel if ctx else ev.channel,
        "status": ev.status, "state": ev.state or "", "reason": ev.reason, "outcome": outcome,
        "occurred_at": ev.occurred_at, "received_at": ev.received_at, "recorded_at": now,
        "attributes": dict(ev.attributes), "version": OUTCOME_RANK[outcome],
    }  # fmt: skip


@dataclass(slots=True)
class MsgJoin:
    """State of one `provider|provider_msg_id` key."""

    delivery_id: str | None = None
    mapped_until: datetime | None = None
    held: list[tuple[datetime, ReceiptEvent]] = field(default_factory=list)
    generation: int = 0  # of the send that got this message id

    def on_accepted(
        self, delivery_id: str, generation: int, now: datetime, cfg: FoldConfig
    ) -> list[tuple[str, ReceiptEvent]]:
        """Dispatch recorded this message: remember it, release held receipts (stamped with
        the send's generation)."""
        self.delivery_id, self.generation = delivery_id, generation
        self.mapped_until = now + cfg.state_ttl
        released = [(delivery_id, replace(ev, generation=generation)) for _d, ev in self.held]
        self.held.clear()
        return released

    def on_receipt(
        self, ev: ReceiptEvent, now: datetime, cfg: FoldConfig
    ) -> list[tuple[str, ReceiptEvent]]:
        """Route to the delivery when known, else hold until `now + hold_ttl`."""
        if self.delivery_id is not None:
            return [(self.delivery_id, replace(ev, generation=_generation(self)))]
        self.held.append((now + cfg.hold_ttl, ev))
        return []

    def on_timer(self, now: datetime) -> list[Unmatched]:
        """Give up on held receipts whose TTL passed."""
        gone = [Unmatched(ev) for deadline, ev in self.held if deadline <= now]
        self.held = [(d, ev) for d, ev in self.held if d > now]
        return gone

    def next_at(self) -> datetime | None:
        times = [d for d, _ in self.held]
        if self.mapped_until is not None:
            times.append(self.mapped_until)
        return min(times) if times else None

    def expired(self, now: datetime) -> bool:
        return not self.held and (self.mapped_until is None or self.mapped_until <= now)

    def snapshot(self) -> MsgJoin:
        """An independent copy for Bytewax recovery."""
        copied = copy.copy(self)
        copied.held = list(self.held)
        return copied


@dataclass(slots=True)
class DeliveryFold:
    """State of one delivery (see module docstring)."""

    ctx: Context | None = None
    state: states.State = states.State.ACCEPTED
    seen: set[str] = field(default_factory=set)
    pending: list[tuple[ReceiptEvent | None, dict[str, Any] | None]] = field(default_factory=list)
    held: list[tuple[datetime, ReceiptEvent]] = field(default_factory=list)
    watch_until: datetime | None = None  # end of the observation window (DELIVERY_UNKNOWN)
    idle_until: datetime | None = None

    # -- inputs ------------------------------------------------------------------------------

    def on_event(self, event: Mapping[str, Any], now: datetime, cfg: FoldConfig) -> list[Output]:
        """A delivery_event from the topic (any job, this one included); see the module doc
        for events of another generation."""
        out: list[Output] = []
        generation = event_generation(event)
        if self.ctx is not None and generation < _generation(self.ctx):
            return out
        if self.ctx is None or generation > _generation(self.ctx):
            self.ctx = Context.of(event)
            self.state, self.watch_until = states.State.ACCEPTED, None
            self.pending.clear()
        else:
            self.ctx.learn(event)
        self._apply(event["state"], None, dict(event), now, cfg, out)
        ready = [ev for _deadline, ev in self.held if not self._ahead(ev)]
        self.held = [(d, ev) for d, ev in self.held if self._ahead(ev)]
        for ev in ready:
            self._receipt(ev, now, cfg, out)
        self._touch(now, cfg)
        return out

    def on_receipt(self, ev: ReceiptEvent, now: datetime, cfg: FoldConfig) -> list[Output]:
        """A normalized receipt routed to this delivery; held until the delivery, or the
        generation of the send it answers, is known."""
        out: list[Output] = []
        if self.ctx is None or self._ahead(ev):
            self.held.append((now + cfg.hold_ttl, ev))
        else:
            self._receipt(ev, now, cfg, out)
            self._touch(now, cfg)
        return out

    def on_timer(self, now: datetime, cfg: FoldConfig) -> list[Output]:
        """Observation window over → DELIVERY_UNKNOWN; held receipts past their TTL → unmatched."""
        out: list[Output] = [Unmatched(ev) for d, ev in self.held if d <= now]
        self.held = [(d, ev) for d, ev in self.held if d > now]
        if self.watch_until is not None and self.watch_until <= now:
            self.watch_until = None
            if self.state is states.State.PROVIDER_ACCEPTED and self.ctx is not None:
                self._apply(states.State.DELIVERY_UNKNOWN, None, None, now, cfg, out)
        return out

    def next_at(self) -> datetime | None:
        times = [d for d, _ in self.held]
        for t in (self.watch_until, self.idle_until):
            if t is not None:
                times.append(t)
        return min(times) if times else None

    def expired(self, now: datetime) -> bool:
        """Idle past the state TTL with nothing held: the state may be discarded."""
        return not self.held and (self.idle_until is None or self.idle_until <= now)

    # -- folding -----------------------------------------------------------------------------

    def _touch(self, now: datetime, cfg: FoldConfig) -> None:
        """Keep the state `state_ttl` after its last event, `final_ttl` once it is terminal."""
        assert self.ctx is not None
        terminal = not states.TABLES.get(self.ctx.channel, {}).get(self.state)
        self.idle_until = now + (cfg.final_ttl if terminal and not self.pending else cfg.state_ttl)

    def _ahead(self, ev: ReceiptEvent) -> bool:
        """The receipt answers a send of a generation this fold has not seen yet."""
        sent = _answers(ev)
        return self.ctx is not None and sent is not None and sent > _generation(self.ctx)

    def _receipt(self, ev: ReceiptEvent, now: datetime, cfg: FoldConfig, out: list[Output]) -> None:
        if ev.provider_event_id in self.seen:
            return  # the same webhook again: appended once
        self.seen.add(ev.provider_event_id)
        sent = _answers(ev)
        assert self.ctx is not None
        before = self.state
        if sent is not None and sent < _generation(self.ctx):
            outcome = str(states.Outcome.STALE)  # answers a send a DLQ replay superseded
        else:
            outcome = self._apply(ev.state or "", ev, None, now, cfg, out)
        failed = states.State.FAILED_PERMANENT
        if self.state is failed and before is not failed:
            out.append(LateFailure(self.ctx.delivery_id, ev.reason or ev.status))
        out.append(Fact(fact_row(ev, outcome, now, self.ctx)))
        # a snapshot taken before Context had the field has no tag: nothing to compare with
        tag = getattr(self.ctx, "address_tag", None)
        if tag and ev.reason and kills_address(ev):
            assert self.ctx is not None
            out.append(DeadAddress(self.ctx.user_id, self.ctx.channel, tag, ev.reason))
        if ev.reason and opts_out(ev):
            out.append(OptOut(self.ctx.user_id, f"marketing:{self.ctx.channel}", ev.reason))

    def _apply(
        self, target: str, ev: ReceiptEvent | None, topic_event: dict[str, Any] | None,
        now: datetime, cfg: FoldConfig, out: list[Output],
    ) -> str:  # fmt: skip
        """Fold one event; on a change emit, then retry premature events. Returns the outcome."""
        assert self.ctx is not None
        result = states.transition(self.ctx.channel, self.state, target)
        if result.outcome is states.Outcome.PREMATURE:
            self.pending.append((ev, topic_event))
        if not result.changed:
            return str(result.outcome)
        self._enter(result.state, ev, topic_event, now, cfg, out)
        progressed = True
        while progressed and self.pending:
            progressed = False
            for item in list(self.pending):
                p_ev, p_topic = item
                p_target = (p_ev.state or "") if p_ev else str(p_topic["state"])  # type: ignore[index]
                retry = states.transition(self.ctx.channel, self.state, p_target)
                if retry.outcome is states.Outcome.PREMATURE:
                    continue
                self.pending.remove(item)  # the list shrinks: the loop ends
                progressed = True
                if retry.changed:
                    self._enter(retry.state, p_ev, p_topic, now, cfg, out)
                if p_ev is not None:
                    out.append(Fact(fact_row(p_ev, str(retry.outcome), now, self.ctx)))
                break
        return str(result.outcome)

    def _enter(
        self, new: states.State, ev: ReceiptEvent | None, topic_event: dict[str, Any] | None,
        now: datetime, cfg: FoldConfig, out: list[Output],
    ) -> None:  # fmt: skip
        """Record the new state: emit its event (unless it came from the topic) and status."""
        ctx = self.ctx
        assert ctx is not None
        self.state = new
        if new is states.State.PROVIDER_ACCEPTED:
            window = cfg.windows.get(ctx.channel)
            started = ctx.provider_accepted_at or now
            self.watch_until = started + window if window is not None else None
        if topic_event is not None:
            reason, provider = topic_event.get("reason"), topic_event.get("provider")
            updated: datetime = topic_event["occurred_at"]
        else:
            event = self._event(new, ev, now)
            out.append(Emit(event))
            reason, provider, updated = event["reason"], event["provider"], event["occurred_at"]
        out.append(StatusUpdate(
            ctx.notification_id, ctx.delivery_id, str(new), ctx.channel, ctx.user_id, updated,
            reason, provider or ctx.provider, _generation(ctx),
        ))  # fmt: skip

    def _event(self, new: states.State, ev: ReceiptEvent | None, now: datetime) -> dict[str, Any]:
        """The delivery_event of a transition this job decided (receipt or observation timer)."""
        ctx = self.ctx
        assert ctx is not None
        occurred = ev.occurred_at if ev is not None else now
        attributes = {"source": "receipts"}
        if ev is not None:
            attributes.update(ev.attributes)
            attributes.update(raw_receipt_id=ev.receipt_id, provider_event_id=ev.provider_event_id)
        else:
            attributes["window_s"] = str(
                int((now - (ctx.provider_accepted_at or now)).total_seconds())
            )
        if ctx.provider_accepted_at is not None:
            since = max(0, _ms(occurred) - _ms(ctx.provider_accepted_at))
            attributes["provider_latency_ms"] = str(since)
        latency = None
        if ctx.accepted_at is not None:
            latency = max(0, _ms(occurred) - _ms(ctx.accepted_at))
        reason = ev.reason if ev is not None else "no_receipt_in_window"
        generation = _generation(ctx)
        return {
            "event_id": ids.event_id(ctx.delivery_id, str(new), ctx.attempt, "", generation),
            "delivery_id": ctx.delivery_id, "notification_id": ctx.notification_id,
            "user_id": ctx.user_id, "tenant_id": ctx.tenant_id,
            "notification_type": ctx.notification_type, "channel": ctx.channel,
            "traffic_class": ctx.traffic_class, "state": str(new), "reason": reason,
            "provider": (ev.provider if ev is not None else None) or ctx.provider,
            "provider_msg_id": (ev.provider_msg_id if ev is not None else None)
            or ctx.provider_msg_id,
            "attempt": ctx.attempt, "latency_ms": latency, "occurred_at": occurred,
            "recorded_at": now, "attributes": attributes, "generation": generation,
            "traceparent": getattr(ctx, "traceparent", None),  # None in an older snapshot's
        }  # fmt: skip

    def snapshot(self) -> DeliveryFold:
        """An independent copy for Bytewax recovery (copy, not dataclasses.replace: a context
        restored from an older snapshot may lack a field added since)."""
        ctx = copy.copy(self.ctx)
        return DeliveryFold(ctx, self.state, set(self.seen), list(self.pending), list(self.held),
                            self.watch_until, self.idle_until)  # fmt: skip
