"""The truth loop through the running stack: the open pixel and the click redirects dispatch
puts into every email become OPENED and CLICKED in the delivery's status and in ClickHouse; an
in-app item fetched by the app is DELIVERED, marked read it is READ; an SMS the carrier reports
undelivered falls back to the next step of its type, once."""

from __future__ import annotations

import time
import uuid

import httpx

from tests.e2e._helpers import (
    REACHED,
    UserPool,
    accepted_count,
    email_of,
    events,
    otp_body,
    sim_log,
)
from tests.e2e._stack import E2EStack


def test_an_email_opened_and_a_link_clicked_are_recorded(e2e: E2EStack, pool: UserPool) -> None:
    client = e2e.client
    (user,) = pool.take(1)
    target = f"https://x.test/w49?u={uuid.uuid4().hex[:6]}"
    nid = client.send({
        "request_id": f"track-{uuid.uuid4().hex[:8]}", "notification_type": "promo_weekly",
        "recipients": {"user_ids": [user]},
        "params": {"week": "W49", "highlights_url": target},
    })  # fmt: skip
    client.wait_for(nid, "email", REACHED, timeout=60)
    page = client.sim("email").stats()["messages"][email_of(user)]["content"][1]["value"]
    assert target not in page  # the link goes through Herald's signed redirect
    click = page.split('href="')[1].split('"')[0].replace("&amp;", "&")
    pixel = page.split('<img src="')[1].split('"')[0].replace("&amp;", "&")
    with httpx.Client(timeout=30, follow_redirects=False) as http:
        opened = http.get(pixel)  # the mail client shows the images
        clicked = http.get(click)  # the reader follows the link
    assert opened.status_code == 200 and opened.headers["content-type"] == "image/gif"
    assert clicked.status_code == 302 and clicked.headers["location"] == target
    status = client.wait_for(nid, "email", {"CLICKED"}, timeout=60)
    assert status["user_id"] == user
    deadline = time.monotonic() + 60  # and in ClickHouse, beside the send's own events
    states = {e["state"] for e in events(client, nid)}
    while not {"OPENED", "CLICKED"} <= states and time.monotonic() < deadline:
        time.sleep(1.0)
        states = {e["state"] for e in events(client, nid)}
    assert {"PROVIDER_ACCEPTED", "OPENED", "CLICKED"} <= states, states


def test_an_inbox_item_fetched_and_read_is_delivered_then_read(
    e2e: E2EStack, pool: UserPool
) -> None:
    """In-app: PROVIDER_ACCEPTED when stored, DELIVERED once the app fetched it, READ once
    marked read (never DELIVERY_UNKNOWN for an item seen)."""
    client = e2e.client
    (user,) = pool.take(1)
    nid = client.send({
        "request_id": f"inbox-{uuid.uuid4().hex[:8]}", "notification_type": "inbox_announcement",
        "recipients": {"user_ids": [user]},
        "params": {"title": "New feature", "body": "Dark mode is here"},
    })  # fmt: skip
    stored = client.wait_for(nid, "inapp", REACHED, timeout=60)
    [item] = client.inbox(user)["items"]
    assert item["notification_id"] == nid
    assert client.wait_for(nid, "inapp", {"DELIVERED"}, timeout=60)["user_id"] == user
    resp = client.api.post(f"/v1/users/{user}/inbox/{item['item_id']}/read")
    assert resp.status_code == 200, resp.text
    read = client.wait_for(nid, "inapp", {"READ"}, timeout=60)
    assert read["delivery_id"] == stored["delivery_id"] == item["item_id"]


def test_an_sms_reported_undelivered_falls_back_to_push_once(e2e: E2EStack, pool: UserPool) -> None:
    """otp_login falls back sms -> push: the SMS provider accepts the OTP, then its DLR says
    undelivered; the push follows, once, to the user's own (verified) device, never to a
    token registered without contact_points:verify."""
    client = e2e.client
    (user,) = pool.take(1)
    token, planted = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    client.put_device(user, "apns", token, verified=True)
    client.put_device(user, "apns", planted)
    sms = client.sim("sms_a")
    sms.configure({"receipts": {"outcomes": {"undelivered:30003": 1.0}}})
    try:
        nid = client.send(otp_body(f"late-{uuid.uuid4().hex[:8]}", user))
        failed = client.wait_for(nid, "sms", {"FAILED_PERMANENT"}, timeout=60)
        pushed = client.wait_for(nid, "push", REACHED, timeout=60)
    finally:
        sms.reset(config=True)
    assert failed["user_id"] == pushed["user_id"] == user
    assert accepted_count(client, "apns", token) == 1  # (once: tests/dataflows/test_receipts.py)
    assert accepted_count(client, "apns", planted) == 0  # the same fallback batch, not sent


def test_an_unread_notice_escalates_to_push_and_a_read_one_does_not(
    e2e: E2EStack, pool: UserPool
) -> None:
    """account_notice (inbox, escalating to push after 20 s): the user who read the inbox item
    in time gets no push (SUPPRESSED read_before_escalation), the other gets it, 20 s on."""
    client = e2e.client
    reader, busy = pool.take(2)
    tokens = {user: uuid.uuid4().hex * 2 for user in (reader, busy)}
    for user, token in tokens.items():
        client.put_device(user, "apns", token)
    sent_at = time.time()
    nid = client.send({
        "request_id": f"notice-{uuid.uuid4().hex[:8]}", "notification_type": "account_notice",
        "recipients": {"user_ids": [reader, busy]},
        "params": {"title": "New sign-in", "body": "A new device signed in to your account"},
    })  # fmt: skip
    deadline = time.monotonic() + 30
    while not (items := client.inbox(reader)["items"]):
        assert time.monotonic() < deadline, "the notice never reached the reader's inbox"
        time.sleep(0.2)
    read = client.api.post(f"/v1/users/{reader}/inbox/{items[0]['item_id']}/read")
    assert read.status_code == 200, read.text

    def push_of(user: str) -> dict | None:  # type: ignore[type-arg]
        entries = client.status(nid)["deliveries"]
        return next((d for d in entries if d["user_id"] == user and d["channel"] == "push"),
                    None)  # fmt: skip

    deadline = time.monotonic() + 120
    while (push_of(busy) or {}).get("state") not in REACHED or push_of(reader) is None \
            or push_of(reader)["state"] == "SCHEDULED":  # fmt: skip
        assert time.monotonic() < deadline, client.status(nid)["deliveries"]
        time.sleep(0.5)
    dropped = push_of(reader)
    assert (dropped["state"], dropped["status_reason"]) == ("SUPPRESSED", "read_before_escalation")
    apns = [(t, a) for t, a, o in sim_log(client, "apns") if o == "accepted"]
    assert [a for _t, a in apns if a == tokens[reader]] == []
    [(pushed_at, _)] = [(t, a) for t, a in apns if a == tokens[busy]]
    assert pushed_at >= sent_at + 20  # not before the window ended


def test_unknown_otps_are_reconciled_at_the_sms_provider(e2e: E2EStack, pool: UserPool) -> None:
    """Two OTPs whose calls time out (UNKNOWN): the provider had taken the first (it answers no
    more) and lost the second before taking it. Asked 3 s later, the first is found — SENT,
    one message — and the second is sent again under the same delivery, once."""
    client = e2e.client
    sms = client.sim("sms_a")
    outcomes = {}
    for fault in ("timeout_after_accept", "lose_before_accept"):
        (user,) = pool.take(1)
        phone = client.contact_points(user)["phone"]["e164"]
        sms.configure({fault: 1.0})
        try:
            nid = client.send(otp_body(f"recon-{uuid.uuid4().hex[:8]}", user))
            unknown = client.wait_for(nid, "sms", {"UNKNOWN"}, timeout=60)
        finally:
            sms.configure({fault: 0.0})
        reached = client.wait_for(nid, "sms", REACHED, timeout=60)
        assert reached["delivery_id"] == unknown["delivery_id"]
        outcomes[fault] = (nid, phone)
    for fault, (_nid, phone) in outcomes.items():
        assert accepted_count(client, "sms_a", phone) == 1, fault  # never a second message
    deadline = time.monotonic() + 60  # ClickHouse: how each was settled
    found = lost = None
    while (found is None or lost is None) and time.monotonic() < deadline:
        found = next((e for e in events(client, outcomes["timeout_after_accept"][0])
                      if e["state"] == "PROVIDER_ACCEPTED"), None)  # fmt: skip
        lost = next((e for e in events(client, outcomes["lose_before_accept"][0])
                     if e["state"] == "PROVIDER_ACCEPTED"), None)  # fmt: skip
        time.sleep(1.0)
    assert found is not None and found["reason"] == "reconciled"
    assert lost is not None and lost["attempt"] == 2  # sent again, as the next attempt
