"""One valid example record per schema, shared by the serde, compat and API tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

NOW = datetime(2026, 3, 29, 1, 30, 15, 123000, tzinfo=UTC)


def example(name: str) -> dict[str, Any]:
    """A fully populated valid record of schema `name` (fresh dict on every call)."""
    return _EXAMPLES[name]()


def _notification_request() -> dict[str, Any]:
    return {
        "notification_id": "n-1",
        "request_id": "r-1",
        "tenant_id": "acme",
        "notification_type": "otp_login",
        "traffic_class": "transactional",
        "recipients": {"user_ids": ["u-1", "u-2"], "segment_id": None},
        "template_version": 3,
        "params": {"code": "123456"},
        "channels": ["sms", "push"],
        "locale": "de-CH",
        "send_at": None,
        "send_local_time": None,
        "expire_at": NOW,
        "accepted_at": NOW,
        "source": "api",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }


def _social_event() -> dict[str, Any]:
    return {
        "event_id": "e-1",
        "event_type": "like",
        "actor_id": "u-9",
        "actor_name": "Zoë",
        "recipient_id": "u-1",
        "object_id": "post-1",
        "object_type": "post",
        "occurred_at": NOW,
        "tenant_id": "acme",
    }


def _user_preferences() -> dict[str, Any]:
    return {
        "user_id": "u-1",
        "global_opt_out": False,
        "category_opt_out": ["marketing"],
        "channel_opt_out": ["sms"],
        "category_channel_opt_out": ["social:email"],
        "quiet_hours": {"start": "22:00", "end": "07:00"},
        "timezone": "Europe/Zurich",
        "locale": "de-CH",
        "updated_at": NOW,
        "version": 7,
    }


def _contact_points() -> dict[str, Any]:
    return {
        "user_id": "u-1",
        "devices": [
            {
                "device_id": "dev-1",
                "platform": "apns",
                "token": "a" * 64,
                "app_id": "com.example.app",
                "registered_at": NOW,
                "valid": True,
                "verified": True,
            }
        ],
        "phone": {"e164": "+41791234567", "verified": True},
        "email": {"address": "user@example.com", "verified": False},
        "disabled": [],
        "updated_at": NOW,
        "version": 2,
    }


def _delivery() -> dict[str, Any]:
    return {
        "delivery_id": "d-1",
        "notification_id": "n-1",
        "request_id": "r-1",
        "tenant_id": "acme",
        "user_id": "u-1",
        "notification_type": "otp_login",
        "category": "transactional",
        "traffic_class": "transactional",
        "channel": "sms",
        "provider": "sms_a",
        "address": "+41791234567",
        "platform": None,
        "rendered": {"title": None, "body": "Your code", "subject": None, "data": {"k": "v"}},
        "locale": "de-CH",
        "template_version": 3,
        "collapse_key": None,
        "attempt": 1,
        "not_before": None,
        "next_attempt_at": NOW,
        "expire_at": NOW,
        "first_attempt_at": NOW,
        "fallback": ["sms:sms_b", "push"],
        "created_at": NOW,
        "fallback_content": [
            {
                "channel": "push",
                "locale": "de-CH",
                "template_version": 3,
                "rendered": {"title": "Code", "body": "Your code", "subject": None, "data": {}},
            }
        ],
        "generation": 1,
        "sealed": None,
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }


def _dead_letter() -> dict[str, Any]:
    return {
        "dead_letter_id": "dl-1",
        "source_topic": "herald.deliveries.sms.transactional",
        "partition": 3,
        "offset": 2**40,
        "key": b"d-1",
        "value": b"\x01garbage",
        "reason": "bad_magic_byte",
        "detail": "first byte is 1, expected 0",
        "job": "dispatch",
        "failed_at": NOW,
        "attempts": 1,
        "delivery_id": None,
        "expire_at": None,
    }


def _delivery_event() -> dict[str, Any]:
    return {
        "event_id": "ev-1",
        "delivery_id": "d-1",
        "notification_id": "n-1",
        "user_id": "u-1",
        "tenant_id": "acme",
        "notification_type": "otp_login",
        "channel": "sms",
        "traffic_class": "transactional",
        "state": "PROVIDER_ACCEPTED",
        "reason": None,
        "provider": "sms_a",
        "provider_msg_id": "SM123",
        "attempt": 1,
        "latency_ms": 412,
        "occurred_at": NOW,
        "recorded_at": NOW,
        "attributes": {"http_status": "200"},
        "generation": 1,
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }


def _raw_receipt() -> dict[str, Any]:
    return {
        "receipt_id": "rc-1",
        "provider": "sms_a",
        "received_at": NOW,
        "content_type": "application/json",
        "headers": {"x-signature": "abc"},
        "body": b'{"sid": "SM123", "status": "delivered", "unknown_field": 1}',
        "signature_valid": True,
        "remote_addr": "203.0.113.7",
    }


_EXAMPLES = {
    "notification_request": _notification_request,
    "social_event": _social_event,
    "user_preferences": _user_preferences,
    "contact_points": _contact_points,
    "delivery": _delivery,
    "dead_letter": _dead_letter,
    "delivery_event": _delivery_event,
    "raw_receipt": _raw_receipt,
}
