"""FCM HTTP v1 client with service-account OAuth2 through google-auth.

google-auth signs the JWT-bearer assertion and exchanges it at the account's `token_uri`
(overridable: tests point it at the simulator); the access token is refreshed before expiry
(google-auth's refresh threshold) in a worker thread, one refresh at a time.

Outcome map (PROVIDERS.md §6):
    200                                        Accepted(message id)
    404 UNREGISTERED; 400 invalid registration token; 403 SENDER_ID_MISMATCH → TokenDead
    400 other INVALID_ARGUMENT                 Permanent
    429 QUOTA_EXCEEDED                         RateLimited (Retry-After)
    500 INTERNAL, 503 UNAVAILABLE              Retryable (Retry-After)
    401 (OAuth rejected: refreshed and retried once; THIRD_PARTY_AUTH_ERROR), 403 IAM,
    404 project not found, token endpoint refusal → PlatformError
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
import httpx
import orjson
from google.oauth2 import service_account

from herald.config import LinksSettings
from herald.outcomes import (
    Accepted,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
)
from sinks.providers.base import (
    Delivery,
    ProviderClient,
    epoch_seconds,
    opened_link,
    parse_retry_after,
)
from sinks.providers.config import FcmConfig
from sinks.providers.h2transport import H2Response

__all__ = ["FcmClient", "load_credentials"]

_BAD_TOKEN_HINTS = ("registration token", "message.token")


def load_credentials(config: FcmConfig) -> service_account.Credentials:
    """Service-account credentials from the configured JSON (token_uri override applied)."""
    if config.service_account_json is not None:
        info = json.loads(config.service_account_json.get_secret_value())
    elif config.service_account_file is not None:
        info = json.loads(config.service_account_file.read_text())
    else:
        raise ValueError("FCM needs service_account_json or service_account_file")
    if config.token_uri:
        info["token_uri"] = config.token_uri
    creds: service_account.Credentials = service_account.Credentials.from_service_account_info(
        info, scopes=config.scopes
    )
    return creds


class FcmClient(ProviderClient):
    """Sends one message per call to `projects/{id}/messages:send`."""

    provider = "fcm"

    def __init__(
        self,
        config: FcmConfig,
        credentials: service_account.Credentials | None = None,
        links: LinksSettings | None = None,
    ) -> None:
        super().__init__(config)
        self.fcm = config
        self._opened = opened_link(links)
        self.credentials = credentials or load_credentials(config)
        project = config.project_id or self.credentials.project_id
        if not project:
            raise ValueError("FCM project_id unknown")
        self.path = f"/v1/projects/{project}/messages:send"
        self._refresh_lock = asyncio.Lock()
        self._auth_request = google.auth.transport.requests.Request()

    async def _token(self, force: bool = False) -> str:
        """A valid access token, refreshed (in a thread) when missing or about to expire."""
        creds = self.credentials
        if not force and creds.valid:
            return str(creds.token)
        async with self._refresh_lock:
            if force or not creds.valid:
                await asyncio.to_thread(creds.refresh, self._auth_request)
        return str(creds.token)

    def _message(self, delivery: Delivery) -> dict[str, Any]:
        rendered: dict[str, Any] = delivery.get("rendered") or {}
        data = {str(k): str(v) for k, v in (rendered.get("data") or {}).items()}
        data["delivery_id"] = str(delivery.get("delivery_id"))
        if self._opened is not None:
            data["herald_opened"] = self._opened(delivery)
        message: dict[str, Any] = {"token": delivery.get("address"), "data": data}
        notification = {k: rendered[k] for k in ("title", "body") if rendered.get(k)}
        if notification:
            message["notification"] = notification
        android: dict[str, Any] = {
            "priority": "HIGH" if delivery.get("traffic_class") == "transactional" else "NORMAL"
        }
        expire = epoch_seconds(delivery.get("expire_at"))
        if expire is not None:
            android["ttl"] = f"{max(0, int(expire - time.time()))}s"
        if delivery.get("collapse_key"):
            key = str(delivery["collapse_key"])
            # collapse_key collapses queued messages; the notification tag replaces the one
            # already shown on the device (Android), as apns-collapse-id does on iOS.
            android["collapse_key"] = key
            android["notification"] = {"tag": key}
            message["apns"] = {"headers": {"apns-collapse-id": key}}
        message["android"] = android
        return {"message": message}

    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        p = self.provider
        if not delivery.get("address"):
            return Permanent("missing_address", provider=p)
        body = orjson.dumps(self._message(delivery))
        headers = {"content-type": "application/json"}
        resp: httpx.Response | H2Response | None = None
        for attempt in range(2):
            try:
                token = await self._token(force=attempt > 0)
            except google.auth.exceptions.TransportError:
                return Retryable("oauth_unavailable", provider=p, latency_ms=self._ms(start))
            except google.auth.exceptions.RefreshError:
                return PlatformError("oauth_refresh_failed", provider=p, latency_ms=self._ms(start))
            headers["authorization"] = f"Bearer {token}"
            resp = await self._post(self.path, headers, body)
            if resp.status_code != 401 or _error_code(resp)[0] == "THIRD_PARTY_AUTH_ERROR":
                break
        assert resp is not None
        return self._map(resp, start)

    def _map(self, resp: httpx.Response | H2Response, start: float) -> Outcome:
        status, ms, p = resp.status_code, self._ms(start), self.provider
        if status == 200:
            try:
                name = str(orjson.loads(resp.content).get("name", ""))
            except (orjson.JSONDecodeError, AttributeError):
                name = ""  # accepted all the same; only the id for receipts is missing
            return Accepted(name.rsplit("/", 1)[-1], provider=p, status_code=status, latency_ms=ms)
        code, message = _error_code(resp)
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        kw: dict[str, Any] = {"provider": p, "status_code": status, "latency_ms": ms}
        if code in ("UNREGISTERED", "SENDER_ID_MISMATCH"):
            return TokenDead(code, **kw)
        if status == 400:
            if any(hint in message for hint in _BAD_TOKEN_HINTS):
                return TokenDead("invalid_registration_token", **kw)
            return Permanent(code, **kw)
        if status == 429:
            return RateLimited(retry_after, **kw)
        if status >= 500:
            return Retryable(code, retry_after, **kw)
        if status in (401, 403, 404):
            return PlatformError(code, **kw)
        return Permanent(code, **kw)


def _error_code(resp: httpx.Response | H2Response) -> tuple[str, str]:
    """(FcmError errorCode or google.rpc status, message) of an error response."""
    try:
        error = orjson.loads(resp.content)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"http_{resp.status_code}", ""
    code = str(error.get("status") or f"http_{resp.status_code}")
    for detail in error.get("details") or []:
        if str(detail.get("@type", "")).endswith("google.firebase.fcm.v1.FcmError"):
            code = str(detail.get("errorCode") or code)
    return code, str(error.get("message", ""))
