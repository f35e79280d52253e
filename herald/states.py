"""Delivery state model (seed 001, SPEC §3): states, per-channel transition tables, capabilities.

    ACCEPTED → PLANNED → (SCHEDULED) → QUEUED → SENDING ⇄ RETRY_SCHEDULED → PROVIDER_ACCEPTED
        → DELIVERED → READ (push, inapp) | OPENED → CLICKED (email)
    side ends: SUPPRESSED, EXPIRED, FAILED_PERMANENT (final);
               UNKNOWN (attempt outcome never told), DELIVERY_UNKNOWN (no receipt within the
               channel's observation window) — final unless a later receipt or reconciliation
               resolves them (UNKNOWN → PROVIDER_ACCEPTED/DELIVERED/FAILED_PERMANENT...,
               DELIVERY_UNKNOWN → DELIVERED/FAILED_PERMANENT).

Receipts are appended first, then folded through `transition(channel, current, event)`, where
`event` is the state a normalized event reports. The tables are explicit per channel (never an
integer order of states), built once at import:

- Out-of-order receipts move forward: SENDING or PROVIDER_ACCEPTED → DELIVERED directly; a late
  `sent` (PROVIDER_ACCEPTED) after DELIVERED is STALE and never downgrades it.
- Engagement (READ, OPENED, CLICKED) is accepted from DELIVERED. On a channel without delivered
  receipts (push: APNs/FCM report acceptance only) it is also accepted from SENDING,
  PROVIDER_ACCEPTED and UNKNOWN, because an open proves delivery. On channels with delivered
  receipts an engagement event before DELIVERED is PREMATURE: the state is kept and `fold`
  re-applies it after the next change (the receipts job keeps the event; nothing is lost).
- An event for a signal the channel does not provide (DELIVERED on push, READ on email), or any
  unknown name, is UNMAPPABLE: the state is kept and the caller counts/flags the event.

`CAPABILITIES` says which signals a channel provides; reports show a not-provided signal as
"unknown", never as success or failure (`layers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "CAPABILITIES",
    "ChannelCapabilities",
    "Folded",
    "Outcome",
    "State",
    "Support",
    "Transition",
    "apply",
    "fold",
    "is_final",
    "layers",
    "observation_expired",
    "transition",
]


class State(StrEnum):
    """Delivery states; the values are the `state` column of delivery events."""

    ACCEPTED = "ACCEPTED"
    PLANNED = "PLANNED"
    SCHEDULED = "SCHEDULED"
    QUEUED = "QUEUED"
    SENDING = "SENDING"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    PROVIDER_ACCEPTED = "PROVIDER_ACCEPTED"
    DELIVERED = "DELIVERED"
    READ = "READ"
    OPENED = "OPENED"
    CLICKED = "CLICKED"
    SUPPRESSED = "SUPPRESSED"
    EXPIRED = "EXPIRED"
    FAILED_PERMANENT = "FAILED_PERMANENT"
    UNKNOWN = "UNKNOWN"
    DELIVERY_UNKNOWN = "DELIVERY_UNKNOWN"


class Support(StrEnum):
    """Whether a channel reports a signal: always, partially (client/pixel based), or never."""

    PROVIDED = "provided"
    PARTIAL = "partial"
    NOT_PROVIDED = "not_provided"


class Outcome(StrEnum):
    """What applying one event did."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    STALE = "stale"
    PREMATURE = "premature"
    UNMAPPABLE = "unmappable"


class Transition(NamedTuple):
    """Result of `transition`: the (possibly unchanged) state, whether it changed, and why."""

    state: State
    changed: bool
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class ChannelCapabilities:
    """Signals a channel reports, and how long to wait for a delivered receipt."""

    channel: str
    delivered: Support
    read: Support
    opened: Support
    clicked: Support
    observation_window: timedelta | None

    def support(self, state: State) -> Support:
        """How the channel reports `state` (states outside the receipt signals: PROVIDED)."""
        return {
            State.DELIVERED: self.delivered,
            State.READ: self.read,
            State.OPENED: self.opened,
            State.CLICKED: self.clicked,
        }.get(state, Support.PROVIDED)


_P, _PART, _NO = Support.PROVIDED, Support.PARTIAL, Support.NOT_PROVIDED
CAPABILITIES: Mapping[str, ChannelCapabilities] = {
    # APNs/FCM answer per request (accepted or token dead) but send no delivered receipt; opens
    # are reported by the app (partial coverage).
    "push": ChannelCapabilities("push", _NO, _PART, _NO, _NO, None),
    # Carrier delivery reports (DLR), usually within minutes, sometimes days.
    "sms": ChannelCapabilities("sms", _P, _NO, _NO, _NO, timedelta(hours=72)),
    # ESP delivery/bounce webhooks; opens by pixel (blocked images: partial), clicks by redirect.
    "email": ChannelCapabilities("email", _P, _NO, _PART, _P, timedelta(hours=72)),
    # Written to the inbox by Herald itself; read when the user marks it.
    "inapp": ChannelCapabilities("inapp", _P, _P, _NO, _NO, timedelta(hours=1)),
}

S = State
_FAILS = {S.SUPPRESSED, S.EXPIRED, S.FAILED_PERMANENT, S.UNKNOWN}
_SEND = {S.SENDING, S.RETRY_SCHEDULED, S.PROVIDER_ACCEPTED, S.DELIVERED}
_BASE: Mapping[State, frozenset[State]] = {
    S.ACCEPTED: frozenset({S.PLANNED, S.SCHEDULED, S.QUEUED, *_SEND, *_FAILS}),
    S.PLANNED: frozenset({S.SCHEDULED, S.QUEUED, *_SEND, *_FAILS}),
    S.SCHEDULED: frozenset({S.QUEUED, *_SEND, *_FAILS}),
    S.QUEUED: frozenset({*_SEND, *_FAILS}),
    S.SENDING: frozenset({S.RETRY_SCHEDULED, *_SEND, *_FAILS} - {S.SENDING, S.SUPPRESSED}),
    # A DLQ replay re-checks opt-outs, so a waiting retry may still end SUPPRESSED.
    S.RETRY_SCHEDULED: frozenset({S.SENDING, S.PROVIDER_ACCEPTED, S.DELIVERED, *_FAILS}),
    # Reconciliation, a late receipt, or a retry the type's policy allows.
    S.UNKNOWN: frozenset({*_SEND, S.FAILED_PERMANENT, S.EXPIRED} - {S.RETRY_SCHEDULED}),
    S.PROVIDER_ACCEPTED: frozenset({S.DELIVERED, S.DELIVERY_UNKNOWN, S.FAILED_PERMANENT}),
    S.DELIVERY_UNKNOWN: frozenset({S.DELIVERED, S.FAILED_PERMANENT}),
    S.DELIVERED: frozenset({S.READ, S.OPENED, S.CLICKED}),
    S.OPENED: frozenset({S.CLICKED}),
}
_ENGAGEMENT = frozenset({S.READ, S.OPENED, S.CLICKED})
_FINAL = frozenset({S.SUPPRESSED, S.EXPIRED, S.FAILED_PERMANENT, S.READ, S.CLICKED})
_BEFORE_DELIVERED = frozenset(
    {S.ACCEPTED, S.PLANNED, S.SCHEDULED, S.QUEUED, S.SENDING, S.RETRY_SCHEDULED,
     S.PROVIDER_ACCEPTED, S.UNKNOWN, S.DELIVERY_UNKNOWN}
)  # fmt: skip


def _table(caps: ChannelCapabilities) -> Mapping[State, frozenset[State]]:
    """The explicit transition table of one channel, derived from `_BASE` and its signals."""
    absent = {s for s in (S.DELIVERED, *_ENGAGEMENT) if caps.support(s) is Support.NOT_PROVIDED}
    table = {state: targets - absent for state, targets in _BASE.items() if state not in absent}
    if caps.delivered is Support.NOT_PROVIDED:
        table.pop(S.DELIVERY_UNKNOWN, None)
        table[S.PROVIDER_ACCEPTED] -= {S.DELIVERY_UNKNOWN}
        engaged = _ENGAGEMENT - absent
        for state in (S.SENDING, S.PROVIDER_ACCEPTED, S.UNKNOWN):
            table[state] = table[state] | engaged
    return table


TABLES: Mapping[str, Mapping[State, frozenset[State]]] = {
    channel: _table(caps) for channel, caps in CAPABILITIES.items()
}


def is_final(state: State) -> bool:
    """True for states nothing can leave (UNKNOWN and DELIVERY_UNKNOWN are resolvable)."""
    return state in _FINAL


def transition(channel: str, current: State | str, event: State | str) -> Transition:
    """Apply one event to the current state of a delivery on `channel` (see module doc)."""
    state = State(current)
    try:
        target = State(event)
    except ValueError:
        return Transition(state, False, Outcome.UNMAPPABLE)
    table = TABLES.get(channel)
    if table is None or CAPABILITIES[channel].support(target) is Support.NOT_PROVIDED:
        return Transition(state, False, Outcome.UNMAPPABLE)
    if target == state:
        return Transition(state, False, Outcome.DUPLICATE)
    if target in table.get(state, frozenset()):
        return Transition(target, True, Outcome.APPLIED)
    if target in _ENGAGEMENT and state in _BEFORE_DELIVERED:
        return Transition(state, False, Outcome.PREMATURE)
    return Transition(state, False, Outcome.STALE)


def apply(channel: str, current: State | str, event: State | str) -> tuple[State, bool]:
    """`(new_state, changed)`; unmappable, stale or premature events keep the state."""
    result = transition(channel, current, event)
    return result.state, result.changed


class Folded(NamedTuple):
    """Result of `fold`: final state, events kept as unmappable, events still premature."""

    state: State
    unmappable: tuple[str, ...]
    pending: tuple[State, ...]


def fold(channel: str, events: Iterable[State | str], start: State = State.ACCEPTED) -> Folded:
    """Fold events in arrival order; premature ones are retried after every change."""
    state, unmappable, pending = start, [], []
    for event in events:
        result = transition(channel, state, event)
        if result.outcome is Outcome.UNMAPPABLE:
            unmappable.append(str(event))
        elif result.outcome is Outcome.PREMATURE:
            pending.append(State(event))
        state = result.state
        while result.changed and pending:
            for waiting in list(pending):
                result = transition(channel, state, waiting)
                if result.outcome is not Outcome.PREMATURE:
                    pending.remove(waiting)
                    state = result.state
                    break
            else:
                break
    return Folded(state, tuple(unmappable), tuple(pending))


def observation_expired(
    channel: str, state: State, provider_accepted_at: datetime, now: datetime
) -> bool:
    """True when PROVIDER_ACCEPTED waited past the channel's window: apply DELIVERY_UNKNOWN."""
    caps = CAPABILITIES.get(channel)
    window = caps.observation_window if caps else None
    if state is not State.PROVIDER_ACCEPTED or window is None:
        return False
    return now >= provider_accepted_at + window


_ACCEPTED_OR_LATER = {S.PROVIDER_ACCEPTED, S.DELIVERY_UNKNOWN, S.DELIVERED, *_ENGAGEMENT}
_REACHED = {
    "provider_accepted": frozenset(_ACCEPTED_OR_LATER),
    "delivered": frozenset({S.DELIVERED, *_ENGAGEMENT}),
    "read": frozenset({S.READ}),
    "opened": frozenset({S.OPENED, S.CLICKED}),
    "clicked": frozenset({S.CLICKED}),
}
_UNKNOWN_AT = {"provider_accepted": {S.UNKNOWN}, "delivered": {S.UNKNOWN, S.DELIVERY_UNKNOWN}}
_NEVER = frozenset({S.SUPPRESSED, S.EXPIRED, S.FAILED_PERMANENT})


def layers(channel: str, state: State) -> dict[str, str]:
    """Layered status for the API: each signal → `yes | no | pending | unknown`.

    A signal the channel does not provide is `unknown` once the delivery got that far (never
    `no`); engagement signals the channel never reports are omitted.
    """
    caps = CAPABILITIES[channel]
    out: dict[str, str] = {}
    for name, reached in _REACHED.items():
        support = caps.support(State(name.upper()))
        if name in ("read", "opened", "clicked") and support is Support.NOT_PROVIDED:
            continue
        if state in reached:
            out[name] = "yes"
        elif state in _NEVER:
            out[name] = "no"
        elif state in _UNKNOWN_AT.get(name, ()) or (
            support is Support.NOT_PROVIDED and state in _REACHED["provider_accepted"]
        ):
            out[name] = "unknown"
        else:
            out[name] = "pending"
    return out
