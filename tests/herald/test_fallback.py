"""herald.fallback: the cross-channel fallback decided at dispatch time (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastavro.validation import validate

from herald import ids
from herald.catalog import load_catalog
from herald.fallback import cross_channel_steps, fall_back
from herald.plan_records import Renderer, plan_user, user_records
from herald.planning import UserView, admit_request
from herald.policy import ContactPoints, Preferences
from herald.quiet_hours import QuietWindow
from schemas import load_schema

CATALOG = load_catalog()
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PUSH = {"channel": "push", "locale": "en", "template_version": 2,
        "rendered": {"title": "Login code", "body": "Your login code is 123456", "subject": None,
                     "data": {"kind": "otp"}}}  # fmt: skip


def sms(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "delivery_id": "d-sms", "notification_id": "n-1", "request_id": "r-1",
        "tenant_id": "acme", "user_id": "u-1", "notification_type": "otp_login",
        "category": "transactional", "traffic_class": "transactional", "channel": "sms",
        "provider": "sms_b", "address": "+15005550006", "platform": None,
        "rendered": {"title": None, "body": "Herald: your code is 123456", "subject": None,
                     "data": {}},
        "locale": "en", "template_version": 2, "collapse_key": None, "attempt": 2,
        "not_before": None, "next_attempt_at": None, "expire_at": NOW + timedelta(minutes=5),
        "first_attempt_at": NOW, "fallback": ["push"], "fallback_content": [PUSH],
        "created_at": NOW - timedelta(seconds=1),
    }  # fmt: skip
    base.update(changes)
    return base


def contacts(
    *tokens: str, valid: bool = True, verified: bool = True, **changes: Any
) -> dict[str, Any]:
    devices = [{"device_id": f"dev-{t}", "platform": "apns", "token": t, "app_id": None,
                "registered_at": 0, "valid": valid, "verified": verified}
               for t in tokens]  # fmt: skip
    return {"user_id": "u-1", "devices": devices, "phone": None, "email": None,
            "updated_at": 0, "version": 1, **changes}  # fmt: skip


def run(delivery: dict[str, Any], prefs: Preferences | None = None, cp: Any = None, **kw: Any):
    nt = CATALOG.types[delivery["notification_type"]]
    return fall_back(delivery, kw.pop("cause", "21408"), nt=nt, prefs=prefs, contacts=cp,
                     now=kw.pop("now", NOW), quiet_channels=CATALOG.quiet_hours_channels,
                     default_timezone="UTC")  # fmt: skip


def test_steps_of_the_same_channel_are_provider_failover_not_fallback() -> None:
    d = sms(channel="sms", fallback=["sms:sms_b", "push", "email:email", "push"])
    assert cross_channel_steps(d) == [(1, "push", None), (2, "email", "email")]


def test_sms_falls_back_to_every_valid_push_device_with_stable_ids() -> None:
    fb = run(sms(), cp=contacts("t1", "t2"))
    assert fb.to == "push" and not fb.held
    assert [d["delivery_id"] for d in fb.deliveries] == [
        ids.delivery_id("n-1", "u-1", "push", "dev-t1"),
        ids.delivery_id("n-1", "u-1", "push", "dev-t2"),
    ]
    first = fb.deliveries[0]
    assert first["address"] == "t1" and first["provider"] == "apns"
    assert first["rendered"] == PUSH["rendered"] and first["attempt"] == 0
    assert first["fallback"] == [] and first["fallback_content"] == []
    assert first["collapse_key"] == "n-1" and first["expire_at"] == sms()["expire_at"]
    ev = fb.events[0]
    assert (ev["state"], ev["reason"]) == ("PLANNED", "fallback")
    assert ev["attributes"] == {"fallback_from": "sms", "fallback_cause": "21408",
                                "from_delivery_id": "d-sms"}  # fmt: skip
    assert run(sms(), cp=contacts("t1", "t2")).events == fb.events  # replay: same ids


def test_an_otp_falls_back_only_to_the_users_verified_devices() -> None:
    """otp_login is `secret`: a token some key registered without contact_points:verify (which
    could be the key holder's own) never receives the code."""
    cp = contacts("mine")
    cp["devices"].append({**contacts("planted", verified=False)["devices"][0]})
    fb = run(sms(), cp=cp)
    assert fb.to == "push" and [d["address"] for d in fb.deliveries] == ["mine"]
    only_planted = run(sms(), cp=contacts("planted", verified=False))
    assert only_planted.to is None and only_planted.skipped == [("push", "device_unverified")]


def test_expired_never_falls_back() -> None:
    fb = run(sms(), cp=contacts("t1"), now=NOW + timedelta(minutes=6))
    assert fb.to is None and fb.skipped == [("*", "expired")] and not fb.deliveries


def test_opt_out_is_rechecked_unless_the_type_bypasses_it() -> None:
    prefs = Preferences("u-1", channel_opt_out=frozenset({"push"}))
    alert = sms(notification_type="order_shipped", category="marketing",
                fallback=["push", "email"], fallback_content=[PUSH])  # fmt: skip
    fb = run(alert, prefs, cp=contacts("t1"))
    assert fb.to is None
    assert fb.skipped == [("push", "channel_opt_out"), ("email", "not_rendered")]
    assert run(sms(), prefs, cp=contacts("t1")).to == "push"  # otp_login bypasses opt-outs


def test_no_valid_token_or_no_copy_skips_the_channel() -> None:
    assert run(sms(), cp=contacts("t1", valid=False)).skipped == [("push", "no_valid_token")]
    assert run(sms(), cp=None).skipped == [("push", "no_contact_point")]
    assert run(sms(), cp=contacts()).skipped == [("push", "no_contact_point")]


def test_a_disabled_address_is_named_when_skipped() -> None:
    email = {**PUSH, "channel": "email", "rendered": {**PUSH["rendered"], "subject": "Code"}}
    d = sms(fallback=["email"], fallback_content=[email])
    assert run(d, cp=contacts(disabled=["email"])).skipped == [("email", "address_disabled")]
    assert run(d, cp=contacts()).skipped == [("email", "no_contact_point")]


def test_quiet_hours_hold_the_fallback_until_morning() -> None:
    prefs = Preferences("u-1", quiet_hours=QuietWindow.parse("11:00", "13:00"), timezone="UTC")
    d = sms(notification_type="order_shipped", category="marketing",
            expire_at=NOW + timedelta(hours=3))  # fmt: skip
    fb = run(d, prefs, cp=contacts("t1"))
    assert fb.to == "push" and not fb.deliveries
    [held] = fb.held
    assert held["not_before"] == NOW + timedelta(hours=1) == held["next_attempt_at"]
    assert fb.events[0]["state"] == "SCHEDULED"
    late = run({**d, "expire_at": NOW + timedelta(minutes=30)}, prefs, cp=contacts("t1"))
    assert late.to is None and late.skipped == [("push", "expired")]


def test_unverified_phone_only_for_types_that_allow_it() -> None:
    content = [{**PUSH, "channel": "sms"}]
    phone = {"e164": "+15005550006", "verified": False}
    push = sms(channel="push", notification_type="payment_result", fallback=["sms"],
               fallback_content=content, address="t1", provider="apns")  # fmt: skip
    fb = run(push, cp=contacts(phone=phone))
    assert fb.skipped == [("sms", "phone_unverified")]
    fb = run(push, cp=contacts(phone={**phone, "verified": True}))
    assert fb.to == "sms" and fb.deliveries[0]["provider"] == "sms_a"
    assert fb.deliveries[0]["delivery_id"] == ids.delivery_id("n-1", "u-1", "sms")


def test_plan_renders_the_fallback_channels_content_and_it_is_valid_avro() -> None:
    rec = {
        "notification_id": "n-1", "request_id": "r-1", "tenant_id": "acme",
        "notification_type": "otp_login", "traffic_class": "transactional",
        "recipients": {"user_ids": ["u-1"], "segment_id": None},
        "params": {"code": "123456"}, "accepted_at": NOW, "source": "api", "locale": "de",
    }  # fmt: skip
    request = admit_request(rec, CATALOG, "t:0:1")
    view = UserView("u-1", None, Preferences("u-1"),
                    ContactPoints("u-1", phone="+15005550006", phone_verified=True))  # fmt: skip
    decisions = plan_user(CATALOG, request, view, NOW)
    out, rejected = user_records(Renderer(CATALOG), request, view, decisions, NOW)
    assert rejected == []
    [sms_delivery] = [o.value for o in out if o.topic == "herald.deliveries.sms.transactional"]
    assert sms_delivery["fallback"] == ["sms:sms_b", "push"]
    [push] = sms_delivery["fallback_content"]
    assert (push["channel"], push["locale"]) == ("push", "de")
    assert push["rendered"]["body"] == "Ihr Anmeldecode lautet 123456"
    assert validate(sms_delivery, load_schema("delivery"), raise_errors=True)
