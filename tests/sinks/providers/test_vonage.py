"""VonageClient (SMS provider B) against the Vonage-shaped simulator."""

from __future__ import annotations

import pytest

from herald.outcomes import (
    Accepted,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
    Unknown,
)
from infra.simulators.launcher import RunningSimulator
from infra.simulators.recorder import CallbackRecorder
from sinks.providers import ProviderClient, VonageClient
from sinks.providers.vonage.signature import verify_vonage
from tests.sinks.providers.helpers import delivery, send_one, send_with, vonage_config

PHONE = "+447700900401"


def test_accepted_with_client_ref_and_signed_dlrs(
    sms_b: RunningSimulator, recorder: CallbackRecorder
) -> None:
    sms_b.configure(receipts={"delay": {"ms": 10}, "step_ms": 40})
    url = recorder.url("/v1/callbacks/sms_b")
    record = delivery(PHONE, channel="sms")
    outcome = send_one(lambda: VonageClient(vonage_config(sms_b, callback_url=url)), record)
    assert isinstance(outcome, Accepted) and outcome.status_code == 200
    assert sms_b.stats()["accepted_ids"][PHONE[1:]] == [
        [outcome.provider_msg_id, record["delivery_id"]]
    ]
    secret = sms_b.credentials()["signature_secret"]
    dlrs = [r.form() for r in recorder.wait_for(2)]
    # two callbacks 40 ms apart: on a busy machine they may arrive in either order (the
    # receipts fold orders them by status, herald/delivery_fold.py)
    assert sorted(d["status"] for d in dlrs) == ["accepted", "delivered"]
    assert all(verify_vonage(d, secret) and d["client-ref"] == record["delivery_id"] for d in dlrs)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("1", RateLimited),
        ("5", Retryable),
        ("2", Permanent),
        ("3", Permanent),
        ("6", Permanent),
        ("12", Permanent),
        ("15", Permanent),
        ("7", TokenDead),
        ("4", PlatformError),
        ("8", PlatformError),
        ("9", PlatformError),
        ("14", PlatformError),
        ("500", Retryable),
        ("503", Retryable),
    ],
)
def test_outcome_map(sms_b: RunningSimulator, status: str, expected: type[Outcome]) -> None:
    sms_b.configure(errors={status: 1.0})
    outcome = send_one(lambda: VonageClient(vonage_config(sms_b)), delivery(PHONE))
    assert isinstance(outcome, expected), outcome


def test_invalid_barred_and_bad_credentials(sms_b: RunningSimulator) -> None:
    sms_b.configure(invalid=["447700900498"], unregistered=["447700900499"])

    async def body(client: ProviderClient) -> list[Outcome]:
        return [
            await client.send(delivery("+447700900498")),
            await client.send(delivery("+447700900499")),
        ]

    invalid, barred = send_with(lambda: VonageClient(vonage_config(sms_b)), body)
    assert isinstance(invalid, Permanent) and invalid.reason == "status_3"
    assert isinstance(barred, TokenDead) and barred.reason == "status_7"
    wrong = send_one(lambda: VonageClient(vonage_config(sms_b, api_secret="x")), delivery(PHONE))
    assert isinstance(wrong, PlatformError) and wrong.reason == "status_4"


@pytest.mark.parametrize(("style", "retry_after"), [("status", None), ("http429", 1.0)])
def test_rate_limit_styles(sms_b: RunningSimulator, style: str, retry_after: float | None) -> None:
    sms_b.configure(rate_limit=1, rate_burst=1, throttle_style=style)

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery(PHONE)) for _ in range(3)]

    outcomes = send_with(lambda: VonageClient(vonage_config(sms_b)), body)
    limited = [o for o in outcomes if isinstance(o, RateLimited)]
    assert limited and limited[0].retry_after == retry_after


def test_timeout_after_accept_is_unknown(sms_b: RunningSimulator) -> None:
    sms_b.configure(timeout_after_accept=1.0)
    outcome = send_one(lambda: VonageClient(vonage_config(sms_b, timeout_s=0.5)), delivery(PHONE))
    assert isinstance(outcome, Unknown)
