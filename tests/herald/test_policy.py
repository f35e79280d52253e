"""The per user × channel decision: check order, bypass rules, fallback, holds, caps, expiry."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herald.catalog import Catalog, load_catalog
from herald.errors import InvalidLocale, InvalidTimeOfDay, InvalidTimezone, UnknownNotificationType
from herald.policy import (
    Address,
    ContactPoints,
    Decision,
    Device,
    Hold,
    PolicyRequest,
    Preferences,
    Send,
    Suppress,
    decide,
)
from herald.quiet_hours import QuietWindow
from herald.states import State

NY = "America/New_York"
NOON_NY = datetime(2026, 6, 1, 16, tzinfo=UTC)  # 12:00 EDT
NIGHT_NY = datetime(2026, 6, 2, 3, tzinfo=UTC)  # 23:00 EDT
MORNING_NY = datetime(2026, 6, 2, 12, tzinfo=UTC)  # 08:00 EDT

IPHONE = Device("d-ios", "apns", "tok-ios", verified=True)
PIXEL = Device("d-and", "fcm", "tok-and", verified=True)
PLANTED = Device("d-x", "apns", "tok-x")  # registered by a key without contact_points:verify
DEAD = Device("d-old", "apns", "tok-old", valid=False)
EVERYTHING = ContactPoints(
    "u1", (IPHONE, DEAD, PIXEL), "+14155550100", True, "u1@example.com", True
)
QUIET = QuietWindow.parse("22:00", "08:00")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def prefs(**kw: object) -> Preferences:
    return Preferences("u1", **{"timezone": NY, "quiet_hours": QUIET, **kw})  # type: ignore[arg-type]


def req(type_name: str, **kw: object) -> PolicyRequest:
    return PolicyRequest(type_name, **{"accepted_at": NOON_NY, **kw})  # type: ignore[arg-type]


def by_channel(decisions: list[Decision]) -> dict[str, Decision]:
    channels = [d.channel for d in decisions]
    assert len(channels) == len(set(channels)), decisions
    return {d.channel: d for d in decisions}


# --- transactional bypass ----------------------------------------------------------------------


def test_otp_bypasses_quiet_hours_and_opt_outs(catalog: Catalog) -> None:
    p = prefs(global_opt_out=True, channel_opt_out=frozenset({"sms"}))
    (send,) = decide(catalog, req("otp_login", accepted_at=NIGHT_NY), p, EVERYTHING, NIGHT_NY)
    assert isinstance(send, Send)
    assert send.channel == "sms" and send.addresses == (Address("+14155550100"),)
    assert send.fallback == ("sms:sms_b", "push")
    assert send.expire_at == NIGHT_NY + timedelta(minutes=5)
    assert send.state is State.PLANNED and send.not_before is None


def test_otp_may_use_an_unverified_phone(catalog: Catalog) -> None:
    contacts = ContactPoints("u1", phone="+14155550100", phone_verified=False)
    (send,) = decide(catalog, req("otp_login"), prefs(), contacts, NOON_NY)
    assert isinstance(send, Send) and send.channel == "sms"


def test_otp_without_phone_falls_back_to_push_on_every_valid_device(catalog: Catalog) -> None:
    contacts = ContactPoints("u1", devices=(IPHONE, DEAD, PIXEL))
    out = by_channel(decide(catalog, req("otp_login"), prefs(), contacts, NOON_NY))
    assert out["sms"] == Suppress("sms", "no_contact_point")
    push = out["push"]
    assert isinstance(push, Send) and push.fallback_from == "sms"
    assert push.addresses == (
        Address("tok-ios", "apns", "d-ios", "apns"),
        Address("tok-and", "fcm", "d-and", "fcm"),
    )


def test_an_otp_is_pushed_to_verified_devices_only(catalog: Catalog) -> None:
    """otp_login is `secret`: a device registered without contact_points:verify (perhaps the
    registering key's own) never gets the code; other types use it as any device."""
    out = by_channel(decide(catalog, req("otp_login"), prefs(),
                            ContactPoints("u1", devices=(PLANTED, PIXEL)), NOON_NY))  # fmt: skip
    assert isinstance(out["push"], Send)
    assert out["push"].addresses == (Address("tok-and", "fcm", "d-and", "fcm"),)
    alone = ContactPoints("u1", devices=(PLANTED,))
    assert decide(catalog, req("otp_login"), prefs(), alone, NOON_NY) == [
        Suppress("sms", "no_contact_point")
    ]
    shipped = by_channel(decide(catalog, req("order_shipped"), prefs(), alone, NOON_NY))
    assert isinstance(shipped["push"], Send) and shipped["push"].addresses == (PLANTED.address,)


def test_fallback_respects_the_callers_channels(catalog: Catalog) -> None:
    contacts = ContactPoints("u1", devices=(IPHONE,))
    out = decide(catalog, req("otp_login", channels=("sms",)), prefs(), contacts, NOON_NY)
    assert out == [Suppress("sms", "no_contact_point")]


def test_a_disabled_phone_is_named_and_push_takes_over(catalog: Catalog) -> None:
    contacts = ContactPoints("u1", devices=(IPHONE,), disabled=frozenset({"phone"}))
    out = by_channel(decide(catalog, req("otp_login"), prefs(), contacts, NOON_NY))
    assert out["sms"] == Suppress("sms", "address_disabled")
    assert isinstance(out["push"], Send) and out["push"].fallback_from == "sms"


def test_no_channel_at_all(catalog: Catalog) -> None:
    out = decide(catalog, req("otp_login"), prefs(), ContactPoints("u1"), NOON_NY)
    assert out == [Suppress("sms", "no_contact_point")]


def test_security_alert_goes_everywhere_despite_opt_outs(catalog: Catalog) -> None:
    p = prefs(global_opt_out=True, category_opt_out=frozenset({"transactional"}))
    out = by_channel(decide(catalog, req("security_alert"), p, EVERYTHING, NIGHT_NY))
    assert {c: type(d) for c, d in out.items()} == {"push": Send, "email": Send}


def test_unapproved_transactional_respects_opt_out_and_quiet_hours(catalog: Catalog) -> None:
    out = decide(catalog, req("order_shipped"), prefs(global_opt_out=True), EVERYTHING, NOON_NY)
    assert [(d.channel, d.reason) for d in out if isinstance(d, Suppress)] == [
        ("push", "global_opt_out"),
        ("email", "global_opt_out"),
    ]
    held = by_channel(decide(catalog, req("order_shipped"), prefs(), EVERYTHING, NIGHT_NY))
    assert all(isinstance(d, Hold) for d in held.values())


# --- opt-outs and availability -----------------------------------------------------------------


def test_marketing_opt_outs_in_order(catalog: Catalog) -> None:
    campaign = req("marketing_campaign")
    everywhere = decide(catalog, campaign, prefs(global_opt_out=True), EVERYTHING, NOON_NY)
    assert {d.reason for d in everywhere if isinstance(d, Suppress)} == {"global_opt_out"}
    category = prefs(category_opt_out=frozenset({"marketing"}))
    assert {d.reason for d in decide(catalog, campaign, category, EVERYTHING, NOON_NY)} == {  # type: ignore[union-attr]
        "category_opt_out"
    }
    push_off = prefs(channel_opt_out=frozenset({"push"}))
    out = by_channel(decide(catalog, campaign, push_off, EVERYTHING, NOON_NY))
    assert out["push"] == Suppress("push", "channel_opt_out") and isinstance(out["email"], Send)
    pair = prefs(category_channel_opt_out=frozenset({"marketing:email"}))
    out = by_channel(decide(catalog, campaign, pair, EVERYTHING, NOON_NY))
    assert out["email"] == Suppress("email", "channel_opt_out") and isinstance(out["push"], Send)


def test_global_opt_out_is_reported_before_availability(catalog: Catalog) -> None:
    out = decide(catalog, req("marketing_campaign"), prefs(global_opt_out=True),
                 ContactPoints("u1"), NOON_NY)  # fmt: skip
    assert {d.reason for d in out if isinstance(d, Suppress)} == {"global_opt_out"}


@pytest.mark.parametrize(
    ("contacts", "reasons"),
    [
        (ContactPoints("u1"), {"push": "no_contact_point", "email": "no_contact_point"}),
        (ContactPoints("u1", devices=(DEAD,), email="a@b.c", email_verified=False),
         {"push": "no_valid_token", "email": "email_unverified"}),
        (ContactPoints.from_record({"user_id": "u1", "email": None, "disabled": ["email"]}),
         {"push": "no_contact_point", "email": "address_disabled"}),  # it bounced
    ],
)  # fmt: skip
def test_availability_reasons(
    catalog: Catalog, contacts: ContactPoints, reasons: dict[str, str]
) -> None:
    out = by_channel(decide(catalog, req("marketing_campaign"), prefs(), contacts, NOON_NY))
    assert {c: d.reason for c, d in out.items() if isinstance(d, Suppress)} == reasons


def test_sms_needs_a_verified_phone_outside_otp(catalog: Catalog) -> None:
    contacts = ContactPoints("u1", phone="+14155550100", phone_verified=False)
    out = by_channel(decide(catalog, req("payment_result"), prefs(), contacts, NOON_NY))
    assert out["push"] == Suppress("push", "no_contact_point")
    assert isinstance(out["inapp"], Send)
    assert "sms" not in out  # the push fallback was unusable too: the push reason stands


def test_requested_channels(catalog: Catalog) -> None:
    out = decide(catalog, req("marketing_campaign", channels=("email", "sms")), prefs(),
                 EVERYTHING, NOON_NY)  # fmt: skip
    assert Suppress("sms", "channel_not_allowed") in out
    assert [d.channel for d in out if isinstance(d, Send)] == ["email"]


# --- quiet hours, schedules, caps and expiry ---------------------------------------------------


def test_marketing_is_held_until_quiet_hours_end(catalog: Catalog) -> None:
    out = by_channel(decide(catalog, req("marketing_campaign", accepted_at=NIGHT_NY), prefs(),
                            EVERYTHING, NIGHT_NY))  # fmt: skip
    for channel in ("push", "email"):
        hold = out[channel]
        assert isinstance(hold, Hold) and hold.reason == "quiet_hours"
        assert hold.until == MORNING_NY and hold.state is State.SCHEDULED
        assert hold.planned.not_before == MORNING_NY and hold.planned.channel == channel
    released = decide(catalog, req("marketing_campaign", accepted_at=NIGHT_NY), prefs(),
                      EVERYTHING, MORNING_NY)  # fmt: skip
    assert all(isinstance(d, Send) for d in released)


def test_inapp_is_not_held_by_quiet_hours(catalog: Catalog) -> None:
    (send,) = decide(catalog, req("inbox_announcement"), prefs(), EVERYTHING, NIGHT_NY)
    assert isinstance(send, Send) and send.addresses == (Address("u1"),)


def test_hold_past_expiry_is_expired(catalog: Catalog) -> None:
    r = req("marketing_campaign", expire_at=NIGHT_NY + timedelta(hours=2))
    out = decide(catalog, r, prefs(), EVERYTHING, NIGHT_NY)
    assert out == [Suppress("push", "expired"), Suppress("email", "expired")]
    assert out[0].state is State.EXPIRED  # type: ignore[union-attr]


def test_user_without_timezone_uses_the_catalog_default(catalog: Catalog) -> None:
    p = prefs(timezone=None)  # catalog default: UTC
    at_23_utc = datetime(2026, 6, 1, 23, tzinfo=UTC)
    out = decide(catalog, req("promo_weekly", accepted_at=at_23_utc), p, EVERYTHING, at_23_utc)
    assert out == [
        Hold("email", datetime(2026, 6, 2, 8, tzinfo=UTC), "quiet_hours", out[0].planned)  # type: ignore[union-attr]
    ]


def test_send_at_in_the_future_is_a_scheduled_hold(catalog: Catalog) -> None:
    later = NOON_NY + timedelta(hours=3)
    (hold,) = decide(catalog, req("promo_weekly", send_at=later), prefs(), EVERYTHING, NOON_NY)
    assert isinstance(hold, Hold) and (hold.until, hold.reason) == (later, "scheduled")
    (send,) = decide(catalog, req("promo_weekly", send_at=later), prefs(), EVERYTHING, later)
    assert isinstance(send, Send)


def test_a_send_scheduled_into_quiet_hours_waits_for_their_end(catalog: Catalog) -> None:
    # send_at 23:00 New York, the user's window 22:00-08:00 (spans midnight): held until 08:00
    r = req("marketing_campaign", send_at=NIGHT_NY)
    out = by_channel(decide(catalog, r, prefs(), EVERYTHING, NOON_NY))
    for channel in ("push", "email"):
        hold = out[channel]
        assert isinstance(hold, Hold) and (hold.until, hold.reason) == (MORNING_NY, "quiet_hours")
        assert hold.planned.not_before == MORNING_NY
    # released at send_at (a schedule that fires on time) it is held again, never sent
    again = decide(catalog, r, prefs(), EVERYTHING, NIGHT_NY)
    assert {(d.until, d.reason) for d in again} == {(MORNING_NY, "quiet_hours")}  # type: ignore[union-attr]
    # outside the window, send_at stays the hold; bypass types are never held by the window
    evening = NIGHT_NY - timedelta(hours=2)  # 21:00
    (hold,) = decide(catalog, req("promo_weekly", send_at=evening), prefs(), EVERYTHING, NOON_NY)
    assert (hold.until, hold.reason) == (evening, "scheduled")  # type: ignore[union-attr]
    (otp,) = decide(catalog, req("otp_login", send_at=NIGHT_NY), prefs(), EVERYTHING, NIGHT_NY)
    assert isinstance(otp, Send)


def test_scheduled_quiet_hours_across_a_dst_change(catalog: Catalog) -> None:
    window = prefs(quiet_hours=QuietWindow.parse("01:00", "03:00"))

    def hold_of(send_at: datetime) -> Decision:
        day_before = send_at - timedelta(days=1)
        r = req("promo_weekly", send_at=send_at, accepted_at=day_before)
        (decision,) = decide(catalog, r, window, EVERYTHING, day_before)
        return decision

    # New York springs forward on 2026-03-08 at 02:00: the 01:00-03:00 window lasts one hour
    hold = hold_of(datetime(2026, 3, 8, 6, 30, tzinfo=UTC))  # 01:30 EST, inside
    assert isinstance(hold, Hold) and hold.reason == "quiet_hours"
    assert hold.until == datetime(2026, 3, 8, 7, tzinfo=UTC)  # 03:00 EDT
    # and falls back on 2026-11-01 at 02:00: 01:30 comes twice, the window ends at 03:00 EST
    hold = hold_of(datetime(2026, 11, 1, 6, 30, tzinfo=UTC))  # the second 01:30 (EST)
    assert isinstance(hold, Hold) and hold.reason == "quiet_hours"
    assert hold.until == datetime(2026, 11, 1, 8, tzinfo=UTC)


def test_expiry_of_a_scheduled_send_counts_from_its_send_at(catalog: Catalog) -> None:
    # promo_weekly expires 7 days after it is due; send_at 10 days after accept is not expired
    send_at = NOON_NY + timedelta(days=10)
    r = req("promo_weekly", send_at=send_at)
    (hold,) = decide(catalog, r, prefs(), EVERYTHING, NOON_NY)
    assert isinstance(hold, Hold) and hold.reason == "scheduled"
    assert hold.planned.expire_at == send_at + catalog.get("promo_weekly").expiry
    (send,) = decide(catalog, r, prefs(), EVERYTHING, send_at)
    assert isinstance(send, Send)
    assert r.expires(catalog.get("promo_weekly")) == send_at + timedelta(days=7)
    past = req("promo_weekly", send_at=NOON_NY - timedelta(minutes=1))  # a late send_at
    assert past.expires(catalog.get("promo_weekly")) == NOON_NY + timedelta(days=7)


def test_frequency_cap(catalog: Catalog) -> None:
    r = req("marketing_campaign")
    assert all(isinstance(d, Send) for d in decide(catalog, r, prefs(), EVERYTHING, NOON_NY, 2))
    capped = decide(catalog, r, prefs(), EVERYTHING, NOON_NY, 3)
    assert {d.reason for d in capped} == {"frequency_cap"}  # type: ignore[union-attr]
    otp = decide(catalog, req("otp_login"), prefs(), EVERYTHING, NOON_NY, cap_count=99)
    assert isinstance(otp[0], Send)
    inbox = decide(catalog, req("inbox_announcement"), prefs(), EVERYTHING, NOON_NY, 99)
    assert isinstance(inbox[0], Send)


def test_expiry(catalog: Catalog) -> None:
    r = req("otp_login", accepted_at=NOON_NY)
    assert isinstance(
        decide(catalog, r, prefs(), EVERYTHING, NOON_NY + timedelta(minutes=4))[0], Send
    )
    (late,) = decide(catalog, r, prefs(), EVERYTHING, NOON_NY + timedelta(minutes=5))
    assert late == Suppress("sms", "expired") and late.state is State.EXPIRED
    never = PolicyRequest("otp_login")  # no accepted_at, no expire_at: no expiry known
    assert isinstance(decide(catalog, never, prefs(), EVERYTHING, NOON_NY)[0], Send)


# --- locales and records -----------------------------------------------------------------------


def test_locale_choice(catalog: Catalog) -> None:
    def locale(request_locale: str | None, pref_locale: str | None) -> str:
        p = prefs(locale=pref_locale)
        (send,) = decide(catalog, req("otp_login", locale=request_locale), p, EVERYTHING, NOON_NY)
        assert isinstance(send, Send)
        return send.locale

    assert locale(None, None) == "en"
    assert locale(None, "de-CH") == "de"
    assert locale("zh-CN", "de") == "zh"
    assert locale("pt-BR", None) == "en"
    with pytest.raises(InvalidLocale):
        locale("not a locale", None)


def test_errors(catalog: Catalog) -> None:
    with pytest.raises(UnknownNotificationType):
        decide(catalog, req("nope"), prefs(), EVERYTHING, NOON_NY)
    with pytest.raises(ValueError, match="timezone-aware"):
        decide(catalog, req("otp_login"), prefs(), EVERYTHING, datetime(2026, 1, 1))


def test_records() -> None:
    rec = {
        "user_id": "u1", "global_opt_out": False, "category_opt_out": ["marketing"],
        "channel_opt_out": [], "category_channel_opt_out": ["social:push"],
        "quiet_hours": {"start": "22:00", "end": "07:30"}, "timezone": "Asia/Kolkata",
        "locale": "zh_cn", "updated_at": NOON_NY, "version": 7,
    }  # fmt: skip
    p = Preferences.from_record(rec)
    assert p.quiet_hours == QuietWindow.parse("22:00", "07:30") and p.locale == "zh-CN"
    assert p.category_opt_out == {"marketing"} and p.version == 7
    with pytest.raises(InvalidTimezone):
        Preferences.from_record({**rec, "timezone": "Asia/Atlantis"})
    with pytest.raises(InvalidTimeOfDay):
        Preferences.from_record({**rec, "quiet_hours": {"start": "25:00", "end": "07:00"}})
    contacts = ContactPoints.from_record({
        "user_id": "u1", "phone": {"e164": "+41791234567", "verified": True}, "email": None,
        "devices": [{"device_id": "d", "platform": "fcm", "token": "t", "app_id": None,
                     "registered_at": NOON_NY, "valid": False}],
        "updated_at": NOON_NY, "version": 2,
    })  # fmt: skip
    assert contacts.phone == "+41791234567" and contacts.phone_verified
    assert contacts.email is None and contacts.devices[0].valid is False
    millis = int(NOON_NY.timestamp() * 1000)
    request = PolicyRequest.from_record({
        "notification_type": "otp_login", "channels": ["sms"], "locale": None,
        "template_version": 1, "send_at": None, "expire_at": millis, "accepted_at": NOON_NY,
    })  # fmt: skip
    assert request.channels == ("sms",) and request.expire_at == NOON_NY


# --- properties --------------------------------------------------------------------------------

TYPES = ["otp_login", "password_reset", "payment_result", "security_alert", "order_shipped",
         "social_like", "marketing_campaign", "promo_weekly", "inbox_announcement"]  # fmt: skip
CHANNEL_SET = st.frozensets(st.sampled_from(["push", "sms", "email", "inapp"]))


@settings(max_examples=300, deadline=None)
@given(
    type_name=st.sampled_from(TYPES),
    global_out=st.booleans(),
    channel_out=CHANNEL_SET,
    devices=st.lists(st.sampled_from([IPHONE, PIXEL, DEAD]), max_size=3, unique=True),
    phone=st.sampled_from([None, (True,), (False,)]),
    hours=st.integers(min_value=0, max_value=47),
    cap=st.integers(min_value=0, max_value=5),
)
def test_one_decision_per_channel_and_bypass_invariants(
    catalog: Catalog,
    type_name: str,
    global_out: bool,
    channel_out: frozenset[str],
    devices: list[Device],
    phone: tuple[bool] | None,
    hours: int,
    cap: int,
) -> None:
    now = NOON_NY + timedelta(hours=hours)
    contacts = ContactPoints(
        "u1", tuple(devices), "+1555" if phone else None, bool(phone and phone[0]), "a@b.c", True
    )
    p = prefs(global_opt_out=global_out, channel_opt_out=channel_out)
    out = decide(catalog, req(type_name, accepted_at=now), p, contacts, now, cap)
    by_channel(out)  # asserts one decision per channel
    nt = catalog.get(type_name)
    for d in out:
        if isinstance(d, Send | Hold):
            assert not (global_out and not nt.bypass_opt_out)
        if isinstance(d, Hold):
            assert not nt.bypass_quiet_hours and d.until > now
        if isinstance(d, Suppress) and d.reason == "frequency_cap":
            assert not nt.transactional


def test_policy_keys_are_shared_by_users_planned_alike_and_survive_pickling() -> None:
    """What dataflows/plan/planned_alike.py relies on: equal keys are one object, also after a
    record crossed processes (pickled by the dataflow), and keys differ where `decide` could."""
    a = Preferences("a", timezone="Asia/Kolkata", category_opt_out=frozenset({"marketing"}))
    b = Preferences("b", timezone="Asia/Kolkata", category_opt_out=frozenset({"marketing"}))
    assert a.policy_key is b.policy_key
    assert Preferences("c", timezone="Asia/Tokyo").policy_key != a.policy_key
    copy = pickle.loads(pickle.dumps(a))
    assert copy == a and copy.policy_key is a.policy_key
    phone = ContactPoints("a", (Device("d1", "fcm", "t1"),), phone="+41790000001")
    other = ContactPoints("b", (Device("d2", "fcm", "t2"),), phone="+41790000002")
    assert phone.policy_key is other.policy_key  # endpoints' values and ids are not in it
    verified = ContactPoints("b", (Device("d2", "fcm", "t2"),), phone="+41790000002",
                               phone_verified=True)  # fmt: skip
    invalid = ContactPoints("b", (Device("d2", "fcm", "t2", valid=False),), phone="+4179")
    assert len({phone.policy_key, verified.policy_key, invalid.policy_key}) == 3
    copy_contacts = pickle.loads(pickle.dumps(phone))
    assert copy_contacts == phone and copy_contacts.policy_key is phone.policy_key


# --- escalation (herald.catalog.Escalation) -----------------------------------------------------


def test_an_inbox_notice_escalates_to_push_after_its_window(catalog: Catalog) -> None:
    """account_notice: in the inbox now, and a push held until 20 s later (reason escalation)
    on every valid device; dispatch drops it if the inbox item was read by then."""
    got = by_channel(decide(catalog, req("account_notice"), prefs(), EVERYTHING, NOON_NY))
    assert isinstance(got["inapp"], Send)
    push = got["push"]
    assert isinstance(push, Hold) and push.reason == "escalation"
    assert push.until == NOON_NY + timedelta(seconds=20)
    assert {a.value for a in push.planned.addresses} == {"tok-ios", "tok-and"}


def test_no_escalation_without_a_way_to_reach_the_user_or_once_expired(catalog: Catalog) -> None:
    no_device = ContactPoints("u1", (), None, False, None, False)
    assert [d.channel for d in decide(catalog, req("account_notice"), prefs(), no_device,
                                      NOON_NY)] == ["inapp"]  # fmt: skip
    opted_out = prefs(channel_opt_out=frozenset({"push"}))
    assert "push" not in by_channel(decide(catalog, req("account_notice"), opted_out,
                                           EVERYTHING, NOON_NY))  # fmt: skip
    soon = req("account_notice", expire_at=NOON_NY + timedelta(seconds=10))
    assert "push" not in by_channel(decide(catalog, soon, prefs(), EVERYTHING, NOON_NY))
