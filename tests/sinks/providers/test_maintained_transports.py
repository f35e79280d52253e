"""The provider clients on the maintained HTTP clients of `HttpConfig.transport` (pyreqwest,
aiohttp under httpx), against the simulators: the same outcomes as on Herald's own transports
(bench/transports.py compares their speed); `auto` takes aiohttp for HTTP/1.1."""

from __future__ import annotations

import pytest

from herald.outcomes import Accepted, Outcome, Permanent
from infra.simulators.launcher import RunningSimulator
from sinks.providers import ApnsClient, ProviderClient, SendGridClient
from tests.sinks.providers.helpers import apns_config, delivery, send_with, sendgrid_config


@pytest.mark.parametrize("transport", ["pyreqwest", "aiohttp"])
def test_email_outcomes_on_a_maintained_client(email: RunningSimulator, transport: str) -> None:
    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery("user@example.com", channel="email")),
                await client.send(delivery("not-an-email", channel="email"))]  # fmt: skip

    accepted, bad = send_with(
        lambda: SendGridClient(sendgrid_config(email, transport=transport)), body
    )
    assert isinstance(accepted, Accepted) and accepted.provider_msg_id
    assert isinstance(bad, Permanent) and bad.reason == "http_400:personalizations.0.to.0.email"


def test_apns_over_http2_on_pyreqwest(apns: RunningSimulator) -> None:
    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery("a" * 64)) for _ in range(3)]

    outcomes = send_with(lambda: ApnsClient(apns_config(apns, transport="pyreqwest")), body)
    assert all(isinstance(o, Accepted) for o in outcomes), outcomes
    apns.configure(errors={"BadTopic": 1.0})
    bad = send_with(
        lambda: ApnsClient(apns_config(apns, transport="pyreqwest")),
        lambda client: client.send(delivery("a" * 64)),
    )
    assert isinstance(bad, Permanent) and bad.reason == "BadTopic"


def test_aiohttp_refuses_an_http2_provider(apns: RunningSimulator) -> None:
    with pytest.raises(ValueError, match="HTTP/1.1 only"):
        ApnsClient(apns_config(apns, transport="aiohttp"))


def test_herald_s_own_transport_refuses_an_http11_provider(email: RunningSimulator) -> None:
    """Herald's own transport is HTTP/2 only (its HTTP/1.1 one gave way to aiohttp)."""
    with pytest.raises(ValueError, match="HTTP/2 transport and this provider speaks HTTP/1.1"):
        SendGridClient(sendgrid_config(email, transport="lean"))
