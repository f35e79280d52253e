"""APNs simulator: HTTP/2 over TLS, token (JWT ES256) auth, `POST /3/device/{token}`.

Wire format per PROVIDERS.md §1: 200 with `apns-id` (echoed or generated), errors as
`{"reason": ...}` (+ `timestamp` on 410). Provider-token checks: MissingProviderToken,
InvalidProviderToken (unknown kid, bad signature, wrong team, iat in the future),
ExpiredProviderToken (iat older than `token_ttl_s`, 1 h), TooManyProviderTokenUpdates (a new token
on one connection sooner than `token_update_min_interval_s`, 20 min). Error kinds for the
fault mix are the APNs reasons below. Verified tokens are cached: one ES256 check per token.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from pydantic import BaseModel, Field

from infra.simulators.config import SimConfig
from infra.simulators.keys import (
    TlsFiles,
    ec_private_pem,
    generate_tls,
    public_pem,
    write_private,
)
from infra.simulators.server import HANG, Request, Response, Simulator, _Hang

__all__ = ["REASON_STATUS", "ApnsConfig", "ApnsSimulator"]

REASON_STATUS: dict[str, int] = {
    **dict.fromkeys(
        [
            "BadCollapseId",
            "BadDeviceToken",
            "BadExpirationDate",
            "BadMessageId",
            "BadPriority",
            "BadTopic",
            "DeviceTokenNotForTopic",
            "DuplicateHeaders",
            "IdleTimeout",
            "InvalidPushType",
            "MissingDeviceToken",
            "MissingTopic",
            "PayloadEmpty",
            "TopicDisallowed",
        ],
        400,
    ),
    **dict.fromkeys(
        [
            "BadCertificate",
            "BadCertificateEnvironment",
            "ExpiredProviderToken",
            "Forbidden",
            "InvalidProviderToken",
            "MissingProviderToken",
            "UnrelatedKeyIdInToken",
            "BadEnvironmentKeyIdInToken",
        ],
        403,
    ),
    "BadPath": 404,
    "MethodNotAllowed": 405,
    "ExpiredToken": 410,
    "Unregistered": 410,
    "PayloadTooLarge": 413,
    "TooManyProviderTokenUpdates": 429,
    "TooManyRequests": 429,
    "InternalServerError": 500,
    "ServiceUnavailable": 503,
    "Shutdown": 503,
}

_PUSH_TYPES = frozenset(
    [
        "alert",
        "background",
        "voip",
        "location",
        "liveactivity",
        "complication",
        "fileprovider",
        "mdm",
        "pushtotalk",
        "controls",
        "widgets",
    ]
)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HEX = re.compile(r"^[0-9a-fA-F]{64,200}$")
_PATH = "/3/device/"


class ApnsKey(BaseModel):
    """A provider signing key as registered with Apple: its team and public key."""

    team_id: str
    public_key_pem: str


class ApnsConfig(SimConfig):
    """APNs simulator config (keys are generated into the state dir when empty)."""

    keys: dict[str, ApnsKey] = Field(default_factory=dict, description="key id → key")
    topics: list[str] = Field(default_factory=list, description="allowed topics; empty = any")
    token_ttl_s: float = 3600.0
    token_update_min_interval_s: float = 1200.0
    max_concurrent_streams: int = Field(default=1000, ge=10)


def _ec_key(pem: str) -> EllipticCurvePublicKey:
    key = load_pem_public_key(pem.encode())
    if not isinstance(key, EllipticCurvePublicKey):
        raise ValueError("APNs keys are P-256 (ES256) keys")
    return key


def _error(reason: str, retry_after: float | None = None) -> Response:
    headers = [("content-type", "application/json")]
    payload: dict[str, Any] = {"reason": reason}
    if REASON_STATUS[reason] == 410:
        payload["timestamp"] = int(time.time() * 1000)
    if retry_after is not None:
        headers.append(("retry-after", str(int(retry_after))))
    return Response(REASON_STATUS[reason], orjson.dumps(payload), headers)


class ApnsSimulator(Simulator):
    """Apple Push Notification service, token-based provider authentication."""

    name = "apns"
    config_model = ApnsConfig
    error_kinds = frozenset(REASON_STATUS)
    tls = True
    config: ApnsConfig

    _CACHE_MAX: ClassVar[int] = 10_000

    def __init__(self, config: SimConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert isinstance(self.config, ApnsConfig)
        self._generated: dict[str, Any] = {}
        if not self.config.keys:
            self._generate_key()
        tls = TlsFiles(*(self.state_dir / "tls" / f for f in ("ca.pem", "cert.pem", "key.pem")))
        if self._generated or not all(p.exists() for p in (tls.ca, tls.cert, tls.key)):
            # keys given (a restart keeps its identity, infra/simulators/__main__.py): keep the CA
            # that clients already trust
            tls = generate_tls(self.state_dir / "tls", (self.host, "localhost", "127.0.0.1"))
        self._tls = tls
        self._tokens: dict[str, tuple[str, int] | str] = {}
        self._conn_token: dict[str, tuple[str, float]] = {}
        self.on_config(self.config)

    def _generate_key(self) -> None:
        private = ec_private_pem()
        key_id, team_id = "SIMKEY0001", "SIMTEAM001"
        path = write_private(self.state_dir / f"AuthKey_{key_id}.p8", private)
        self.config = self.config.model_copy(
            update={"keys": {key_id: ApnsKey(team_id=team_id, public_key_pem=public_pem(private))}}
        )
        self._generated = {"key_id": key_id, "team_id": team_id, "auth_key_path": str(path)}

    def on_config(self, config: SimConfig) -> None:
        assert isinstance(config, ApnsConfig)
        self._keys = {kid: (k.team_id, _ec_key(k.public_key_pem)) for kid, k in config.keys.items()}
        self._topics = frozenset(config.topics)
        self._tokens.clear()

    def ssl_files(self) -> tuple[Path, Path]:
        return self._tls.cert, self._tls.key

    def credentials(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "ca_path": str(self._tls.ca),
            "topic": next(iter(self.config.topics), "com.herald.app"),
            **self._generated,
        }

    # -- provider token -------------------------------------------------------------------

    def _verify(self, token: str) -> tuple[str, int] | str:
        """(team_id, iat) of a valid token, else the InvalidProviderToken reason."""
        try:
            header = jwt.get_unverified_header(token)
            kid = header.get("kid")
            if header.get("alg") != "ES256" or kid not in self._keys:
                return "InvalidProviderToken"
            team_id, key = self._keys[kid]
            claims = jwt.decode(
                token, key, algorithms=["ES256"], options={"require": ["iss", "iat"]}
            )
        except jwt.PyJWTError:
            return "InvalidProviderToken"
        if claims["iss"] != team_id or not isinstance(claims["iat"], int):
            return "InvalidProviderToken"
        return team_id, claims["iat"]

    def _auth(self, req: Request) -> str | None:
        """The provider-token error reason, or None when the token is acceptable."""
        value = req.header("authorization")
        if not value or not value.lower().startswith("bearer "):
            return "MissingProviderToken"
        token = value[7:].strip()
        verdict = self._tokens.get(token)
        if verdict is None:
            if len(self._tokens) >= self._CACHE_MAX:
                self._tokens.clear()
            verdict = self._tokens[token] = self._verify(token)
        if isinstance(verdict, str):
            return verdict
        now = time.time()
        if now - verdict[1] > self.config.token_ttl_s:
            return "ExpiredProviderToken"
        last = self._conn_token.get(req.client)
        if last is None or last[0] != token:
            if last is not None and now - last[1] < self.config.token_update_min_interval_s:
                return "TooManyProviderTokenUpdates"
            if last is None:
                self.stats.extra["connections"] += 1
            if len(self._conn_token) >= self._CACHE_MAX:
                self._conn_token.clear()
            self._conn_token[req.client] = (token, now)
        return None

    # -- request --------------------------------------------------------------------------

    def _validate(self, req: Request, device: str) -> str | None:
        h = req.header
        if not (h("apns-topic") or ""):
            return "MissingTopic"
        if self._topics and h("apns-topic") not in self._topics:
            return "TopicDisallowed"
        if not device:
            return "MissingDeviceToken"
        if not _HEX.match(device):
            return "BadDeviceToken"
        apns_id = h("apns-id")
        if apns_id is not None and not _UUID.match(apns_id):
            return "BadMessageId"
        priority = h("apns-priority")
        if priority is not None and priority not in ("10", "5", "1"):
            return "BadPriority"
        push_type = h("apns-push-type")
        if push_type is not None and push_type not in _PUSH_TYPES:
            return "InvalidPushType"
        expiration = h("apns-expiration")
        if expiration is not None and not expiration.isdigit():
            return "BadExpirationDate"
        collapse = h("apns-collapse-id")
        if collapse is not None and len(collapse.encode()) > 64:
            return "BadCollapseId"
        if not req.body:
            return "PayloadEmpty"
        limit = 5120 if push_type == "voip" else 4096
        if len(req.body) > limit:
            return "PayloadTooLarge"
        return None

    async def handle(self, req: Request) -> Response | _Hang:
        stats, faults = self.stats, self.faults
        reason: str | None
        if not req.path.startswith(_PATH):
            reason = "BadPath"
        elif req.method != "POST":
            reason = "MethodNotAllowed"
        else:
            reason = self._auth(req)
        device = req.path[len(_PATH) :]
        if reason is None:
            reason = self._validate(req, device)
        if reason is None and device in faults.invalid:
            reason = "BadDeviceToken"
        if reason is None and device in faults.unregistered:
            reason = "Unregistered"
        await faults.delay()
        if faults.lose():  # lost before the provider took it: no record, no answer
            self.stats.lost += 1
            return HANG
        if reason is None:
            retry_after = faults.throttle()
            if retry_after is not None:
                stats.rate_limited += 1
                stats.error("TooManyRequests")
                return _error("TooManyRequests", retry_after)
            reason = faults.pick_error()
        if reason is not None:
            stats.error(reason)
            retry = self.config.retry_after_s if REASON_STATUS[reason] in (429, 503) else None
            return _error(reason, retry)
        apns_id = req.header("apns-id") or str(uuid.uuid4())
        stats.accept(device, apns_id, req.header("apns-collapse-id"), self.config.record_ids)
        if faults.hang():
            return HANG
        return Response(200, b"", [("apns-id", apns_id)])
