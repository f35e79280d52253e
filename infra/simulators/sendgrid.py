"""Email provider: the SendGrid v3 Mail Send API with a signed Event Webhook.

- `POST /v3/mail/send` (Bearer API key, JSON personalizations/from/subject/content) → 202 with
  an empty body and `X-Message-Id`; errors `{"errors": [{"message", "field", "help"}]}`; 429 with
  `X-RateLimit-Limit/-Remaining/-Reset` (and Retry-After).
- Event Webhook: per recipient `processed`, then the final event from `receipts.outcomes`
  ("delivered", "bounce", "dropped", "deferred", "blocked", "spamreport", ...), batched into JSON
  arrays every `receipts.batch_ms`, signed with ECDSA P-256 over timestamp + body
  (`X-Twilio-Email-Event-Webhook-Signature` / `-Timestamp`); duplicates keep their
  `sg_event_id`. Custom args come back as top-level event fields.
- The last accepted message per address (its `headers`, e.g. RFC 8058's `List-Unsubscribe`,
  and `content`) shows under "messages" in `GET /_admin/stats` while ids are recorded.
- `GET /v3/user/webhooks/event/settings/signed` → `{"enabled": true, "public_key": ...}`.
- Email Activity: `GET /v3/messages?query=unique_args['delivery_id']="<id>"&limit=N` →
  `{"messages": [{"msg_id", "to_email", "subject", "status", "last_event_time", ...}]}` for the
  messages accepted with that custom arg (the last 100,000 kept); other queries → 400.
Error kinds: "400", "401", "403", "413", "429", "500", "503".
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import time
from typing import Any

import orjson
from cryptography.hazmat.primitives import serialization
from pydantic import Field

from infra.simulators.config import SimConfig
from infra.simulators.keys import ec_private_pem, random_hex
from infra.simulators.receipts import CallbackPoster, plan, sign_sendgrid
from infra.simulators.server import HANG, Request, Response, Simulator, _Hang, json_response

__all__ = ["SendGridConfig", "SendGridSimulator"]

ERROR_TEXT: dict[str, str] = {
    "400": "Bad Request",
    "401": "The provided authorization grant is invalid, expired, or revoked",
    "403": "access forbidden",
    "413": "Payload Too Large",
    "429": "too many requests",
    "500": "internal server error",
    "503": "service unavailable",
}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_MAX_BYTES = 30 * 1024 * 1024
_SIGNED = "/v3/user/webhooks/event/settings/signed"
_ACTIVITY_QUERY = re.compile(r"unique_args\['delivery_id'\]\s*=\s*\"([^\"]+)\"")
ACTIVITY_KEPT = 100_000  # deliveries whose messages Email Activity answers for


class SendGridConfig(SimConfig):
    """SendGrid simulator config (API key and webhook signing key generated when empty)."""

    api_key: str = ""
    webhook_private_key_pem: str = Field(default="", description="P-256 PKCS#8 PEM")


def _errors(status: int, message: str, field: str | None = None) -> Response:
    return json_response(status, {"errors": [{"message": message, "field": field, "help": None}]})


class SendGridSimulator(Simulator):
    """SendGrid v3 Mail Send + Event Webhook."""

    name = "email"
    config_model = SendGridConfig
    error_kinds = frozenset(ERROR_TEXT)
    config: SendGridConfig

    def __init__(self, config: SimConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert isinstance(self.config, SendGridConfig)
        update: dict[str, str] = {}
        if not self.config.api_key:
            update["api_key"] = f"SG.{secrets.token_urlsafe(16)}.{secrets.token_urlsafe(32)}"
        if not self.config.webhook_private_key_pem:
            update["webhook_private_key_pem"] = ec_private_pem().decode()
        self.config = self.config.model_copy(update=update)
        self.poster = CallbackPoster(self.stats)
        self._pending: list[tuple[float, dict[str, Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._event_ids: dict[tuple[str, str], str] = {}
        self._activity: dict[str, list[dict[str, Any]]] = {}  # delivery_id -> messages
        self.on_config(self.config)

    def on_config(self, config: SimConfig) -> None:
        assert isinstance(config, SendGridConfig)
        self._private = config.webhook_private_key_pem.encode()
        key = serialization.load_pem_private_key(self._private, password=None)
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.public_key_b64 = base64.b64encode(der).decode()

    def credentials(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "api_key": self.config.api_key,
            "webhook_public_key": self.public_key_b64,
        }

    async def startup(self) -> None:
        await self.poster.start()
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def shutdown(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        await self.poster.close()

    # -- mail/send ------------------------------------------------------------------------

    def _authorized(self, req: Request) -> bool:
        return req.header("authorization") == f"Bearer {self.config.api_key}"

    def _validate(self, body: bytes) -> tuple[dict[str, Any], list[str]] | Response:
        """(request, recipient emails) or a 400/413 response."""
        if len(body) > _MAX_BYTES:
            return _errors(413, ERROR_TEXT["413"])
        try:
            mail = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _errors(400, "Bad Request", None)
        if not isinstance(mail, dict):
            return _errors(400, "Bad Request", None)
        people = mail.get("personalizations")
        if not isinstance(people, list) or not people:
            return _errors(400, "The personalizations field is required.", "personalizations")
        emails: list[str] = []
        for i, person in enumerate(people):
            for j, to in enumerate((person or {}).get("to") or []):
                email = (to or {}).get("email", "")
                if not _EMAIL.match(str(email)):
                    field = f"personalizations.{i}.to.{j}.email"
                    return _errors(400, "Does not contain a valid address.", field)
                emails.append(email)
        if not emails:
            return _errors(400, "The to array is required.", "personalizations.0.to")
        if not _EMAIL.match(str((mail.get("from") or {}).get("email", ""))):
            return _errors(400, "The from email does not contain a valid address.", "from.email")
        if not mail.get("subject") and not all(p.get("subject") for p in people):
            return _errors(400, "The subject is required.", "subject")
        if not mail.get("content") and not mail.get("template_id"):
            return _errors(400, "The content value must be a string.", "content")
        return mail, emails

    async def handle(self, req: Request) -> Response | _Hang:
        if req.path == _SIGNED and req.method == "GET":
            if not self._authorized(req):
                return _errors(401, ERROR_TEXT["401"])
            return json_response(200, {"enabled": True, "public_key": self.public_key_b64})
        if req.path == "/v3/messages" and req.method == "GET":
            if not self._authorized(req):
                return _errors(401, ERROR_TEXT["401"])
            return self._messages(req.query_params())
        if req.path != "/v3/mail/send" or req.method != "POST":
            return _errors(404, "not found")
        faults, stats = self.faults, self.stats
        await faults.delay()
        if not self._authorized(req):
            stats.error("401")
            return _errors(401, ERROR_TEXT["401"])
        if faults.lose():  # lost before the provider took it: no record, no answer
            stats.lost += 1
            return HANG
        checked = self._validate(req.body)
        if isinstance(checked, Response):
            stats.error(str(checked.status))
            return checked
        mail, emails = checked
        retry_after = faults.throttle()
        if retry_after is not None:
            stats.rate_limited += 1
            stats.error("429")
            reset = str(int(time.time() + retry_after))
            resp = _errors(429, ERROR_TEXT["429"])
            resp.headers += [
                ("x-ratelimit-limit", str(int(self.config.rate_limit or 0))),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", reset),
                ("retry-after", str(int(retry_after))),
            ]
            return resp
        code = faults.pick_error()
        if code is not None:
            stats.error(code)
            return _errors(int(code), ERROR_TEXT[code])
        msg_id = secrets.token_urlsafe(16)[:22]
        for person in mail["personalizations"]:
            args = {**(mail.get("custom_args") or {}), **(person.get("custom_args") or {})}
            for to in person.get("to") or []:
                stats.accept(to["email"], msg_id, args.get("delivery_id"), self.config.record_ids)
                self._remember(msg_id, to["email"], args.get("delivery_id"), mail)
                if self.config.record_ids:
                    headers = {**(mail.get("headers") or {}), **(person.get("headers") or {})}
                    content = mail.get("content") or []
                    stats.messages[to["email"]] = {"headers": headers, "content": content}
                self._events(msg_id, to["email"], args, mail.get("categories"))
        if faults.hang():
            return HANG
        return Response(202, b"", [("x-message-id", msg_id)])

    # -- email activity -------------------------------------------------------------------

    def _remember(self, msg_id: str, email: str, delivery_id: Any, mail: dict[str, Any]) -> None:
        if not isinstance(delivery_id, str):
            return
        if len(self._activity) >= ACTIVITY_KEPT:
            self._activity.pop(next(iter(self._activity)))
        self._activity.setdefault(delivery_id, []).append({
            "msg_id": msg_id, "from_email": (mail.get("from") or {}).get("email"),
            "subject": mail.get("subject"), "to_email": email, "status": "processed",
            "opens_count": 0, "clicks_count": 0,
            "last_event_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })  # fmt: skip

    def _messages(self, query: dict[str, str]) -> Response:
        found = _ACTIVITY_QUERY.fullmatch(query.get("query", "").strip())
        if found is None:
            return _errors(400, "invalid query: only unique_args['delivery_id']=\"...\"", "query")
        limit = int(query.get("limit", "10")) if query.get("limit", "10").isdigit() else 10
        messages = self._activity.get(found.group(1), [])[:limit]
        return json_response(200, {"messages": messages})

    # -- event webhook --------------------------------------------------------------------

    def _events(self, msg_id: str, email: str, args: dict[str, Any], categories: Any) -> None:
        cfg = self.config.receipts
        if not cfg.enabled or not self.callback_url:
            return
        if email in self.faults.invalid:
            final = "dropped"
        elif email in self.faults.unregistered:
            final = "bounce"
        else:
            final = self.faults.choose(cfg.outcomes)
        now = time.monotonic()
        base = {
            "email": email,
            "sg_message_id": f"{msg_id}.recvd-{random_hex(6)}-1-0",
            "smtp-id": f"<{msg_id}@ismtpd0001p1herald.sendgrid.net>",
            **args,
        }
        if categories:
            base["category"] = categories
        for delay, event in plan(["processed", final], cfg, self.faults, self.stats):
            self._pending.append((now + delay, self._event(base, event)))

    def _event(self, base: dict[str, Any], event: str) -> dict[str, Any]:
        # One sg_event_id per (message, event): a duplicated event keeps its id.
        key = (base["sg_message_id"], event)
        ids = self._event_ids
        if key not in ids:
            if len(ids) > 200_000:
                ids.clear()
            ids[key] = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode()[:22]
        out = {**base, "event": event, "timestamp": int(time.time()), "sg_event_id": ids[key]}
        if event in ("bounce", "blocked"):
            out.update(
                event="bounce",
                type=event,
                status="5.1.1",
                reason="550 5.1.1 The email account that you tried to reach does not exist.",
            )
        elif event == "dropped":
            out["reason"] = "Invalid"
        elif event == "deferred":
            out.update(response="400 try again later", attempt="1")
        return out

    async def _flush_loop(self) -> None:
        while True:
            cfg = self.config.receipts
            await asyncio.sleep(cfg.batch_ms / 1000.0)
            if not self._pending or not self.callback_url:
                continue
            now = time.monotonic()
            due = sorted((p for p in self._pending if p[0] <= now), key=lambda p: p[0])
            self._pending = [p for p in self._pending if p[0] > now]
            events = [event for _, event in due]
            for i in range(0, len(events), cfg.batch_max):
                self._post_batch(events[i : i + cfg.batch_max], cfg.retries)

    def _post_batch(self, events: list[dict[str, Any]], retries: int) -> None:
        assert self.callback_url is not None
        body = orjson.dumps(events)
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            "x-twilio-email-event-webhook-signature": sign_sendgrid(self._private, timestamp, body),
            "x-twilio-email-event-webhook-timestamp": timestamp,
        }
        self.stats.callbacks["batches"] += 1
        self.poster.later(0.0, self.callback_url, body, headers, retries)
