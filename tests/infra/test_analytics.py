"""The ClickHouse analytics model (migrations 0003+) and the report queries of dashboards/sql.

Events go into delivery_events as the loaders write them; every assertion reads through the
materialized views and the panel SQL files, as dashboards and users do.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from dashboards.queries import PANELS, run_panel, window
from dataflows.accepted import event_columns
from herald import ids, states
from herald.clickhouse import herald_client
from infra.migrate import MIGRATIONS_DIR

pytestmark = pytest.mark.integration


def event(
    tenant: str, delivery: str, state: str, minute: int, t0: datetime, **changes: Any
) -> dict[str, Any]:
    """A delivery_event of `delivery` (channel from its name: 'sms-1' -> sms)."""
    channel = changes.pop("channel", delivery.split("-")[0])
    at = t0 + timedelta(minutes=minute, seconds=1)
    return {
        "event_id": ids.event_id(delivery, state, 1), "delivery_id": f"{tenant}:{delivery}",
        "notification_id": f"{tenant}:n", "user_id": "u-1", "tenant_id": tenant,
        "notification_type": "order_shipped", "channel": channel, "traffic_class": "normal",
        "state": state, "reason": None, "provider": None, "provider_msg_id": None, "attempt": 1,
        "latency_ms": None, "occurred_at": at, "recorded_at": at, "attributes": {}, "generation": 0,
        "traceparent": None,
        **changes,
    }  # fmt: skip


def scenario(tenant: str, t0: datetime | None = None) -> list[dict[str, Any]]:
    """Two requests; six deliveries over four channels, some events out of order, starting
    10 minutes before now (or at `t0`)."""
    sms, push, mail = {"provider": "sms_a"}, {"provider": "apns"}, {"provider": "email"}
    start = t0 or datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)

    def ev(tenant: str, delivery: str, state: str, minute: int, **changes: Any) -> dict[str, Any]:
        return event(tenant, delivery, state, minute, start, **changes)

    return [
        ev(tenant, "req-1", "ACCEPTED", 0, channel="", delivery_id=f"{tenant}:n"),
        ev(tenant, "req-2", "ACCEPTED", 0, channel="", delivery_id=f"{tenant}:n2"),
        ev(tenant, "sms-1", "PLANNED", 0),
        # delivered arrives before provider-accepted: must not go back to PROVIDER_ACCEPTED
        ev(tenant, "sms-1", "DELIVERED", 2, attributes={"provider_latency_ms": "2000"}, **sms),
        ev(tenant, "sms-1", "PROVIDER_ACCEPTED", 1, latency_ms=800, **sms),
        ev(tenant, "sms-2", "PLANNED", 0),
        ev(tenant, "sms-2", "PROVIDER_ACCEPTED", 1, latency_ms=1200, **sms),
        ev(tenant, "sms-2", "DELIVERY_UNKNOWN", 5, reason="no_receipt_in_window", **sms),
        ev(tenant, "sms-3", "SUPPRESSED", 0, reason="quiet_hours"),
        ev(tenant, "push-1", "PLANNED", 0),
        ev(tenant, "push-1", "PROVIDER_ACCEPTED", 1, latency_ms=300, **push),
        ev(tenant, "email-1", "PLANNED", 0),
        ev(tenant, "email-1", "PROVIDER_ACCEPTED", 1, latency_ms=500, **mail),
        ev(tenant, "email-1", "CLICKED", 4, **mail),
        ev(tenant, "email-1", "OPENED", 3, **mail),
        ev(tenant, "email-1", "DELIVERED", 2, attributes={"provider_latency_ms": "4000"}, **mail),
        ev(tenant, "email-2", "PLANNED", 0),
        ev(tenant, "email-2", "PROVIDER_ACCEPTED", 1, latency_ms=700, **mail),
        ev(tenant, "email-2", "FAILED_PERMANENT", 2, reason="bounce", **mail),
        ev(tenant, "inapp-1", "PLANNED", 0),
        ev(tenant, "inapp-1", "EXPIRED", 1, reason="expired"),
    ]


@pytest.fixture
def client(stack: Any) -> Iterator[Client]:
    c = herald_client(stack.settings.clickhouse)
    yield c
    c.close()


def insert(client: Client, events: list[dict[str, Any]]) -> None:
    columns = event_columns()
    client.insert("delivery_events", [[e[c] for c in columns] for e in events], columns)


def panels(
    client: Client, tenant: str, now: datetime | None = None
) -> dict[str, list[dict[str, Any]]]:
    params = window(60, tenant, now)
    return {name: run_panel(client, name, params) for name in PANELS}


def by(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {row[key]: row for row in rows}


def test_reports_answer_the_seed_questions_and_replays_change_nothing(client: Client) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    events = scenario(tenant)
    insert(client, events)
    at = datetime.now(UTC) + timedelta(minutes=2)  # one fixed window for both reads
    first = panels(client, tenant, at)

    rates = by(first["report_rates"], "channel")
    sms, push, email = rates["sms"], rates["push"], rates["email"]
    assert (sms["deliveries"], sms["suppressed"], sms["accepted_for_send"]) == (3, 1, 2)
    assert sms["acceptance_rate"] == pytest.approx(2 / 3)
    assert sms["provider_accept_rate"] == 1.0
    assert sms["observable_delivery_rate"] == 0.5 and sms["delivery_unknown"] == 1
    assert sms["observable_delivery_rate_shown"] == "50.0%"
    assert sms["open_rate"] is None and sms["open_rate_shown"] == "unknown"  # no read on sms
    assert push["observable_delivery_rate"] is None
    assert push["observable_delivery_rate_shown"] == "unknown"  # APNs sends no receipt
    assert email["observable_delivery_rate"] == 0.5 and email["failed"] == 1
    assert email["open_rate"] == 1.0 and email["open_rate_shown"] == "100.0% (partial)"
    assert rates["inapp"]["expired"] == 1 and rates["inapp"]["acceptance_rate"] == 0.0

    funnel = {row["step"]: row["count"] for row in first["funnel"]}
    assert funnel == {
        "accepted": 2, "planned": 6, "suppressed": 1, "provider_accepted": 5, "delivered": 2,
        "opened": 1, "read": 0, "clicked": 1, "failed": 1, "unknown": 1, "expired": 1,
    }  # fmt: skip
    current = {(r["channel"], r["state"]): r["deliveries"] for r in first["current_states"]}
    assert current[("sms", "DELIVERED")] == 1  # the late PROVIDER_ACCEPTED did not win
    assert current[("email", "CLICKED")] == 1 and current[("sms", "DELIVERY_UNKNOWN")] == 1
    latency = {(r["stage"], r["traffic_class"]): r for r in first["latency_by_class"]}
    assert latency[("accept_to_provider", "normal")]["samples"] == 5
    assert latency[("provider_to_delivered", "normal")]["p50_ms"] in (2000, 4000)
    assert by(first["suppression_reasons"], "reason")["quiet_hours"]["suppressed"] == 1
    errors = by(first["provider_errors"], "provider")
    assert errors["email"]["failed"] == 1 and errors["email"]["error_rate"] == pytest.approx(1 / 3)

    insert(client, events)  # a replay of the whole range
    insert(client, events[::-1])  # and again, in reverse order
    assert panels(client, tenant, at) == first


@pytest.mark.parametrize("migration", ["0004_delivery_state.sql", "0009_delivery_generation.sql"])
def test_state_ranks_follow_every_transition_table(migration: str) -> None:
    sql = (MIGRATIONS_DIR / migration).read_text()
    names_sql, ranks_sql = re.search(r"\[('ACCEPTED'.*?)\],\s*\[(0,.*?)\]", sql, re.S).groups()  # type: ignore[union-attr]
    names = re.findall(r"'(\w+)'", names_sql)
    rank = dict(zip(names, map(int, ranks_sql.split(",")), strict=True))
    assert set(rank) == {str(s) for s in states.State}
    cycle = {"SENDING", "RETRY_SCHEDULED", "UNKNOWN"}  # may move back and forth: later one wins
    for channel, table in states.TABLES.items():
        for source, targets in table.items():
            for target in targets:
                if {str(source), str(target)} <= cycle:
                    assert rank[source] == rank[target]
                else:
                    assert rank[target] > rank[source], (channel, source, target)


def test_a_replay_generation_supersedes_the_failed_state_and_both_histories_stay(
    client: Client,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)

    def ev(state: str, minute: int, generation: int, **changes: Any) -> dict[str, Any]:
        event_id = ids.event_id("sms-1", state, 1, "", generation)
        return event(tenant, "sms-1", state, minute, t0, event_id=event_id,
                     generation=generation, **changes)  # fmt: skip

    insert(client, [
        ev("SENDING", 0, 0), ev("FAILED_PERMANENT", 1, 0, reason="retries_exhausted"),
        # the replay: a SENDING of generation 1 outranks FAILED_PERMANENT of generation 0 ...
        ev("SENDING", 5, 1),
    ])  # fmt: skip

    def current() -> tuple[str, str | None]:
        [(state, reason)] = client.query(
            "SELECT state, reason FROM delivery_current WHERE tenant_id = {t:String}",
            parameters={"t": tenant},
        ).result_rows
        return state, reason

    assert current() == ("SENDING", None)
    # ... within generation 1 the ranks hold, whatever the arrival order
    insert(client, [ev("DELIVERED", 7, 1), ev("PROVIDER_ACCEPTED", 6, 1)])
    assert current() == ("DELIVERED", None)
    insert(client, [ev("EXPIRED", 8, 0, reason="expired")])  # late, of generation 0
    assert current() == ("DELIVERED", None)
    history = client.query(
        "SELECT generation, state FROM delivery_events FINAL WHERE tenant_id = {t:String}"
        " ORDER BY generation, occurred_at",
        parameters={"t": tenant},
    ).result_rows
    assert [tuple(r) for r in history] == [
        (0, "SENDING"), (0, "FAILED_PERMANENT"), (0, "EXPIRED"),
        (1, "SENDING"), (1, "PROVIDER_ACCEPTED"), (1, "DELIVERED"),
    ]  # fmt: skip


def test_channel_capabilities_match_herald_states(client: Client) -> None:
    rows = client.query(
        "SELECT channel, delivered, read, opened, clicked, observation_window_s"
        " FROM channel_capabilities FINAL"
    ).result_rows
    expected = {
        c.channel: (c.delivered, c.read, c.opened, c.clicked,
                    int(c.observation_window.total_seconds()) if c.observation_window else None)
        for c in states.CAPABILITIES.values()
    }  # fmt: skip
    assert {r[0]: tuple(r[1:]) for r in rows} == expected
