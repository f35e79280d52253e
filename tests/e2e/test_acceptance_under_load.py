"""Seed 001 acceptance, under load: a bulk flood must not slow OTPs.

On the full stack from the API (tests/e2e/conftest.py), measured at the provider simulators'
request log (when each message reached the provider). Seed 001's other scenario under load, a
killed transactional worker losing no accepted OTP, is part of the fault injection run
(tests/e2e_faults: every process kind killed under OTP load, the dispatch and plan jobs of
transactional traffic among them, on a stack of its own).
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from herald.topics import DELIVERY_EVENTS
from infra.stackclient import StackClient
from tests.dataflows.helpers import consume, decoder
from tests.e2e._helpers import (
    REACHED,
    UserPool,
    ensure_push_audience,
    insert_segment,
    max_window_count,
    otp_body,
    percentile,
    produce_devices,
    sim_log,
    wait_all,
)
from tests.e2e._stack import FCM_RATE, E2EStack

# Sized to this 2-core box: ~25 s of push at the FCM budget when the machine is otherwise idle
# (HERALD_E2E_CAMPAIGN_USERS overrides it, e.g. smaller when other work shares the machine).
CAMPAIGN_USERS = int(os.environ.get("HERALD_E2E_CAMPAIGN_USERS", "20000"))
OTPS = 40
OTP_INTERVAL_S = 0.25
BURST_S = 0.1  # RateModel.burst_s default: the bucket holds rate x 0.1 s
# Requests reach the simulator a variable time after their token was granted (HTTP/2 streams,
# event-loop turns, GC, two cores shared by the whole stack): sends delayed and then sent
# together can put up to rate x that variance more arrivals into one second than the bucket
# granted in any second: a simulator starved of the CPU for 100 ms stamps 100 ms of requests
# at once, however evenly they were sent. 934 against 881 (about 70 ms) and 966 against 961
# (about 110 ms, while the fault-injection lane's own stack shared the box; Herald's grants
# 838 in that run) were the worst seen in CI runs. Herald's own grants are held to the budget
# without this allowance (`granted` below).
ARRIVAL_JITTER_S = 0.15
PROBE_USERS = 200
DRAIN_WINDOW_S = 900.0  # seed 001: the bulk backlog is digested within 15 minutes


def _start_campaign(client: StackClient, tag: str) -> tuple[str, list[str]]:
    """A marketing campaign to a fresh 20k-user segment, each user with one FCM device."""
    users = [f"bulk-{tag}-{i:05d}" for i in range(CAMPAIGN_USERS)]
    probe = [f"probe-{tag}-{i:03d}" for i in range(PROBE_USERS)]
    produce_devices(client.settings(), users + probe)
    insert_segment(client, f"seg-{tag}", users)
    ensure_push_audience(client, probe, tag)
    nid = client.send(
        {
            "request_id": f"campaign-{tag}",
            "notification_type": "marketing_campaign",
            "recipients": {"segment_id": f"seg-{tag}"},
            "params": {"headline": "Spring sale", "offer": "20% off", "cta_url": "https://x.test"},
        }
    )
    return nid, users


def _wait_flooding(client: StackClient, at_least: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while client.sim("fcm").stats(ids=False)["accepted"] < at_least:
        assert time.monotonic() < deadline, "the campaign never reached the FCM simulator"
        time.sleep(0.5)


def _campaign_pushes(client: StackClient, tokens: set[str]) -> list[float]:
    """When the FCM simulator accepted each push of the campaign (probe pushes left out)."""
    return [t for t, a, o in sim_log(client, "fcm") if o == "accepted" and a in tokens]


def _campaign_sending(client: StackClient, nid: str, expected: int) -> list[float]:
    """When Herald granted each FCM send of the campaign: the SENDING events dispatch produced,
    read from the events topic once it holds them all (or after 120 s). Not from ClickHouse:
    the warehouse is niced and trails a loaded machine by minutes, and what is checked here is
    what dispatch decided, which the topic holds first."""
    settings = client.settings()
    decode, marker = decoder(settings), nid.encode()
    deadline = time.monotonic() + 120
    while True:
        granted: dict[str, float] = {}  # event_id -> occurred_at (a re-produced event once)
        for _key, value in consume(settings, DELIVERY_EVENTS):
            if value is None or marker not in value:
                continue
            event = decode(value)
            if (
                event["notification_id"] == nid
                and event["state"] == "SENDING"
                and (event["provider"] == "fcm")
            ):
                granted[event["event_id"]] = event["occurred_at"].timestamp()
        if len(granted) >= expected or time.monotonic() > deadline:
            return list(granted.values())
        time.sleep(1.0)


@pytest.mark.timeout(1500)
def test_bulk_flood_does_not_slow_otps_and_provider_rate_holds(
    e2e: E2EStack, pool: UserPool
) -> None:
    client = e2e.client
    tag = uuid.uuid4().hex[:8]
    otp_users = pool.take(OTPS)
    for name in ("fcm", "sms_a", "sms_b"):
        client.sim(name).reset()

    began = time.monotonic()
    campaign, bulk_users = _start_campaign(client, tag)
    posted = time.monotonic()
    flood_start = client.sim("fcm").stats(ids=False)["accepted"]
    _wait_flooding(client, at_least=flood_start + 300)
    flooding = time.monotonic()
    tokens = {f"tok-{u}" for u in bulk_users}

    accepted_at: dict[str, float] = {}  # phone -> wall time the API answered 202
    nids = []
    for i, (user, phone) in enumerate(otp_users.items()):
        nids.append(client.send(otp_body(f"otp-{tag}-{i}", user)))
        accepted_at[phone] = time.time()
        time.sleep(OTP_INTERVAL_S)
    last_otp = max(accepted_at.values())

    reached = wait_all(client, nids, "sms", REACHED, timeout=120)
    assert len(reached) == OTPS, f"{OTPS - len(reached)} OTPs never reached a provider"
    received = {}
    for t, address, outcome in sim_log(client, "sms_a") + sim_log(client, "sms_b"):
        if outcome == "accepted" and address in accepted_at:
            received.setdefault(address, t)
    latencies = [received[p] - accepted_at[p] for p in accepted_at]
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    print(
        f"\nOTP 202 -> provider under a {CAMPAIGN_USERS}-user flood: n={len(latencies)} "
        f"p50={p50:.3f}s p99={p99:.3f}s max={max(latencies):.3f}s"
    )

    # the flood was still going when the last OTP was accepted (else this proved nothing)
    fcm_times = _campaign_pushes(client, tokens)
    assert max(fcm_times) > last_otp, "the campaign drained before the OTPs: no contention"
    assert p99 < 2.0, f"OTP accept->provider p99 {p99:.3f}s (p50 {p50:.3f}s) >= 2 s"

    # the campaign drains completely within the seed's 15-minute window, and Herald never sends
    # above the configured FCM budget (rate x 1 s + bucket depth in any second); at the
    # provider, within that plus the arrival jitter
    deadline = time.monotonic() + DRAIN_WINDOW_S
    while len(fcm_times) < len(bulk_users) and time.monotonic() < deadline:
        time.sleep(2)
        fcm_times = _campaign_pushes(client, tokens)
    span = max(fcm_times) - min(fcm_times)
    busiest = max_window_count(fcm_times, 1.0)
    print(
        f"campaign: {len(fcm_times)} pushes in {span:.1f}s ({len(fcm_times) / span:.0f}/s), "
        f"busiest 1 s window {busiest} (budget {FCM_RATE:.0f}/s + burst)"
    )
    assert len(fcm_times) == len(bulk_users), "campaign not drained (or a user pushed twice)"
    drained = time.monotonic()
    sending = _campaign_sending(client, campaign, len(bulk_users))
    granted = max_window_count(sending, 1.0)
    print(f"Herald's sends: {len(sending)}, busiest 1 s window {granted}")
    print(
        f"phases: audience loaded and known {posted - began:.1f}s, first 300 pushes "
        f"{flooding - posted:.1f}s, OTPs and drain {drained - flooding:.1f}s, "
        f"events read {time.monotonic() - drained:.1f}s"
    )
    assert len(sending) >= len(bulk_users)
    assert granted <= FCM_RATE * (1.0 + BURST_S) + 1
    assert max_window_count(sending, 5.0) <= FCM_RATE * (5.0 + BURST_S) + 1
    assert busiest <= FCM_RATE * (1.0 + BURST_S + ARRIVAL_JITTER_S) + 1
    assert max_window_count(fcm_times, 5.0) <= FCM_RATE * (5.0 + BURST_S + ARRIVAL_JITTER_S) + 1
