"""SMS provider B: the Vonage (Nexmo) SMS API with signed delivery receipts.

- `POST /sms/json` (form or JSON: api_key, api_secret, from, to, text, client-ref, callback,
  status-report-req, ttl, type) → HTTP 200 `{"message-count", "messages": [...]}`, one entry per
  part, `status` "0" = queued; failures carry their status code and `error-text` (HTTP 200 too).
- DLRs per part (POST to `callback`, else `--callback-url`; form or JSON per `dlr_format`):
  `accepted` then the final status from `receipts.outcomes` ("delivered:0", "failed:3",
  "expired:2", "rejected:4", ...), signed with the signature secret (`sig` + `timestamp`).
Error kinds: Vonage status codes "1".."15" and "500"/"503" (HTTP errors).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal
from urllib.parse import urlencode

import orjson
from pydantic import Field

from infra.simulators.config import SimConfig
from infra.simulators.keys import random_hex
from infra.simulators.receipts import CallbackPoster, plan, sign_vonage
from infra.simulators.server import HANG, Request, Response, Simulator, _Hang, json_response

__all__ = ["STATUS_TEXT", "VonageConfig", "VonageSimulator"]

STATUS_TEXT: dict[str, str] = {
    "1": "Throughput Rate Exceeded - please wait [ 1 ] and retry",
    "2": "Missing params",
    "3": "Invalid params",
    "4": "Bad Credentials",
    "5": "Internal Error",
    "6": "Invalid Message",
    "7": "Number barred",
    "8": "Partner account barred",
    "9": "Partner quota exceeded",
    "11": "Account not enabled for HTTP",
    "12": "Message too long",
    "14": "Invalid Signature",
    "15": "Invalid Sender Address",
}
_HTTP_ERRORS = {"500": 500, "503": 503}
_MSISDN = re.compile(r"^\+?[1-9]\d{6,14}$")


class VonageConfig(SimConfig):
    """Vonage simulator config (credentials generated when empty)."""

    api_key: str = ""
    api_secret: str = ""
    signature_secret: str = ""
    signature_method: Literal["md5hash", "md5", "sha1", "sha256", "sha512"] = "sha256"
    dlr_format: Literal["form", "json"] = "form"
    throttle_style: Literal["status", "http429"] = Field(
        default="status",
        description="rate limit as status 1 (documented) or HTTP 429 + Retry-After",
    )
    network: str = "23410"


def _reply(to: str, status: str, text: str | None = None) -> Response:
    entry = {"status": status, "to": to}
    if text is not None:
        entry["error-text"] = text
    return json_response(200, {"message-count": "1", "messages": [entry]})


class VonageSimulator(Simulator):
    """Vonage SMS API (SMS provider B)."""

    name = "sms_b"
    config_model = VonageConfig
    error_kinds = frozenset(STATUS_TEXT) | frozenset(_HTTP_ERRORS)
    config: VonageConfig

    def __init__(self, config: SimConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert isinstance(self.config, VonageConfig)
        update: dict[str, str] = {}
        for field, size in (("api_key", 4), ("api_secret", 8), ("signature_secret", 16)):
            if not getattr(self.config, field):
                update[field] = random_hex(size)
        self.config = self.config.model_copy(update=update)
        self.poster = CallbackPoster(self.stats)

    def credentials(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "base_url": self.base_url,
            "api_key": cfg.api_key,
            "api_secret": cfg.api_secret,
            "signature_secret": cfg.signature_secret,
            "signature_method": cfg.signature_method,
        }

    async def startup(self) -> None:
        await self.poster.start()

    async def shutdown(self) -> None:
        await self.poster.close()

    def _params(self, req: Request) -> dict[str, str]:
        if (req.header("content-type") or "").startswith("application/json"):
            try:
                data = orjson.loads(req.body)
            except orjson.JSONDecodeError:
                return {}
            return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        return req.form()

    def _validate(self, p: dict[str, str]) -> str | None:
        cfg = self.config
        if p.get("api_key") != cfg.api_key or p.get("api_secret") != cfg.api_secret:
            return "4"
        if not p.get("from") or not p.get("to") or not p.get("text"):
            return "2"
        if not _MSISDN.match(p["to"]):
            return "3"
        if len(p["text"]) > 1600:
            return "12"
        to = p["to"].lstrip("+")
        if to in self.faults.invalid or "+" + to in self.faults.invalid:
            return "3"
        if to in self.faults.unregistered or "+" + to in self.faults.unregistered:
            return "7"
        return None

    async def handle(self, req: Request) -> Response | _Hang:
        if req.path != "/sms/json" or req.method != "POST":
            return json_response(404, {"error": "not found"})
        faults, stats = self.faults, self.stats
        await faults.delay()
        if faults.lose():  # lost before the provider took it: no record, no answer
            self.stats.lost += 1
            return HANG
        p = self._params(req)
        to = p.get("to", "").lstrip("+")
        status = self._validate(p)
        if status is None:
            retry_after = faults.throttle()
            if retry_after is not None:
                stats.rate_limited += 1
                stats.error("1", to)
                if self.config.throttle_style == "http429":
                    return json_response(429, {}, [("retry-after", str(int(retry_after)))])
                return _reply(to, "1", STATUS_TEXT["1"])
            status = faults.pick_error()
        if status in _HTTP_ERRORS:
            stats.error(status, to)
            code = _HTTP_ERRORS[status]
            return json_response(code, {"type": "about:blank", "title": "Server error"})
        if status is not None:
            stats.error(status, to)
            return _reply(to, status, STATUS_TEXT[status])
        parts = 1 if len(p["text"]) <= 160 else -(-len(p["text"]) // 153)
        messages = [
            {
                "to": to,
                "message-id": str(uuid.uuid4()),
                "status": "0",
                "remaining-balance": "100.00000000",
                "message-price": "0.03330000",
                "network": self.config.network,
            }
            for _ in range(parts)
        ]
        if p.get("client-ref"):
            for m in messages:
                m["client-ref"] = p["client-ref"]
        stats.accept(to, messages[0]["message-id"], p.get("client-ref"), self.config.record_ids)
        url = p.get("callback") or self.callback_url
        if p.get("status-report-req", "1") not in ("0", "false") and url:
            for m in messages:
                self._receipts(m, p, url)
        if faults.hang():
            return HANG
        return json_response(200, {"message-count": str(parts), "messages": messages})

    def _receipts(self, message: dict[str, str], p: dict[str, str], url: str) -> None:
        cfg = self.config.receipts
        if not cfg.enabled:
            return
        final, _, err = self.faults.choose(cfg.outcomes).partition(":")
        for delay, status in plan(["accepted", final], cfg, self.faults, self.stats):
            now = time.gmtime()
            dlr = {
                "msisdn": message["to"],
                "to": p["from"],
                "network-code": self.config.network,
                "messageId": message["message-id"],
                "price": message["message-price"],
                "status": status,
                "err-code": (err or "0") if status == final else "0",
                "scts": time.strftime("%y%m%d%H%M", now),
                "message-timestamp": time.strftime("%Y-%m-%d %H:%M:%S", now),
                "api-key": self.config.api_key,
                "timestamp": str(int(time.time())),
            }
            if p.get("client-ref"):
                dlr["client-ref"] = p["client-ref"]
            dlr["sig"] = sign_vonage(
                self.config.signature_secret, dlr, self.config.signature_method
            )
            if self.config.dlr_format == "json":
                body, ctype = orjson.dumps(dlr), "application/json"
            else:
                body, ctype = urlencode(dlr).encode(), "application/x-www-form-urlencoded"
            self.poster.later(delay, url, body, {"content-type": ctype}, cfg.retries,
                              message=message["message-id"])  # fmt: skip
