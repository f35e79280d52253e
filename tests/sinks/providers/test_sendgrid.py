"""SendGridClient (email) against the SendGrid-shaped simulator."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from herald.config import LinksSettings
from herald.links import verify
from herald.outcomes import (
    Accepted,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    Unknown,
)
from infra.simulators.launcher import RunningSimulator
from infra.simulators.recorder import CallbackRecorder
from sinks.providers import ProviderClient, SendGridClient
from sinks.providers.sendgrid.signature import verify_sendgrid
from tests.sinks.providers.helpers import delivery, send_one, send_with, sendgrid_config

EMAIL = "user@example.com"


def test_accepted_and_events_carry_the_delivery_id(
    email: RunningSimulator, recorder: CallbackRecorder
) -> None:
    email.configure(
        unregistered=["gone@example.com"],
        receipts={"delay": {"ms": 10}, "step_ms": 20, "batch_ms": 30},
    )
    ok, gone = delivery(EMAIL, channel="email"), delivery("gone@example.com", channel="email")

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(ok), await client.send(gone)]

    outcomes = send_with(lambda: SendGridClient(sendgrid_config(email)), body)
    assert all(isinstance(o, Accepted) and o.status_code == 202 for o in outcomes)
    events: list[dict[str, str]] = []
    while len(events) < 4:
        recorder.wait_for(len(recorder.requests) + 1)
        events = [e for r in recorder.requests for e in r.json()]
    key = email.credentials()["webhook_public_key"]
    for r in recorder.requests:
        assert verify_sendgrid(
            key,
            r.headers["x-twilio-email-event-webhook-signature"],
            r.headers["x-twilio-email-event-webhook-timestamp"],
            r.body,
        )
    final = {e["delivery_id"]: e["event"] for e in events if e["event"] != "processed"}
    assert final == {ok["delivery_id"]: "delivered", gone["delivery_id"]: "bounce"}
    first = outcomes[0]
    assert isinstance(first, Accepted)
    assert all(
        e["sg_message_id"].startswith(first.provider_msg_id)
        for e in events
        if e["delivery_id"] == ok["delivery_id"]
    )


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("400", Permanent),
        ("413", Permanent),
        ("401", PlatformError),
        ("403", PlatformError),
        ("500", Retryable),
        ("503", Retryable),
    ],
)
def test_outcome_map(email: RunningSimulator, code: str, expected: type[Outcome]) -> None:
    email.configure(errors={code: 1.0})
    outcome = send_one(lambda: SendGridClient(sendgrid_config(email)), delivery(EMAIL))
    assert isinstance(outcome, expected) and outcome.status_code == int(code)


def test_invalid_address_and_bad_key(email: RunningSimulator) -> None:
    bad = send_one(lambda: SendGridClient(sendgrid_config(email)), delivery("not-an-email"))
    assert isinstance(bad, Permanent) and bad.reason == "http_400:personalizations.0.to.0.email"
    wrong = send_one(
        lambda: SendGridClient(sendgrid_config(email, api_key="SG.x")), delivery(EMAIL)
    )
    assert isinstance(wrong, PlatformError) and wrong.status_code == 401


def test_rate_limit_gives_retry_after(email: RunningSimulator) -> None:
    email.configure(rate_limit=1, rate_burst=1, retry_after_s=2)

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery(EMAIL)) for _ in range(3)]

    outcomes = send_with(lambda: SendGridClient(sendgrid_config(email)), body)
    limited = [o for o in outcomes if isinstance(o, RateLimited)]
    assert limited and limited[0].retry_after is not None and limited[0].retry_after >= 1


def test_timeout_after_accept_is_unknown(email: RunningSimulator) -> None:
    email.configure(timeout_after_accept=1.0)
    outcome = send_one(
        lambda: SendGridClient(sendgrid_config(email, timeout_s=0.5)), delivery(EMAIL)
    )
    assert isinstance(outcome, Unknown)


def test_marketing_mail_carries_a_one_click_unsubscribe(email: RunningSimulator) -> None:
    """RFC 8058: List-Unsubscribe (the signed URL) and List-Unsubscribe-Post headers, and the
    same URL in the body; transactional mail has neither."""
    links = LinksSettings(base_url="https://notify.example", secret=SecretStr("s3cret"))
    promo = delivery("promo@example.com", channel="email", category="marketing", user_id="u-7")
    reset = delivery("reset@example.com", channel="email", user_id="u-7")

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(promo), await client.send(reset)]

    outcomes = send_with(lambda: SendGridClient(sendgrid_config(email), links), body)
    assert all(isinstance(o, Accepted) for o in outcomes)
    messages = email.stats()["messages"]
    headers = messages["promo@example.com"]["headers"]
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = headers["List-Unsubscribe"].removeprefix("<").removesuffix(">")
    token = url.removeprefix("https://notify.example/v1/unsubscribe/")
    assert verify(b"s3cret", "u", token) == {"u": "u-7", "k": "marketing:email"}
    assert all(url in part["value"] for part in messages["promo@example.com"]["content"])
    assert messages["reset@example.com"]["headers"] == {}
    assert "unsubscribe" not in str(messages["reset@example.com"]["content"]).lower()


def test_links_are_tracked_and_an_open_pixel_ends_the_html(email: RunningSimulator) -> None:
    links = LinksSettings(base_url="https://notify.example", secret=SecretStr("s3cret"))
    page = '<p>Your order <a href="https://shop.example/o?id=42&amp;x=1">is here</a>.</p>'
    rendered = {"title": "Shipped", "body": page, "subject": "Shipped", "data": {}}
    mail = delivery("track@example.com", channel="email", rendered=rendered)
    outcome = send_one(lambda: SendGridClient(sendgrid_config(email), links), mail)
    assert isinstance(outcome, Accepted)
    plain, html_part = email.stats()["messages"]["track@example.com"]["content"]
    assert plain == {"type": "text/plain", "value": "Your order is here."}
    value = html_part["value"]
    assert "shop.example" not in value  # the link goes through the redirect
    click = value.split('href="')[1].split('"')[0]
    token = click.removeprefix("https://notify.example/t/c/")
    claims = verify(b"s3cret", "c", token)
    assert claims["l"] == "https://shop.example/o?id=42&x=1"
    assert claims["d"] == mail["delivery_id"] and claims["u"] == mail["user_id"]
    pixel = value.split('<img src="')[1].split('"')[0]
    assert pixel.startswith("https://notify.example/t/o/") and pixel.endswith(".gif")
    opened = verify(b"s3cret", "o", pixel.removeprefix("https://notify.example/t/o/")[:-4])
    assert opened["d"] == mail["delivery_id"]
