"""Dispatch meets cancelled and paused notifications (herald.controls), on real Redis and a
real APNs simulator: nothing of theirs is sent; a running one is sent under a send lease that
is given back after the batch."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from herald.controls import DispatchControls, parked_entry, split_parked
from herald.guard import Proceed
from herald.status_keys import header_key, request_header
from infra.process import free_port
from infra.simulators.launcher import RunningSimulator
from sinks.dispatch.work import Item
from tests.sinks.dispatch_helpers import (
    accepted_for,
    delivery,
    dispatch_settings,
    factories,
    harness,
    states,
)

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


@pytest.mark.parametrize("control", ["paused", "cancelled"])
def test_a_control_met_while_a_batch_waits_for_tokens_withholds_the_rest(
    apns: RunningSimulator, url: str, control: str
) -> None:
    """A campaign batch at its budget takes seconds (here 400 sends at 200/s): a pause or cancel
    set while it waits for tokens takes effect within `control_recheck_s`, not at its end.
    The rest is parked (or suppressed) unsent, its guards released, and nothing is sent twice."""
    nid, total = str(uuid.uuid4()), 400
    batch = [delivery(notification_id=nid, traffic_class="bulk", category="marketing",
                      notification_type="marketing_campaign") for _ in range(total)]  # fmt: skip
    cfg = dispatch_settings(rates={"apns": {"rate": 200, "reserved": 0}}, pending_ttl_s=30.0,
                            shape_max_wait_s=5.0, control_recheck_s=0.2)  # fmt: skip
    addresses = {d["address"] for d in batch}

    def sent() -> int:
        counts = apns.stats()["accepted_ids"]
        return sum(len(counts.get(a, [])) for a in addresses)

    with harness(url, factories({"apns": apns}, url), cfg) as h:
        _notification(h.redis, nid, None)

        def interrupt() -> None:  # from the moment 40 messages reached the provider
            deadline = time.monotonic() + 10
            while sent() < 40 and time.monotonic() < deadline:
                time.sleep(0.02)
            h.redis.hset(header_key(nid), "control", control)

        thread = threading.Thread(target=interrupt)
        thread.start()
        out = h.run(batch)
        thread.join()
        accepted = {e["delivery_id"] for e in out.events if e["state"] == "PROVIDER_ACCEPTED"}
        held = [e for e in out.events if e["state"] in ("SCHEDULED", "SUPPRESSED")]
        # 40 before the control, then at most a recheck's worth (0.2 s at 200/s) plus a bucket
        assert 40 <= len(accepted) <= 40 + 120, len(accepted)
        assert len(accepted) + len(held) == total  # every delivery decided, none deferred
        reason = "cancelled" if control == "cancelled" else "paused"
        assert {(e["state"], e["reason"]) for e in held} == {
            ("SUPPRESSED" if control == "cancelled" else "SCHEDULED", reason)
        }
        assert not accepted & {e["delivery_id"] for e in held}
        parked = {d["delivery_id"] for d in out.parked}
        assert parked == (set() if control == "cancelled" else {e["delivery_id"] for e in held})
        assert sent() == len(accepted)  # what was withheld never reached the provider
        # their guards were released: a resume sends them (bulk is at most once per claim)
        first = next(iter({e["delivery_id"] for e in held}))
        assert isinstance(h.guard.acquire_many([(first, "bulk")])[0], Proceed)
        fields = [f for f in h.redis.hkeys(header_key(nid)) if f.startswith(b"lease:")]
        assert fields == []  # the batch's lease given back


def test_a_recheck_redis_does_not_answer_finds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The batch goes on under its leases (the API's answer to a pause waits for them)."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    controls = DispatchControls(client, "seat-x", 60)
    assert controls.check(["n-1", "n-2"]) == {}
    assert "dispatch.control_recheck_failed" in caplog.text
    client.close()
