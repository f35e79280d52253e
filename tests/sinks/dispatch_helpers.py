"""Shared pieces of the dispatch sink tests: deliveries, a Dispatcher on real services.

The dispatcher under test is the production one (sinks/dispatch/engine.py) with real Redis
(guard, shaper, breaker, contact copies), real provider simulator processes and the real
clients; only its Kafka output is read from the returned `Outputs` instead of a topic (the
sink's producing path is covered by tests/dataflows/test_dispatch.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import redis

from herald import keys
from herald.breaker import CircuitBreaker
from herald.catalog import load_catalog
from herald.config import PiiSettings
from herald.controls import DispatchControls
from herald.guard import SendGuard
from herald.shaping import RateShaper
from infra.simulators.launcher import RunningSimulator
from sinks.dispatch.clients import Factory, Providers
from sinks.dispatch.contacts import ContactStore
from sinks.dispatch.engine import Dispatcher, Hook
from sinks.dispatch.escalation import EscalationCheck
from sinks.dispatch.inbox import InboxClient
from sinks.dispatch.loop import LoopThread
from sinks.dispatch.sending import ShapedSender
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.work import Outputs
from sinks.providers import ApnsClient, FcmClient, SendGridClient, TwilioClient, VonageClient
from tests.sinks.providers.helpers import (
    apns_config,
    fcm_config,
    sendgrid_config,
    twilio_config,
    vonage_config,
)

CATALOG = load_catalog()


def now() -> datetime:
    return datetime.now(UTC)


def token(i: int | str) -> str:
    """A valid-looking APNs device token (64 hex)."""
    return uuid.uuid5(uuid.NAMESPACE_OID, str(i)).hex * 2


def delivery(channel: str = "push", **changes: Any) -> dict[str, Any]:
    """A ready Delivery record (schemas/delivery.avsc) with fresh ids."""
    did = str(uuid.uuid4())
    base: dict[str, Any] = {
        "delivery_id": did,
        "notification_id": str(uuid.uuid4()),
        "request_id": "r-1",
        "tenant_id": "acme",
        "user_id": f"u-{uuid.uuid4().hex[:8]}",
        "notification_type": "payment_result",
        "category": "transactional",
        "traffic_class": "transactional",
        "channel": channel,
        "provider": None,
        "address": None,
        "platform": None,
        "rendered": {"title": "Paid", "body": "Your payment went through", "subject": None,
                     "data": {}},
        "locale": "en",
        "template_version": 1,
        "collapse_key": None,
        "attempt": 0,
        "not_before": None,
        "next_attempt_at": None,
        "expire_at": now() + timedelta(hours=1),
        "first_attempt_at": None,
        "fallback": [],
        "created_at": now(),
    }  # fmt: skip
    if channel == "push":
        base.update(platform="apns", provider="apns", address=token(did))
    elif channel == "sms":
        base.update(address="+15005550006", notification_type="otp_login",
                    fallback=["sms:sms_b", "push"])  # fmt: skip
    elif channel == "email":
        base.update(address="someone@example.com", notification_type="order_shipped",
                    provider="email", traffic_class="normal")  # fmt: skip
    elif channel == "inapp":
        base.update(provider="inbox")
    base.update(changes)
    if base["channel"] == "inapp" and base["address"] is None:
        base["address"] = base["user_id"]
    return base


def factories(
    sims: Mapping[str, RunningSimulator], redis_url: str, **kw: Any
) -> dict[str, Factory]:
    """Client factories pointing at the given simulators (names as provider keys)."""
    out: dict[str, Factory] = {"inbox": lambda: InboxClient(redis_url)}
    makers: dict[str, Callable[[RunningSimulator], Any]] = {
        "apns": lambda s: ApnsClient(apns_config(s, **kw.get("apns", {}))),
        "fcm": lambda s: FcmClient(fcm_config(s, **kw.get("fcm", {}))),
        "sms_a": lambda s: TwilioClient(twilio_config(s, **kw.get("sms_a", {}))),
        "sms_b": lambda s: VonageClient(vonage_config(s, **kw.get("sms_b", {}))),
        "email": lambda s: SendGridClient(sendgrid_config(s, **kw.get("email", {}))),
    }
    for name, sim in sims.items():
        out[name] = (lambda make, s: lambda: make(s))(makers[name], sim)
    return out


def dispatch_settings(**changes: Any) -> DispatchSettings:
    """Dispatch settings with a unique Redis prefix and short timers."""
    base: dict[str, Any] = {
        "state_prefix": f"t{uuid.uuid4().hex[:8]}:",
        "pending_ttl_s": 20.0,
        "shape_max_wait_s": 2.0,
        "call_timeout_s": 5.0,
        "platform_pause_s": 2.0,
        "breaker": {"min_volume": 5, "cooldown_s": 1.0, "window_s": 10.0, "sync_interval_s": 0.05,
                    "flush_every": 1, "probes": 2},
    }  # fmt: skip
    base.update(changes)
    return DispatchSettings(**base)


class Harness:
    """A Dispatcher with its own loop thread; `run(deliveries)` returns the batch's Outputs."""

    def __init__(self, redis_url: str, fac: Mapping[str, Factory], cfg: DispatchSettings,
                 hook: Hook | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.redis = redis.Redis.from_url(redis_url)
        self.guard = SendGuard(self.redis, pending_ttl_s=cfg.pending_ttl_s, prefix=cfg.state_prefix)
        default, overrides = cfg.breaker_config()
        self.breaker = CircuitBreaker(self.redis, default, overrides=overrides,
                                      prefix=cfg.state_prefix)  # fmt: skip
        self.shaper = RateShaper(self.redis, cfg.provider_rates(), prefix=cfg.state_prefix)
        self.loop = LoopThread("test-dispatch")
        self.providers = Providers(self.loop, fac)
        sender = ShapedSender(self.providers, self.shaper, frozenset(cfg.rates),
                              max_wait_s=cfg.shape_max_wait_s, clock=now,
                              recheck_s=cfg.control_recheck_s)  # fmt: skip
        self.contacts = ContactStore(self.redis)
        self.controls = DispatchControls(self.redis, f"test-{uuid.uuid4().hex[:6]}",
                                         cfg.control_lease_s)  # fmt: skip
        self.dispatcher = Dispatcher(cfg, CATALOG, self.guard, self.breaker, sender,
                                     self.contacts, clock=now, hook=hook,
                                     pii_key=PiiSettings().key_bytes(),
                                     controls=self.controls,
                                     escalations=EscalationCheck(self.redis, CATALOG))  # fmt: skip

    def run(self, deliveries: list[dict[str, Any]]) -> Outputs:
        return self.dispatcher.dispatch([(None, d) for d in deliveries])

    def close(self) -> None:
        self.providers.close()
        self.loop.close()
        self.redis.close()


@contextmanager
def harness(redis_url: str, fac: Mapping[str, Factory], cfg: DispatchSettings | None = None,
            hook: Hook | None = None) -> Iterator[Harness]:  # fmt: skip
    h = Harness(redis_url, fac, cfg or dispatch_settings(), hook)
    try:
        yield h
    finally:
        h.close()


def states(out: Outputs, delivery_id: str | None = None) -> list[tuple[str, str | None]]:
    """(state, reason) of the batch's events, optionally of one delivery."""
    return [(e["state"], e["reason"]) for e in out.events
            if delivery_id is None or e["delivery_id"] == delivery_id]  # fmt: skip


def accepted_for(sim: RunningSimulator, address: str) -> int:
    """How many messages the simulator accepted for `address`."""
    return len(sim.stats()["accepted_ids"].get(address, []))


def put_prefs(client: redis.Redis, user: str, **changes: Any) -> None:
    """Write the API's copy of a user's preferences."""
    record = {
        "user_id": user, "global_opt_out": False, "category_opt_out": [], "channel_opt_out": [],
        "category_channel_opt_out": [], "quiet_hours": None, "timezone": None, "locale": None,
        "updated_at": 0, "version": 1, **changes,
    }  # fmt: skip
    client.set(keys.prefs(user), orjson.dumps(record))


def put_devices(client: redis.Redis, user: str, tokens: list[str]) -> None:
    """Write the API's copy of a user's contact points with these APNs tokens (the user's own:
    verified, so OTPs may fall back to them)."""
    devices = [{"device_id": f"dev-{t[:8]}", "platform": "apns", "token": t, "app_id": None,
                "registered_at": 0, "valid": True, "verified": True}
               for t in tokens]  # fmt: skip
    record = {"user_id": user, "devices": devices, "phone": None, "email": None,
              "updated_at": 0, "version": 3}  # fmt: skip
    client.set(keys.contact_points(user), orjson.dumps(record))
