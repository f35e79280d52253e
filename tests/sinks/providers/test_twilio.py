"""TwilioClient (SMS provider A) against the Twilio-shaped simulator."""

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
from infra.process import free_port
from infra.simulators.launcher import RunningSimulator
from infra.simulators.recorder import CallbackRecorder
from sinks.providers import ProviderClient, TwilioClient
from sinks.providers.twilio.signature import verify_twilio
from tests.sinks.providers.helpers import delivery, send_one, send_with, twilio_config

PHONE = "+447700900301"


def test_accepted_and_signed_status_callbacks(
    sms_a: RunningSimulator, recorder: CallbackRecorder
) -> None:
    sms_a.configure(receipts={"delay": {"ms": 10}, "step_ms": 40})
    url = recorder.url("/v1/callbacks/sms_a")
    outcome = send_one(
        lambda: TwilioClient(twilio_config(sms_a, status_callback_url=url)),
        delivery(PHONE, channel="sms"),
    )
    assert isinstance(outcome, Accepted) and outcome.status_code == 201
    assert outcome.provider_msg_id.startswith("SM")
    got = recorder.wait_for(2)
    token = sms_a.credentials()["auth_token"]
    for r in got:
        assert r.form()["MessageSid"] == outcome.provider_msg_id
        assert verify_twilio(url, r.form(), r.headers["x-twilio-signature"], token)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("21211", Permanent),
        ("21614", Permanent),
        ("21408", Permanent),
        ("21610", TokenDead),
        ("20429", RateLimited),
        ("500", Retryable),
        ("503", Retryable),
        ("20003", PlatformError),
    ],
)
def test_outcome_map(sms_a: RunningSimulator, code: str, expected: type[Outcome]) -> None:
    sms_a.configure(errors={code: 1.0})
    outcome = send_one(lambda: TwilioClient(twilio_config(sms_a)), delivery(PHONE))
    assert isinstance(outcome, expected), outcome


def test_invalid_unsubscribed_and_bad_credentials(sms_a: RunningSimulator) -> None:
    sms_a.configure(invalid=["+447700900398"], unregistered=["+447700900399"])

    async def body(client: ProviderClient) -> list[Outcome]:
        return [
            await client.send(delivery("+447700900398")),
            await client.send(delivery("+447700900399")),
            await client.send(delivery("not-a-number")),
        ]

    invalid, stopped, garbage = send_with(lambda: TwilioClient(twilio_config(sms_a)), body)
    assert isinstance(invalid, Permanent) and invalid.reason == "21211"
    assert isinstance(stopped, TokenDead) and stopped.reason == "21610"
    assert isinstance(garbage, Permanent)
    wrong = send_one(lambda: TwilioClient(twilio_config(sms_a, auth_token="nope")), delivery(PHONE))
    assert isinstance(wrong, PlatformError) and wrong.status_code == 401


def test_rate_limit_gives_retry_after(sms_a: RunningSimulator) -> None:
    sms_a.configure(rate_limit=1, rate_burst=1)

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery(PHONE)) for _ in range(3)]

    outcomes = send_with(lambda: TwilioClient(twilio_config(sms_a)), body)
    limited = [o for o in outcomes if isinstance(o, RateLimited)]
    assert limited and limited[0].retry_after is not None and limited[0].retry_after >= 1


def test_timeout_after_accept_is_unknown_and_reconcilable(sms_a: RunningSimulator) -> None:
    sms_a.configure(timeout_after_accept=1.0, receipts={"enabled": False})
    record = delivery("+447700900355")

    async def body(client: ProviderClient) -> tuple[Outcome, list[dict[str, object]]]:
        outcome = await client.send(record)
        assert isinstance(client, TwilioClient)
        return outcome, await client.find_messages("+447700900355")

    outcome, found = send_with(lambda: TwilioClient(twilio_config(sms_a, timeout_s=0.5)), body)
    assert isinstance(outcome, Unknown)
    assert len(found) == 1 and found[0]["to"] == "+447700900355"


def test_connect_error_is_retryable_before_send(sms_a: RunningSimulator) -> None:
    cfg = twilio_config(sms_a).model_copy(update={"base_url": f"http://127.0.0.1:{free_port()}"})
    outcome = send_one(lambda: TwilioClient(cfg), delivery(PHONE))
    assert isinstance(outcome, Retryable) and outcome.before_send
