"""herald.outcomes: the typed outcome values every provider client returns."""

from __future__ import annotations

import dataclasses

import pytest

from herald.outcomes import (
    CONNECT_ERROR,
    Accepted,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
    Unknown,
    is_retryable,
)
from herald.pii import mask_address
from sinks.providers.base import epoch_seconds, parse_retry_after


def test_outcomes_are_frozen_and_carry_common_fields() -> None:
    accepted = Accepted("m-1", provider="apns", status_code=200, latency_ms=3.5)
    assert accepted.as_dict() == {
        "kind": "accepted",
        "provider": "apns",
        "status_code": 200,
        "latency_ms": 3.5,
        "provider_msg_id": "m-1",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        accepted.provider = "fcm"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Accepted("m-1")  # type: ignore[call-arg]  # provider is required


def test_kinds_and_retry_classes() -> None:
    kinds = {
        cls.kind
        for cls in (Accepted, Retryable, RateLimited, Permanent, TokenDead, PlatformError, Unknown)
    }
    assert len(kinds) == 7
    assert is_retryable(Retryable("http_503", provider="sms_a"))
    assert is_retryable(RateLimited(2.0, provider="fcm"))
    assert not is_retryable(Unknown("timeout", provider="apns"))
    assert Retryable(CONNECT_ERROR, provider="sms_a").before_send
    assert not Retryable("http_500", provider="sms_a").before_send


def test_helpers() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert mask_address("+447700900123") == "…0123" and mask_address(None) == "-"
    assert epoch_seconds(1_700_000_000_000) == 1_700_000_000.0 and epoch_seconds(None) is None
