"""Deliveries and client configs for the provider-client tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from herald.outcomes import Outcome
from infra.simulators.launcher import RunningSimulator
from sinks.providers import (
    ApnsConfig,
    FcmConfig,
    ProviderClient,
    SendGridConfig,
    TwilioConfig,
    VonageConfig,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion (tests are synchronous)."""
    return asyncio.run(coro)


def delivery(address: str | None, channel: str = "push", **overrides: Any) -> dict[str, Any]:
    """A Delivery record shaped like schemas/delivery.avsc."""
    record: dict[str, Any] = {
        "delivery_id": str(uuid.uuid4()),
        "notification_id": "n-1",
        "request_id": "r-1",
        "tenant_id": "t-1",
        "user_id": "u-1",
        "notification_type": "otp",
        "category": "transactional",
        "traffic_class": "transactional",
        "channel": channel,
        "provider": None,
        "address": address,
        "platform": None,
        "rendered": {"title": "Hello", "body": "Your code is 123456", "subject": "Hi", "data": {}},
        "locale": "en",
        "template_version": 1,
        "collapse_key": None,
        "attempt": 0,
        "not_before": None,
        "next_attempt_at": None,
        "expire_at": None,
        "first_attempt_at": None,
        "fallback": [],
        "created_at": 0,
    }
    record.update(overrides)
    return record


def send_one(make: Callable[[], ProviderClient], record: dict[str, Any]) -> Outcome:
    """Create a client, send one delivery, close the client."""

    async def go() -> Outcome:
        async with make() as client:
            return await client.send(record)

    return run(go())


def send_with(
    make: Callable[[], ProviderClient], body: Callable[[ProviderClient], Awaitable[T]]
) -> T:
    """Create a client, run `body(client)`, close the client."""

    async def go() -> T:
        async with make() as client:
            return await body(client)

    return run(go())


def apns_config(sim: RunningSimulator, **kw: Any) -> ApnsConfig:
    c = sim.credentials()
    return ApnsConfig(
        base_url=sim.base_url,
        ca_path=sim.ca_path,
        team_id=c["team_id"],
        key_id=c["key_id"],
        auth_key_path=Path(c["auth_key_path"]),
        topic="com.herald.app",
        **kw,
    )


def fcm_config(sim: RunningSimulator, **kw: Any) -> FcmConfig:
    c = sim.credentials()
    kw.setdefault("token_uri", c["token_uri"])
    kw.setdefault("service_account_file", Path(c["service_account_path"]))
    return FcmConfig(base_url=sim.base_url, **kw)


def twilio_config(sim: RunningSimulator, **kw: Any) -> TwilioConfig:
    c = sim.credentials()
    kw.setdefault("auth_token", c["auth_token"])
    return TwilioConfig(
        base_url=sim.base_url, account_sid=c["account_sid"], from_number="+15005550006", **kw
    )


def vonage_config(sim: RunningSimulator, **kw: Any) -> VonageConfig:
    c = sim.credentials()
    kw.setdefault("api_secret", c["api_secret"])
    return VonageConfig(base_url=sim.base_url, api_key=c["api_key"], **kw)


def sendgrid_config(sim: RunningSimulator, **kw: Any) -> SendGridConfig:
    c = sim.credentials()
    kw.setdefault("api_key", c["api_key"])
    return SendGridConfig(base_url=sim.base_url, from_email="noreply@herald.dev", **kw)
