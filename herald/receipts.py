"""Provider receipts → normalized receipt events (pure: no Bytewax, no I/O).

    normalize(raw_receipt dict) -> list[ReceiptEvent]      raises BadReceipt for unusable bodies

One raw receipt (herald.receipts.raw: the webhook body unchanged, its headers) yields one or more
`ReceiptEvent`s (a SendGrid batch holds many). Per provider (PROVIDERS.md):

    sms_a  Twilio status callback, form: MessageSid, MessageStatus, ErrorCode, RawDlrDoneDate
    sms_b  Vonage DLR, form or JSON: messageId, status, err-code, message-timestamp, client-ref
    email  SendGrid event webhook, JSON array: sg_event_id, sg_message_id, event, timestamp, ...
    inbox  Herald's in-app inbox (JSON object or array): delivery_id, event delivered|read
    app    Herald's mobile SDK reporting push opens (JSON): delivery_id, event opened|read

A provider whose receipt format lives in its own folder (sinks/providers/<vendor>/) registers a
`ReceiptFormat` for its name (`register_format`; the receipts job does it for every registered
provider) and builds its events with the helpers below (`base_fields`, `state_of`,
`extra_fields`, `event_digest`, `form_body`, `json_body`).

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
    "event_digest",
    "extra_fields",
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

# Source -> channel of the deliveries it reports on: the webhook providers, the in-app inbox's
# reads and the app's own engagement events (push opens).
CHANNEL_OF: Mapping[str, str] = {
    **{name: PROVIDERS[name].channel for name in WEBHOOK}, "inbox": "inapp", "app": "push",
}  # fmt: skip

_MAX_EXTRA = 20  # unknown fields kept per event
_MAX_VALUE = 256  # characters kept per unknown field value
# Never stored: personal data and signature material (logs and ClickHouse must not hold them).
_DROP = frozenset({
    "to", "from", "msisdn", "email", "ip", "useragent", "phone", "api-key", "api_key", "sig",
    "nonce", "timestamp", "accountsid", "reason", "response", "url", "smtp-id",
})  # fmt: skip

# Provider status word -> (Herald state or None, reason or None)
_TWILIO: Mapping[str, tuple[str | None, str | None]] = {
    "accepted": ("PROVIDER_ACCEPTED", None),
    "scheduled": ("PROVIDER_ACCEPTED", "scheduled"),
    "queued": ("PROVIDER_ACCEPTED", None),
    "sending": ("PROVIDER_ACCEPTED", None),
    "sent": ("PROVIDER_ACCEPTED", None),
    "delivered": ("DELIVERED", None),
    "undelivered": ("FAILED_PERMANENT", "undelivered"),
    "failed": ("FAILED_PERMANENT", "failed"),
    "canceled": ("FAILED_PERMANENT", "canceled"),
    "read": ("READ", None),  # WhatsApp/RCS only: unmappable on sms (no read signal)
}
_VONAGE: Mapping[str, tuple[str | None, str | None]] = {
    "accepted": ("PROVIDER_ACCEPTED", None),
    "buffered": ("PROVIDER_ACCEPTED", "buffered"),
    "delivered": ("DELIVERED", None),
    "expired": ("FAILED_PERMANENT", "expired_at_carrier"),
    "failed": ("FAILED_PERMANENT", "failed"),
    "rejected": ("FAILED_PERMANENT", "rejected"),
    # The carrier never said: that is exactly DELIVERY_UNKNOWN, not a failure.
    "unknown": ("DELIVERY_UNKNOWN", "carrier_unknown"),
}
_SENDGRID: Mapping[str, tuple[str | None, str | None]] = {
    "processed": ("PROVIDER_ACCEPTED", None),
    "deferred": ("PROVIDER_ACCEPTED", "deferred"),
    "delivered": ("DELIVERED", None),
    "open": ("OPENED", None),
    "click": ("CLICKED", None),
    "bounce": ("FAILED_PERMANENT", "bounce"),
    "dropped": ("FAILED_PERMANENT", "dropped"),
    # Not delivery states (opt-out signals for preferences): kept, counted as unmappable.
    "spamreport": (None, "spamreport"),
    "unsubscribe": (None, "unsubscribe"),
    "group_unsubscribe": (None, "group_unsubscribe"),
    "group_resubscribe": (None, "group_resubscribe"),
}
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
    join them. APNs and FCM send none; the inbox and the app name the delivery."""
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


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text[:_MAX_VALUE]


def extra_fields(fields: Mapping[str, Any], known: frozenset[str]) -> dict[str, str]:
    """Unknown fields as `x.<name>` (bounded), minus personal data and signature material."""
    out: dict[str, str] = {}
    for name in sorted(fields):
        if name in known or name.lower() in _DROP or len(out) >= _MAX_EXTRA:
            continue
        out[f"x.{name}"] = _text(fields[name])
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


def _epoch(value: Any) -> datetime | None:
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


# -- per provider ----------------------------------------------------------------------------

_TWILIO_KNOWN = frozenset({
    "MessageSid", "SmsSid", "MessageStatus", "SmsStatus", "ErrorCode", "RawDlrDoneDate",
    "AccountSid", "From", "To", "ApiVersion", "SmsMessageSid", "MessagingServiceSid",
})  # fmt: skip
_TWILIO_TOKEN = "i-twilio-idempotency-token"


def _twilio(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    form = form_body(body)
    sid = form.get("MessageSid") or form.get("SmsSid")
    status = (form.get("MessageStatus") or form.get("SmsStatus") or "").lower()
    if not sid or not status:
        raise BadReceipt("unparseable_receipt", "sms_a: MessageSid or MessageStatus missing")
    state, reason = state_of(_TWILIO, status)
    code = form.get("ErrorCode") or ""
    if code and state == "FAILED_PERMANENT":
        reason = f"twilio_{code}"
    attributes = {"provider_status": status, **extra_fields(form, _TWILIO_KNOWN)}
    if code:
        attributes["error_code"] = code
    if form.get("RawDlrDoneDate"):
        attributes["dlr_done"] = form["RawDlrDoneDate"]
    headers = {str(k).lower(): str(v) for k, v in (raw.get("headers") or {}).items()}
    token = headers.get(_TWILIO_TOKEN)
    # The id comes from the signed form only: the idempotency token is an unsigned header, so
    # a replayed callback with a new token must still be the event it was.
    event_id = event_digest("sms_a", sid, status, code, form.get("RawDlrDoneDate"))
    redrive = {_TWILIO_TOKEN: token} if token else {}
    received = received_time(raw)
    return [
        ReceiptEvent(
            **base_fields(raw, body, redrive),
            provider_event_id=event_id,
            provider_msg_id=sid,
            delivery_hint=None,
            status=status,
            state=state,
            reason=reason,
            occurred_at=received,
            attributes=attributes,
        )  # fmt: skip
    ]


_VONAGE_KNOWN = frozenset({
    "messageId", "status", "err-code", "message-timestamp", "scts", "client-ref", "msisdn", "to",
    "network-code", "price", "api-key", "sig", "timestamp", "nonce",
})  # fmt: skip


def _vonage_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def _vonage(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    if is_json(raw, body):
        data = json_body(body)
        if not isinstance(data, dict):
            raise BadReceipt("unparseable_receipt", "sms_b: JSON DLR is not an object")
        fields = {str(k): v if isinstance(v, str) else _text(v) for k, v in data.items()}
    else:
        fields = form_body(body)
    msg_id = fields.get("messageId") or fields.get("message-id")
    status = (fields.get("status") or "").lower()
    if not msg_id or not status:
        raise BadReceipt("unparseable_receipt", "sms_b: messageId or status missing")
    state, reason = state_of(_VONAGE, status)
    code = fields.get("err-code") or ""
    if code and code != "0" and state in ("FAILED_PERMANENT", "DELIVERY_UNKNOWN"):
        reason = f"vonage_err_{code}"
    attributes = {"provider_status": status, **extra_fields(fields, _VONAGE_KNOWN)}
    for name, key in (("err-code", "error_code"), ("network-code", "network"), ("scts", "scts")):
        if fields.get(name):
            attributes[key] = fields[name]
    event_id = event_digest("sms_b", msg_id, status, code, fields.get("scts"),
                       fields.get("message-timestamp"))  # fmt: skip
    occurred = _vonage_time(fields.get("message-timestamp")) or received_time(raw)
    return [
        ReceiptEvent(
            **base_fields(raw, body, {}),
            provider_event_id=event_id,
            provider_msg_id=msg_id,
            delivery_hint=fields.get("client-ref") or None,
            status=status,
            state=state,
            reason=reason,
            occurred_at=occurred,
            attributes=attributes,
        )  # fmt: skip
    ]


_SENDGRID_KNOWN = frozenset({
    "event", "sg_event_id", "sg_message_id", "timestamp", "delivery_id", "type", "status",
    "attempt", "category", "email", "smtp-id", "reason", "response", "url", "ip", "useragent",
    "tls", "cert_err", "asm_group_id", "url_offset", "sg_machine_open", "bounce_classification",
})  # fmt: skip


def _sendgrid_event(raw: Mapping[str, Any], item: Any) -> ReceiptEvent:
    if not isinstance(item, dict):
        raise BadReceipt("unparseable_receipt", "email: an event is not an object")
    status = str(item.get("event") or "").lower()
    sg_message_id = str(item.get("sg_message_id") or "")
    if not status:
        raise BadReceipt("unparseable_receipt", "email: event without `event`")
    msg_id = sg_message_id.split(".", 1)[0] or None  # X-Message-Id is its prefix
    state, reason = state_of(_SENDGRID, status)
    if status == "bounce" and item.get("type") == "blocked":
        reason = "blocked"
    attributes = {"provider_status": status, **extra_fields(item, _SENDGRID_KNOWN)}
    for name in ("type", "status", "attempt", "bounce_classification", "sg_machine_open"):
        if item.get(name) not in (None, ""):
            attributes[name if name != "status" else "smtp_status"] = _text(item[name])
    if item.get("url"):
        attributes["link_hash"] = hashlib.sha256(str(item["url"]).encode()).hexdigest()[:16]
    occurred = _epoch(item.get("timestamp")) or received_time(raw)
    event_id = (
        f"sendgrid:{item['sg_event_id']}"
        if item.get("sg_event_id")
        else event_digest("email", sg_message_id, status, item.get("timestamp"), item.get("url"))
    )
    hint = item.get("delivery_id")
    return ReceiptEvent(
        **base_fields(raw, orjson.dumps([item]), {}), provider_event_id=event_id,
        provider_msg_id=msg_id, delivery_hint=str(hint) if hint else None, status=status,
        state=state, reason=reason, occurred_at=occurred, attributes=attributes,
    )  # fmt: skip


def _sendgrid(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    data = json_body(body)
    items = data if isinstance(data, list) else [data]
    return [_sendgrid_event(raw, item) for item in items]


_INTERNAL_KNOWN = frozenset({"delivery_id", "event", "event_id", "occurred_at"})


def _internal_event(raw: Mapping[str, Any], item: Any) -> ReceiptEvent:
    if not isinstance(item, dict) or not item.get("delivery_id") or not item.get("event"):
        raise BadReceipt("unparseable_receipt", f"{raw['provider']}: delivery_id/event missing")
    provider = str(raw["provider"])
    status = str(item["event"]).lower()
    state, reason = state_of(_INTERNAL, status)
    delivery_id = str(item["delivery_id"])
    occurred = _epoch(item.get("occurred_at")) or received_time(raw)
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


# Receipts that say the address itself is dead (PROVIDERS.md §6, token_dead column): Twilio
# 21610 (the recipient replied STOP) and 30006 (landline or unreachable carrier); Vonage DLR err
# 3 (absent subscriber, permanent), 4 (barred by the user), 9 (illegal number); SendGrid hard
# bounce (not `blocked`, which is the receiving server's policy). Receipts that say the person
# wants no more marketing on that channel while the address works (a marketing opt-out,
# sinks/consent.py, never a disabled address: their password resets must still arrive):
# SendGrid's unsubscribe, group unsubscribe and spam report.
_FORMATS: dict[str, ReceiptFormat] = {
    "sms_a": ReceiptFormat(_twilio, dead_address=frozenset({"twilio_21610", "twilio_30006"})),
    "sms_b": ReceiptFormat(
        _vonage, dead_address=frozenset({"vonage_err_3", "vonage_err_4", "vonage_err_9"})
    ),
    "email": ReceiptFormat(
        _sendgrid,
        dead_address=frozenset({"bounce"}),
        opt_out=frozenset({"unsubscribe", "group_unsubscribe", "spamreport"}),
    ),
    "inbox": ReceiptFormat(_internal, names_delivery=True),
    "app": ReceiptFormat(_internal, names_delivery=True),
}


def register_format(source: str, fmt: ReceiptFormat) -> None:
    """Read `source`'s receipts with `fmt` from now on: a provider whose receipt format lives in
    its own folder (its SPEC, sinks/provider_registry.py); the receipts job registers every
    registered provider's at start."""
    _FORMATS[source] = fmt


def sources() -> frozenset[str]:
    """Every source whose receipts `normalize` reads (the webhook providers, the inbox, the app)."""
    return frozenset(_FORMATS)
