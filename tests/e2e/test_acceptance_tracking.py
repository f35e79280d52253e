"""The truth loop for email through the running stack: the open pixel and the click redirects
dispatch puts into every email become OPENED and CLICKED in the delivery's status and in
ClickHouse."""

from __future__ import annotations

import time
import uuid

import httpx

from tests.e2e._helpers import REACHED, UserPool, email_of, events
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
