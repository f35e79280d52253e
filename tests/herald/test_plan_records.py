"""herald.plan_records: decisions as Deliveries and events, caps, rendering, DST holds."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from fastavro.validation import validate

from herald import ids
from herald.catalog import load_catalog
from herald.plan_records import (
    EVENTS_TOPIC,
    SCHEDULED_TOPIC,
    CapDays,
    Renderer,
    cap_charge,
    plan_user,
    refuse_capped,
    user_records,
)
from herald.planning import PlanRequest, UserView, admit_request
from herald.policy import ContactPoints, Device, Hold, Preferences, Send, Suppress
from herald.quiet_hours import QuietWindow
from schemas import load_schema

CATALOG = load_catalog()
NOW = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)
CAMPAIGN = {"headline": "Sale", "offer": "20% off", "cta_url": "https://x.test"}


def request(notification_type: str = "marketing_campaign", **changes: Any) -> PlanRequest:
    rec: dict[str, Any] = {
        "notification_id": "n-1",
        "request_id": "r-1",
        "tenant_id": "acme",
        "notification_type": notification_type,
        "traffic_class": "bulk",
        "recipients": {"user_ids": ["u-1"], "segment_id": None},
        "params": CAMPAIGN,
        "accepted_at": NOW,
        "source": "api",
        **changes,
    }
    return admit_request(rec, CATALOG, "t:0:1")


def view(user: str = "u-1", params: dict[str, str] | None = None, **prefs: Any) -> UserView:
    devices = (Device("d-1", "apns", "tok-1"), Device("d-2", "fcm", "tok-2"))
    contacts = ContactPoints(user, devices=devices, email=f"{user}@x.test", email_verified=True)
    return UserView(user, params, Preferences(user, **prefs), contacts)


def outputs(req: PlanRequest, v: UserView, now: datetime = NOW) -> list[Any]:
    decisions = plan_user(CATALOG, req, v, now)
    out, rejected = user_records(Renderer(CATALOG), req, v, decisions, now)
    assert rejected == []
    return out


def test_sends_become_valid_deliveries_and_planned_events_with_stable_ids() -> None:
    out = outputs(request(), view())
    deliveries = [o for o in out if o.topic.startswith("herald.deliveries.")]
    events = [o for o in out if o.topic == EVENTS_TOPIC]
    assert sorted(o.topic for o in deliveries) == [
        "herald.deliveries.email.bulk",
        "herald.deliveries.push.bulk",
        "herald.deliveries.push.bulk",
    ]
    pushes = {o.value["platform"]: o.value for o in deliveries if o.value["channel"] == "push"}
    assert pushes["apns"]["delivery_id"] == ids.delivery_id("n-1", "u-1", "push", "d-1")
    assert pushes["fcm"]["address"] == "tok-2" and pushes["fcm"]["collapse_key"] == "n-1"
    assert all(validate(o.value, load_schema("delivery"), strict=True) for o in deliveries)
    assert all(validate(o.value, load_schema("delivery_event"), strict=True) for o in events)
    assert {(e.value["state"], e.value["event_id"]) for e in events} == {
        ("PLANNED", ids.event_id(o.key, "PLANNED", 0)) for o in deliveries
    }
    # a replay yields the same records (the shape is an encoding hint, one per prototype)
    assert [o[:3] for o in outputs(request(), view())] == [o[:3] for o in out]


def test_personal_params_are_rendered_per_user_and_unshaped() -> None:
    personal = outputs(request(), view(params={"first_name": "Ada"}))
    shared = outputs(request(), view())
    body = {
        o.value["channel"]: o.value["rendered"]["body"] for o in personal if "rendered" in o.value
    }
    assert body["push"] == "Ada, 20% off"
    assert all(o.shape is None for o in personal if "rendered" in o.value)
    assert all(o.shape is not None for o in shared)


def test_users_planned_together_share_prototypes_and_get_their_own_records() -> None:
    """Records copied from a shared prototype equal the records built in full for that user."""
    req = request()
    night = QuietWindow.parse("23:00", "08:00")  # NOW is 01:30 in New York, 07:30 in Zurich
    views = [view("u-1"), view("u-2", locale="de"), view("u-3"),
             view("u-4", timezone="America/New_York", quiet_hours=night),
             view("u-5", timezone="Europe/Zurich", quiet_hours=night),
             view("u-6", timezone="America/New_York", quiet_hours=night),
             view("u-7", category_opt_out=frozenset({"marketing"})), view("u-8")]  # fmt: skip
    shared = Renderer(CATALOG)
    together = {v.user_id: user_records(shared, req, v, plan_user(CATALOG, req, v, NOW), NOW)[0]
                for v in views}  # fmt: skip
    for v in views:
        alone = outputs(req, v)  # a fresh Renderer: every record built in full
        assert [o[:3] for o in together[v.user_id]] == [o[:3] for o in alone]
    shapes = {o.shape for out in together.values() for o in out}
    assert len(shapes) < sum(len(out) for out in together.values()) / 2
    u1, u3, u8 = (together[u] for u in ("u-1", "u-3", "u-8"))
    assert [o.shape for o in u1] == [o.shape for o in u3] == [o.shape for o in u8]
    assert together["u-2"][0].shape is not u1[0].shape  # another locale, another shape
    held = {u: {o.value["not_before"] for o in together[u] if o.topic == SCHEDULED_TOPIC}
            for u in ("u-4", "u-5", "u-6")}  # fmt: skip
    assert held["u-4"] == held["u-6"] != held["u-5"] and len(held["u-4"]) == 1


def test_suppressions_are_events_only() -> None:
    out = outputs(request(), view(category_opt_out=frozenset({"marketing"})))
    assert {(o.topic, o.value["state"], o.value["reason"]) for o in out} == {
        (EVENTS_TOPIC, "SUPPRESSED", "category_opt_out")
    }
    assert {o.key for o in out} == {
        ids.delivery_id("n-1", "u-1", "push"),
        ids.delivery_id("n-1", "u-1", "email"),
    }


def test_lord_howe_quiet_hours_end_in_the_half_hour_dst_gap() -> None:
    """Lord Howe springs forward 02:00 -> 02:30 (+10:30 -> +11) on 2026-10-04."""
    now = datetime(2026, 10, 3, 15, 0, tzinfo=UTC)  # 01:30 LHST
    quiet = QuietWindow.parse("22:00", "02:15")  # 02:15 does not exist that night
    v = view(timezone="Australia/Lord_Howe", quiet_hours=quiet)
    out = outputs(request(accepted_at=now), v, now)
    held = [o for o in out if o.topic == SCHEDULED_TOPIC]
    assert {o.value["not_before"] for o in held} == {datetime(2026, 10, 3, 15, 30, tzinfo=UTC)}
    events = [o.value for o in out if o.topic == EVENTS_TOPIC]
    assert {(e["state"], e["reason"]) for e in events} == {("SCHEDULED", "quiet_hours")}
    assert events[0]["attributes"]["not_before"] == "2026-10-03T15:30:00+00:00"


def test_local_time_campaign_uses_each_users_zone() -> None:
    req = request(send_local_time="09:00")
    kolkata = plan_user(CATALOG, req, view(timezone="Asia/Kolkata"), NOW)
    new_york = plan_user(CATALOG, req, view(timezone="America/New_York"), NOW)
    assert {d.until for d in kolkata if isinstance(d, Hold)} == {
        datetime(2026, 3, 9, 3, 30, tzinfo=UTC)  # 12:00 IST now: tomorrow 09:00 IST
    }
    assert {d.until for d in new_york if isinstance(d, Hold)} == {
        datetime(2026, 3, 8, 13, 0, tzinfo=UTC)  # today 09:00 EDT, after spring forward
    }


def test_cap_is_charged_on_the_local_day_of_the_first_emitted_instant() -> None:
    req = request()
    late = datetime(2026, 3, 8, 4, 30, tzinfo=UTC)  # 23:30 EST on 7 March
    v = view(timezone="America/New_York")
    decisions = plan_user(CATALOG, req, v, late)
    bucket = cap_charge(CATALOG, req, v, decisions, late, CapDays(late))
    assert bucket is not None and bucket.local_date == date(2026, 3, 7)
    assert bucket.key == "cap:{u-1}:marketing:2026-03-07" and bucket.daily_limit == 3
    assert timedelta(minutes=30) < timedelta(seconds=bucket.ttl_seconds) <= timedelta(hours=2)
    quiet = view(timezone="America/New_York", quiet_hours=QuietWindow.parse("23:00", "08:00"))
    held = plan_user(CATALOG, req, quiet, late)
    charged = cap_charge(CATALOG, req, quiet, held, late, CapDays(late))
    assert charged is not None and charged.local_date == date(2026, 3, 8)  # sent at 08:00 EDT


@pytest.mark.parametrize("notification_type", ["inbox_announcement", "order_shipped"])
def test_uncapped_types_charge_nothing(notification_type: str) -> None:
    params = (
        {"title": "t", "body": "b"}
        if notification_type == "inbox_announcement"
        else {"order_id": "o-1"}
    )
    req = request(notification_type, params=params)
    decisions = plan_user(CATALOG, req, view(), NOW)
    assert cap_charge(CATALOG, req, view(), decisions, NOW) is None


def test_a_refused_charge_suppresses_every_emitted_channel() -> None:
    decisions = [Send("push", (), "en", None, (), None), Suppress("sms", "no_contact_point")]
    assert refuse_capped(decisions) == [
        Suppress("push", "frequency_cap"),
        Suppress("sms", "no_contact_point"),
    ]
