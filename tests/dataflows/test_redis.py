"""dataflows._redis against the real Redis: replay-safe request dedup and cap charges."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
import redis

from dataflows._redis import CapCharge, CapCounter, RequestGate
from herald.caps import CapBucket, cap_key
from herald.planning import PlanRequest
from herald.policy import PolicyRequest
from tests.conftest import RunningStack

pytestmark = pytest.mark.integration

NOW = datetime(2026, 3, 8, 9, 0, tzinfo=UTC)


def plan_request(nid: str, origin: str) -> PlanRequest:
    return PlanRequest(
        nid,
        "r",
        "t",
        "marketing_campaign",
        "marketing",
        "bulk",
        {},
        PolicyRequest("x"),
        None,
        origin,
    )


def test_gate_readmits_a_replay_and_drops_a_second_copy(stack: RunningStack) -> None:
    client = redis.Redis.from_url(stack.settings.redis.url)
    gate = RequestGate(client, max_ttl_seconds=86400)
    nid = f"n-{uuid.uuid4()}"
    first, copy = plan_request(nid, "t:0:10"), plan_request(nid, "t:0:99")
    soon = NOW + timedelta(minutes=5)
    assert gate.admit([(first, soon)], NOW) == [True]
    assert gate.admit([(first, soon), (copy, soon)], NOW) == [True, False]  # replay, copy
    assert 60 < client.ttl(f"plan:req:{{{nid}}}") <= 6 * 60  # until the request expires


def test_cap_counts_each_notification_once_up_to_the_limit(stack: RunningStack) -> None:
    client = redis.Redis.from_url(stack.settings.redis.url)
    caps = CapCounter(client)
    user = f"u-{uuid.uuid4()}"
    key = cap_key(user, "marketing", date(2026, 3, 8))
    bucket = CapBucket(key, "marketing", 3, date(2026, 3, 8), 3600)
    charges = [CapCharge.of(bucket, user, f"n{i}") for i in range(5)]
    assert caps.charge(charges[:2]) == [True, True]
    assert caps.charge(charges[:2]) == [True, True]  # replays: allowed, not counted again
    assert caps.charge(charges[2:]) == [True, False, False]
    assert client.get(key) == b"3" and 0 < client.ttl(key) <= 3600


def test_cap_charges_of_a_large_batch_span_script_chunks(stack: RunningStack) -> None:
    client = redis.Redis.from_url(stack.settings.redis.url)
    caps = CapCounter(client)
    run = uuid.uuid4().hex[:8]
    buckets = [
        CapBucket(cap_key(f"{run}-{i}", "marketing", date(2026, 3, 8)), "marketing", 1,
                  date(2026, 3, 8), 3600)
        for i in range(600)
    ]  # fmt: skip
    first = [CapCharge.of(b, f"{run}-{i}", "n1") for i, b in enumerate(buckets)]
    second = [CapCharge.of(b, f"{run}-{i}", "n2") for i, b in enumerate(buckets)]
    assert caps.charge(first + first) == [True] * 1200  # each counted once, replays allowed
    assert caps.charge(second) == [False] * 600  # limit 1 reached for every user
    assert {client.get(b.key) for b in buckets} == {b"1"}
