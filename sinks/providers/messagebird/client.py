"""MessageBird SMS API client (SMS provider C): JSON `POST /messages`, `Authorization: AccessKey`.

The request names Herald's delivery id as `reference` (it comes back in every status report)
and the report URL. Outcome map (errors come as `{"errors": [{"code", "description",
"parameter"}]}`):

    201                                          Accepted(message id)
    422 code 9 (no correct recipients)           TokenDead("invalid_number"): the number is unusable
    401 / code 2 (access key), 402 / code 25     PlatformError("mb_<code>"): pause this provider
    429                                          RateLimited (Retry-After if present)
    5xx; codes 98, 99 (internal)                 Retryable
    any other 4xx (code 10 parameter invalid,
    21 bad request, ...)                         Permanent("mb_<code>"): may fail over
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
    Unknown,
)
from sinks.providers.base import Delivery, ProviderClient, epoch_seconds, parse_retry_after
from sinks.providers.messagebird.config import MessageBirdConfig

__all__ = ["MessageBirdClient"]

_PLATFORM = frozenset({2, 25})  # the access key; the balance
_INTERNAL = frozenset({98, 99})


def _error_code(resp: httpx.Response) -> int | None:
    try:
        errors = orjson.loads(resp.content)["errors"]
        return int(errors[0]["code"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return None


class MessageBirdClient(ProviderClient):
    """Sends one SMS per call to `/messages`."""

    provider = "sms_c"

    def __init__(self, config: MessageBirdConfig) -> None:
        super().__init__(config)
        self.mb = config
        self._headers = {"Authorization": f"AccessKey {config.access_key.get_secret_value()}"}

    def _body(self, delivery: Delivery) -> dict[str, Any]:
        body: dict[str, Any] = {
            "originator": self.mb.originator,
            "recipients": [str(delivery.get("address") or "").lstrip("+")],
            "body": str((delivery.get("rendered") or {}).get("body", "")),
            "reference": str(delivery.get("delivery_id"))[:100],
        }
        if self.mb.report_url:
            body["reportUrl"] = self.mb.report_url
        expire = epoch_seconds(delivery.get("expire_at"))
        if expire is not None:
            body["validity"] = max(60, int(expire - time.time()))
        return body

    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        if not delivery.get("address"):
            return Permanent("missing_address", provider=self.provider)
        resp = await self.http.post("/messages", json=self._body(delivery), headers=self._headers)
        return self._map(resp, start)

    def _map(self, resp: httpx.Response, start: float) -> Outcome:
        status = resp.status_code
        kw: dict[str, Any] = {
            "provider": self.provider,
            "status_code": status,
            "latency_ms": self._ms(start),
        }
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status in (200, 201):
            try:
                return Accepted(str(orjson.loads(resp.content)["id"]), **kw)
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return Unknown("no_message_id", **kw)  # taken, but which message is it?
        if status == 429:
            return RateLimited(retry_after, **kw)
        code = _error_code(resp)
        reason = f"mb_{code}" if code is not None else f"http_{status}"
        if status >= 500 or code in _INTERNAL:
            return Retryable(reason, retry_after, **kw)
        if status in (401, 402) or code in _PLATFORM:
            return PlatformError(reason, **kw)
        if code == 9:
            return TokenDead("invalid_number", **kw)
        return Permanent(reason, **kw)
