"""APNs client: HTTP/2 (multiplexed streams on one shared connection), ES256 provider tokens.

Provider token (JWT `{alg: ES256, kid}` / `{iss: team, iat}`) is minted with PyJWT and reused
until `token_refresh_s` (default 40 min: within Apple's 20–60 min window); a new one is never
minted sooner than `token_min_interval_s` (20 min) after the last, except that is exactly when
APNs answers 403 ExpiredProviderToken, which is refreshed and retried once (then PlatformError).

Outcome map (PROVIDERS.md §6):
    200                                      Accepted(apns-id)
    410 Unregistered/ExpiredToken; 400 BadDeviceToken, DeviceTokenNotForTopic → TokenDead
    400 IdleTimeout; 500; 503                Retryable
    429 TooManyRequests                      RateLimited (Retry-After if present)
    429 TooManyProviderTokenUpdates; 403 token/certificate reasons → PlatformError
    other 400, 403 Forbidden, 404, 405, 413  Permanent
    timeout / reset after sending            Unknown
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import orjson

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
from sinks.providers.config import ApnsConfig
from sinks.providers.h2transport import H2Response

__all__ = ["ApnsClient", "ApnsTokenSigner", "apns_id"]

log = logging.getLogger(__name__)

_TOKEN_DEAD = frozenset({"BadDeviceToken", "DeviceTokenNotForTopic"})
_PLATFORM_403 = frozenset(
    {
        "BadCertificate",
        "BadCertificateEnvironment",
        "ExpiredProviderToken",
        "InvalidProviderToken",
        "MissingProviderToken",
        "UnrelatedKeyIdInToken",
        "BadEnvironmentKeyIdInToken",
    }
)
_UNIQUE = frozenset({"apns-id", "apns-expiration"})
_Response = httpx.Response | H2Response
_LOWER_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NAMESPACE = uuid.UUID("5f0c6b52-8d3e-4a57-9a43-6a0f3b1e2c11")


def apns_id(delivery_id: str) -> str:
    """The apns-id for a delivery: its id if it is a UUID, else a UUIDv5 of it (stable)."""
    if _LOWER_UUID.fullmatch(delivery_id):
        return delivery_id  # already canonical: no parse (a hot path at 10k sends/s)
    try:
        return str(uuid.UUID(delivery_id))
    except ValueError:
        return str(uuid.uuid5(_NAMESPACE, delivery_id))


class ApnsTokenSigner:
    """Mints and caches the provider JWT; thread-safe; never mints more than once per interval."""

    def __init__(
        self,
        team_id: str,
        key_id: str,
        private_key_pem: str,
        *,
        refresh_s: float = 2400.0,
        min_interval_s: float = 1200.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.team_id = team_id
        self.key_id = key_id
        self._key = private_key_pem
        self.refresh_s = refresh_s
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._minted_at = float("-inf")
        self.minted = 0

    def _mint(self, now: float) -> str:
        self._token = jwt.encode(
            {"iss": self.team_id, "iat": int(now)},
            self._key,
            algorithm="ES256",
            headers={"kid": self.key_id},
        )
        self._minted_at = now
        self.minted += 1
        log.info("apns.token_minted key_id=%s n=%d", self.key_id, self.minted)
        return self._token

    def current(self) -> str:
        """The token to use now (minted when missing or older than `refresh_s`)."""
        now = self._clock()
        token = self._token
        if token is not None and now - self._minted_at < self.refresh_s:
            return token
        with self._lock:
            if self._token is None or now - self._minted_at >= self.refresh_s:
                return self._mint(now)
            return self._token

    def refresh_after_expired(self, used: str) -> str | None:
        """A newer token after APNs rejected `used` as expired, or None if none may be minted."""
        with self._lock:
            if self._token is not None and self._token != used:
                return self._token  # another request already refreshed it
            now = self._clock()
            if now - self._minted_at < self.min_interval_s:
                log.warning("apns.token_refresh_refused key_id=%s", self.key_id)
                return None
            return self._mint(now)


class ApnsClient(ProviderClient):
    """Sends push notifications to APNs over one multiplexed HTTP/2 connection (configurable)."""

    provider = "apns"
    http2 = True

    def __init__(
        self,
        config: ApnsConfig,
        signer: ApnsTokenSigner | None = None,
        links: LinksSettings | None = None,
    ) -> None:
        super().__init__(config)
        self.apns = config
        self._opened = opened_link(links)
        self.signer = signer or ApnsTokenSigner(
            config.team_id,
            config.key_id,
            config.private_key(),
            refresh_s=config.token_refresh_s,
            min_interval_s=config.token_min_interval_s,
        )

    def _request(self, delivery: Delivery) -> tuple[str, dict[str, str], bytes]:
        rendered: dict[str, Any] = delivery.get("rendered") or {}
        title, body = rendered.get("title"), rendered.get("body")
        data: dict[str, Any] = dict(rendered.get("data") or {})
        topic = data.pop("apns_topic", None) or self.apns.topic
        aps: dict[str, Any]
        if title or body:
            alert = {k: v for k, v in (("title", title), ("body", body)) if v}
            aps, push_type, priority = {"alert": alert, "sound": "default"}, "alert", "10"
        else:
            aps, push_type, priority = {"content-available": 1}, "background", "5"
        payload = {**data, "aps": aps, "delivery_id": delivery.get("delivery_id")}
        if self._opened is not None:
            payload["herald_opened"] = self._opened(delivery)
        headers = {
            "apns-topic": topic,
            "apns-push-type": push_type,
            "apns-priority": priority,
            "apns-id": apns_id(str(delivery["delivery_id"])),
        }
        expire = epoch_seconds(delivery.get("expire_at"))
        if expire is not None:
            headers["apns-expiration"] = str(max(0, int(expire)))
        if delivery.get("collapse_key"):
            headers["apns-collapse-id"] = str(delivery["collapse_key"])
        return f"/3/device/{delivery.get('address') or ''}", headers, orjson.dumps(payload)

    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        if not delivery.get("address"):
            return Permanent("missing_address", provider=self.provider)
        path, headers, body = self._request(delivery)
        token = self.signer.current()
        headers["authorization"] = f"bearer {token}"
        resp = await self._post(path, headers, body, unique=_UNIQUE, index_path=False)
        reason = _reason(resp) if resp.status_code != 200 else ""
        if resp.status_code == 403 and reason == "ExpiredProviderToken":
            fresh = self.signer.refresh_after_expired(token)
            if fresh is None:
                return PlatformError(
                    reason, provider=self.provider, status_code=403, latency_ms=self._ms(start)
                )
            headers["authorization"] = f"bearer {fresh}"
            resp = await self._post(path, headers, body, unique=_UNIQUE, index_path=False)
            reason = _reason(resp) if resp.status_code != 200 else ""
        return self._map(resp, reason, headers["apns-id"], start)

    def _map(self, resp: _Response, reason: str, sent_id: str, start: float) -> Outcome:
        status, ms, p = resp.status_code, self._ms(start), self.provider
        if status == 200:
            return Accepted(
                resp.headers.get("apns-id", sent_id), provider=p, status_code=status, latency_ms=ms
            )
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 410 or (status == 400 and reason in _TOKEN_DEAD):
            return TokenDead(reason, provider=p, status_code=status, latency_ms=ms)
        if status == 429:
            if reason == "TooManyProviderTokenUpdates":
                return PlatformError(reason, provider=p, status_code=status, latency_ms=ms)
            return RateLimited(retry_after, provider=p, status_code=status, latency_ms=ms)
        if status >= 500 or reason == "IdleTimeout":
            return Retryable(reason, retry_after, provider=p, status_code=status, latency_ms=ms)
        if status == 403 and reason in _PLATFORM_403:
            return PlatformError(reason, provider=p, status_code=status, latency_ms=ms)
        return Permanent(reason, provider=p, status_code=status, latency_ms=ms)


def _reason(resp: _Response) -> str:
    """The `reason` of an APNs error body (or `http_<status>` when there is none)."""
    try:
        data = orjson.loads(resp.content)
        return str(data["reason"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"http_{resp.status_code}"
