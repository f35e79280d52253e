"""SMS provider C: a MessageBird-style SMS API with signed status reports.

- `POST /messages` (JSON: originator, recipients, body, reference, reportUrl, validity;
  `Authorization: AccessKey <key>`) → 201 `{"id", "reference", "recipients": {"items": [...]}}`;
  errors are `{"errors": [{"code", "description", "parameter"}]}`: 401 code 2 (access key),
  422 code 9 (no correct recipients), 422 code 10 (parameter invalid), 402 code 25 (balance),
  500 code 99 (internal), 429 when throttled (Retry-After).
- Status reports (JSON, POST to `reportUrl`, else `--callback-url`): `sent`, then the final
  status from `receipts.outcomes` ("delivered", "delivery_failed:1", "expired", ...), signed:
  `MessageBird-Signature` = hex HMAC-SHA256 under the signing key of
  `MessageBird-Request-Timestamp` + "." + body.
Error kinds: "2", "9", "10", "25", "99", "500", "503".
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

from infra.simulators.config import SimConfig
from infra.simulators.keys import random_hex
from infra.simulators.receipts import CallbackPoster, plan
from infra.simulators.server import HANG, Request, Response, Simulator, _Hang, json_response

__all__ = ["MessageBirdConfig", "MessageBirdSimulator"]

# error kind -> (HTTP status, error code, description)
ERRORS: dict[str, tuple[int, int, str]] = {
    "2": (401, 2, "Request not allowed (incorrect access_key)"),
    "9": (422, 9, "no (correct) recipients found"),
    "10": (422, 10, "originator is invalid"),
    "25": (402, 25, "Not enough balance"),
    "99": (500, 99, "Internal error"),
}
_HTTP_ERRORS = {"500": 500, "503": 503}
_MSISDN = re.compile(r"^[1-9]\d{6,14}$")


class MessageBirdConfig(SimConfig):
    """MessageBird simulator config (credentials generated when empty)."""

    access_key: str = ""
    signing_key: str = ""
    mccmnc: str = "20408"


def _errors(status: int, code: int, text: str, parameter: str | None = None) -> Response:
    return json_response(
        status, {"errors": [{"code": code, "description": text, "parameter": parameter}]}
    )


def _sign(key: str, timestamp: str, body: bytes) -> str:
    return hmac.new(key.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class MessageBirdSimulator(Simulator):
    """MessageBird-style SMS API (SMS provider C)."""

    name = "sms_c"
    config_model = MessageBirdConfig
    error_kinds = frozenset(ERRORS) | frozenset(_HTTP_ERRORS)
    config: MessageBirdConfig

    def __init__(self, config: SimConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert isinstance(self.config, MessageBirdConfig)
        update = {
            f: random_hex(16) for f in ("access_key", "signing_key") if not getattr(self.config, f)
        }
        self.config = self.config.model_copy(update=update)
        self.poster = CallbackPoster(self.stats)

    def credentials(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "access_key": self.config.access_key,
            "signing_key": self.config.signing_key,
        }

    async def startup(self) -> None:
        await self.poster.start()

    async def shutdown(self) -> None:
        await self.poster.close()

    def _check(self, req: Request, p: dict[str, Any]) -> tuple[int, int, str, str | None] | None:
        if req.header("authorization") != f"AccessKey {self.config.access_key}":
            return (*ERRORS["2"], "access_key")
        recipients = p.get("recipients")
        if not p.get("originator") or not p.get("body") or not isinstance(recipients, list):
            return 422, 9, "no (correct) recipients found", "recipients"
        to = str(recipients[0]) if recipients else ""
        if not _MSISDN.match(to) or to in self.faults.invalid or "+" + to in self.faults.invalid:
            return 422, 9, "no (correct) recipients found", "recipients"
        return None

    async def handle(self, req: Request) -> Response | _Hang:
        if req.path != "/messages" or req.method != "POST":
            return json_response(404, {"errors": [{"code": 20, "description": "not found"}]})
        faults, stats = self.faults, self.stats
        await faults.delay()
        if faults.lose():  # lost before the provider took it: no record, no answer
            stats.lost += 1
            return HANG
        try:
            p = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            p = None
        if not isinstance(p, dict):
            return _errors(422, 21, "Bad request (the body is not a JSON object)")
        to = str((p.get("recipients") or [""])[0])
        bad = self._check(req, p)
        if bad is not None:
            stats.error(str(bad[1]), to)
            return _errors(*bad)
        retry_after = faults.throttle()
        if retry_after is not None:
            stats.rate_limited += 1
            stats.error("429", to)
            return json_response(429, {"errors": [{"code": 429, "description": "Too many"}]},
                                 [("retry-after", str(int(retry_after)))])  # fmt: skip
        kind = faults.pick_error()
        if kind in _HTTP_ERRORS:
            stats.error(kind, to)
            return json_response(_HTTP_ERRORS[kind], {"message": "gateway error"})  # not the API
        if kind is not None:
            stats.error(kind, to)
            return _errors(*ERRORS[kind])
        msg_id = uuid.uuid4().hex
        reference = str(p.get("reference") or "") or None
        stats.accept(to, msg_id, reference, self.config.record_ids)
        url = p.get("reportUrl") or self.callback_url
        if url:
            self._reports(msg_id, to, reference, str(url))
        if faults.hang():
            return HANG
        now = datetime.now(UTC).isoformat(timespec="seconds")
        return json_response(201, {
            "id": msg_id, "href": f"{self.base_url}/messages/{msg_id}", "direction": "mt",
            "type": "sms", "originator": p["originator"], "reference": reference,
            "createdDatetime": now,
            "recipients": {"totalCount": 1, "totalSentCount": 1, "items": [
                {"recipient": int(to), "status": "sent", "statusDatetime": now}]},
        })  # fmt: skip

    def _reports(self, msg_id: str, to: str, reference: str | None, url: str) -> None:
        cfg = self.config.receipts
        if not cfg.enabled:
            return
        final, _, code = self.faults.choose(cfg.outcomes).partition(":")
        for delay, status in plan(["sent", final], cfg, self.faults, self.stats):
            report = {
                "id": msg_id, "reference": reference, "recipient": int(to), "status": status,
                "statusReason": "successfully delivered" if status == "delivered" else status,
                "statusErrorCode": int(code) if code and status == final else None,
                "statusDatetime": datetime.now(UTC).isoformat(timespec="seconds"),
                "mccmnc": self.config.mccmnc,
            }  # fmt: skip
            body = orjson.dumps(report)
            stamp = str(int(time.time()))
            headers = {
                "content-type": "application/json",
                "messagebird-request-timestamp": stamp,
                "messagebird-signature": _sign(self.config.signing_key, stamp, body),
            }
            self.poster.later(delay, url, body, headers, cfg.retries, message=msg_id)
