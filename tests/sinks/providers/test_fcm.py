"""FcmClient against the FCM simulator: google-auth OAuth via the simulated token endpoint."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from functools import partial
from pathlib import Path

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
    TokenDead,
    Unknown,
)
from infra.simulators.keys import rsa_private_pem
from infra.simulators.launcher import RunningSimulator
from sinks.providers import FcmClient, FcmConfig, ProviderClient
from tests.sinks.providers.helpers import delivery, fcm_config, send_one, send_with


def test_oauth_token_from_simulated_endpoint_is_reused(
    fcm: RunningSimulator, tmp_path: Path
) -> None:
    # The account file names Google's real token_uri; the config points it at the simulator.
    info = json.loads(Path(fcm.credentials()["service_account_path"]).read_text())
    info["token_uri"] = "https://oauth2.googleapis.com/token"
    account = tmp_path / "sa.json"
    account.write_text(json.dumps(info))
    cfg = FcmConfig(
        base_url=fcm.base_url,
        service_account_file=account,
        token_uri=fcm.credentials()["token_uri"],
    )

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery(f"token-{i}", data={"k": "v"})) for i in range(5)]

    outcomes = send_with(lambda: FcmClient(cfg), body)
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert str(outcomes[0].provider_msg_id).startswith("0:")  # type: ignore[union-attr]
    stats = fcm.stats()
    assert stats["token_requests"] == 1 and stats["accepted"] == 5
    refs = {ids[0][1] for ids in stats["accepted_ids"].values()}
    assert len(refs) == 5  # delivery_id travels in data


@pytest.mark.parametrize(
    ("code", "expected", "retry_after"),
    [
        ("UNREGISTERED", TokenDead, None),
        ("SENDER_ID_MISMATCH", TokenDead, None),
        ("INVALID_ARGUMENT", Permanent, None),
        ("QUOTA_EXCEEDED", RateLimited, 1.0),
        ("UNAVAILABLE", Retryable, 1.0),
        ("INTERNAL", Retryable, None),
        ("THIRD_PARTY_AUTH_ERROR", PlatformError, None),
    ],
)
def test_outcome_map(
    fcm: RunningSimulator, code: str, expected: type[Outcome], retry_after: float | None
) -> None:
    fcm.configure(errors={code: 1.0})
    outcome = send_one(lambda: FcmClient(fcm_config(fcm)), delivery("tok"))
    assert isinstance(outcome, expected), outcome
    assert getattr(outcome, "retry_after", None) == retry_after


def test_dead_and_invalid_registration_tokens(fcm: RunningSimulator) -> None:
    fcm.configure(unregistered=["gone"], invalid=["junk"])

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery("gone")), await client.send(delivery("junk"))]

    gone, junk = send_with(lambda: FcmClient(fcm_config(fcm)), body)
    assert isinstance(gone, TokenDead) and gone.reason == "UNREGISTERED"
    assert gone.status_code == 404
    assert isinstance(junk, TokenDead) and junk.reason == "invalid_registration_token"


def test_rate_limit_honours_retry_after(fcm: RunningSimulator) -> None:
    fcm.configure(rate_limit=1, rate_burst=1, retry_after_s=5)

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(delivery("tok")) for _ in range(3)]

    outcomes = send_with(lambda: FcmClient(fcm_config(fcm)), body)
    limited = [o for o in outcomes if isinstance(o, RateLimited)]
    assert limited and limited[0].retry_after is not None and limited[0].retry_after >= 1


def test_rejected_access_token_is_refreshed_once(fcm: RunningSimulator) -> None:
    client = FcmClient(fcm_config(fcm))
    client.credentials.token = "ya29.revoked"
    client.credentials.expiry = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(hours=1)
    outcome = send_one(lambda: client, delivery("tok"))
    assert isinstance(outcome, Accepted)
    assert fcm.stats()["errors"] == {"UNAUTHENTICATED": 1}


def test_oauth_refusal_and_wrong_project_are_platform_errors(
    fcm: RunningSimulator, tmp_path: Path
) -> None:
    info = json.loads(Path(fcm.credentials()["service_account_path"]).read_text())
    info["private_key"] = rsa_private_pem().decode()  # not the key the "Google" side knows
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(info))
    refused = send_one(
        lambda: FcmClient(fcm_config(fcm, service_account_file=forged)), delivery("tok")
    )
    assert isinstance(refused, PlatformError) and refused.reason == "oauth_refresh_failed"
    wrong = send_one(lambda: FcmClient(fcm_config(fcm, project_id="other")), delivery("tok"))
    assert isinstance(wrong, PlatformError) and wrong.status_code == 403


def test_timeout_after_accept_is_unknown(fcm: RunningSimulator) -> None:
    fcm.configure(timeout_after_accept=1.0)
    outcome = send_one(lambda: FcmClient(fcm_config(fcm, timeout_s=0.5)), delivery("tok"))
    assert isinstance(outcome, Unknown)
    assert fcm.stats()["accepted"] == 1


def test_message_shape(fcm: RunningSimulator) -> None:
    client = FcmClient(fcm_config(fcm))
    record = delivery(
        "tok",
        collapse_key="c-1",
        expire_at=int((time.time() + 600) * 1000),
        rendered={"title": "T", "body": "B", "subject": None, "data": {"n": "1"}},
    )
    message = client._message(record)["message"]
    assert message["token"] == "tok" and message["notification"] == {"title": "T", "body": "B"}
    assert message["data"] == {"n": "1", "delivery_id": record["delivery_id"]}
    assert message["android"]["collapse_key"] == "c-1"
    assert message["android"]["priority"] == "HIGH"
    assert 590 <= int(message["android"]["ttl"].rstrip("s")) <= 600
    assert message["apns"]["headers"]["apns-collapse-id"] == "c-1"
    assert message["android"]["notification"] == {"tag": "c-1"}


def test_collapse_key_tags_the_android_notification(fcm: RunningSimulator) -> None:
    """Same collapse key → the simulated device replaces the shown notification (same tag)."""
    token = f"tok-{time.time_ns()}"
    records = [delivery(token, collapse_key=k) for k in ("score", "score", "news")]

    async def body(client: ProviderClient) -> list[Outcome]:
        return [await client.send(r) for r in records]

    outcomes = send_with(lambda: FcmClient(fcm_config(fcm)), body)
    assert all(isinstance(o, Accepted) for o in outcomes)
    stats = fcm.stats(ids=False)
    assert stats["android_tagged"] == 3
    assert stats["android_tag_replaced"] == 1


@pytest.mark.parametrize("transport", ["lean", "httpcore"])
def test_both_http2_transports_send(fcm: RunningSimulator, transport: str) -> None:
    """The lean HTTP/2 transport (default) and httpx's own give the same outcomes."""
    records = [delivery(f"tok-{i}") for i in range(64)]

    async def body(client: ProviderClient) -> list[Outcome]:
        return list(await asyncio.gather(*(client.send(r) for r in records)))

    client = FcmClient(fcm_config(fcm, transport=transport))
    assert (client._h2 is not None) == (transport == "lean")  # noqa: SLF001
    outcomes = send_with(lambda: client, body)
    assert all(isinstance(o, Accepted) and o.provider_msg_id for o in outcomes)
    assert len({o.provider_msg_id for o in outcomes if isinstance(o, Accepted)}) == 64


def test_a_base_url_path_is_kept_by_both_transports(fcm: RunningSimulator) -> None:
    """A base_url with a path (a proxy in front of FCM) is merged as httpx merges it: the
    simulator serves no such path, and both transports get the same answer for it."""

    def client(transport: str) -> FcmClient:
        config = fcm_config(fcm, transport=transport)
        return FcmClient(config.model_copy(update={"base_url": f"{fcm.base_url}/proxy/"}))

    outcomes = [send_one(partial(client, t), delivery("tok-1")) for t in ("lean", "httpcore")]
    lean, httpcore = ((type(o), getattr(o, "reason", None), o.status_code) for o in outcomes)
    assert lean == httpcore == (PlatformError, "NOT_FOUND", 404)


def test_the_push_carries_its_signed_opened_url(fcm: RunningSimulator) -> None:
    links = LinksSettings(base_url="https://notify.example", secret=SecretStr("s3cret"))
    record = delivery("tok", user_id="u-9")
    message = FcmClient(fcm_config(fcm), links=links)._message(record)["message"]
    url = message["data"]["herald_opened"]
    claims = verify(b"s3cret", "p", url.removeprefix("https://notify.example/t/p/"))
    assert (claims["d"], claims["u"]) == (record["delivery_id"], "u-9")
    assert "herald_opened" not in FcmClient(fcm_config(fcm))._message(record)["message"]["data"]
