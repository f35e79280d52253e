"""Status reports (JSON posted to `reportUrl`) -> receipt events.

    {"id": message id, "reference": Herald's delivery id, "recipient": 14155550100,
     "status": "sent" | "buffered" | "delivered" | "expired" | "delivery_failed",
     "statusReason": text, "statusErrorCode": int or null, "statusDatetime": ISO 8601}

A failed report names its error: `mb_err_<statusErrorCode>`; error 1 (unknown subscriber) and 6
(the number is barred) say the number is dead.
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
    json_body,
    received_time,
    state_of,
)

__all__ = ["FORMAT", "parse"]

_STATES: Mapping[str, tuple[str | None, str | None]] = {
    "scheduled": ("PROVIDER_ACCEPTED", "scheduled"),
    "sent": ("PROVIDER_ACCEPTED", None),
    "buffered": ("PROVIDER_ACCEPTED", "buffered"),
    "delivered": ("DELIVERED", None),
    "expired": ("FAILED_PERMANENT", "expired_at_carrier"),
    "delivery_failed": ("FAILED_PERMANENT", "delivery_failed"),
}
_KNOWN = frozenset({
    "id", "reference", "recipient", "status", "statusReason", "statusErrorCode",
    "statusDatetime", "mccmnc", "ported", "datacoding",
})  # fmt: skip


def _time(text: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def parse(raw: Mapping[str, Any], body: bytes) -> list[ReceiptEvent]:
    """The one event of a status report (BadReceipt when it has no message id or status)."""
    data = json_body(body)
    if not isinstance(data, dict):
        raise BadReceipt("unparseable_receipt", "sms_c: the report is not a JSON object")
    msg_id, status = data.get("id"), str(data.get("status") or "").lower()
    if not isinstance(msg_id, str) or not msg_id or not status:
        raise BadReceipt("unparseable_receipt", "sms_c: id or status missing")
    state, reason = state_of(_STATES, status)
    code = data.get("statusErrorCode")
    if code not in (None, "", 0, "0") and state == "FAILED_PERMANENT":
        reason = f"mb_err_{code}"
    attributes = {"provider_status": status, **extra_fields(data, _KNOWN)}
    if code not in (None, ""):
        attributes["error_code"] = str(code)
    reference = data.get("reference")
    event_id = event_digest("sms_c", msg_id, status, code, data.get("statusDatetime"))
    return [
        ReceiptEvent(
            **base_fields(raw, body, {}),
            provider_event_id=event_id,
            provider_msg_id=msg_id,
            delivery_hint=reference if isinstance(reference, str) and reference else None,
            status=status,
            state=state,
            reason=reason,
            occurred_at=_time(data.get("statusDatetime")) or received_time(raw),
            attributes=attributes,
        )
    ]


FORMAT = ReceiptFormat(parse, dead_address=frozenset({"mb_err_1", "mb_err_6"}))
