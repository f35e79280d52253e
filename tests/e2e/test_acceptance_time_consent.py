"""Time and consent through the running stack: a send scheduled into the user's quiet hours
waits for their end; an email unsubscribe opts the user out of marketing email while their
password resets still arrive; marketing email carries a one-click unsubscribe (RFC 8058).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from herald.errors import ApiError
from infra.stackclient import StackClient
from tests.e2e._helpers import REACHED, QuietSend, UserPool, email_of, sim_log, wait_events
from tests.e2e._stack import E2EStack


def _promo(tag: str, user: str) -> dict[str, object]:
    return {
        "request_id": f"promo-{tag}",
        "notification_type": "promo_weekly",
        "recipients": {"user_ids": [user]},
        "params": {"week": "W49", "highlights_url": "https://x.test/w49"},
    }


def _preferences(client: StackClient, user: str) -> dict[str, Any]:
    """The user's preferences; the defaults while none are stored (404)."""
    try:
        return client.preferences(user)
    except ApiError as exc:
        assert "preferences_not_found" in str(exc), exc
        return {"global_opt_out": False, "category_opt_out": [], "category_channel_opt_out": []}


def test_a_send_scheduled_into_quiet_hours_waits_for_their_end(
    e2e: E2EStack, quiet_send: QuietSend
) -> None:
    """send_at 15 s ahead, inside the user's quiet window (Asia/Tokyo) that ends a minute or two
    later: held with reason quiet_hours and sent after the window's end, not at send_at. The
    send was made when the package's stack started (tests/e2e/conftest.py `quiet_send`), so the
    wait for the window's end overlaps the tests before this one."""
    client = e2e.client
    nid, user = quiet_send.notification_id, quiet_send.user
    held = wait_events(client, nid, "SCHEDULED", timeout=30)
    assert [(e["state"], e["reason"]) for e in held if e["state"] == "SCHEDULED"] == [
        ("SCHEDULED", "quiet_hours")
    ], held
    sent = client.wait_for(nid, "email", REACHED, timeout=240)
    assert sent["user_id"] == user
    at_provider = [t for t, address, _ in sim_log(client, "email") if address == email_of(user)]
    assert len(at_provider) == 1, at_provider
    window_end = quiet_send.window_end.timestamp()
    print(f"\nquiet hours: sent {at_provider[0] - window_end:+.1f}s after the window's end "
          f"({at_provider[0] - quiet_send.send_at.timestamp():+.1f}s after send_at)")  # fmt: skip
    assert at_provider[0] >= window_end, "sent inside the user's quiet hours"


def test_an_unsubscribe_opts_out_of_marketing_email_and_resets_still_arrive(
    e2e: E2EStack, pool: UserPool
) -> None:
    """The email provider reports an unsubscribe for a marketing email: the user's preferences
    (API) gain marketing:email, the next marketing email is suppressed, a password reset to
    the same address is delivered."""
    client = e2e.client
    (user,) = pool.take(1)
    tag = uuid.uuid4().hex[:8]
    sim = client.sim("email")
    sim.configure({"receipts": {"outcomes": {"unsubscribe": 1.0}}})
    try:
        nid = client.send(_promo(f"{tag}-1", user))
        client.wait_for(nid, "email", REACHED, timeout=60)
        deadline = time.monotonic() + 60
        prefs = _preferences(client, user)  # none stored before the opt-out: the defaults
        while "marketing:email" not in prefs["category_channel_opt_out"]:
            assert time.monotonic() < deadline, f"no opt-out recorded: {prefs}"
            time.sleep(0.5)
            prefs = _preferences(client, user)
    finally:
        sim.reset(config=True)
    assert not prefs["global_opt_out"] and prefs["category_opt_out"] == []

    reset = client.send({"request_id": f"reset-{tag}", "notification_type": "password_reset",
                         "recipients": {"user_ids": [user]},
                         "params": {"reset_url": "https://x.test/r"}})  # fmt: skip
    assert client.wait_for(reset, "email", REACHED, timeout=60)["user_id"] == user
    again = client.send(_promo(f"{tag}-2", user))
    suppressed = client.wait_for(again, "email", {"SUPPRESSED"}, timeout=60)
    assert suppressed["status_reason"] == "channel_opt_out", suppressed
    # since the simulator's reset (after the first promo): the password reset, no second promo
    mails = [a for _t, a, _outcome in sim_log(client, "email") if a == email_of(user)]
    assert len(mails) == 1


def test_marketing_email_has_a_one_click_unsubscribe_that_records_the_opt_out(
    e2e: E2EStack, pool: UserPool
) -> None:
    """RFC 8058 headers at the email provider; POSTing their URL (as a mail client does)
    opts the user out of marketing email."""
    client = e2e.client
    (user,) = pool.take(1)
    nid = client.send(_promo(uuid.uuid4().hex[:8], user))
    client.wait_for(nid, "email", REACHED, timeout=60)
    message = client.sim("email").stats()["messages"][email_of(user)]
    headers = message["headers"]
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = headers["List-Unsubscribe"].removeprefix("<").removesuffix(">")
    assert all(url in part["value"] for part in message["content"])  # and a link in the body
    assert _preferences(client, user)["category_channel_opt_out"] == []
    resp = httpx.post(
        url, content=b"List-Unsubscribe=One-Click", timeout=30,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    assert _preferences(client, user)["category_channel_opt_out"] == ["marketing:email"]
