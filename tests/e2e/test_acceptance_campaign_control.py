"""Issue 20, campaigns you can stop: a campaign to a segment made through the API, paused,
resumed and cancelled through the running stack, judged at the FCM simulator's own request log.

- after the pause is answered, no message of the campaign reaches FCM until it is resumed;
  what reached dispatch meanwhile is parked (SCHEDULED `paused`) and sent after the resume;
- after the cancel is answered, none at all; every delivery not sent ends SUPPRESSED
  `cancelled`, and the status counts add up: sent + not sent = deliveries = users.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from infra.stackclient import StackClient
from tests.e2e._helpers import ensure_push_audience, produce_devices, sim_log
from tests.e2e._stack import E2EStack

USERS = 6000  # ~7.5 s of sends at the e2e FCM budget (800/s)
PROBE_USERS = 100
STEP = 600  # messages at FCM between two controls


def _accepted_times(client: StackClient, tokens: set[str]) -> list[float]:
    """When FCM accepted each message of the campaign (the simulator's clock)."""
    return sorted(t for t, address, outcome in sim_log(client, "fcm")
                  if address in tokens and outcome == "accepted")  # fmt: skip


def _fcm_accepted(client: StackClient) -> int:
    """Every message FCM accepted so far (a counter: cheap to poll)."""
    return int(client.sim("fcm").stats(ids=False)["accepted"])


def _wait_accepted(client: StackClient, tokens: set[str], at_least: int, since: int) -> None:
    """Until `at_least` messages of the campaign reached FCM. The FCM counter (`since`: its
    value before the campaign) is polled first: it is cheap, while the request log grows with
    every test of the lane, and on a loaded machine reading it each time let a whole campaign
    drain before the control meant to interrupt it."""
    deadline = time.monotonic() + 120
    while _fcm_accepted(client) < since + at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} messages reached FCM"
        time.sleep(0.1)
    while len(_accepted_times(client, tokens)) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} messages reached FCM"
        time.sleep(0.2)


def _wait_progress(client: StackClient, nid: str, done: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while True:
        status = client.status(nid, limit=1)
        if done(status):
            return status
        assert time.monotonic() < deadline, f"{what}: {status['summary']} {status['progress']}"
        time.sleep(0.3)


def _reasons(client: StackClient, nid: str) -> dict[tuple[str, str | None], int]:
    """(state, reason) -> deliveries, over every page of the status."""
    counts: dict[tuple[str, str | None], int] = {}
    cursor = "0"
    while cursor is not None:
        resp = client.api.get(f"/v1/notifications/{nid}", params={"cursor": cursor,
                                                                   "limit": 1000})  # fmt: skip
        page = resp.json()
        for d in page["deliveries"]:
            key = (d["state"], d["status_reason"])
            counts[key] = counts.get(key, 0) + 1
        cursor = page["next_cursor"]
    return counts


def test_a_campaign_paused_resumed_and_cancelled(e2e: E2EStack) -> None:
    client = e2e.client
    tag = uuid.uuid4().hex[:8]
    users = [f"ctl-{tag}-{i:05d}" for i in range(USERS)]
    probe = [f"ctl-probe-{tag}-{i:03d}" for i in range(PROBE_USERS)]
    produce_devices(client.settings(), users + probe)
    lines = "".join(f'"{u}"\n' for u in users)  # the segment through the API, as JSON lines
    # 60 s, not the client's 10: right after the stack started, beside the lane of stacks of
    # their own, this upload once took longer than 10 s (its statements wait their turn at the
    # embedded ClickHouse, which runs one at a time); latency is the benchmarks' to judge
    made = client.api.put(f"/v1/segments/seg-ctl-{tag}", content=lines, timeout=60,
                          headers={"Content-Type": "application/x-ndjson"})  # fmt: skip
    assert made.status_code == 201 and made.json()["size"] == USERS, made.text
    ensure_push_audience(client, probe, f"ctl-{tag}")
    tokens = {f"tok-{u}" for u in users}
    since = _fcm_accepted(client)
    nid = client.send({
        "request_id": f"ctl-{tag}", "notification_type": "marketing_campaign",
        "recipients": {"segment_id": f"seg-ctl-{tag}"}, "channels": ["push"],
        "params": {"headline": "Spring sale", "offer": "20% off", "cta_url": "https://x.test"},
    })  # fmt: skip

    _wait_accepted(client, tokens, STEP, since)
    paused = client.control(nid, "pause")
    paused_at = time.time()
    assert paused["settled"], paused
    # barrier: everything planned was either sent or parked by dispatch (nothing in between)
    held = _wait_progress(
        client, nid,
        lambda s: s["progress"]["users_planned"] == USERS
        and s["summary"].get("SCHEDULED", 0) > 0
        and s["progress"]["sent"] + s["summary"].get("SCHEDULED", 0) == USERS,
        "paused deliveries never all parked",
    )  # fmt: skip
    before = _accepted_times(client, tokens)
    assert not [t for t in before if t > paused_at], "a message reached FCM after the pause"
    assert held["progress"]["control"] == "paused"

    resumed = e2e.cli("resume", nid)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "parked deliveries released" in resumed.stdout
    _wait_accepted(client, tokens, len(before) + STEP, since)
    cancelled = client.control(nid, "cancel")
    cancelled_at = time.time()
    assert cancelled["settled"], cancelled

    final = _wait_progress(
        client, nid, lambda s: s["progress"]["deliveries"] == USERS
        and s["progress"]["remaining"] == 0, "the campaign never settled after the cancel",
    )  # fmt: skip
    times = _accepted_times(client, tokens)
    assert not [t for t in times if t > cancelled_at], "a message reached FCM after the cancel"
    progress = final["progress"]
    assert progress["control"] == "cancelled"
    assert progress["sent"] == len(times)  # one message per user: bulk is at most once
    assert progress["sent"] + progress["not_sent"] == progress["deliveries"] == USERS
    assert len(before) + STEP <= progress["sent"] < USERS
    reasons = _reasons(client, nid)
    assert reasons == {
        ("PROVIDER_ACCEPTED", None): progress["sent"],
        ("SUPPRESSED", "cancelled"): progress["not_sent"],
    }, reasons
    shown = e2e.cli("progress", nid)
    assert f"sent {progress['sent']:,}" in shown.stdout, shown.stdout
    print(f"\ncampaign control: {USERS} users, {len(before)} sent before the pause, "
          f"{progress['sent']} before the cancel, {progress['not_sent']} cancelled")  # fmt: skip
