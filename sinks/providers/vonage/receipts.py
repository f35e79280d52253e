"""Vonage delivery receipts (a form or JSON DLR posted to the callback URL) -> receipt events.

    messageId, status, err-code, message-timestamp, scts, client-ref (PROVIDERS.md)

`client-ref` carries Herald's delivery id. A failed DLR names its error: `vonage_err_<err-code>`;
3 (absent subscriber, permanent), 4 (barred by the user) and 9 (illegal number) say the number
is dead.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from herald.receipts import (
    BadReceipt,
    ReceiptEvent,
    ReceiptFormat,
    base_fields,
    event_digest,
    extra_fields,
    field_text,
    form_body,
    is_json,
    json_body,
    received_time,
    state_of,
)

__all__ = ["FORMAT", "parse"]

_STATES: Mapping[str, tuple[str | None, str | None]] = {
    "accepted": ("PROVIDER_ACCEPTED", None),
    "buffered": ("PROVIDER_ACCEPTED", "buffered"),
    "delivered": ("DELIVERED", None),
    "expired": ("FAILED_PERMANENT", "expired_at_carrier"),
    "failed": ("FAILED_PERMANENT", "failed"),
    "rejected": ("FAILED_PERMANENT", "rejected"),
    # The carrier never said: that is exactly DELIVERY_UNKNOWN, not a failure.
    "unknown": ("DELIVERY_UNKNOWN", "carrier_unknown"),
}

_KNOWN = frozenset({
    "messageId", "status", "err-code", "message-timestamp", "scts", "client-ref", "msisdn", "to",
    "network-code", "price", "api-key", "sig", "timestamp", "nonce",
})  # fmt: skip


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def parse(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    if is_json(raw, body):
        data = json_body(body)
        if not isinstance(data, dict):
            raise BadReceipt("unparseable_receipt", "sms_b: JSON DLR is not an object")
        fields = {str(k): v if isinstance(v, str) else field_text(v) for k, v in data.items()}
    else:
        fields = form_body(body)
    msg_id = fields.get("messageId") or fields.get("message-id")
    status = (fields.get("status") or "").lower()
    if not msg_id or not status:
        raise BadReceipt("unparseable_receipt", "sms_b: messageId or status missing")
    state, reason = state_of(_STATES, status)
    code = fields.get("err-code") or ""
    if code and code != "0" and state in ("FAILED_PERMANENT", "DELIVERY_UNKNOWN"):
        reason = f"vonage_err_{code}"
    attributes = {"provider_status": status, **extra_fields(fields, _KNOWN)}
    for name, key in (("err-code", "error_code"), ("network-code", "network"), ("scts", "scts")):
        if fields.get(name):
            attributes[key] = fields[name]
    event_id = event_digest("sms_b", msg_id, status, code, fields.get("scts"),
                       fields.get("message-timestamp"))  # fmt: skip
    occurred = _time(fields.get("message-timestamp")) or received_time(raw)
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


FORMAT = ReceiptFormat(
    parse, dead_address=frozenset({"vonage_err_3", "vonage_err_4", "vonage_err_9"})
)
