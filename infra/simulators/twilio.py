"""SMS provider A: the Twilio Programmable Messaging API with signed status callbacks.

- `POST /2010-04-01/Accounts/{AccountSid}/Messages.json` (Basic auth AccountSid:AuthToken, form:
  To, From | MessagingServiceSid, Body, StatusCallback, ValidityPeriod) → 201 message resource.
- `GET .../Messages.json?To=...` and `GET .../Messages/{Sid}.json`: look up accepted messages
  (reconciliation of an unknown outcome before a resend).
- Status callbacks (form POST to StatusCallback, else `--callback-url`): `sent` then the final
  status from `receipts.outcomes` ("delivered", "undelivered:30003", "failed:30008", ...), each
  signed with `X-Twilio-Signature`, delayed/duplicated/reordered per the receipt config.
Error kinds: Twilio error codes ("21211", "21610", "20429", ...) and "500"/"503".
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any
from urllib.parse import urlencode

from pydantic import Field

from infra.simulators.config import SimConfig
from infra.simulators.keys import random_hex
from infra.simulators.receipts import CallbackPoster, plan, sign_twilio
from infra.simulators.server import HANG, Request, Response, Simulator, _Hang, json_response

__all__ = ["ERRORS", "TwilioConfig", "TwilioSimulator"]

API = "2010-04-01"
# code → (HTTP status, message)
ERRORS: dict[str, tuple[int, str]] = {
    "20003": (401, "Authenticate"),
    "20429": (429, "Too Many Requests"),
    "21211": (400, "The 'To' number is not a valid phone number."),
    "21408": (400, "Permission to send an SMS has not been enabled for the region."),
    "21602": (400, "Message body is required."),
    "21603": (400, "A 'From' phone number is required."),
    "21604": (400, "A 'To' phone number is required."),
    "21610": (400, "Attempt to send to unsubscribed recipient"),
    "21614": (400, "'To' number is not a valid mobile number"),
    "21617": (400, "The concatenated message body exceeds the 1600 character limit."),
    "500": (500, "An internal server error has occurred"),
    "503": (503, "Service unavailable"),
}
_E164 = re.compile(r"^\+[1-9]\d{6,14}$")
_MESSAGES = re.compile(rf"^/{API}/Accounts/([^/]+)/Messages(?:/([^/]+))?\.json$")


class TwilioConfig(SimConfig):
    """Twilio simulator config (sid/token generated when empty)."""

    account_sid: str = ""
    auth_token: str = ""
    keep_messages: int = Field(default=100_000, ge=0, description="messages kept for GET lookups")


def _error(code: str, retry_after: float | None = None) -> Response:
    status, message = ERRORS[code]
    body = {
        "code": int(code) if status < 500 else 20000 + status,
        "message": message,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    headers = [("retry-after", str(int(retry_after)))] if retry_after is not None else []
    return json_response(status, body, headers)


class TwilioSimulator(Simulator):
    """Twilio Messages API (SMS provider A)."""

    name = "sms_a"
    config_model = TwilioConfig
    error_kinds = frozenset(ERRORS)
    config: TwilioConfig

    def __init__(self, config: SimConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert isinstance(self.config, TwilioConfig)
        update: dict[str, str] = {}
        if not self.config.account_sid:
            update["account_sid"] = "AC" + random_hex(16)
        if not self.config.auth_token:
            update["auth_token"] = random_hex(16)
        self.config = self.config.model_copy(update=update)
        self.poster = CallbackPoster(self.stats)
        self._messages: dict[str, dict[str, Any]] = {}

    def credentials(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "account_sid": self.config.account_sid,
            "auth_token": self.config.auth_token,
        }

    async def startup(self) -> None:
        await self.poster.start()

    async def shutdown(self) -> None:
        await self.poster.close()

    def _authorized(self, req: Request, sid: str) -> bool:
        value = req.header("authorization") or ""
        if not value.lower().startswith("basic "):
            return False
        try:
            user, _, password = base64.b64decode(value[6:]).decode().partition(":")
        except ValueError:
            return False
        cfg = self.config
        return user == sid == cfg.account_sid and password == cfg.auth_token

    def _validate(self, form: dict[str, str]) -> str | None:
        to = form.get("To", "")
        if not to:
            return "21604"
        if not _E164.match(to):
            return "21211"
        if not (form.get("From") or form.get("MessagingServiceSid")):
            return "21603"
        if not form.get("Body"):
            return "21602"
        if len(form["Body"]) > 1600:
            return "21617"
        if to in self.faults.invalid:
            return "21211"
        if to in self.faults.unregistered:
            return "21610"
        return None

    async def handle(self, req: Request) -> Response | _Hang:
        match = _MESSAGES.match(req.path)
        if match is None:
            return json_response(404, {"code": 20404, "message": "Not found", "status": 404})
        faults, stats = self.faults, self.stats
        await faults.delay()
        if not self._authorized(req, match.group(1)):
            stats.error("20003")
            return _error("20003")
        if req.method == "GET":
            return self._lookup(match.group(2), req.query_params())
        if faults.lose():  # lost before the provider took it: no record, no answer
            stats.lost += 1
            return HANG
        form = req.form()
        code = self._validate(form)
        if code is None:
            retry_after = faults.throttle()
            if retry_after is not None:
                stats.rate_limited += 1
                stats.error("20429", form.get("To"))
                return _error("20429", retry_after)
            code = faults.pick_error()
        if code is not None:
            stats.error(code, form.get("To"))
            retry = self.config.retry_after_s if code in ("20429", "503") else None
            return _error(code, retry)
        resource = self._create(form)
        token = req.header("i-twilio-idempotency-token")  # Herald sends its delivery_id
        stats.accept(form["To"], resource["sid"], token, self.config.record_ids)
        self._receipts(resource, form.get("StatusCallback") or self.callback_url)
        if faults.hang():
            return HANG
        return json_response(201, resource)

    def _create(self, form: dict[str, str]) -> dict[str, Any]:
        sid = "SM" + uuid.uuid4().hex
        now = format_datetime(datetime.now(UTC), usegmt=True)
        body = form["Body"]
        resource = {
            "sid": sid,
            "account_sid": self.config.account_sid,
            "api_version": API,
            "to": form["To"],
            "from": form.get("From"),
            "messaging_service_sid": form.get("MessagingServiceSid"),
            "body": body,
            "status": "accepted" if form.get("MessagingServiceSid") else "queued",
            "num_segments": str(max(1, -(-len(body) // 153)) if len(body) > 160 else 1),
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "price": None,
            "price_unit": "USD",
            "date_created": now,
            "date_updated": now,
            "date_sent": None,
            "uri": f"/{API}/Accounts/{self.config.account_sid}/Messages/{sid}.json",
        }
        if self.config.record_ids and len(self._messages) < self.config.keep_messages:
            self._messages[sid] = resource
        return resource

    def _lookup(self, sid: str | None, query: dict[str, str]) -> Response:
        if sid is not None:
            found = self._messages.get(sid)
            if found is None:
                return json_response(404, {"code": 20404, "message": "Not found", "status": 404})
            return json_response(200, found)
        to = query.get("To")
        items = [m for m in self._messages.values() if to is None or m["to"] == to]
        return json_response(200, {"messages": items[-50:], "page": 0, "page_size": 50})

    def _receipts(self, resource: dict[str, Any], url: str | None) -> None:
        cfg = self.config.receipts
        if not cfg.enabled or not url:
            return
        final, _, code = self.faults.choose(cfg.outcomes).partition(":")
        steps = [final] if final == "failed" else ["sent", final]
        for delay, status in plan(steps, cfg, self.faults, self.stats):
            params = {
                "MessageSid": resource["sid"],
                "SmsSid": resource["sid"],
                "MessageStatus": status,
                "SmsStatus": status,
                "AccountSid": self.config.account_sid,
                "From": resource["from"] or "",
                "To": resource["to"],
                "ApiVersion": API,
            }
            if status in ("undelivered", "failed") and code:
                params["ErrorCode"] = code
            if status in ("delivered", "undelivered"):
                params["RawDlrDoneDate"] = time.strftime("%y%m%d%H%M", time.gmtime())
            headers = {
                "content-type": "application/x-www-form-urlencoded",
                "x-twilio-signature": sign_twilio(self.config.auth_token, url, params),
                # Same token for a repeated status, as on Twilio's own webhook retries.
                "i-twilio-idempotency-token": hashlib.sha1(
                    f"{resource['sid']}:{status}".encode()
                ).hexdigest(),
            }
            self.poster.later(delay, url, urlencode(params).encode(), headers, cfg.retries,
                              message=resource["sid"])  # fmt: skip
