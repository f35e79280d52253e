"""herald.dispatching: the pure rules of one dispatch attempt (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from herald import dispatching as dx
from herald.backoff import BackoffPolicy
from herald.outcomes import Accepted, Permanent, Retryable, Unknown
from herald.policy import Preferences
from herald.receipts import address_tag
from herald.retry import (
    Done,
    Expire,
    Failover,
    FailPermanent,
    MarkUnknown,
    PausePlatform,
    Retry,
    TokenCleanup,
    UnknownPolicy,
    decide,
)
from herald.states import State
from sinks.dispatch.settings import DispatchSettings

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
KEY = b"test-pii-key"


def delivery(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "delivery_id": "d-1", "notification_id": "n-1", "user_id": "u-1", "tenant_id": "acme",
        "notification_type": "otp_login", "category": "transactional",
        "traffic_class": "transactional", "channel": "sms", "provider": None,
        "platform": None, "attempt": 0, "not_before": None, "next_attempt_at": None,
        "expire_at": NOW + timedelta(minutes=5), "first_attempt_at": None,
        "fallback": ["sms:sms_b", "push"], "created_at": NOW - timedelta(seconds=2),
    }  # fmt: skip
    return {**base, **changes}


def fx(action: Any, outcome: Any = None, **kw: Any) -> dx.Effects:
    args: dict[str, Any] = {"provider": "sms_a", "attempt": 1, "now": NOW,
                            "first_attempt_at": NOW, "pii_key": KEY, **kw}  # fmt: skip
    return dx.effects(action, delivery(), outcome, **args)


def test_provider_choice() -> None:
    assert dx.provider_of(delivery()) == "sms_a"
    assert dx.provider_of(delivery(provider="sms_b")) == "sms_b"
    assert dx.provider_of(delivery(channel="push", platform="fcm")) == "fcm"
    assert dx.provider_of(delivery(channel="inapp")) == "inbox"
    with pytest.raises(ValueError):
        dx.provider_of(delivery(channel="fax"))


def test_alternates_are_same_channel_provider_steps_only() -> None:
    assert dx.alternates(delivery()) == ("sms_b",)
    assert dx.alternates(delivery(fallback=["push", "email"])) == ()
    assert dx.alternates(delivery(channel="push", fallback=["sms:sms_b"])) == ()


def test_due_at_is_the_later_hold() -> None:
    later = NOW + timedelta(seconds=9)
    assert dx.due_at(delivery()) is None
    assert dx.due_at(delivery(not_before=NOW, next_attempt_at=later)) == later
    assert dx.due_at(delivery(next_attempt_at=int(later.timestamp() * 1000))) == later


def test_recheck_expiry_then_opt_outs() -> None:
    prefs = Preferences("u-1", category_channel_opt_out=frozenset({"marketing:sms"}))
    expired = delivery(expire_at=NOW)
    assert dx.recheck(expired, NOW, None, False) == dx.Skip(State.EXPIRED, "expired")
    marketing = delivery(category="marketing")
    assert dx.recheck(marketing, NOW, prefs, False) == dx.Skip(State.SUPPRESSED, "channel_opt_out")
    assert dx.recheck(marketing, NOW, prefs, True) is None  # approved bypass
    assert dx.recheck(delivery(), NOW, prefs, False) is None
    assert dx.opt_out_reason(Preferences("u", global_opt_out=True), "social", "push") == (
        "global_opt_out"
    )
    assert dx.opt_out_reason(
        Preferences("u", category_opt_out=frozenset({"social"})), "social", "push"
    ) == "category_opt_out"  # fmt: skip


def test_sent_marker_round_trip() -> None:
    marker = dx.sent_marker("fcm", 3, "projects/p/messages/0:1|x")
    assert dx.parse_sent_marker(marker) == ("fcm", 3, "projects/p/messages/0:1|x")
    assert dx.parse_sent_marker("legacy-id") == (None, 0, "legacy-id")
    assert dx.parse_sent_marker(None) == (None, 0, None)


def test_event_ids_are_deterministic_per_state_attempt_reason() -> None:
    a = dx.event(delivery(), State.SENDING, attempt=1, now=NOW, provider="sms_a")
    b = dx.event(delivery(), State.SENDING, attempt=1, now=NOW + timedelta(1), provider="sms_a")
    c = dx.event(delivery(), State.SENDING, attempt=2, now=NOW, provider="sms_a")
    assert a["event_id"] == b["event_id"] != c["event_id"]
    assert a["state"] == "SENDING" and a["channel"] == "sms" and a["attributes"] == {}


def test_done_marks_sent_with_latency_since_planning() -> None:
    out = fx(Done("SM1"), Accepted("SM1", provider="sms_a", status_code=201, latency_ms=12.0))
    [ev] = out.events
    assert (ev["state"], ev["provider_msg_id"], ev["latency_ms"]) == (
        "PROVIDER_ACCEPTED",
        "SM1",
        2000,
    )
    assert ev["attributes"] == {
        "outcome": "accepted",
        "provider_call_ms": "12",
        "http_status": "201",
    }
    assert out.guard == "sent" and out.retry is None


def test_accepted_sms_and_email_tag_the_address_they_went_to() -> None:
    ok = Accepted("SM1", provider="sms_a", status_code=201, latency_ms=12.0)
    sms = dx.effects(Done("SM1"), delivery(address="+15550100"), ok, provider="sms_a",
                     attempt=1, now=NOW, first_attempt_at=NOW, pii_key=KEY)  # fmt: skip
    assert sms.events[0]["attributes"]["address_tag"] == address_tag("+15550100", KEY)
    push = dx.effects(Done("a1"), delivery(channel="push", address="ab" * 32), ok,
                      provider="apns", attempt=1, now=NOW, first_attempt_at=NOW,
                      pii_key=KEY)  # fmt: skip
    assert "address_tag" not in push.events[0]["attributes"]  # a dead token answers at once


def test_retry_counts_the_attempt_and_frees_the_guard() -> None:
    at = NOW + timedelta(seconds=3)
    out = fx(Retry(at, "http_503"), Retryable("http_503", provider="sms_a"))
    assert out.guard == "release" and out.retry is not None
    assert (out.retry["attempt"], out.retry["next_attempt_at"]) == (1, at)
    assert out.retry["first_attempt_at"] == NOW and out.retry["provider"] == "sms_a"
    refused = fx(Retry(at, "breaker_open", counts_as_attempt=False))
    assert refused.retry is not None and refused.retry["attempt"] == 0
    assert refused.retry["first_attempt_at"] is None and refused.guard == "release"


def test_failover_keeps_the_guard_and_names_the_target() -> None:
    out = fx(Failover("sms_b", "rejected:21408"), Permanent("21408", provider="sms_a"))
    assert out.failover_to == "sms_b" and out.guard == "keep" and out.retry is None
    assert out.events[0]["reason"] == "failover:rejected:21408"
    assert out.events[0]["attributes"]["failover_to"] == "sms_b"


def test_permanent_token_dead_expired() -> None:
    plain = fx(FailPermanent("21211"), Permanent("21211", provider="sms_a"))
    assert plain.dead_letter is None and plain.retry is None and plain.guard == "release"
    exhausted = fx(FailPermanent("retries_exhausted:http_503", dead_letter=True))
    assert exhausted.dead_letter == "retries_exhausted:http_503"
    assert exhausted.retry is not None and exhausted.retry["attempt"] == 1
    dead = fx(TokenCleanup("Unregistered"))
    assert dead.cleanup_token and dead.events[0]["state"] == "FAILED_PERMANENT"
    assert fx(Expire()).events[0]["state"] == "EXPIRED"


def test_platform_pause_requeues_uncounted_or_fails_over() -> None:
    at = NOW + timedelta(seconds=90)
    paused = fx(PausePlatform("sms_a", "20003", 60.0, at))
    assert paused.pause == ("sms_a", "20003", 60.0) and paused.retry is not None
    assert paused.retry["attempt"] == 0 and paused.retry["next_attempt_at"] == at
    moved = fx(PausePlatform("sms_a", "20003", 60.0, at, failover_to="sms_b"))
    assert moved.failover_to == "sms_b" and moved.retry is None and moved.pause is not None


def test_unknown_reconciles_unless_the_type_accepts_duplicates() -> None:
    plain = fx(MarkUnknown("timeout"), Unknown("timeout", provider="sms_a"))
    assert plain.guard == "unknown" and plain.retry is None and plain.failover_to is None
    over = fx(MarkUnknown("timeout", Failover("sms_b", "unknown:timeout")))
    assert [e["state"] for e in over.events] == ["UNKNOWN", "RETRY_SCHEDULED"]
    assert over.failover_to == "sms_b" and over.guard == "keep"
    again = fx(MarkUnknown("timeout", Retry(NOW + timedelta(seconds=1), "unknown:timeout")))
    assert again.guard == "release" and again.retry is not None


def test_policy_from_the_catalog_flag_drives_decide() -> None:
    backoff = BackoffPolicy()
    strict = dx.retry_policy(backoff, failover_on_unknown=False, platform_pause_s=60)
    lenient = dx.retry_policy(backoff, failover_on_unknown=True, platform_pause_s=60)
    assert (strict.on_unknown, lenient.on_unknown) == (
        UnknownPolicy.RECONCILE,
        UnknownPolicy.FAILOVER,
    )
    ctx = dx.attempt_context(delivery(), "sms_a", 1, NOW)
    unknown = Unknown("timeout", provider="sms_a")
    assert decide(unknown, ctx, strict) == MarkUnknown("timeout")
    assert decide(unknown, ctx, lenient) == MarkUnknown(
        "timeout", Failover("sms_b", "unknown:timeout")
    )


def test_retried_consumes_the_fallback_up_to_the_provider() -> None:
    rec = dx.retried(delivery(), at=NOW, provider="sms_b", attempts_made=2, first_attempt_at=NOW)
    assert rec["fallback"] == ["push"] and rec["provider"] == "sms_b"
    assert dx.requeued(delivery(), NOW)["attempt"] == 0


def test_settings_refuse_a_pending_ttl_shorter_than_a_guard_hold() -> None:
    with pytest.raises(ValidationError):
        DispatchSettings(pending_ttl_s=10.0, shape_max_wait_s=10.0, call_timeout_s=10.0)
    cfg = DispatchSettings(rates={"sms_a": {"rate": 100, "reserved": 30}})
    assert cfg.provider_rates()["sms_a"].cap == 30
    assert cfg.backoff_for("bulk").max_attempts == 8


def test_a_channels_bulk_job_reads_and_dispatches_its_own_slices() -> None:
    cfg = DispatchSettings(max_slice=500, batch_size=400, bulk_slices={"push": 6000})
    push = cfg.for_job("push", "bulk")
    assert (push.max_slice, push.batch_size) == (6000, 6000)
    for channel, cls in (("push", "transactional"), ("email", "bulk"), ("all", "normal")):
        assert cfg.for_job(channel, cls) is cfg
    assert DispatchSettings().for_job("push", "bulk").max_slice == 8000
    with pytest.raises(ValidationError):
        DispatchSettings(bulk_slices={"push": 0})
