"""Dispatch meets cancelled and paused notifications (herald.controls), on real Redis and a
real APNs simulator: nothing of theirs is sent; a running one is sent under a send lease that
is given back after the batch."""

from __future__ import annotations

import uuid

import pytest
import redis

from herald.controls import DispatchControls, parked_entry, split_parked
from herald.guard import Proceed
from herald.status_keys import header_key, request_header
from infra.simulators.launcher import RunningSimulator
from sinks.dispatch.work import Item
from tests.sinks.dispatch_helpers import accepted_for, delivery, factories, harness, states

pytestmark = pytest.mark.integration


def _notification(client: redis.Redis, nid: str, control: str | None) -> None:
    header = request_header("acme", "r-1", "payment_result", "transactional", 0, 1, None, False)
    if control is not None:
        header["control"] = control
    client.hset(header_key(nid), mapping=header)  # type: ignore[arg-type]


def test_cancelled_deliveries_end_suppressed_and_are_not_sent(
    apns: RunningSimulator, url: str
) -> None:
    batch = [delivery() for _ in range(3)]
    with harness(url, factories({"apns": apns}, url)) as h:
        for d in batch:
            _notification(h.redis, d["notification_id"], "cancelled")
        out = h.run(batch)
        for d in batch:
            assert states(out, d["delivery_id"]) == [("SUPPRESSED", "cancelled")]
            assert accepted_for(apns, d["address"]) == 0
            # no guard was taken: a later attempt (a replay) may proceed
            assert isinstance(
                h.guard.acquire_many([(d["delivery_id"], "transactional")])[0], Proceed
            )
        assert out.parked == []


def test_paused_deliveries_are_parked_not_sent(apns: RunningSimulator, url: str) -> None:
    paused, running = delivery(), delivery()
    with harness(url, factories({"apns": apns}, url)) as h:
        _notification(h.redis, paused["notification_id"], "paused")
        _notification(h.redis, running["notification_id"], None)
        out = h.run([paused, running])
        assert states(out, paused["delivery_id"]) == [("SCHEDULED", "paused")]
        assert [d["delivery_id"] for d in out.parked] == [paused["delivery_id"]]
        assert accepted_for(apns, paused["address"]) == 0
        assert ("PROVIDER_ACCEPTED", None) in states(out, running["delivery_id"])
        assert accepted_for(apns, running["address"]) == 1


def test_a_running_notification_is_sent_under_a_lease_given_back_after(
    apns: RunningSimulator, url: str
) -> None:
    d = delivery()
    seen: dict[str, list[str]] = {}

    def hook(stage: str, items: list[Item]) -> None:
        fields = h.redis.hkeys(header_key(d["notification_id"]))
        seen[stage] = [f.decode() for f in fields if f.startswith(b"lease:")]

    with harness(url, factories({"apns": apns}, url), hook=hook) as h:
        _notification(h.redis, d["notification_id"], None)
        out = h.run([d])
    assert ("PROVIDER_ACCEPTED", None) in states(out, d["delivery_id"])
    assert len(seen["guarded"]) == 1  # held while sending
    assert seen["sent"] == []  # given back once the sends were over


def test_parking_is_refused_once_the_notification_is_no_longer_paused(url: str) -> None:
    client = redis.Redis.from_url(url)
    controls = DispatchControls(client, "seat-x", 60)
    resumed, paused = f"n-resumed-{uuid.uuid4()}", f"n-paused-{uuid.uuid4()}"
    _notification(client, resumed, "running")
    _notification(client, paused, "paused")
    entry = parked_entry("herald.deliveries.push.bulk", "d-1", b"\x00avro")
    assert controls.park([(resumed, entry), (paused, entry)]) == [False, True]
    assert split_parked(client.lrange(f"parked:{{{paused}}}", 0, -1)[0]) == (
        "herald.deliveries.push.bulk",
        "d-1",
        b"\x00avro",
    )
    assert client.llen(f"parked:{{{resumed}}}") == 0
    client.close()
