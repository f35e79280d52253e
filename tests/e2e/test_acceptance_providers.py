"""The third SMS provider (sms_c, a MessageBird-style API, issue 24) on the whole stack: a
refusal by one SMS provider fails over to the other, in both directions.

The stack's catalog adds two types (tests/e2e/catalog_extra.toml): `e2e_code_from_sms_c` is sent
through sms_c with sms_a as its fallback, `e2e_code_to_sms_c` through sms_a with sms_c as its
fallback. Each provider refuses with its own permanent error code, injected in its simulator at
run time; the OTP goes in through the API and is followed to the other simulator and into
ClickHouse. The same paths at dispatch level: tests/sinks/test_messagebird.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from infra.stackclient import StackClient
from tests.e2e._helpers import REACHED, UserPool, accepted_count, wait_events
from tests.e2e._stack import E2EStack

SMS = ("sms_a", "sms_c")


@pytest.fixture
def sms(e2e: E2EStack) -> Iterator[StackClient]:
    """The stack's client with sms_a and sms_c reset before and restored after."""
    for name in SMS:
        e2e.client.sim(name).reset(config=True)
    yield e2e.client
    for name in SMS:
        e2e.client.sim(name).reset(config=True)


def _code(notification_type: str, user: str) -> dict[str, object]:
    return {
        "request_id": f"{notification_type}-{uuid.uuid4().hex[:8]}",
        "notification_type": notification_type,
        "recipients": {"user_ids": [user]},
        "params": {"code": "482913"},
    }


SENDS = ("SENDING", "RETRY_SCHEDULED", "PROVIDER_ACCEPTED")  # in an attempt's order


def _sends(client: StackClient, nid: str) -> list[tuple[str, str, int, str | None]]:
    """(state, provider, attempt, reason) of the notification's send events in ClickHouse, by
    attempt and state (two events of one millisecond have no order there), once one was
    accepted. Receipts that follow (DELIVERED) are left out."""
    found = wait_events(client, nid, "PROVIDER_ACCEPTED", timeout=60)
    sends = [
        (e["state"], e["provider"], e["attempt"], e["reason"]) for e in found
        if e["state"] in SENDS
    ]  # fmt: skip
    return sorted(sends, key=lambda s: (s[2], SENDS.index(s[0])))


@pytest.mark.parametrize(
    ("notification_type", "refuses", "error", "reason", "takes_over"),
    [
        ("e2e_code_from_sms_c", "sms_c", "10", "failover:rejected:mb_10", "sms_a"),
        ("e2e_code_to_sms_c", "sms_a", "21408", "failover:rejected:21408", "sms_c"),
    ],
    ids=["sms_c-to-sms_a", "sms_a-to-sms_c"],
)
def test_an_sms_provider_s_refusal_fails_over_to_the_other(
    sms: StackClient,
    pool: UserPool,
    notification_type: str,
    refuses: str,
    error: str,
    reason: str,
    takes_over: str,
) -> None:
    ((user, phone),) = pool.take(1).items()
    sms.sim(refuses).configure({"errors": {error: 1.0}})  # the provider's own refusal
    nid = sms.send(_code(notification_type, user))

    delivery = sms.wait_for(nid, "sms", REACHED, timeout=60)
    assert delivery["provider"] == takes_over, delivery
    assert _sends(sms, nid) == [
        ("SENDING", refuses, 1, None), ("RETRY_SCHEDULED", refuses, 1, reason),
        ("SENDING", takes_over, 2, None), ("PROVIDER_ACCEPTED", takes_over, 2, None),
    ]  # fmt: skip
    addresses = {"sms_a": phone, "sms_c": phone.lstrip("+")}  # how each simulator keys them
    assert accepted_count(sms, takes_over, addresses[takes_over]) == 1
    assert accepted_count(sms, refuses, addresses[refuses]) == 0
