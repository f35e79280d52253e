"""Reconciliation of Unknown outcomes (sinks/dispatch/reconcile.py) against real Twilio- and
SendGrid-style simulators and real Redis: a provider that took the message and never answered
is found (SENT, no second message); one that lost the request before taking it is sent again
once, under the same delivery_id; bulk is never resent; a provider without a lookup stays
UNKNOWN."""

from __future__ import annotations

from datetime import timedelta

import pytest

from herald.guard import AlreadySent
from infra.simulators.launcher import RunningSimulator
from tests.sinks.dispatch_helpers import (
    accepted_for,
    delivery,
    dispatch_settings,
    factories,
    harness,
    now,
    states,
)

pytestmark = pytest.mark.integration

FAST = {"timeout_s": 0.5}  # the provider call's timeout: an Unknown within half a second
MAIL = {**FAST, "activity_lag_s": 0.0}  # the simulator's activity feed has no lag


@pytest.fixture
def fresh(
    sms_a: RunningSimulator, email: RunningSimulator, apns: RunningSimulator
) -> dict[str, RunningSimulator]:
    """The shared simulators (tests/simulator_fixtures.py), reset for this test."""
    return {"sms_a": sms_a, "email": email, "apns": apns}


def _unknown_then_follow_up(h, sim: RunningSimulator, d: dict, **fault: float) -> dict:  # type: ignore[no-untyped-def]
    """Dispatch `d` against `sim` with `fault` on: UNKNOWN, and its follow-up record (due
    `reconcile_after_s` later on the retry topic); the fault is off again afterwards."""
    sim.configure(**fault)
    out = h.run([d])
    sim.configure(timeout_after_accept=0.0, lose_before_accept=0.0)
    assert [s for s, _ in states(out, d["delivery_id"])] == ["SENDING", "UNKNOWN"]
    [follow_up] = out.retries
    assert follow_up["delivery_id"] == d["delivery_id"] and follow_up["attempt"] == 1
    assert follow_up["next_attempt_at"] >= now() + timedelta(seconds=h.cfg.reconcile_after_s - 1)
    return {**follow_up, "next_attempt_at": None}  # the retry job released it: due now


def test_a_message_the_provider_took_is_marked_sent_not_sent_again(
    fresh: dict[str, RunningSimulator], url: str
) -> None:
    otp = delivery("sms", address="+15005550121")
    with harness(url, factories(fresh, url, sms_a=FAST)) as h:
        again = _unknown_then_follow_up(h, fresh["sms_a"], otp, timeout_after_accept=1.0)
        out = h.run([again])
        assert states(out, otp["delivery_id"]) == [("PROVIDER_ACCEPTED", "reconciled")]
        [accepted] = out.events
        assert accepted["provider_msg_id"].startswith("SM") and accepted["attempt"] == 1
        repeat = h.run([again])  # delivered twice: SENT now, the same event again, no send
        assert "SENDING" not in [s for s, _ in states(repeat)]
    assert accepted_for(fresh["sms_a"], "+15005550121") == 1  # one message, the first


def test_a_request_lost_before_the_provider_is_sent_again_exactly_once(
    fresh: dict[str, RunningSimulator], url: str
) -> None:
    otp = delivery("sms", address="+15005550122")
    with harness(url, factories(fresh, url, sms_a=FAST)) as h:
        again = _unknown_then_follow_up(h, fresh["sms_a"], otp, lose_before_accept=1.0)
        assert accepted_for(fresh["sms_a"], "+15005550122") == 0  # the provider never got it
        out = h.run([again])
        assert [s for s, _ in states(out, otp["delivery_id"])] == ["SENDING", "PROVIDER_ACCEPTED"]
        assert {e["attempt"] for e in out.events} == {2}  # the next attempt, same delivery_id
        repeat = h.run([again])  # the same follow-up delivered twice: SENT now, no send
        assert "SENDING" not in [s for s, _ in states(repeat)]
    assert accepted_for(fresh["sms_a"], "+15005550122") == 1


def test_email_is_looked_up_in_the_activity_feed(
    fresh: dict[str, RunningSimulator], url: str
) -> None:
    found = delivery("email", address="found@example.com")
    lost = delivery("email", address="lost@example.com")
    with harness(url, factories(fresh, url, email=MAIL)) as h:
        first = _unknown_then_follow_up(h, fresh["email"], found, timeout_after_accept=1.0)
        second = _unknown_then_follow_up(h, fresh["email"], lost, lose_before_accept=1.0)
        out = h.run([first, second])
    assert states(out, found["delivery_id"]) == [("PROVIDER_ACCEPTED", "reconciled")]
    assert [s for s, _ in states(out, lost["delivery_id"])] == ["SENDING", "PROVIDER_ACCEPTED"]
    assert accepted_for(fresh["email"], "found@example.com") == 1
    assert accepted_for(fresh["email"], "lost@example.com") == 1


def test_bulk_is_never_sent_twice_and_no_lookup_stays_unknown(
    fresh: dict[str, RunningSimulator], url: str
) -> None:
    promo = delivery("email", address="promo@example.com", traffic_class="bulk",
                     notification_type="marketing_campaign", category="marketing")  # fmt: skip
    push = delivery()  # APNs: no lookup API
    cfg = dispatch_settings()
    with harness(url, factories(fresh, url, email=MAIL, apns={"timeout_s": 0.5}), cfg) as h:
        again = _unknown_then_follow_up(h, fresh["email"], promo, lose_before_accept=1.0)
        out = h.run([again])
        assert states(out, promo["delivery_id"]) == [("FAILED_PERMANENT", "lost_before_provider")]
        fresh["apns"].configure(timeout_after_accept=1.0)
        unknown = h.run([push])
        assert unknown.retries == []  # nothing to ask APNs: no follow-up
        [held] = h.guard.acquire_many([(push["delivery_id"], "transactional")])
        assert isinstance(held, AlreadySent) and held.state == "unknown"
    assert accepted_for(fresh["email"], "promo@example.com") == 0


def test_a_not_found_younger_than_the_providers_record_lag_is_asked_again(
    fresh: dict[str, RunningSimulator], url: str
) -> None:
    """SendGrid's activity feed lags: "not found" a moment after the send is not believed."""
    lost = delivery("email", address="late@example.com")
    lagging = {**FAST, "activity_lag_s": 3600.0}
    with harness(url, factories(fresh, url, email=lagging)) as h:
        again = _unknown_then_follow_up(h, fresh["email"], lost, lose_before_accept=1.0)
        out = h.run([again])
    assert states(out) == []  # nothing sent, nothing decided
    [later] = out.retries
    assert later["delivery_id"] == lost["delivery_id"] and later["next_attempt_at"] > now()
    assert accepted_for(fresh["email"], "late@example.com") == 0
