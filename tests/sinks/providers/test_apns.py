"""ApnsClient against the APNs simulator: HTTP/2 multiplexing, provider tokens, every outcome."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

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
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.providers import ApnsClient, ApnsConfig, ApnsTokenSigner, ProviderClient
from sinks.providers.apns.client import apns_id
from tests.sinks.providers.helpers import apns_config, delivery, send_one, send_with

TOKEN = "0f" * 32


def test_accepted_with_delivery_id_as_apns_id(apns: RunningSimulator) -> None:
    record = delivery(TOKEN, collapse_key="thread-1", expire_at=int(time.time() * 1000) + 60_000)
    outcome = send_one(lambda: ApnsClient(apns_config(apns)), record)
    assert isinstance(outcome, Accepted) and outcome.status_code == 200
    assert outcome.provider_msg_id == record["delivery_id"] == apns_id(record["delivery_id"])
    assert outcome.latency_ms > 0
    assert apns.stats()["accepted_ids"][TOKEN] == [[record["delivery_id"], "thread-1"]]
    assert apns_id("not-a-uuid") == apns_id("not-a-uuid") != apns_id("other")


def test_128_concurrent_streams_share_one_connection(apns: RunningSimulator) -> None:
    records = [delivery(f"{i:064x}") for i in range(128)]

    async def body(client: ProviderClient) -> list[Outcome]:
        return list(await asyncio.gather(*(client.send(r) for r in records)))

    outcomes = send_with(lambda: ApnsClient(apns_config(apns)), body)
    assert all(isinstance(o, Accepted) for o in outcomes)
    stats = apns.stats(ids=False)
    assert stats["accepted"] == 128 and stats["connections"] == 1


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("Unregistered", TokenDead),
        ("ExpiredToken", TokenDead),
        ("BadDeviceToken", TokenDead),
        ("DeviceTokenNotForTopic", TokenDead),
        ("TooManyRequests", RateLimited),
        ("InternalServerError", Retryable),
        ("ServiceUnavailable", Retryable),
        ("Shutdown", Retryable),
        ("IdleTimeout", Retryable),
        ("PayloadTooLarge", Permanent),
        ("BadTopic", Permanent),
        ("Forbidden", Permanent),
        ("BadPath", Permanent),
        ("InvalidProviderToken", PlatformError),
        ("BadCertificateEnvironment", PlatformError),
        ("TooManyProviderTokenUpdates", PlatformError),
    ],
)
def test_outcome_map(apns: RunningSimulator, reason: str, expected: type[Outcome]) -> None:
    apns.configure(errors={reason: 1.0})
    outcome = send_one(lambda: ApnsClient(apns_config(apns)), delivery(TOKEN))
    assert isinstance(outcome, expected), outcome
    if not isinstance(outcome, RateLimited):
        assert outcome.reason == reason  # type: ignore[union-attr]


def test_rate_limit_gives_retry_after(apns: RunningSimulator) -> None:
    apns.configure(rate_limit=1, rate_burst=1, retry_after_s=3)

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery(TOKEN)) for _ in range(3)]

    outcomes = send_with(lambda: ApnsClient(apns_config(apns)), body)
    limited = [o for o in outcomes if isinstance(o, RateLimited)]
    assert isinstance(outcomes[0], Accepted) and limited
    assert limited[0].retry_after is not None and limited[0].retry_after >= 1
    assert limited[0].status_code == 429


def test_expired_provider_token_is_refreshed_and_retried_once(apns: RunningSimulator) -> None:
    # a 2 s TTL: the first send must not take that long even on a loaded machine
    apns.configure(token_ttl_s=2, token_update_min_interval_s=0)
    cfg = apns_config(apns, token_refresh_s=3600, token_min_interval_s=0)

    async def body(client: ProviderClient) -> list[Outcome]:
        first = await client.send(delivery(TOKEN))
        await asyncio.sleep(2.2)  # the token's iat is now older than the simulator's 2 s TTL
        return [first, await client.send(delivery(TOKEN))]

    client = ApnsClient(cfg)
    outcomes = send_with(lambda: client, body)
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert client.signer.minted == 2
    assert apns.stats()["errors"] == {"ExpiredProviderToken": 1}


def test_expired_token_that_may_not_be_refreshed_is_platform_error(
    apns: RunningSimulator,
) -> None:
    apns.configure(token_ttl_s=0)  # every token is already expired
    cfg = apns_config(apns, token_refresh_s=3600, token_min_interval_s=1200)
    outcome = send_one(lambda: ApnsClient(cfg), delivery(TOKEN))
    assert isinstance(outcome, PlatformError) and outcome.reason == "ExpiredProviderToken"


def test_token_signer_refresh_schedule() -> None:
    from infra.simulators.keys import ec_private_pem

    now = [1_000_000.0]
    signer = ApnsTokenSigner(
        "TEAM",
        "KEY",
        ec_private_pem().decode(),
        refresh_s=2400,
        min_interval_s=1200,
        clock=lambda: now[0],
    )
    first = signer.current()
    now[0] += 60
    assert signer.refresh_after_expired(first) is None  # never twice within 20 min
    now[0] += 2339
    assert signer.current() == first  # reused until refresh_s (40 min)
    now[0] += 1
    second = signer.current()
    assert second != first and signer.minted == 2
    now[0] += 60
    assert signer.refresh_after_expired(second) is None
    assert signer.refresh_after_expired(first) == second  # someone else already refreshed
    now[0] += 1200
    third = signer.refresh_after_expired(second)
    assert third not in (None, first, second) and signer.minted == 3
    with pytest.raises(ValueError):
        ApnsConfig(token_refresh_s=600, token_min_interval_s=1200)


def test_timeout_after_accept_is_unknown(apns: RunningSimulator) -> None:
    apns.configure(timeout_after_accept=1.0)
    outcome = send_one(lambda: ApnsClient(apns_config(apns, timeout_s=0.5)), delivery(TOKEN))
    assert isinstance(outcome, Unknown) and outcome.reason == "timeout"
    assert apns.stats()["accepted"] == 1  # the provider did take it: the unknown case


def test_connection_reset_after_send_is_unknown(tmp_path: Path) -> None:
    sim = start_simulator("apns", tmp_path / "apns", config={"timeout_after_accept": 1.0})

    async def body(client: ProviderClient) -> Outcome:
        task = asyncio.create_task(client.send(delivery(TOKEN)))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(sim.stop)  # the server dies with the stream open
        return await task

    try:
        outcome = send_with(lambda: ApnsClient(apns_config(sim, timeout_s=10)), body)
    finally:
        sim.stop()
    assert isinstance(outcome, Unknown) and outcome.reason != "timeout"


def test_connect_error_is_retryable_before_send(apns: RunningSimulator) -> None:
    cfg = apns_config(apns).model_copy(update={"base_url": f"https://127.0.0.1:{free_port()}"})
    outcome = send_one(lambda: ApnsClient(cfg), delivery(TOKEN))
    assert isinstance(outcome, Retryable) and outcome.before_send
    assert outcome.status_code is None


def test_missing_address_is_permanent(apns: RunningSimulator) -> None:
    outcome = send_one(lambda: ApnsClient(apns_config(apns)), delivery(None))
    assert isinstance(outcome, Permanent) and outcome.reason == "missing_address"
    assert str(uuid.UUID(apns_id(str(uuid.uuid4()))))
