"""SendGrid event webhook (a JSON array of events) -> receipt events, one per event.

    sg_event_id, sg_message_id, event, timestamp, type, delivery_id (custom_args) (PROVIDERS.md)

A hard bounce (not `blocked`, the receiving server's policy) says the address is dead; an
unsubscribe, group unsubscribe or spam report says the person wants no more marketing email
while the address works (sinks/consent.py): their password resets must still arrive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from herald.receipts import (
    BadReceipt,
    ReceiptEvent,
    ReceiptFormat,
    base_fields,
    epoch_time,
    event_digest,
    extra_fields,
    field_text,
    json_body,
    received_time,
    state_of,
)

__all__ = ["FORMAT", "parse"]

_STATES: Mapping[str, tuple[str | None, str | None]] = {
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

_KNOWN = frozenset({
    "event", "sg_event_id", "sg_message_id", "timestamp", "delivery_id", "type", "status",
    "attempt", "category", "email", "smtp-id", "reason", "response", "url", "ip", "useragent",
    "tls", "cert_err", "asm_group_id", "url_offset", "sg_machine_open", "bounce_classification",
})  # fmt: skip


def _event(raw: Mapping[str, Any], item: Any) -> ReceiptEvent:
    if not isinstance(item, dict):
        raise BadReceipt("unparseable_receipt", "email: an event is not an object")
    status = str(item.get("event") or "").lower()
    sg_message_id = str(item.get("sg_message_id") or "")
    if not status:
        raise BadReceipt("unparseable_receipt", "email: event without `event`")
    msg_id = sg_message_id.split(".", 1)[0] or None  # X-Message-Id is its prefix
    state, reason = state_of(_STATES, status)
    if status == "bounce" and item.get("type") == "blocked":
        reason = "blocked"
    attributes = {"provider_status": status, **extra_fields(item, _KNOWN)}
    for name in ("type", "status", "attempt", "bounce_classification", "sg_machine_open"):
        if item.get(name) not in (None, ""):
            attributes[name if name != "status" else "smtp_status"] = field_text(item[name])
    if item.get("url"):
        attributes["link_hash"] = hashlib.sha256(str(item["url"]).encode()).hexdigest()[:16]
    occurred = epoch_time(item.get("timestamp")) or received_time(raw)
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


def parse(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    data = json_body(body)
    items = data if isinstance(data, list) else [data]
    return [_event(raw, item) for item in items]


FORMAT = ReceiptFormat(
    parse,
    dead_address=frozenset({"bounce"}),
    opt_out=frozenset({"unsubscribe", "group_unsubscribe", "spamreport"}),
)
