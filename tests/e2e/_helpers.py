"""Small helpers of the end-to-end tests on top of infra.stackclient.StackClient.

What StackClient lacks and these tests need: the simulators' request log (`?log=1`: when each
message reached the provider, and how retries spread), bulk loading of 20k+ users (device
records straight onto the `herald.devices` changelog, a segment in ClickHouse: the API is the
wrong tool for seeding an audience), waiting on many notifications, and reading delivery events
back from ClickHouse.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
from confluent_kafka import Producer

from dataflows.users import wait_copied
from herald.config import HeraldSettings
from infra.stackclient import StackClient
from schemas.registry import make_registry
from sinks.kafka import topic_serializer

# States that say the provider took the message, and final side states.
REACHED = frozenset({"PROVIDER_ACCEPTED", "DELIVERED", "READ", "DELIVERY_UNKNOWN"})
TERMINAL = frozenset({"SUPPRESSED", "EXPIRED", "FAILED_PERMANENT", "UNKNOWN"})

_phones = itertools.count(int(time.time()) % 100_000 * 10)


def new_phone() -> str:
    """A fresh US E.164 number: one address per expected delivery makes duplicates exact."""
    return f"+1415{next(_phones) % 10_000_000:07d}"


def sim_log(client: StackClient, name: str) -> list[tuple[float, str | None, str]]:
    """The simulator's request log: (unix time, address, outcome) per provider request."""
    resp = httpx.get(
        f"{client.simulator_urls[name]}/_admin/stats",
        params={"ids": "0", "log": "1"},
        timeout=30,
        verify=False,
    )
    resp.raise_for_status()
    return [(float(t), a, str(o)) for t, a, o in resp.json()["log"]]


def accepted_count(client: StackClient, name: str, address: str) -> int:
    """How many messages simulator `name` accepted for `address` since its last reset."""
    return len(client.sim(name).stats()["accepted_ids"].get(address, []))


class UserPool:
    """Users onboarded once per session through the API (verified phone and email), handed
    out to tests. A request may follow the API's answer at once (plan reads the API's copy of
    a change it has not yet read from the changelog: test_acceptance_user_state.py)."""

    def __init__(self, client: StackClient, size: int) -> None:
        tag = f"{int(time.time()) % 1_000_000:06d}"
        self.free = [(f"pool-{tag}-{i:03d}", new_phone()) for i in range(size)]
        for user, phone in self.free:
            client.put_contact_points(user, phone=phone, email=email_of(user))
        # the stack plans for a pool user before any test starts
        user, phone = self.free.pop()
        nid = client.send(otp_body(f"probe-{user}", user))
        client.wait_for(nid, "sms", REACHED, timeout=120)

    def take(self, n: int) -> dict[str, str]:
        """`n` unused users: user_id -> phone (their email is `email_of(user_id)`)."""
        assert len(self.free) >= n, "the session's user pool is exhausted: make it larger"
        taken, self.free = self.free[:n], self.free[n:]
        return dict(taken)


def email_of(user: str) -> str:
    """The verified email address of a pool user."""
    return f"{user}@example.test"


def otp_body(request_id: str, user: str, **extra: Any) -> dict[str, Any]:
    """An otp_login request for one user."""
    return {
        "request_id": request_id,
        "notification_type": "otp_login",
        "recipients": {"user_ids": [user]},
        "params": {"code": "482913"},
        **extra,
    }


def wait_all(
    client: StackClient,
    nids: Iterable[str],
    channel: str,
    states: frozenset[str] | set[str],
    timeout: float,
) -> dict[str, dict[str, Any]]:
    """Poll until each notification has a `channel` delivery in `states`; nid -> delivery.

    Returns what was reached by the deadline (the caller asserts on completeness, with the
    missing ones in its message)."""
    pending = set(nids)
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for nid in list(pending):
            resp = client.api.get(f"/v1/notifications/{nid}")
            if resp.status_code != 200:
                continue
            for d in resp.json().get("deliveries", []):
                if d.get("channel") == channel and d.get("state") in states:
                    done[nid] = d
                    pending.discard(nid)
        if pending:
            time.sleep(0.5)
    return done


def events(client: StackClient, notification_id: str) -> list[dict[str, Any]]:
    """Delivery events of a notification in ClickHouse (deduplicated by event_id)."""
    result = client.clickhouse().query(
        "SELECT delivery_id, state, reason, provider, attempt, occurred_at, attributes "
        "FROM herald.delivery_events FINAL WHERE notification_id = {nid:String} "
        "ORDER BY occurred_at, state",
        parameters={"nid": notification_id},
    )
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def current_state(client: StackClient, delivery_id: str) -> str | None:
    """The delivery's current state in ClickHouse (delivery_current: never regresses)."""
    result = client.clickhouse().query(
        "SELECT state FROM herald.delivery_current WHERE delivery_id = {d:String}",
        parameters={"d": delivery_id},
    )
    return str(result.result_rows[0][0]) if result.result_rows else None


def wait_events(
    client: StackClient, notification_id: str, state: str | set[str], timeout: float = 60
) -> list[dict[str, Any]]:
    """Poll ClickHouse until the notification has an event in `state` (one or a set); all its
    events (whatever was there at the deadline)."""
    wanted = {state} if isinstance(state, str) else state
    deadline = time.monotonic() + timeout
    while True:
        found = events(client, notification_id)
        if any(e["state"] in wanted for e in found) or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


def ensure_push_audience(client: StackClient, probe: list[str], tag: str) -> None:
    """Wait until the bulk plan job has read the device records of `probe` users (produced
    last, after the audience): a probe campaign to them must reach FCM for every one. A user
    planned before its device was read is suppressed (no_contact_point), so try again, up to
    the marketing cap of three a day. First the barrier a bulk import has: the users job's
    Redis copies hold every device produced so far (without it the first probe raced the
    copy of a 20k audience, was suppressed, and this waited a minute before trying again)."""
    wait_copied(client.settings(), timeout=300)
    insert_segment(client, f"probe-{tag}", probe)
    tokens = {f"tok-{u}" for u in probe}
    for attempt in range(3):
        client.send(
            {
                "request_id": f"probe-{tag}-{attempt}",
                "notification_type": "marketing_campaign",
                "recipients": {"segment_id": f"probe-{tag}"},
                "params": {"headline": "probe", "offer": "probe", "cta_url": "https://x.test"},
            }
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = set(client.sim("fcm").stats()["accepted_ids"]) & tokens
            if seen == tokens:
                return
            time.sleep(1)
    raise AssertionError(f"the bulk plan job never learnt {len(tokens - seen)} probe devices")


def produce_devices(settings: HeraldSettings, users: list[str], platform: str = "fcm") -> None:
    """A push device per user on the `herald.devices` changelog (what the API writes per user,
    produced in bulk: the audience of a campaign is seeded, not onboarded one by one)."""
    encode = topic_serializer(settings.kafka, make_registry(settings.registry), "herald.devices")
    producer = Producer({**settings.kafka.client_config(), "acks": "all", "linger.ms": 20})
    topic = settings.kafka.topic("herald.devices")
    now = datetime.now(UTC)
    for user in users:
        device = {
            "device_id": f"d-{user}", "platform": platform, "token": f"tok-{user}",
            "registered_at": now, "valid": True,
        }  # fmt: skip
        record = {"user_id": user, "devices": [device], "updated_at": now, "version": 1}
        while True:
            try:
                producer.produce(topic, encode(record), user.encode())
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "device records left unacknowledged"


def insert_segment(client: StackClient, segment_id: str, users: list[str]) -> None:
    """An audience snapshot in ClickHouse (`segment_members`), read by the plan job."""
    rows = [[segment_id, user, {}] for user in users]
    client.clickhouse().insert(
        "herald.segment_members", rows, column_names=["segment_id", "user_id", "params"]
    )


def max_window_count(times: list[float], window_s: float) -> int:
    """The most events inside any window of `window_s` seconds (sliding, over sorted times)."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


@dataclass(frozen=True)
class QuietSend:
    """A promo email scheduled into its user's quiet hours, which end a minute or two later."""

    notification_id: str
    user: str
    send_at: datetime
    window_end: datetime


def send_into_quiet_hours(client: StackClient, user: str) -> QuietSend:
    """Give `user` quiet hours (Asia/Tokyo) that end at the first whole minute at least 60 s from
    now (HH:MM precision), and schedule a promo email 15 s from now, inside them."""
    tokyo = ZoneInfo("Asia/Tokyo")
    now = datetime.now(UTC)
    local = now.astimezone(tokyo)
    end = (local + timedelta(seconds=120)).replace(second=0, microsecond=0)
    start = (local - timedelta(minutes=5)).replace(second=0, microsecond=0)
    client.put_preferences(
        user,
        {
            "quiet_hours": {"start": f"{start:%H:%M}", "end": f"{end:%H:%M}"},
            "timezone": "Asia/Tokyo",
        },
    )
    send_at = now + timedelta(seconds=15)
    nid = client.send(
        {
            "request_id": f"promo-quiet-{uuid.uuid4().hex[:8]}",
            "notification_type": "promo_weekly",
            "recipients": {"user_ids": [user]},
            "params": {"week": "W49", "highlights_url": "https://x.test/w49"},
            "send_at": send_at.isoformat(),
        }
    )
    return QuietSend(nid, user, send_at, end.astimezone(UTC))
