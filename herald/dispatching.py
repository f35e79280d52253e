"""One dispatch attempt, decided without I/O: re-checks, attempt context, action → effects.

The dispatch engine (sinks/dispatch/) runs each delivery of a batch through

    guard (herald.guard) → re-checks (`recheck`: expiry, opt-out) → breaker (herald.breaker)
    → shaping (herald.shaping) → provider call (sinks/providers) → `herald.retry.decide`
    → `effects(...)`: the events to emit, what to do with the send guard, the record for the
    retry topic or the dead-letter topic, a device token to remove, a provider to pause, or a
    provider to fail over to now

and carries the effects out. Everything here is pure and works on `delivery` dicts shaped like
schemas/delivery.avsc; timestamps may be aware datetimes or epoch milliseconds (the dispatch job
decodes them as milliseconds, `instant` reads both).

Event ids are deterministic (`herald.ids.event_id(delivery_id, state, attempt, reason,
generation)`), so a batch processed again after a crash emits the same ids and consumers
deduplicate. `attempt` is the 1-based number of the provider attempt an event belongs to;
`Delivery.attempt` counts the attempts already made; `Delivery.generation` (DLQ replays) is
copied into every event and every record made from the delivery. A retry's record carries the
provider it will use and the fallback steps left, so a delivery that failed over to sms_b
retries on sms_b and never fails over twice.

The guard value of a sent delivery stores `"<provider>|<attempt>|<provider_msg_id>"`
(`sent_marker`), so a redelivered record that finds SENT re-emits the exact PROVIDER_ACCEPTED
event that a crash may have lost (`parse_sent_marker`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from herald import ids
from herald.backoff import BackoffPolicy
from herald.outcomes import Outcome
from herald.policy import Preferences
from herald.providers import DEFAULT_PROVIDER
from herald.receipts import address_tag
from herald.retry import (
    Action,
    AttemptContext,
    Done,
    Expire,
    Failover,
    FailPermanent,
    MarkUnknown,
    PausePlatform,
    Retry,
    RetryPolicy,
    TokenCleanup,
    UnknownPolicy,
)
from herald.states import State

__all__ = [
    "Effects",
    "GuardOp",
    "Skip",
    "alternates",
    "attempt_context",
    "due_at",
    "effects",
    "event",
    "instant",
    "opt_out_reason",
    "parse_sent_marker",
    "provider_of",
    "recheck",
    "requeued",
    "retried",
    "retry_policy",
    "sent_marker",
]

GuardOp = Literal["sent", "release", "unknown", "keep"]


def instant(value: Any) -> datetime | None:
    """A delivery timestamp as an aware datetime (fastavro's datetime, or epoch milliseconds)."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def provider_of(delivery: Mapping[str, Any], defaults: Mapping[str, str] = DEFAULT_PROVIDER) -> str:
    """The provider to call: the delivery's, else its push platform, else the channel default."""
    chosen = delivery.get("provider") or (
        delivery.get("platform") if delivery["channel"] == "push" else None
    )
    if chosen:
        return str(chosen)
    try:
        return defaults[delivery["channel"]]
    except KeyError:
        raise ValueError(f"no provider for channel {delivery['channel']!r}") from None


def alternates(delivery: Mapping[str, Any]) -> tuple[str, ...]:
    """Providers of the same channel the delivery may fail over to (`channel:provider` steps).

    Steps naming another channel (`push` after `sms`) are channel fallbacks, decided at plan
    time; dispatch only fails over between providers of the delivery's own channel.
    """
    channel = delivery["channel"]
    out: list[str] = []
    for step in delivery.get("fallback") or ():
        target, _, provider = str(step).partition(":")
        if target == channel and provider and provider not in out:
            out.append(provider)
    return tuple(out)


def due_at(delivery: Mapping[str, Any]) -> datetime | None:
    """When the delivery may be attempted: the later of `not_before` and `next_attempt_at`."""
    times = [t for t in (instant(delivery.get(k)) for k in ("not_before", "next_attempt_at")) if t]
    return max(times) if times else None


@dataclass(frozen=True, slots=True)
class Skip:
    """Do not call the provider: terminal `state` with a machine-readable `reason`."""

    state: State
    reason: str


def opt_out_reason(prefs: Preferences, category: str, channel: str) -> str | None:
    """The user's opt-out that covers this category × channel (herald.policy's reasons)."""
    if prefs.global_opt_out:
        return "global_opt_out"
    if category in prefs.category_opt_out:
        return "category_opt_out"
    if (
        channel in prefs.channel_opt_out
        or f"{category}:{channel}" in prefs.category_channel_opt_out
    ):
        return "channel_opt_out"
    return None


def recheck(
    delivery: Mapping[str, Any],
    now: datetime,
    prefs: Preferences | None,
    bypass_opt_out: bool,
) -> Skip | None:
    """Just before sending: expired → EXPIRED; opted out since planning → SUPPRESSED."""
    expire_at = instant(delivery.get("expire_at"))
    if expire_at is not None and now >= expire_at:
        return Skip(State.EXPIRED, "expired")
    if prefs is not None and not bypass_opt_out:
        reason = opt_out_reason(prefs, delivery["category"], delivery["channel"])
        if reason is not None:
            return Skip(State.SUPPRESSED, reason)
    return None


def retry_policy(
    backoff: BackoffPolicy, *, failover_on_unknown: bool, platform_pause_s: float
) -> RetryPolicy:
    """The retry rules of one delivery: its class's backoff and its type's unknown rule."""
    on_unknown = UnknownPolicy.FAILOVER if failover_on_unknown else UnknownPolicy.RECONCILE
    return RetryPolicy(backoff=backoff, on_unknown=on_unknown, platform_pause_s=platform_pause_s)


def attempt_context(
    delivery: Mapping[str, Any],
    provider: str,
    attempt: int,
    now: datetime,
    *,
    rejected_by: frozenset[str] = frozenset(),
    open_breakers: frozenset[str] = frozenset(),
    first_attempt_at: datetime | None | Literal["delivery"] = "delivery",
) -> AttemptContext:
    """`herald.retry.AttemptContext` of attempt `attempt` through `provider`; the delivery's
    own `first_attempt_at` unless one is given (the sink's, once its first call is made)."""
    if first_attempt_at == "delivery":
        first_attempt_at = instant(delivery.get("first_attempt_at"))
    return AttemptContext(
        provider=provider,
        attempt=attempt,
        now=now,
        first_attempt_at=first_attempt_at,
        expire_at=instant(delivery.get("expire_at")),
        alternates=alternates(delivery),
        rejected_by=rejected_by,
        open_breakers=open_breakers,
    )


def event(
    delivery: Mapping[str, Any],
    state: State | str,
    *,
    attempt: int,
    now: datetime,
    provider: str | None = None,
    reason: str | None = None,
    provider_msg_id: str | None = None,
    latency_ms: int | None = None,
    attributes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A delivery_event record of the delivery's generation (DLQ replays, infra.dlq); its id
    is `event_id(delivery_id, state, attempt, reason, generation)`."""
    name = str(state)
    generation = int(delivery.get("generation") or 0)
    return {
        "event_id": ids.event_id(delivery["delivery_id"], name, attempt, reason or "", generation),
        "delivery_id": delivery["delivery_id"],
        "notification_id": delivery["notification_id"],
        "user_id": delivery["user_id"],
        "tenant_id": delivery["tenant_id"],
        "notification_type": delivery["notification_type"],
        "channel": delivery["channel"],
        "traffic_class": delivery["traffic_class"],
        "state": name,
        "reason": reason,
        "provider": provider,
        "provider_msg_id": provider_msg_id,
        "attempt": attempt,
        "latency_ms": latency_ms,
        "occurred_at": now,
        "recorded_at": now,
        "attributes": dict(attributes or {}),
        "generation": generation,
        "traceparent": delivery.get("traceparent"),
    }


def sent_marker(provider: str, attempt: int, provider_msg_id: str) -> str:
    """What the guard stores as SENT's provider_msg_id (see the module docstring)."""
    return f"{provider}|{attempt}|{provider_msg_id}"


def parse_sent_marker(marker: str | None) -> tuple[str | None, int, str | None]:
    """(provider, attempt, provider_msg_id) of a `sent_marker`; (None, 0, marker) otherwise."""
    if not marker:
        return None, 0, None
    parts = marker.split("|", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0] or None, int(parts[1]), parts[2] or None
    return None, 0, marker


def retried(
    delivery: Mapping[str, Any],
    *,
    at: datetime,
    provider: str,
    attempts_made: int,
    first_attempt_at: datetime | None,
) -> dict[str, Any]:
    """The delivery as written to herald.retry.{class}: due at `at`, on `provider`.

    `attempts_made` becomes `attempt`; the fallback steps up to `provider` are consumed.
    """
    steps = list(delivery.get("fallback") or ())
    own = f"{delivery['channel']}:{provider}"
    if own in steps:
        steps = steps[steps.index(own) + 1 :]
    return {
        **delivery,
        "provider": provider,
        "attempt": attempts_made,
        "next_attempt_at": at,
        "first_attempt_at": first_attempt_at or instant(delivery.get("first_attempt_at")),
        "fallback": steps,
    }


def requeued(delivery: Mapping[str, Any], at: datetime) -> dict[str, Any]:
    """The delivery unchanged but due at `at` (no attempt was made: in flight, shaped, held)."""
    return {**delivery, "next_attempt_at": at}


@dataclass
class Effects:
    """What the sink must do after one decided attempt (see `effects`).

    `events` in order; `guard` what to do with this delivery's send guard; `retry` the record
    for the retry topic, or, when `dead_letter` (the reason) is set, the dead letter's value
    (replayable by infra.dlq); `cleanup_token`
    remove the address from the user's contact points; `pause` (provider, reason, seconds) to
    trip the breaker; `failover_to` send again now through that provider (attempt + 1).
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    guard: GuardOp = "keep"
    retry: dict[str, Any] | None = None
    dead_letter: str | None = None
    cleanup_token: bool = False
    pause: tuple[str, str, float] | None = None
    failover_to: str | None = None


def effects(
    action: Action,
    delivery: Mapping[str, Any],
    outcome: Outcome | None,
    *,
    provider: str,
    attempt: int,
    now: datetime,
    first_attempt_at: datetime | None,
    pii_key: bytes,
) -> Effects:
    """Map a `herald.retry` action of attempt `attempt` (None outcome: breaker refused it);
    `pii_key` keys the address tag of an accepted SMS or email (herald.receipts)."""
    ev = _EventMaker(delivery, attempt, now, provider, outcome, pii_key)
    if isinstance(action, Done):
        return Effects([ev.accepted(action.provider_msg_id)], guard="sent")
    if isinstance(action, Expire):
        return Effects([ev.make(State.EXPIRED, action.reason)], guard="release")
    if isinstance(action, TokenCleanup):
        return Effects(
            [ev.make(State.FAILED_PERMANENT, action.reason)], guard="release", cleanup_token=True
        )
    if isinstance(action, FailPermanent):
        fx = Effects([ev.make(State.FAILED_PERMANENT, action.reason)], guard="release")
        if action.dead_letter:
            fx.dead_letter = action.reason
            fx.retry = retried(delivery, at=now, provider=provider, attempts_made=attempt,
                               first_attempt_at=first_attempt_at)  # fmt: skip
        return fx
    if isinstance(action, Failover):
        return Effects(
            [ev.make(State.RETRY_SCHEDULED, f"failover:{action.reason}", to=action.to_provider)],
            guard="keep", failover_to=action.to_provider,
        )  # fmt: skip
    if isinstance(action, PausePlatform):
        return _paused(action, delivery, ev, outcome, attempt, first_attempt_at)
    if isinstance(action, MarkUnknown):
        return _unknown(action, delivery, ev, provider, attempt, first_attempt_at)
    return _retry(action, delivery, ev, provider, attempt, first_attempt_at)


class _EventMaker:
    """Events of one attempt (same delivery, attempt, provider, outcome facts)."""

    def __init__(
        self,
        delivery: Mapping[str, Any],
        attempt: int,
        now: datetime,
        provider: str,
        outcome: Outcome | None,
        pii_key: bytes,
    ) -> None:
        self.delivery, self.attempt, self.now = delivery, attempt, now
        self.provider, self.outcome, self.pii_key = provider, outcome, pii_key

    def _attrs(self, to: str | None = None, at: datetime | None = None) -> dict[str, str]:
        attrs: dict[str, str] = {}
        if self.outcome is not None:
            attrs["outcome"] = self.outcome.kind
            attrs["provider_call_ms"] = str(int(self.outcome.latency_ms))
            if self.outcome.status_code is not None:
                attrs["http_status"] = str(self.outcome.status_code)
        if to is not None:
            attrs["failover_to"] = to
        if at is not None:
            attrs["next_attempt_at"] = at.isoformat()
        return attrs

    def make(
        self, state: State, reason: str | None, *, to: str | None = None, at: datetime | None = None
    ) -> dict[str, Any]:
        return event(
            self.delivery, state, attempt=self.attempt, now=self.now,
            provider=self.provider, reason=reason, attributes=self._attrs(to, at),
        )  # fmt: skip

    def accepted(self, msg_id: str) -> dict[str, Any]:
        created = instant(self.delivery.get("created_at"))
        since = int((self.now - created).total_seconds() * 1000) if created else None
        attrs = self._attrs()
        address = self.delivery.get("address")
        if address and self.delivery["channel"] in ("sms", "email"):
            # which address a later "dead address" receipt is about (herald.receipts)
            attrs["address_tag"] = address_tag(str(address), self.pii_key)
        return event(self.delivery, State.PROVIDER_ACCEPTED, attempt=self.attempt, now=self.now,
                     provider=self.provider, provider_msg_id=msg_id or None,
                     latency_ms=max(since, 0) if since is not None else None,
                     attributes=attrs)  # fmt: skip


def _retry(
    action: Retry,
    delivery: Mapping[str, Any],
    ev: _EventMaker,
    provider: str,
    attempt: int,
    first_attempt_at: datetime | None,
) -> Effects:
    made = attempt if action.counts_as_attempt else attempt - 1
    first = first_attempt_at if action.counts_as_attempt else None
    record = retried(
        delivery, at=action.at, provider=provider, attempts_made=made, first_attempt_at=first
    )
    # Whether or not a call was made, the retry must find the guard free.
    return Effects([ev.make(State.RETRY_SCHEDULED, action.reason, at=action.at)], "release", record)


def _paused(
    action: PausePlatform,
    delivery: Mapping[str, Any],
    ev: _EventMaker,
    outcome: Outcome | None,
    attempt: int,
    first_attempt_at: datetime | None,
) -> Effects:
    pause = (action.provider, action.reason, action.pause_s)
    reason = f"platform:{action.reason}"
    if action.failover_to is not None:
        return Effects([ev.make(State.RETRY_SCHEDULED, reason, to=action.failover_to)],
                       guard="keep", pause=pause, failover_to=action.failover_to)  # fmt: skip
    # Not counted as an attempt: the provider's configuration failed, not this message.
    record = retried(delivery, at=action.requeue_at, provider=action.provider,
                     attempts_made=attempt - 1, first_attempt_at=None)  # fmt: skip
    return Effects([ev.make(State.RETRY_SCHEDULED, reason, at=action.requeue_at)],
                   guard="release", retry=record, pause=pause)  # fmt: skip


def _unknown(
    action: MarkUnknown,
    delivery: Mapping[str, Any],
    ev: _EventMaker,
    provider: str,
    attempt: int,
    first_attempt_at: datetime | None,
) -> Effects:
    events = [ev.make(State.UNKNOWN, action.reason)]
    then = action.then
    if isinstance(then, Failover):
        # The type accepts a duplicate: keep the guard and send through the alternate now.
        events.append(
            ev.make(State.RETRY_SCHEDULED, f"failover:{then.reason}", to=then.to_provider)
        )
        return Effects(events, guard="keep", failover_to=then.to_provider)
    if isinstance(then, Retry):
        record = retried(delivery, at=then.at, provider=provider, attempts_made=attempt,
                         first_attempt_at=first_attempt_at)  # fmt: skip
        events.append(ev.make(State.RETRY_SCHEDULED, then.reason, at=then.at))
        return Effects(events, guard="release", retry=record)
    return Effects(events, guard="unknown")
