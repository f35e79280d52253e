"""The plan job against the real broker and Redis: a bounded in-process run, then real processes."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from bytewax.testing import run_main

from dataflows._settings import PlanningSettings
from dataflows.plan import build_flow
from herald import ids
from herald.config import HeraldSettings
from tests.dataflows.helpers import produce
from tests.dataflows.jobs import (
    CAMPAIGN,
    DEAD_LETTERS,
    EVENTS,
    contacts,
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
    }
