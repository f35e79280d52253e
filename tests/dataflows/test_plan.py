"""The plan job against the real broker and Redis: a bounded in-process run, then real processes."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from bytewax.testing import run_main
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from dataflows._settings import PlanningSettings
from dataflows.plan import build_flow
from herald import ids
from herald.caps import cap_key
from herald.config import HeraldSettings
from tests.dataflows.helpers import encoder, produce
from tests.dataflows.jobs import (
    CAMPAIGN,
    DEAD_LETTERS,
    EVENTS,
    contacts,
    load_users,
    now,
    prefs,
    read,
    request,
    send,
)

pytestmark = pytest.mark.integration


def quiet_now(tz_offset_minutes: int = 330) -> dict[str, str]:
    """A quiet-hours window around the current time in a zone `tz_offset_minutes` east of UTC."""
    local = now() + timedelta(minutes=tz_offset_minutes)
    start, end = local - timedelta(hours=1), local + timedelta(hours=2)
    return {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M")}


def by_state(events: list[dict[str, Any]], nid: str) -> dict[tuple[str, str], tuple[str, Any]]:
    """(user, channel) -> (state, reason) of a notification's events (one per pair here)."""
    return {
        (e["user_id"], e["channel"]): (e["state"], e["reason"])
        for e in events
        if e["notification_id"] == nid
    }


def run_bounded(settings: HeraldSettings, traffic_class: str = "bulk") -> None:
    """The users sent so far into their copies (the users job), then the plan job until the
    requests' end."""
    load_users(settings)
    flow = build_flow(
        settings, traffic_class=traffic_class, planning=PlanningSettings(), bounded=True
    )
    run_main(flow, epoch_interval=timedelta(milliseconds=200))


def test_campaign_policy_outcomes(settings: HeraldSettings) -> None:
    users = [f"{settings.kafka.topic_prefix}u{i}" for i in range(1, 7)]
    u1, u2, u3, u4, u5, u6 = users
    send(settings, "herald.devices", [contacts(u) for u in users[:5]], "user_id")
    send(
        settings,
        "herald.preferences",
        [
            prefs(u2, global_opt_out=True),
            prefs(u3, channel_opt_out=["email"]),
            prefs(u4, category_opt_out=["marketing"]),
            prefs(u5, timezone="Asia/Kolkata", quiet_hours=quiet_now()),
            prefs(u1, version=2, timezone="Mars/Olympus_Mons"),  # bad: dead-lettered, u1 kept
        ],
        "user_id",
    )
    nid = f"{settings.kafka.topic_prefix}campaign"
    good = request(nid, "marketing_campaign", users=users, params=CAMPAIGN)
    unknown = request(f"{nid}-x", "no_such_type", users=[u1])
    missing = request(f"{nid}-m", "marketing_campaign", users=[u1], params={"headline": "h"})
    send(settings, "herald.requests.bulk", [good, unknown, missing], "notification_id")
    produce(settings, "herald.requests.bulk", [(b"k", b"garbage")])

    run_bounded(settings)

    events = by_state(read(settings, EVENTS), nid)
    assert events[(u1, "push")] == ("PLANNED", None)
    assert events[(u1, "email")] == ("PLANNED", None)
    assert events[(u2, "push")] == ("SUPPRESSED", "global_opt_out")
    assert events[(u3, "email")] == ("SUPPRESSED", "channel_opt_out")
    assert events[(u3, "push")] == ("PLANNED", None)
    assert events[(u4, "push")] == ("SUPPRESSED", "category_opt_out")
    assert events[(u5, "push")] == ("SCHEDULED", "quiet_hours")
    assert events[(u6, "push")] == ("SUPPRESSED", "no_contact_point")
    pushes = read(settings, "herald.deliveries.push.bulk")
    assert sorted(d["user_id"] for d in pushes) == [u1, u3]
    d1 = next(d for d in pushes if d["user_id"] == u1)
    assert d1["delivery_id"] == ids.delivery_id(nid, u1, "push", f"{u1}-d0")
    assert (d1["rendered"]["title"], d1["rendered"]["body"]) == ("Sale", "20% off")
    held = read(settings, "herald.scheduled")
    assert [(d["user_id"], d["channel"]) for d in held] == [(u5, "push"), (u5, "email")] or sorted(
        (d["user_id"], d["channel"]) for d in held
    ) == [(u5, "email"), (u5, "push")]
    assert all(d["not_before"] > now() for d in held)
    letters = Counter(d["reason"] for d in read(settings, DEAD_LETTERS))
    assert letters == {
        "unknown_notification_type": 1,
        "missing_param:cta_url": 1,
        "bad_magic_byte": 1,
        "invalid_timezone": 1,
    }


DST_NOW = datetime(
    2026, 3, 8, 6, 30, tzinfo=UTC
)  # 01:30 EST, 30 min before New York springs forward


def test_quiet_hours_in_user_zones_with_dst(settings: HeraldSettings) -> None:
    """Held until the end of quiet hours in each user's zone; approved transactional bypasses."""
    p = settings.kafka.topic_prefix
    ny, kolkata, lord_howe, default, awake = (f"{p}{n}" for n in ("ny", "in", "lh", "utc", "ok"))
    users = [ny, kolkata, lord_howe, default, awake]
    send(settings, "herald.devices", [contacts(u) for u in users], "user_id")
    quiet = [
        prefs(ny, timezone="America/New_York", quiet_hours={"start": "22:00", "end": "02:30"}),
        prefs(kolkata, timezone="Asia/Kolkata", quiet_hours={"start": "11:00", "end": "13:30"}),
        prefs(
            lord_howe,
            timezone="Australia/Lord_Howe",
            quiet_hours={"start": "17:00", "end": "18:00"},
        ),
        prefs(default, quiet_hours={"start": "06:00", "end": "07:15"}),  # no zone: catalog's UTC
        prefs(awake, timezone="America/New_York", quiet_hours={"start": "08:00", "end": "09:00"}),
    ]
    send(settings, "herald.preferences", quiet, "user_id")
    nid, otp = f"{p}campaign", f"{p}payment"
    campaign = request(nid, "marketing_campaign", users=users, params=CAMPAIGN, accepted_at=DST_NOW)
    payment = request(otp, "payment_result", users=[ny], traffic_class="transactional",
                      accepted_at=DST_NOW, params={"amount": "9", "currency": "EUR",
                                                   "status": "ok", "order_id": "o1"})  # fmt: skip
    send(settings, "herald.requests.bulk", [campaign], "notification_id")
    send(settings, "herald.requests.transactional", [payment], "notification_id")
    offset = (DST_NOW - datetime.now(UTC)).total_seconds()
    planning = PlanningSettings(clock_offset_seconds=offset)

    load_users(settings)
    for traffic_class in ("bulk", "transactional"):
        flow = build_flow(settings, traffic_class=traffic_class, planning=planning, bounded=True)
        run_main(flow, epoch_interval=timedelta(milliseconds=200))

    held = {
        (d["user_id"], d["channel"]): d["not_before"] for d in read(settings, "herald.scheduled")
    }
    assert held[(ny, "push")] == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 02:30 EST -> 03:00 EDT
    assert held[(kolkata, "push")] == datetime(2026, 3, 8, 8, 0, tzinfo=UTC)  # 13:30 IST
    assert held[(lord_howe, "push")] == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 18:00 LHDT
    assert held[(default, "email")] == datetime(2026, 3, 8, 7, 15, tzinfo=UTC)
    assert (awake, "push") not in held
    events = by_state(read(settings, EVENTS), nid)
    assert events[(ny, "push")] == ("SCHEDULED", "quiet_hours")
    assert events[(awake, "push")] == ("PLANNED", None)
    bypass = by_state(read(settings, EVENTS), otp)
    assert bypass[(ny, "push")] == ("PLANNED", None)  # approved transactional: no hold at 01:30
    sent = read(settings, "herald.deliveries.push.transactional")
    assert [(d["user_id"], d["not_before"]) for d in sent] == [(ny, None)]
    client = redis.Redis.from_url(settings.redis.url)
    assert client.get(cap_key(ny, "marketing", date(2026, 3, 8))) == b"1"  # NY's local day


def counted() -> Counter[str]:
    """The plan jobs' PLANNED and SUPPRESSED events and frequency-cap suppressions so far in
    this process (prometheus_client's default registry)."""
    sample = REGISTRY.get_sample_value
    values = {
        "PLANNED": sample("herald_events_total", {"job": "plan", "state": "PLANNED"}),
        "SUPPRESSED": sample("herald_events_total", {"job": "plan", "state": "SUPPRESSED"}),
        "frequency_cap": sample(
            "herald_suppressed_total", {"job": "plan", "reason": "frequency_cap"}
        ),
    }
    return Counter({k: int(v or 0) for k, v in values.items()})


def test_frequency_cap_and_duplicate_requests(settings: HeraldSettings) -> None:
    """Marketing 3/day: the 4th is suppressed; a second copy of a request is dropped. Users
    planned alike (the same class: dataflows/plan/planned_alike.py) are refused one by one."""
    p = settings.kafka.topic_prefix
    users = [f"{p}capped{i}" for i in range(6)]
    send(settings, "herald.devices", [contacts(u) for u in users], "user_id")
    nids = [f"{p}c{i}" for i in range(4)]
    requests = [request(n, "marketing_campaign", users=users, params=CAMPAIGN) for n in nids]
    send(settings, "herald.requests.bulk", [*requests, requests[0]], "notification_id")
    before = counted()

    run_bounded(settings)

    # the events counted in the job's metrics, templated users included
    assert counted() - before == Counter({"PLANNED": 36, "SUPPRESSED": 12, "frequency_cap": 12})
    events = [e for e in read(settings, EVENTS) if e["user_id"] in users]
    per_pair = Counter((e["user_id"], e["notification_id"]) for e in events)
    # push + email each, the copy planned nothing
    assert per_pair == {(u, n): 2 for u in users for n in nids}
    for user in users:
        outcomes = Counter((e["state"], e["reason"]) for e in events if e["user_id"] == user)
        assert outcomes == {("PLANNED", None): 6, ("SUPPRESSED", "frequency_cap"): 2}, user
    deliveries = [d for d in read(settings, "herald.deliveries.push.bulk") if d["user_id"] in users]
    assert sorted((d["user_id"], d["address"]) for d in deliveries) == sorted(
        (u, f"tok-{u}-0") for u in users for _ in range(3)
    )
    client = redis.Redis.from_url(settings.redis.url)
    for user in users:
        key = cap_key(user, "marketing", datetime.now(UTC).date())
        assert client.get(key) == b"3" and 0 < client.ttl(key) <= 25 * 3600


def test_producer_path_otps_meet_the_phone_limit_and_the_country_list(
    settings: HeraldSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """OTPs that did not come through the API (a producer, or a record claiming "api" that the
    API never accepted) are charged per phone and checked against the SMS prefixes in plan, as
    the API would: over the limit or outside the list is a dead letter with the API's reason;
    one the API accepted (and charged) is planned without a second charge. A producer's tenant
    must have a key in the tenants file that may send the type (herald/tenants.py)."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        '[[tenants.acme.keys]]\nid = "a"\nsha256 = "00"\nscopes = []\ntypes = ["otp_login"]\n'
        '[[tenants.orders.keys]]\nid = "o"\nsha256 = "01"\nscopes = []\n'
        'types = ["order_shipped"]\n'
    )
    monkeypatch.setenv("HERALD_API_TENANTS_FILE", str(tenants))
    monkeypatch.setenv("HERALD_API_OTP_PER_PHONE", "[2, 600]")
    monkeypatch.setenv("HERALD_API_SMS_ALLOWED_PREFIXES", '["+41"]')
    p = settings.kafka.topic_prefix
    swiss, pumped = f"{p}swiss", f"{p}pumped"
    phones = {swiss: "+41791234567", pumped: "+88212345678"}
    send(settings, "herald.devices",
         [{**contacts(u, push=0, email=False), "phone": {"e164": phone, "verified": True}}
          for u, phone in phones.items()], "user_id")  # fmt: skip
    client = redis.Redis.from_url(settings.redis.url)
    client.set(f"idem:{{{p}api}}", "digest|pending|0")  # the API's claim, before it publishes
    client.close()

    nids: dict[str, str] = {}

    def otp(
        name: str, user: str, source: str, nid: str | None = None, tenant: str = "acme"
    ) -> dict[str, Any]:
        """A producer's request carries the id the API would give it (`ids.notification_id`);
        one claiming "api" any id (the API made it)."""
        request_id = f"r-{p}{name}"
        if nid is None:
            nid = f"{p}{name}" if source == "api" else ids.notification_id(tenant, request_id)
        nids[name] = nid
        return request(nid, "otp_login", users=[user], params={"code": "123456"},
                       traffic_class="transactional", source=source, tenant_id=tenant,
                       request_id=request_id)  # fmt: skip

    requests = [
        otp("api", swiss, "api"),  # accepted and charged by the API: not charged again
        otp("o1", swiss, "producer"),
        otp("o2", swiss, "outbox"),
        otp("o3", swiss, "producer"),  # the third in the window: over the limit of 2
        otp("forged", swiss, "api"),  # says "api", but the API never saw it
        otp("pump", pumped, "producer"),
        otp("made-up", swiss, "producer", nid=f"{p}made-up"),  # not the id the API would give
        otp("stranger", swiss, "producer", tenant="stranger"),  # no key in the tenants file
        otp("orders", swiss, "producer", tenant="orders"),  # its keys may not send otp_login
    ]
    send(settings, "herald.requests.transactional", requests, "notification_id")

    run_bounded(settings, "transactional")

    planned = {d["notification_id"] for d in read(settings, "herald.deliveries.sms.transactional")}
    letters = {d["key"].decode(): d["reason"] for d in read(settings, DEAD_LETTERS)}
    charged = {nids[name] for name in ("o1", "o2", "o3", "forged")}  # in any order: 2 pass
    assert nids["api"] in planned and len(planned & charged) == 2
    assert {k for k, reason in letters.items() if reason == "otp_rate_limited"} == (
        charged - planned
    )
    assert letters[nids["pump"]] == "sms_prefix_not_allowed"
    assert letters[nids["made-up"]] == "notification_id_mismatch"
    assert letters[nids["stranger"]] == "unknown_tenant"
    assert letters[nids["orders"]] == "type_not_allowed" and len(letters) == 6


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_requests_trace_context_reaches_every_record_planned_from_it(
    settings: HeraldSettings,
) -> None:
    """A traceparent in the request record, or in a Kafka header of a record without one, is on
    every Delivery and delivery_event of the notification, for users planned from a template and
    in full alike; an invalid one is dropped (herald/tracing.py)."""
    p = settings.kafka.topic_prefix
    users = [f"{p}t{i}" for i in range(8)]  # one class: all but the first from a template
    send(settings, "herald.devices", [contacts(u) for u in users], "user_id")
    in_field = request(f"{p}field", "marketing_campaign", users=users, params=CAMPAIGN,
                       traceparent=TRACE)  # fmt: skip
    in_header = request(f"{p}header", "marketing_campaign", users=users[:4], params=CAMPAIGN)
    invalid = request(f"{p}invalid", "marketing_campaign", users=users[:1], params=CAMPAIGN,
                      traceparent="00-not-a-trace")  # fmt: skip
    send(settings, "herald.requests.bulk", [in_field, invalid], "notification_id")
    encode = encoder(settings, "herald.requests.bulk")
    producer = Producer({**settings.kafka.client_config(), "acks": "all"})
    producer.produce(settings.kafka.topic("herald.requests.bulk"), encode(in_header),
                     in_header["notification_id"].encode(),
                     headers=[("traceparent", OTHER_TRACE.encode())])  # fmt: skip
    assert producer.flush(30) == 0

    run_bounded(settings)

    expected = {in_field["notification_id"]: TRACE, in_header["notification_id"]: OTHER_TRACE,
                invalid["notification_id"]: None}  # fmt: skip
    deliveries = [d for t in ("herald.deliveries.push.bulk", "herald.deliveries.email.bulk")
                  for d in read(settings, t) if d["notification_id"] in expected]  # fmt: skip
    events = [e for e in read(settings, EVENTS) if e["notification_id"] in expected]
    assert len(deliveries) == 2 * (8 + 4 + 1) and len(events) == len(deliveries)
    for record in deliveries + events:
        assert record["traceparent"] == expected[record["notification_id"]], record
