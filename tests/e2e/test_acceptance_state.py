"""Seed 001 acceptance, delivery identity and state: a duplicated queue message reuses its
delivery_id, out-of-order and duplicated receipts never regress a state, an unsubscribe after
acceptance and before dispatch suppresses the send.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import httpx

from infra.simulators.receipts import sign_twilio
from tests.e2e._helpers import (
    REACHED,
    UserPool,
    accepted_count,
    current_state,
    email_of,
    events,
    otp_body,
    wait_events,
)
from tests.e2e._stack import E2EStack

RANK = {"PROVIDER_ACCEPTED": 1, "DELIVERED": 2}


def test_duplicated_queue_messages_reuse_the_delivery_id(e2e: E2EStack, pool: UserPool) -> None:
    """The request and the delivery record are each delivered twice (`herald replay` of the
    range into the same topics): same delivery_id, one provider send."""
    client = e2e.client
    tag = uuid.uuid4().hex[:8]
    [(user, phone)] = pool.take(1).items()
    since = datetime.now(UTC) - timedelta(seconds=1)
    nid = client.send(otp_body(f"dup-{tag}", user))
    first = client.wait_for(nid, "sms", {"DELIVERED"}, timeout=60)
    until = datetime.now(UTC) + timedelta(seconds=1)
    for topic in ("herald.requests.transactional", "herald.deliveries.sms.transactional"):
        replay = e2e.cli(
            "replay", "--topic", topic, "--from", since.isoformat(), "--to", until.isoformat()
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
    # both copies through plan, then whatever plan wrote through dispatch
    client.wait_consumed("plan_transactional", ["herald.requests.transactional"])
    client.wait_consumed("dispatch_transactional", ["herald.deliveries.sms.transactional"])

    status = client.status(nid)
    assert [d["delivery_id"] for d in status["deliveries"]] == [first["delivery_id"]]
    assert status["deliveries"][0]["state"] == "DELIVERED"
    assert (
        accepted_count(client, "sms_a", phone) + accepted_count(client, "sms_b", phone.lstrip("+"))
        == 1
    )
    assert {e["delivery_id"] for e in events(client, nid)} <= {first["delivery_id"], nid}


def _twilio_callback(e2e: E2EStack, sid: str, phone: str, status: str) -> None:
    """A signed Twilio status callback, as the provider posts it (its idempotency token is
    per sid x status, so a repeated status is the provider's own retry)."""
    creds = json.loads((e2e.run_dir / "simulators" / "sms_a" / "credentials.json").read_text())
    url = f"{e2e.client.api_url}/v1/callbacks/sms_a"
    params = {
        "MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status,
        "AccountSid": creds["account_sid"], "From": "+15005550006", "To": phone,
        "ApiVersion": "2010-04-01",
    }  # fmt: skip
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-twilio-signature": sign_twilio(creds["auth_token"], url, params),
        "i-twilio-idempotency-token": hashlib.sha1(f"{sid}:{status}".encode()).hexdigest(),
    }
    resp = httpx.post(url, content=urlencode(params).encode(), headers=headers, timeout=10)
    assert resp.status_code < 300, resp.text


def test_out_of_order_and_duplicated_receipts_never_regress(e2e: E2EStack, pool: UserPool) -> None:
    """delivered → sent → delivered → sent: DELIVERED stays, in the API and in ClickHouse."""
    client = e2e.client
    sim = client.sim("sms_a")
    sim.reset(config=True)
    sim.configure({"receipts": {"enabled": False}})  # the test posts the receipts itself
    try:
        tag = uuid.uuid4().hex[:8]
        [(user, phone)] = pool.take(1).items()
        nid = client.send(otp_body(f"rcpt-{tag}", user))
        delivery = client.wait_for(nid, "sms", REACHED, timeout=60)
        [(sid, _)] = sim.stats()["accepted_ids"][phone]
        seen: list[str] = []
        for status in ("delivered", "sent", "delivered", "sent"):
            _twilio_callback(e2e, sid, phone, status)
            for _ in range(6):  # watch the state between receipts
                seen.append(client.status(nid)["deliveries"][0]["state"])
                time.sleep(0.25)
        client.wait_for(nid, "sms", {"DELIVERED"}, timeout=30)
        client.wait_consumed("receipts", ["herald.receipts.raw"])  # every receipt folded
        seen.append(client.status(nid)["deliveries"][0]["state"])
    finally:
        sim.reset(config=True)
    ranks = [RANK.get(s, 0) for s in seen]
    assert ranks == sorted(ranks), f"state regressed: {seen}"
    assert seen[-1] == "DELIVERED"
    wait_events(client, nid, "DELIVERED")
    deadline = time.monotonic() + 30
    while current_state(client, delivery["delivery_id"]) != "DELIVERED":
        assert time.monotonic() < deadline, current_state(client, delivery["delivery_id"])
        time.sleep(1)


def test_unsubscribe_after_accept_before_send_suppresses(e2e: E2EStack, pool: UserPool) -> None:
    """A campaign held until send_at; the user opts out of marketing meanwhile: SUPPRESSED
    with the opt-out reason at dispatch, nothing reaches the email provider."""
    client = e2e.client
    tag = uuid.uuid4().hex[:8]
    stay, leave = pool.take(2)
    send_at = datetime.now(UTC) + timedelta(seconds=15)
    nid = client.send(
        {
            "request_id": f"unsub-{tag}",
            "notification_type": "promo_weekly",
            "recipients": {"user_ids": [stay, leave]},
            "params": {"week": "W48", "highlights_url": "https://x.test/w48"},
            "send_at": send_at.isoformat(),
        }
    )
    held = wait_events(client, nid, {"SCHEDULED", "QUEUED"}, timeout=30)
    assert {e["state"] for e in held} & {"SCHEDULED"}, held
    assert datetime.now(UTC) < send_at, "planning took longer than the hold: test is void"
    client.put_preferences(leave, {"category_opt_out": ["marketing"]})

    sent = client.wait_for(nid, "email", REACHED, timeout=90)
    assert sent["user_id"] == stay
    suppressed = client.wait_for(nid, "email", {"SUPPRESSED"}, timeout=60)
    assert suppressed["user_id"] == leave
    assert "opt_out" in (suppressed["status_reason"] or ""), suppressed
    # SUPPRESSED is dispatch's decision not to call the provider for that delivery: nothing can
    # reach the provider for it after this, so the log is read at once
    stats = client.sim("email").stats()["accepted_ids"]
    assert email_of(leave) not in stats
    assert len(stats.get(email_of(stay), [])) == 1
