"""Twilio status callbacks (a form posted to StatusCallback) -> receipt events.

    MessageSid, MessageStatus, ErrorCode, RawDlrDoneDate (PROVIDERS.md)

A failed callback names its error: `twilio_<ErrorCode>`; 21610 (the recipient replied STOP) and
30006 (landline or unreachable carrier) say the number is dead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herald.receipts import (
    BadReceipt,
    ReceiptEvent,
    ReceiptFormat,
    base_fields,
    event_digest,
    extra_fields,
    form_body,
    received_time,
    state_of,
)

__all__ = ["FORMAT", "parse"]

_STATES: Mapping[str, tuple[str | None, str | None]] = {
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

_KNOWN = frozenset({
    "MessageSid", "SmsSid", "MessageStatus", "SmsStatus", "ErrorCode", "RawDlrDoneDate",
    "AccountSid", "From", "To", "ApiVersion", "SmsMessageSid", "MessagingServiceSid",
})  # fmt: skip
_TOKEN = "i-twilio-idempotency-token"


def parse(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    form = form_body(body)
    sid = form.get("MessageSid") or form.get("SmsSid")
    status = (form.get("MessageStatus") or form.get("SmsStatus") or "").lower()
    if not sid or not status:
        raise BadReceipt("unparseable_receipt", "sms_a: MessageSid or MessageStatus missing")
    state, reason = state_of(_STATES, status)
    code = form.get("ErrorCode") or ""
    if code and state == "FAILED_PERMANENT":
        reason = f"twilio_{code}"
    attributes = {"provider_status": status, **extra_fields(form, _KNOWN)}
    if code:
        attributes["error_code"] = code
    if form.get("RawDlrDoneDate"):
        attributes["dlr_done"] = form["RawDlrDoneDate"]
    headers = {str(k).lower(): str(v) for k, v in (raw.get("headers") or {}).items()}
    token = headers.get(_TOKEN)
    # The id comes from the signed form only: the idempotency token is an unsigned header, so
    # a replayed callback with a new token must still be the event it was.
    event_id = event_digest("sms_a", sid, status, code, form.get("RawDlrDoneDate"))
    redrive = {_TOKEN: token} if token else {}
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


FORMAT = ReceiptFormat(parse, dead_address=frozenset({"twilio_21610", "twilio_30006"}))
