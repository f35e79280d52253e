"""Twilio Programmable Messaging client (SMS provider A): form POST, Basic auth.

Twilio has no idempotency key on message creation; `I-Twilio-Idempotency-Token` is sent with the
delivery id anyway (honoured or ignored, harmless). An unknown outcome is reconciled before any
resend: `lookup` lists the recent messages to the number and looks for the same body (an OTP's
code makes it unique; two identical bodies to one number would read as sent).

Outcome map (PROVIDERS.md §6):
    201                                   Accepted(sid)
    21211, 21614, 21408 (and other 4xx)   Permanent
    21610 (unsubscribed), 30006           TokenDead
    429 / 20429                           RateLimited (Retry-After if present)
    20003 / 401 / 403                     PlatformError
    5xx; 30001, 30003, 30008              Retryable
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from herald.outcomes import (
    Accepted,
    Lookup,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
)
from sinks.providers.base import Delivery, ProviderClient, epoch_seconds, parse_retry_after
from sinks.providers.config import TwilioConfig

__all__ = ["TwilioClient"]

_TOKEN_DEAD = frozenset({21610, 30006})
_RETRYABLE = frozenset({30001, 30003, 30008})
_PLATFORM = frozenset({20003, 20005, 20008})


class TwilioClient(ProviderClient):
    """Creates one Message resource per delivery."""

    provider = "sms_a"

    def __init__(self, config: TwilioConfig) -> None:
        super().__init__(config)
        self.twilio = config
        self.path = f"/2010-04-01/Accounts/{config.account_sid}/Messages.json"
        self.http.auth = httpx.BasicAuth(config.account_sid, config.auth_token.get_secret_value())

    def _form(self, delivery: Delivery) -> dict[str, str]:
        cfg = self.twilio
        rendered: dict[str, Any] = delivery.get("rendered") or {}
        form = {"To": str(delivery.get("address")), "Body": str(rendered.get("body", ""))}
        if cfg.messaging_service_sid:
            form["MessagingServiceSid"] = cfg.messaging_service_sid
        elif cfg.from_number:
            form["From"] = cfg.from_number
        if cfg.status_callback_url:
            form["StatusCallback"] = cfg.status_callback_url
        expire = epoch_seconds(delivery.get("expire_at"))
        if expire is not None:
            form["ValidityPeriod"] = str(min(36000, max(1, int(expire - time.time()))))
        return form

    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        if not delivery.get("address"):
            return Permanent("missing_address", provider=self.provider)
        resp = await self.http.post(
            self.path,
            data=self._form(delivery),
            headers={"i-twilio-idempotency-token": str(delivery.get("delivery_id"))},
        )
        return self._map(resp, start)

    def _map(self, resp: httpx.Response, start: float) -> Outcome:
        status, p = resp.status_code, self.provider
        kw: dict[str, Any] = {"provider": p, "status_code": status, "latency_ms": self._ms(start)}
        if status in (200, 201):
            try:
                sid = str(orjson.loads(resp.content)["sid"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                sid = ""  # created all the same; only the sid for receipts is missing
            return Accepted(sid, **kw)
        code = _code(resp)
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        reason = str(code) if code else f"http_{status}"
        if status == 429 or code == 20429:
            return RateLimited(retry_after, **kw)
        if code in _TOKEN_DEAD:
            return TokenDead(reason, **kw)
        if status in (401, 403) or code in _PLATFORM:
            return PlatformError(reason, **kw)
        if status >= 500 or code in _RETRYABLE:
            return Retryable(reason, retry_after, **kw)
        return Permanent(reason, **kw)

    lookups = True

    async def _lookup(self, delivery: Delivery) -> Lookup:
        form = self._form(delivery)
        for message in await self.find_messages(form["To"]):
            if message.get("body") == form["Body"]:
                return Lookup(True, str(message.get("sid") or ""))
        return Lookup(False)

    async def find_messages(self, to: str) -> list[dict[str, Any]]:
        """Recent messages to `to` (reconcile an Unknown outcome before resending)."""
        resp = await self.http.get(self.path, params={"To": to})
        resp.raise_for_status()
        messages: list[dict[str, Any]] = orjson.loads(resp.content).get("messages", [])
        return messages


def _code(resp: httpx.Response) -> int | None:
    try:
        return int(orjson.loads(resp.content)["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
