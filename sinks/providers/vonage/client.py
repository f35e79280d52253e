"""Vonage SMS API client (SMS provider B): form POST, api_key/api_secret.

The API answers HTTP 200 for most failures; the per-part `status` decides (PROVIDERS.md §6):
    "0" for every part          Accepted(message-id of the first part; client-ref = delivery id)
    "1" throttled (or HTTP 429) RateLimited
    "5" internal; HTTP 5xx      Retryable
    "2" "3" "6" "12" "15"       Permanent
    "7" number barred           TokenDead
    "4" "8" "9" "11" "14"       PlatformError
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from herald.outcomes import (
    Accepted,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
)
from sinks.providers.base import Delivery, ProviderClient, epoch_seconds, parse_retry_after
from sinks.providers.config import VonageConfig

__all__ = ["VonageClient"]

_PERMANENT = frozenset({"2", "3", "6", "12", "15"})
_PLATFORM = frozenset({"4", "8", "9", "11", "14"})


def _is_gsm(text: str) -> bool:
    """Roughly: plain ASCII text can go as `type=text`; anything else as `unicode`."""
    return text.isascii()


class VonageClient(ProviderClient):
    """Sends one SMS per call to `/sms/json`."""

    provider = "sms_b"

    def __init__(self, config: VonageConfig) -> None:
        super().__init__(config)
        self.vonage = config

    def _form(self, delivery: Delivery) -> dict[str, str]:
        cfg = self.vonage
        text = str((delivery.get("rendered") or {}).get("body", ""))
        form = {
            "api_key": cfg.api_key,
            "api_secret": cfg.api_secret.get_secret_value(),
            "from": cfg.sender,
            "to": str(delivery.get("address") or "").lstrip("+"),
            "text": text,
            "type": "text" if _is_gsm(text) else "unicode",
            "client-ref": str(delivery.get("delivery_id"))[:100],
        }
        if cfg.callback_url:
            form["callback"] = cfg.callback_url
            form["status-report-req"] = "1"
        expire = epoch_seconds(delivery.get("expire_at"))
        if expire is not None:
            form["ttl"] = str(max(20_000, int((expire - time.time()) * 1000)))
        return form

    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        if not delivery.get("address"):
            return Permanent("missing_address", provider=self.provider)
        resp = await self.http.post("/sms/json", data=self._form(delivery))
        return self._map(resp, start)

    def _map(self, resp: httpx.Response, start: float) -> Outcome:
        status = resp.status_code
        kw: dict[str, Any] = {
            "provider": self.provider,
            "status_code": status,
            "latency_ms": self._ms(start),
        }
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 429:
            return RateLimited(retry_after, **kw)
        if status >= 500:
            return Retryable(f"http_{status}", retry_after, **kw)
        if status in (401, 403):
            return PlatformError(f"http_{status}", **kw)
        try:
            parts = orjson.loads(resp.content)["messages"]
            codes = [str(part["status"]) for part in parts]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return Permanent(f"http_{status}", **kw)
        bad = next((c for c in codes if c != "0"), None)
        if bad is None and codes:
            return Accepted(str(parts[0]["message-id"]), **kw)
        reason = f"status_{bad}"
        if bad == "1":
            return RateLimited(retry_after, **kw)
        if bad == "5":
            return Retryable(reason, retry_after, **kw)
        if bad == "7":
            return TokenDead(reason, **kw)
        if bad in _PLATFORM:
            return PlatformError(reason, **kw)
        return Permanent(reason, **kw)
