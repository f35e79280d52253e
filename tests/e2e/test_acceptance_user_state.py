"""User state across the seams: a request right after a contact-point change uses it; a Redis
that lost everything loses no device, phone or email, and a new opt-out is honoured.

The Redis loss runs last of the package (this module's name sorts after the load scenarios):
FLUSHALL takes the stack's hot state with it (idempotency keys, statuses, inbox), as a failover
that lost its data would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import redis

from herald.errors import ApiError
from infra.stackclient import StackClient
from tests.e2e._helpers import REACHED, accepted_count, email_of, new_phone, otp_body
from tests.e2e._stack import E2EStack

T = TypeVar("T")


def _retry_503(call: Callable[..., T], *args: Any, timeout: float = 60.0) -> T:
    """`call(*args)`, again while the API answers 503 user_state_restoring."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call(*args)
        except ApiError as exc:
            if exc.status_code != 503 or time.monotonic() > deadline:
                raise
            assert orjson.loads(exc.body)["code"] == "user_state_restoring", exc.body
            time.sleep(1)


def test_request_right_after_a_contact_point_change_uses_it(e2e: E2EStack) -> None:
    """A phone set through the API and an OTP sent right after its 200 (no wait): the OTP goes
    to that phone; then the phone changes and the next OTP, again at once, goes to the new one."""
    client = e2e.client
    user = f"ryw-{uuid.uuid4().hex[:10]}"
    for _ in range(2):
        phone = new_phone()
        client.put_contact_points(user, phone=phone, email=email_of(user))
        nid = client.send(otp_body(f"ryw-{uuid.uuid4().hex[:10]}", user))
        sent = client.wait_for(nid, "sms", REACHED, timeout=60)
        assert accepted_count(client, sent["provider"], phone) == 1, sent


def _contacts(client: StackClient, user: str) -> dict[str, object]:
    view = client.contact_points(user)
    return {
        "devices": sorted(d["token_hint"] for d in view["devices"]),
        "phone": (view["phone"] or {}).get("e164"),
        "email": (view["email"] or {}).get("address"),
        "version": view["version"],
    }


def test_redis_loss_loses_no_contact_point_and_a_new_opt_out_holds(e2e: E2EStack) -> None:
    """A user with an iPhone, a phone and an email; Redis flushed; an Android phone registered
    and marketing opted out through the API (retried while the copies are restored): the user
    has both devices, the phone and the email, versions went forward, and a marketing campaign
    to them is suppressed while an OTP still reaches the phone."""
    client = e2e.client
    user = f"loss-{uuid.uuid4().hex[:10]}"
    phone = new_phone()
    client.put_device(user, "apns", f"apns-{uuid.uuid4().hex}")
    client.put_contact_points(user, phone=phone, email=email_of(user))
    before = client.put_preferences(user, {"locale": "en"})
    held = _contacts(client, user)

    hot = redis.Redis.from_url(client.settings().redis.url)
    try:
        hot.flushall()
    finally:
        hot.close()

    _retry_503(client.put_device, user, "fcm", f"fcm-{uuid.uuid4().hex}")
    after = client.put_preferences(user, {"locale": "en", "category_opt_out": ["marketing"]})
    now = _contacts(client, user)
    assert len(now["devices"]) == 2 and set(held["devices"]) < set(now["devices"]), now  # type: ignore[arg-type]
    assert (now["phone"], now["email"]) == (held["phone"], held["email"]), now
    assert now["version"] > held["version"], (held, now)  # type: ignore[operator]
    assert after["version"] > before["version"], (before, after)

    campaign = client.send(
        {
            "request_id": f"loss-{uuid.uuid4().hex[:10]}",
            "notification_type": "marketing_campaign",
            "recipients": {"user_ids": [user]},
            "params": {
                "headline": "Sale",
                "offer": "Everything -20%",
                "cta_url": "https://x.test/sale",
            },  # fmt: skip
        }
    )
    suppressed = client.wait_for(campaign, "push", {"SUPPRESSED"}, timeout=120)
    assert "opt_out" in (suppressed["status_reason"] or ""), suppressed
    otp = client.send(otp_body(f"loss-otp-{uuid.uuid4().hex[:10]}", user))
    sent = client.wait_for(otp, "sms", REACHED, timeout=60)
    assert accepted_count(client, sent["provider"], phone) == 1, sent
