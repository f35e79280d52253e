"""Cross-channel fallback at dispatch time (SMS permanently failed → push), decided without I/O.

Design: **pre-rendered fallback content, re-checked policy at dispatch.** The plan job is the only
place that holds a request's params, so it renders, next to the primary content, the content of
every channel named by the delivery's fallback steps (`Delivery.fallback_content`, one entry per
channel, locale resolved for that channel). Dispatch never needs the request again: when a
delivery ends

- FAILED_PERMANENT (an explicit rejection on every eligible provider of its channel, a dead
  address, retries exhausted), or
- with no usable provider (every provider's breaker open, or the provider paused for an
  auth/config failure, with no same-channel alternate left),

`fall_back(...)` walks the remaining steps naming *another* channel, in order, and re-checks the
policy for each one against what the API's Redis copies say now: expiry, the user's opt-outs
(`bypass_opt_out` types skip them), the channel's contact point (valid push tokens, verified
ones for a `secret` type such as an OTP; a phone or email, verified unless the type allows
unverified contacts), quiet hours in the user's zone (a
hold: the delivery goes to the retry topic with `not_before`; a hold ending after the expiry
stops the fallback). The first usable channel gets its deliveries (one per valid device for
push), with the deterministic delivery_id plan would give that user × channel (× device)
(`herald.ids.delivery_id`): a fallback replayed after a crash, triggered twice, or to a channel
that was planned anyway, meets the send guard of that id and is never sent twice.

Never after UNKNOWN: an unknown outcome may have reached the user, so the engine only calls this
for the terminal outcomes above (a type with `failover_on_unknown` already fails over to the
same-channel alternates in herald.retry; it does not change channel either).

Why not route the fallback back through the plan job: plan would need the request's params,
which only exist in the request (the delivery carries rendered text), and a round trip through
another job and topic would add its latency to an OTP that already failed once.

Events: each new delivery gets PLANNED (SCHEDULED when held) with reason `fallback` and the
attributes `fallback_from` (channel), `fallback_cause` (why the source ended) and
`from_delivery_id`; the source's terminal event gets `fallback_to` (the channel chosen) and
`fallback_skipped` (`channel:reason,...` for the steps whose policy re-check failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from herald import ids
from herald.catalog import NotificationType
from herald.dispatching import instant, opt_out_reason
from herald.policy import Preferences
from herald.providers import DEFAULT_PROVIDER
from herald.quiet_hours import quiet_until
from herald.states import State

__all__ = ["Fallback", "cross_channel_steps", "fall_back", "has_cross_channel_step"]


@dataclass
class Fallback:
    """What a fallback produced: deliveries to send now, held ones, their events, notes.

    `to` is the channel chosen (None: no step usable); `skipped` the (channel, reason) of the
    steps passed over; `source_attributes` the notes for the source's terminal event.
    """

    deliveries: list[dict[str, Any]] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    to: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def source_attributes(self) -> dict[str, str]:
        """Attributes for the source delivery's terminal event."""
        attrs: dict[str, str] = {}
        if self.to is not None:
            attrs["fallback_to"] = self.to
        if self.skipped:
            attrs["fallback_skipped"] = ",".join(f"{c}:{r}" for c, r in self.skipped)
        return attrs


def cross_channel_steps(delivery: Mapping[str, Any]) -> list[tuple[int, str, str | None]]:
    """(index, channel, provider hint) of the fallback steps naming another channel, in order."""
    own = delivery["channel"]
    out: list[tuple[int, str, str | None]] = []
    seen: set[str] = set()
    for i, step in enumerate(delivery.get("fallback") or ()):
        channel, _, provider = str(step).partition(":")
        if channel != own and channel not in seen:
            seen.add(channel)
            out.append((i, channel, provider or None))
    return out


def has_cross_channel_step(delivery: Mapping[str, Any]) -> bool:
    """Whether a fallback to another channel is configured for this delivery."""
    return bool(cross_channel_steps(delivery))


def fall_back(
    delivery: Mapping[str, Any],
    cause: str,
    *,
    nt: NotificationType | None,
    prefs: Preferences | None,
    contacts: Mapping[str, Any] | None,
    now: datetime,
    quiet_channels: frozenset[str],
    default_timezone: str,
) -> Fallback:
    """The fallback of `delivery`, which ended because of `cause` (see the module docstring).

    `contacts` is the API's copy of the user's contact points (None: unknown, so no channel
    needing an address can be used); `prefs` None means no copy (opt-outs are then not known
    and not re-checked, as for the primary channel's re-check).
    """
    result = Fallback()
    expire_at = instant(delivery.get("expire_at"))
    if expire_at is not None and now >= expire_at:
        result.skipped.append(("*", "expired"))
        return result
    steps = list(delivery.get("fallback") or ())
    contents = {c["channel"]: c for c in delivery.get("fallback_content") or ()}
    for index, channel, provider in cross_channel_steps(delivery):
        reason = _blocked(delivery, channel, nt, prefs)
        content = contents.get(channel)
        if reason is None and content is None:
            reason = "not_rendered"
        addresses: list[dict[str, Any]] | str = (
            reason if reason is not None else _addresses(channel, provider, nt, contacts, delivery)
        )
        if isinstance(addresses, str):
            result.skipped.append((channel, addresses))
            continue
        hold = _hold(channel, nt, prefs, now, quiet_channels, default_timezone)
        if hold is not None and expire_at is not None and hold >= expire_at:
            result.skipped.append((channel, "expired"))
            continue
        assert content is not None
        rest = steps[index + 1 :]
        for address in addresses:
            made = _delivery(delivery, channel, address, content, rest, hold)
            state = State.SCHEDULED if hold is not None else State.PLANNED
            attrs = {"fallback_from": delivery["channel"], "fallback_cause": cause,
                     "from_delivery_id": delivery["delivery_id"]}  # fmt: skip
            if hold is not None:
                attrs["not_before"] = hold.isoformat()
            result.events.append(_event(made, state, now, attrs))
            (result.held if hold is not None else result.deliveries).append(made)
        result.to = channel
        return result
    return result


def _blocked(
    delivery: Mapping[str, Any],
    channel: str,
    nt: NotificationType | None,
    prefs: Preferences | None,
) -> str | None:
    """The opt-out covering `channel` now (None: allowed)."""
    if prefs is None or (nt is not None and nt.bypass_opt_out):
        return None
    return opt_out_reason(prefs, delivery["category"], channel)


def _addresses(
    channel: str,
    provider: str | None,
    nt: NotificationType | None,
    contacts: Mapping[str, Any] | None,
    delivery: Mapping[str, Any],
) -> list[dict[str, Any]] | str:
    """The endpoints of `channel` (address, platform, provider, device_id) or why there is none."""
    if channel == "inapp":
        return [{"address": delivery["user_id"], "platform": None,
                 "provider": provider or "inbox", "device_id": None}]  # fmt: skip
    if contacts is None:
        return "no_contact_point"
    if channel == "push":
        devices = contacts.get("devices") or []
        if not devices:
            return "no_contact_point"
        valid = [d for d in devices if d.get("valid", True) and d.get("token")]
        if not valid:
            return "no_valid_token"
        if nt is not None and nt.secret:  # a code or a reset link: the user's own devices only
            valid = [d for d in valid if d.get("verified")]
            if not valid:
                return "device_unverified"
        return [{"address": d["token"], "platform": d.get("platform"),
                 "provider": provider or d.get("platform"), "device_id": d["device_id"]}
                for d in valid]  # fmt: skip
    unverified_ok = bool(nt and nt.allow_unverified_contact)
    field = "phone" if channel == "sms" else "email"
    point = contacts.get(field) or {}
    value, verified = point.get("e164" if channel == "sms" else "address"), point.get("verified")
    why = f"{field}_unverified"
    if not value:
        disabled = field in (contacts.get("disabled") or ())
        return "address_disabled" if disabled else "no_contact_point"
    if not verified and not unverified_ok:
        return why
    default = DEFAULT_PROVIDER.get(channel)
    return [{"address": value, "platform": None, "provider": provider or default,
             "device_id": None}]  # fmt: skip


def _hold(
    channel: str,
    nt: NotificationType | None,
    prefs: Preferences | None,
    now: datetime,
    quiet_channels: frozenset[str],
    default_timezone: str,
) -> datetime | None:
    """The end of the user's quiet hours when `channel` must wait for it (None: send now)."""
    if prefs is None or prefs.quiet_hours is None or channel not in quiet_channels:
        return None
    if nt is not None and nt.bypass_quiet_hours:
        return None
    return quiet_until(now, prefs.quiet_hours, prefs.timezone or default_timezone)


def _delivery(
    source: Mapping[str, Any],
    channel: str,
    address: Mapping[str, Any],
    content: Mapping[str, Any],
    rest: list[str],
    hold: datetime | None,
) -> dict[str, Any]:
    """The fallback delivery: the source's request facts, this channel's content and endpoint."""
    device = address["device_id"] if channel == "push" else None
    did = ids.delivery_id(source["notification_id"], source["user_id"], channel, device)
    remaining = {s.partition(":")[0] for s in rest}
    return {
        **source,
        "delivery_id": did,
        "channel": channel,
        "provider": address["provider"],
        "address": address["address"],
        "platform": address["platform"],
        "rendered": dict(content["rendered"]),
        "locale": content["locale"],
        "template_version": int(content["template_version"]),
        "collapse_key": source["notification_id"] if channel == "push" else None,
        "attempt": 0,
        "not_before": hold,
        "next_attempt_at": hold,
        "first_attempt_at": None,
        "fallback": list(rest),
        "fallback_content": [
            c for c in source.get("fallback_content") or () if c["channel"] in remaining
        ],
        # Its own delivery, never replayed: a fallback made again by a DLQ replay of the source
        # meets the first one's event ids and send guard instead of superseding its state.
        "generation": 0,
    }


def _event(
    delivery: Mapping[str, Any], state: State, now: datetime, attributes: Mapping[str, str]
) -> dict[str, Any]:
    """The PLANNED/SCHEDULED event of a fallback delivery (deterministic id)."""
    return {
        "event_id": ids.event_id(delivery["delivery_id"], state.value, 0, "fallback"),
        "delivery_id": delivery["delivery_id"],
        "notification_id": delivery["notification_id"],
        "user_id": delivery["user_id"],
        "tenant_id": delivery["tenant_id"],
        "notification_type": delivery["notification_type"],
        "channel": delivery["channel"],
        "traffic_class": delivery["traffic_class"],
        "state": state.value,
        "reason": "fallback",
        "provider": None,
        "provider_msg_id": None,
        "attempt": 0,
        "latency_ms": None,
        "occurred_at": now,
        "recorded_at": now,
        "attributes": dict(attributes),
        "traceparent": delivery.get("traceparent"),
    }
