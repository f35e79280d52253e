"""Provider receipts → normalized receipt events (pure: no Bytewax, no I/O).

    normalize(raw_receipt dict) -> list[ReceiptEvent]      raises BadReceipt for unusable bodies

One raw receipt (herald.receipts.raw: the webhook body unchanged, its headers) yields one or more
`ReceiptEvent`s (a SendGrid batch holds many). Each webhook provider's format lives in its own
folder (sinks/providers/<vendor>/receipts.py: Twilio, Vonage, SendGrid, MessageBird; PROVIDERS.md)
as a `ReceiptFormat` in its SPEC, which the receipts job registers at start (`register_format`);
those modules build their events with the helpers below (`base_fields`, `state_of`,
`extra_fields`, `event_digest`, `form_body`, `json_body`, `epoch_time`). Herald's own sources
are read here:

    inbox  Herald's in-app inbox (JSON object or array): delivery_id, event delivered|read

(A push gets no receipt: the app reports an open through the push's signed `herald_opened` URL,
which the API records as an event with its delivery's context, api/routes/tracking.py.)

Each event keeps: the provider's status word, the Herald state it reports (`None` when Herald
has no mapping: such events are kept and counted as unmappable, never guessed), a reason code,
the provider message id (the join key back to the delivery) and, where the payload carries
Herald's own delivery id (SendGrid custom_args, Vonage client-ref, Herald's own events), a
delivery hint. Unknown fields are kept in `attributes` as `x.<name>`; fields that identify a
person (phone numbers, email addresses, IPs, user agents) and signature material are dropped.

Idempotency: `provider_event_id` is the provider's own event id where the signed payload gives
one (SendGrid sg_event_id) and otherwise `sha256:` of the normalized fields (never of the receive
time, nor of an unsigned header), so the same webhook delivered three times is one event.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

import orjson

from herald.config import pii_digest
from herald.providers import PROVIDERS, WEBHOOK

__all__ = [
    "CHANNEL_OF",
    "BadReceipt",
    "Parser",
    "ReceiptEvent",
    "ReceiptFormat",
    "address_tag",
    "base_fields",
    "epoch_time",
    "event_digest",
    "extra_fields",
    "field_text",
    "form_body",
    "is_json",
    "join_key",
    "joins_by_message_id",
    "json_body",
    "kills_address",
    "normalize",
    "opts_out",
    "received_time",
    "register_format",
    "sources",
    "state_of",
]

# Source -> channel of the deliveries it reports on: the webhook providers and the in-app
# inbox's reads.
CHANNEL_OF: Mapping[str, str] = {
    **{name: PROVIDERS[name].channel for name in WEBHOOK}, "inbox": "inapp",
}  # fmt: skip

_MAX_EXTRA = 20  # unknown fields kept per event
_MAX_VALUE = 256  # characters kept per unknown field value
# Never stored: personal data and signature material (logs and ClickHouse must not hold them).
_DROP = frozenset({
    "to", "from", "msisdn", "email", "ip", "useragent", "phone", "api-key", "api_key", "sig",
    "nonce", "timestamp", "accountsid", "reason", "response", "url", "smtp-id",
})  # fmt: skip

# Provider status word -> (Herald state or None, reason or None)
_INTERNAL: Mapping[str, tuple[str | None, str | None]] = {
    "delivered": ("DELIVERED", None),
    "read": ("READ", None),
    "opened": ("READ", "opened"),  # a push open proves it was seen: push's read signal
    "clicked": ("READ", "clicked"),
}


class BadReceipt(ValueError):
    """A raw receipt that cannot be normalized at all (dead-lettered with `reason`)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


Parser = Callable[[Mapping[str, Any], bytes], "list[ReceiptEvent]"]


@dataclass(frozen=True, slots=True)
class ReceiptFormat:
    """How one source's receipts read: its parser (a raw_receipt's fields and body -> events,
    raising BadReceipt when there are none) and what its reasons mean."""

    parse: Parser
    names_delivery: bool = False  # its receipts name Herald's delivery, not the message
    dead_address: frozenset[str] = frozenset()  # reasons that say the address is dead
    opt_out: frozenset[str] = frozenset()  # reasons that say: no more marketing here


@dataclass(frozen=True, slots=True)
class ReceiptEvent:
    """One normalized provider event; `payload` is its own raw bytes (for re-driving it)."""

    receipt_id: str
    provider: str
    provider_event_id: str
    provider_msg_id: str | None
    delivery_hint: str | None
    status: str
    state: str | None
    reason: str | None
    occurred_at: datetime
    received_at: datetime
    attributes: dict[str, str] = field(default_factory=dict)
    payload: bytes = b""
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    # Generation (DLQ replays) of the send the receipt answers, set by the receipts job's join
    # from the PROVIDER_ACCEPTED event of its message; None: the delivery's latest (a hint).
    generation: int | None = None

    @property
    def channel(self) -> str:
        """Channel of the deliveries this provider reports on ("" when unknown)."""
        return CHANNEL_OF.get(self.provider, "")


def joins_by_message_id(provider: str) -> bool:
    """True for a provider whose receipts name the message, not the delivery (an SMS
    carrier's DLR, an email provider's webhook): its PROVIDER_ACCEPTED events are kept to
    join them. APNs and FCM send none; the inbox names the delivery."""
    fmt = _FORMATS.get(provider)
    return fmt is not None and not fmt.names_delivery


def join_key(provider: str, provider_msg_id: str) -> str:
    """Key joining a receipt to the PROVIDER_ACCEPTED event that recorded the same message."""
    return f"{provider}|{provider_msg_id}"


def kills_address(ev: ReceiptEvent) -> bool:
    """True when the receipt says the phone number or email address can't be used again."""
    fmt = _FORMATS.get(ev.provider)
    return fmt is not None and ev.reason in fmt.dead_address


def opts_out(ev: ReceiptEvent) -> bool:
    """True when the receipt says the person opts out of marketing on the channel."""
    fmt = _FORMATS.get(ev.provider)
    return fmt is not None and ev.reason in fmt.opt_out


def address_tag(address: str, key: bytes) -> str:
    """A short keyed digest of a phone number or email address (the first 8 hex digits of its
    HMAC-SHA256 under the PII key, herald.config.PiiSettings; email case-folded).

    Dispatch puts it on PROVIDER_ACCEPTED (attribute `address_tag`) so that a later receipt
    saying "this address is dead" disables the address the message went to, and not the one
    the user has set since, while events and receipts still hold no address (32 bits tell two
    addresses of one user apart; they don't name anybody).
    """
    value = address.strip()
    if "@" in value:
        value = value.lower()
    return pii_digest(key, value, 8)


def normalize(raw: Mapping[str, Any]) -> list[ReceiptEvent]:
    """The events of one `raw_receipt` record; raises `BadReceipt` when there are none."""
    provider = str(raw.get("provider", ""))
    fmt = _FORMATS.get(provider)
    if fmt is None:
        raise BadReceipt("unknown_provider", f"no receipt format for provider {provider!r}")
    body = raw.get("body") or b""
    if not body:
        raise BadReceipt("empty_receipt", f"{provider}: empty body")
    events = fmt.parse(raw, bytes(body))
    if not events:
        raise BadReceipt("empty_receipt", f"{provider}: no events in the payload")
    return events


# -- helpers ---------------------------------------------------------------------------------


def form_body(body: bytes) -> dict[str, str]:
    """A form-encoded body's fields (BadReceipt when it is not one)."""
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadReceipt("unparseable_receipt", f"not a form body ({type(exc).__name__})") from None
    return dict(pairs)


def json_body(body: bytes) -> Any:
    """A JSON body (BadReceipt when it is not one)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadReceipt("unparseable_receipt", "not a JSON body") from None


def is_json(raw: Mapping[str, Any], body: bytes) -> bool:
    """Whether the receipt came as JSON (by its content type, else by its first byte)."""
    ctype = str(raw.get("content_type", "")).lower()
    return "json" in ctype or body.lstrip()[:1] in (b"{", b"[")


def field_text(value: Any) -> str:
    """A field's value as bounded text (JSON for anything but a string)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text[:_MAX_VALUE]


def extra_fields(fields: Mapping[str, Any], known: frozenset[str]) -> dict[str, str]:
    """Unknown fields as `x.<name>` (bounded), minus personal data and signature material."""
    out: dict[str, str] = {}
    for name in sorted(fields):
        if name in known or name.lower() in _DROP or len(out) >= _MAX_EXTRA:
            continue
        out[f"x.{name}"] = field_text(fields[name])
    return out


def event_digest(*parts: object) -> str:
    """`sha256:` of the normalized fields (stable across processes and re-deliveries)."""
    canonical = json.dumps([str(p) if p is not None else None for p in parts])
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def received_time(raw: Mapping[str, Any]) -> datetime:
    """When Herald received the receipt (its time when the provider's own is unusable)."""
    value = raw.get("received_at")
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int):
        return datetime.fromtimestamp(value / 1000, UTC)
    return datetime.now(UTC)


_LATEST_EPOCH_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the last instant a datetime holds


def epoch_time(value: Any) -> datetime | None:
    """Epoch seconds (SendGrid) or milliseconds (Herald's own events), or None when `value` is
    not a number of either within 1970..9999 (`1e20`, `inf`, `nan`, `true`: the receipt's
    arrival time stands in for it)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not 0 < number <= _LATEST_EPOCH_S * 1000:  # also false for nan
        return None
    return datetime.fromtimestamp(number / 1000 if number > 1e11 else number, UTC)


def state_of(
    table: Mapping[str, tuple[str | None, str | None]], status: str
) -> tuple[str | None, str | None]:
    """(Herald state, reason) a provider status maps to in `table`; (None, None) if unmapped."""
    return table.get(status, (None, None))


def base_fields(
    raw: Mapping[str, Any], payload: bytes, redrive: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "receipt_id": str(raw.get("receipt_id", "")),
        "provider": str(raw["provider"]),
        "received_at": received_time(raw),
        "payload": payload,
        "content_type": str(raw.get("content_type", "")),
        "headers": dict(redrive),
    }


# -- Herald's own source: the in-app inbox ----------------------------------------------------

_INTERNAL_KNOWN = frozenset({"delivery_id", "event", "event_id", "occurred_at"})


def _internal_event(raw: Mapping[str, Any], item: Any) -> ReceiptEvent:
    if not isinstance(item, dict) or not item.get("delivery_id") or not item.get("event"):
        raise BadReceipt("unparseable_receipt", f"{raw['provider']}: delivery_id/event missing")
    provider = str(raw["provider"])
    status = str(item["event"]).lower()
    state, reason = state_of(_INTERNAL, status)
    delivery_id = str(item["delivery_id"])
    occurred = epoch_time(item.get("occurred_at")) or received_time(raw)
    given = item.get("event_id")
    event_id = f"{provider}:{given}" if given else event_digest(provider, delivery_id, status)
    return ReceiptEvent(
        **base_fields(raw, orjson.dumps(item), {}), provider_event_id=event_id,
        provider_msg_id=None,
        delivery_hint=delivery_id, status=status, state=state, reason=reason,
        occurred_at=occurred, attributes={"provider_status": status,
                                          **extra_fields(item, _INTERNAL_KNOWN)},
    )  # fmt: skip


def _internal(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    data = json_body(body)
    items = data if isinstance(data, list) else [data]
    return [_internal_event(raw, item) for item in items]


# The in-app inbox's reads; each webhook provider's format lives in its folder
# (sinks/providers/<vendor>/receipts.py, its SPEC) and is registered by the receipts job.
# A format names the reasons that say the address itself is dead (PROVIDERS.md §6, token_dead
# column) and those that say the person wants no more marketing on that channel while the
# address works (a marketing opt-out, sinks/consent.py, never a disabled address).
_FORMATS: dict[str, ReceiptFormat] = {
    "inbox": ReceiptFormat(_internal, names_delivery=True),
}


def register_format(source: str, fmt: ReceiptFormat) -> None:
    """Read `source`'s receipts with `fmt` from now on: a provider whose receipt format lives in
    its own folder (its SPEC, sinks/provider_registry.py); the receipts job registers every
    registered provider's at start."""
    _FORMATS[source] = fmt


def sources() -> frozenset[str]:
    """Every source whose receipts `normalize` reads (the webhook providers, the inbox)."""
    return frozenset(_FORMATS)
