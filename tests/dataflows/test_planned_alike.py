"""dataflows.plan.planned_alike: a template's records are byte for byte those of the full
planning path.

Varied users (opt-outs, quiet hours in several zones, locales, 0-2 devices some invalid, email
and phone verified or not, disabled addresses) against varied requests (capped campaign, send at
local time, scheduled, transactional with fallbacks, inbox); every user is planned both ways.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dataflows._encode import Encoder
from dataflows._redis import CapCharge
from dataflows.plan.planned_alike import MIN_CLASS_USERS, Classes, Template, endpoints
from herald.caps import CapBucket
from herald.catalog import load_catalog
from herald.config import HeraldSettings, RegistrySettings
from herald.plan_records import CapDays, Output, Renderer, cap_charge, plan_user, user_records
from herald.planning import Planned, PlanRequest, UserView, admit_request
from herald.policy import ContactPoints, Device, Preferences
from herald.quiet_hours import QuietWindow
from schemas.registry import make_registry
from sinks.kafka import KafkaRecord

CATALOG = load_catalog()
NOW = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)  # 01:30 in New York: inside 22:00-08:00
CAMPAIGN = {"headline": "Sale", "offer": "20% off", "cta_url": "https://x.test"}
PAYMENT = {"amount": "9.99", "currency": "CHF", "status": "ok", "order_id": "o-1"}
CAPPED = {"marketing_campaign"}  # of REQUESTS' types (inbox_announcement: cap_bucket none)
ZONES = [None, "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]


def request(notification_type: str, n: int, params: dict[str, str], **more: Any) -> PlanRequest:
    rec: dict[str, Any] = {
        "notification_id": f"n-{n}", "request_id": f"r-{n}", "tenant_id": "acme",
        "notification_type": notification_type, "traffic_class": "bulk",
        "recipients": {"user_ids": ["x"], "segment_id": None}, "params": params,
        "accepted_at": NOW, "source": "api", **more,
    }  # fmt: skip
    return admit_request(rec, CATALOG, "t:0:1")


REQUESTS = [
    request("marketing_campaign", 1, CAMPAIGN),
    request("marketing_campaign", 2, CAMPAIGN, send_local_time="09:00"),
    request("marketing_campaign", 3, CAMPAIGN, send_at=NOW + timedelta(hours=3)),
    request("otp_login", 4, {"code": "123456"}),
    request("payment_result", 5, PAYMENT),
    request("order_shipped", 6, {"order_id": "o-1"}),
    request("inbox_announcement", 7, {"title": "Hi", "body": "News"}),
]


def population(users: int, profiles: int = 40, seed: int = 3) -> list[UserView]:
    """Users of `profiles` random profiles (what the policy reads), each with its own ids,
    tokens and addresses, so classes repeat."""
    rng = random.Random(seed)
    kinds = [_profile(rng) for _ in range(profiles)]
    return [_user(f"u-{i}", i, *rng.choice(kinds)) for i in range(users)]


def _profile(rng: random.Random) -> tuple[dict[str, Any], list[tuple[str, bool]], dict[str, Any]]:
    prefs = {
        "global_opt_out": rng.random() < 0.05,
        "category_opt_out": frozenset(rng.choice([(), (), ("marketing",)])),
        "channel_opt_out": frozenset(rng.choice([(), (), (), ("push",), ("email",)])),
        "quiet_hours": rng.choice([None, None, QuietWindow.parse("22:00", "08:00")]),
        "timezone": rng.choice(ZONES),
        "locale": rng.choice([None, "en", "de", "zh"]),
    }
    devices = [
        (rng.choice(["apns", "fcm"]), rng.random() < 0.8) for _ in range(rng.choice([0, 1, 1, 2]))
    ]
    contacts = {
        "phone": rng.random() < 0.5, "phone_verified": rng.random() < 0.7,
        "email": rng.random() < 0.7, "email_verified": rng.random() < 0.8,
        "disabled": frozenset(rng.choice([(), (), (), ("email",)])),
    }  # fmt: skip
    return prefs, devices, contacts


def _user(
    user: str, i: int, prefs: dict[str, Any], devices: list[tuple[str, bool]], c: dict[str, Any]
) -> UserView:
    contacts = ContactPoints(
        user,
        tuple(
            Device(f"d-{i}-{k}", platform, f"tok-{i}-{k}", valid=valid)
            for k, (platform, valid) in enumerate(devices)
        ),  # fmt: skip
        phone=f"+4179{i:07d}" if c["phone"] else None,
        phone_verified=c["phone_verified"],
        email=f"{user}@x.test" if c["email"] else None,
        email_verified=c["email_verified"],
        disabled=c["disabled"],
    )
    return UserView(user, None, Preferences(user, **prefs), contacts)


@pytest.fixture
def encoder(tmp_path: Path) -> Encoder:
    settings = HeraldSettings(registry=RegistrySettings(path=tmp_path / "registry"))
    return Encoder(settings, make_registry(settings.registry), "plan")


def full(encoder: Encoder, renderer: Renderer, req: PlanRequest, view: UserView) -> list[Any]:
    """The full path: decisions, Outputs, cap bucket."""
    decisions = plan_user(CATALOG, req, view, NOW)
    outputs, rejected = user_records(renderer, req, view, decisions, NOW)
    assert rejected == []
    return [outputs, cap_charge(CATALOG, req, view, decisions, NOW, CapDays(NOW))]


def charge_of(req: PlanRequest, bucket: CapBucket | None, view: UserView) -> CapCharge | None:
    return None if bucket is None else CapCharge.of(bucket, view.user_id, req.notification_id)


def encoded(encoder: Encoder, outputs: list[Any]) -> list[KafkaRecord]:
    records = encoder(outputs)
    assert all(type(r) is KafkaRecord for r in records)
    return records


def test_template_records_and_charges_are_the_full_paths(encoder: Encoder) -> None:
    users = population(600)
    templated: Counter[str] = Counter()
    charged: set[str] = set()  # types with cap charges made from templates
    devices: set[int] = set()  # push Deliveries of templated users
    for req in REQUESTS:
        expected_renderer, renderer = Renderer(CATALOG), Renderer(CATALOG)
        classes = Classes(encoder, renderer.ids, batch(req, users))
        for view in users:
            outputs, bucket = full(encoder, expected_renderer, req, view)
            expected = encoded(encoder, outputs)
            template = classes.get(req, view)
            if template is None:
                got_outputs, got_bucket = full(encoder, renderer, req, view)
                learned = classes.learn(req, view, got_bucket, lambda o=got_outputs: o)
                assert learned is None or learned == got_outputs
                got = encoded(encoder, got_outputs)
                got_charge = charge_of(req, got_bucket, view)
            else:
                got, charges = template.records([view]), template.charges([view])
                got_charge = None if charges is None else charges[0]
                templated[req.notification_type] += 1
                devices.add(sum(1 for r in got if r.topic.startswith("herald.deliveries.push")))
                if got_charge is not None:
                    charged.add(req.notification_type)
            assert got == expected, (req.notification_id, view)
            assert got_charge == charge_of(req, bucket, view)
    # every request had most of its users made from templates
    assert set(templated) == {r.notification_type for r in REQUESTS}
    assert min(templated.values()) > 300, templated
    assert charged == CAPPED
    assert devices == {0, 1, 2}


def batch(req: PlanRequest, views: list[UserView]) -> list[Planned]:
    """The views as one planned item (what Classes counts its classes' users in)."""
    return [Planned(req, 0, tuple(views))]


def test_template_counts_its_events(encoder: Encoder) -> None:
    req, renderer = REQUESTS[0], Renderer(CATALOG)
    view = population(1)[0]
    classes = Classes(encoder, renderer.ids, batch(req, [view] * MIN_CLASS_USERS))
    outputs, bucket = full(encoder, renderer, req, view)
    assert classes.learn(req, view, bucket, lambda: outputs) == outputs
    template = classes.get(req, view)
    assert isinstance(template, Template)
    events = Counter(
        (o.value["state"], o.value["reason"])
        for o in outputs
        if isinstance(o, Output) and o.topic == "herald.delivery-events"
    )
    assert template.events == events


def test_users_with_their_own_params_are_never_templated(encoder: Encoder) -> None:
    req, renderer = REQUESTS[0], Renderer(CATALOG)
    plain = population(1)[0]
    personal = UserView(plain.user_id, {"first_name": "Ada"}, plain.prefs, plain.contacts)
    classes = Classes(encoder, renderer.ids, batch(req, [plain, *[personal] * 5]))
    outputs, bucket = full(encoder, renderer, req, plain)
    assert classes.learn(req, plain, bucket, lambda: outputs) is None  # 1 user without params
    assert classes.get(req, personal) is None
    assert classes.learn(req, personal, None, list) is None


def test_only_a_class_with_enough_users_in_the_batch_is_derived(encoder: Encoder) -> None:
    calls: list[str] = []

    def records() -> list[Any]:
        calls.append("made")
        return []  # no records: a template of nothing (a user with nothing to send)

    req = REQUESTS[0]
    big = population(1)[0]
    small = UserView("s", None, Preferences("s", timezone="Asia/Tokyo"), big.contacts)
    assert big.prefs.policy_key is not small.prefs.policy_key
    views = [big] * MIN_CLASS_USERS + [small] * (MIN_CLASS_USERS - 1)
    classes = Classes(encoder, Renderer(CATALOG).ids, batch(req, views))
    assert classes.learn(req, small, None, records) is None
    assert calls == [] and classes.get(req, small) is None  # too small: planned in full
    assert classes.learn(req, big, None, records) == []
    assert calls == ["made"]
    assert isinstance(classes.get(req, big), Template)
    assert classes.learn(req, big, None, records) is None  # derived once
    assert calls == ["made"]


def test_records_that_do_not_map_exactly_leave_the_class_on_the_full_path(
    encoder: Encoder,
) -> None:
    req, renderer = REQUESTS[0], Renderer(CATALOG)
    view = next(v for v in population(50) if endpoints(v.contacts, "email") and not
                v.prefs.category_opt_out and not v.prefs.global_opt_out)  # fmt: skip
    outputs, bucket = full(encoder, renderer, req, view)
    assert outputs
    tampered = [*outputs[:-1], outputs[-1]._replace(shape=None)]  # no shape: cannot splice
    letter = {"reason": "render_failed"}
    for bad in (tampered, [*outputs, letter]):
        classes = Classes(encoder, renderer.ids, batch(req, [view] * MIN_CLASS_USERS))
        assert classes.learn(req, view, bucket, lambda b=bad: b) == bad
        assert classes.get(req, view) is None
        assert classes.learn(req, view, bucket, lambda b=bad: b) is None  # not derived again
