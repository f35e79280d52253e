"""FCM HTTP v1 simulator with its own OAuth2 token endpoint.

- `POST /token`: the Google OAuth2 JWT-bearer grant (RFC 7523) that google-auth's
  service-account credentials use: form `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`
  and `assertion=<RS256 JWT signed with the service-account key>` → `{"access_token",
  "expires_in", "token_type": "Bearer"}`. Point `token_uri` of the service-account JSON here.
- `POST /v1/projects/{project}/messages:send` with `Authorization: Bearer <access token>` →
  200 `{"name": "projects/{p}/messages/{id}"}` or the google.rpc error shape with an FcmError
  detail (PROVIDERS.md §2). Error kinds: the FCM errorCodes below.
- A device shows one notification per `android.notification.tag`: a message whose (token, tag)
  was already shown replaces it, counted as `android_tag_replaced` in `/_admin/stats`
  (`android_tagged` counts tagged messages).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from pydantic import BaseModel, Field

from infra.simulators.config import SimConfig
from infra.simulators.keys import public_pem, random_hex, rsa_private_pem, write_private
from infra.simulators.server import HANG, Request, Response, Simulator, _Hang, json_response

__all__ = ["ERRORS", "FcmConfig", "FcmSimulator"]

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPES = frozenset(
    {
        "https://www.googleapis.com/auth/firebase.messaging",
        "https://www.googleapis.com/auth/cloud-platform",
    }
)

# errorCode → (HTTP status, google.rpc status, message)
ERRORS: dict[str, tuple[int, str, str]] = {
    "UNREGISTERED": (404, "NOT_FOUND", "Requested entity was not found."),
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT", "Request contains an invalid argument."),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED", "SenderId mismatch"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED", "Quota exceeded for sending messages."),
    "UNAVAILABLE": (503, "UNAVAILABLE", "The service is currently unavailable."),
    "INTERNAL": (500, "INTERNAL", "Internal error encountered."),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED", "Auth error from APNS or Web Push."),
}
_BAD_TOKEN = "The registration token is not a valid FCM registration token"
_SEND = re.compile(r"^/v1/projects/([^/]+)/messages:send$")
_TTL = re.compile(r"^\d+(\.\d{1,9})?s$")


class ServiceAccount(BaseModel):
    """A service account allowed to get tokens: its public key and project."""

    public_key_pem: str
    project_id: str


class FcmConfig(SimConfig):
    """FCM simulator config (a service account is generated when none is given)."""

    project_id: str = "herald-sim"
    service_accounts: dict[str, ServiceAccount] = Field(
        default_factory=dict, description="client_email → account"
    )
    access_token_ttl_s: int = Field(default=3600, ge=1)


def _rsa_key(pem: str) -> RSAPublicKey:
    key = load_pem_public_key(pem.encode())
    if not isinstance(key, RSAPublicKey):
        raise ValueError("service-account keys are RSA keys")
    return key


def _rpc_error(
    code: str | None, status: int, rpc: str, message: str, retry_after: float | None = None
) -> Response:
    error: dict[str, Any] = {"code": status, "message": message, "status": rpc}
    if code is not None:
        error["details"] = [
            {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}
        ]
    headers = [("retry-after", str(int(retry_after)))] if retry_after is not None else []
    return json_response(status, {"error": error}, headers)


def _fcm_error(code: str, retry_after: float | None = None, message: str | None = None) -> Response:
    status, rpc, default = ERRORS[code]
    return _rpc_error(code, status, rpc, message or default, retry_after)


class FcmSimulator(Simulator):
    """Firebase Cloud Messaging HTTP v1 + OAuth2 token endpoint."""

    name = "fcm"
    config_model = FcmConfig
    error_kinds = frozenset(ERRORS)
    config: FcmConfig

    def __init__(self, config: SimConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert isinstance(self.config, FcmConfig)
        self._sa_path: str | None = None
        if not self.config.service_accounts:
            self._generate_account()
        self._access: dict[str, tuple[float, str]] = {}
        self._tags: set[tuple[str, str]] = set()  # (token, tag) shown on a device
        self.on_config(self.config)

    def _generate_account(self) -> None:
        private = rsa_private_pem()
        email = f"herald-sim@{self.config.project_id}.iam.gserviceaccount.com"
        info = {
            "type": "service_account",
            "project_id": self.config.project_id,
            "private_key_id": random_hex(20),
            "private_key": private.decode(),
            "client_email": email,
            "client_id": str(int(random_hex(8), 16)),
            "auth_uri": f"{self.base_url}/auth",
            "token_uri": f"{self.base_url}/token",
        }
        path = write_private(self.state_dir / "service_account.json", json.dumps(info).encode())
        self._sa_path = str(path)
        account = ServiceAccount(public_key_pem=public_pem(private), project_id=info["project_id"])
        self.config = self.config.model_copy(update={"service_accounts": {email: account}})

    def on_config(self, config: SimConfig) -> None:
        assert isinstance(config, FcmConfig)
        self._keys = {
            email: (_rsa_key(sa.public_key_pem), sa.project_id)
            for email, sa in config.service_accounts.items()
        }

    def credentials(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "project_id": self.config.project_id,
            "token_uri": f"{self.base_url}/token",
            "service_account_path": self._sa_path,
        }

    # -- OAuth2 ---------------------------------------------------------------------------

    def _token(self, req: Request) -> Response:
        self.stats.extra["token_requests"] += 1
        form = req.form()
        if form.get("grant_type") != GRANT_TYPE:
            return json_response(400, {"error": "unsupported_grant_type"})
        try:
            claims = jwt.decode(form.get("assertion", ""), options={"verify_signature": False})
            key, project = self._keys[claims["iss"]]
            claims = jwt.decode(
                form["assertion"],
                key,
                algorithms=["RS256"],
                options={"require": ["iss", "aud", "iat", "exp"], "verify_aud": False},
            )
        except (jwt.PyJWTError, KeyError):
            return json_response(
                400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            )
        if not str(claims["aud"]).endswith("/token"):
            return json_response(400, {"error": "invalid_grant", "error_description": "aud"})
        if not SCOPES & set(str(claims.get("scope", "")).split()):
            return json_response(400, {"error": "invalid_scope"})
        access = "ya29.sim-" + secrets.token_urlsafe(32)
        ttl = self.config.access_token_ttl_s
        self._access[access] = (time.time() + ttl, project)
        self.stats.extra["tokens_issued"] += 1
        return json_response(
            200, {"access_token": access, "expires_in": ttl, "token_type": "Bearer"}
        )

    # -- messages:send --------------------------------------------------------------------

    def _auth(self, req: Request, project: str) -> Response | None:
        value = req.header("authorization") or ""
        grant = self._access.get(value[7:].strip()) if value[:7].lower() == "bearer " else None
        if grant is None or grant[0] < time.time():
            self.stats.error("UNAUTHENTICATED")
            return _rpc_error(
                None,
                401,
                "UNAUTHENTICATED",
                "Request had invalid authentication credentials. "
                "Expected OAuth 2 access token, login cookie or other valid authentication "
                "credential.",
            )
        if grant[1] != project:
            self.stats.error("PERMISSION_DENIED")
            return _rpc_error(
                None,
                403,
                "PERMISSION_DENIED",
                "Permission 'cloudmessaging.messages.create' "
                "denied on resource (or it may not exist).",
            )
        return None

    def _shown(self, target: str, message: dict[str, Any]) -> None:
        """Count a tagged notification and whether it replaced one with the same tag."""
        tag = ((message.get("android") or {}).get("notification") or {}).get("tag")
        if not tag:
            return
        self.stats.extra["android_tagged"] += 1
        if (target, tag) in self._tags:
            self.stats.extra["android_tag_replaced"] += 1
            return
        if len(self._tags) >= 100_000:
            self._tags.clear()  # bounded: old devices' tags are forgotten
        self._tags.add((target, tag))

    def _validate(self, body: bytes) -> tuple[dict[str, Any], str] | str:
        """(message, target) or an INVALID_ARGUMENT message."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return "Invalid JSON payload received."
        message = payload.get("message") if isinstance(payload, dict) else None
        if not isinstance(message, dict):
            return "Request contains an invalid argument."
        targets = [k for k in ("token", "topic", "condition") if message.get(k)]
        if len(targets) != 1:
            return "Exactly one of token, topic or condition must be specified."
        data = message.get("data", {})
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            return "Invalid value at 'message.data': values must be strings."
        android = message.get("android") or {}
        if "ttl" in android and not _TTL.match(str(android["ttl"])):
            return "Invalid value at 'message.android.ttl'."
        if android.get("priority", "NORMAL") not in ("NORMAL", "HIGH"):
            return "Invalid value at 'message.android.priority'."
        notification = android.get("notification", {})
        if not isinstance(notification, dict) or not isinstance(notification.get("tag", ""), str):
            return "Invalid value at 'message.android.notification'."
        if len(orjson.dumps(message)) > 4096:
            return "Message is too big"
        return message, str(message[targets[0]])

    async def handle(self, req: Request) -> Response | _Hang:
        if req.path == "/token" and req.method == "POST":
            return self._token(req)
        match = _SEND.match(req.path)
        if match is None or req.method != "POST":
            return _rpc_error(None, 404, "NOT_FOUND", "Not found")
        faults, stats = self.faults, self.stats
        await faults.delay()
        if faults.lose():  # lost before the provider took it: no record, no answer
            self.stats.lost += 1
            return HANG
        denied = self._auth(req, match.group(1))
        if denied is not None:
            return denied
        checked = self._validate(req.body)
        if isinstance(checked, str):
            stats.error("INVALID_ARGUMENT")
            return _fcm_error("INVALID_ARGUMENT", message=checked)
        message, target = checked
        if target in faults.invalid:
            stats.error("INVALID_ARGUMENT")
            return _fcm_error("INVALID_ARGUMENT", message=_BAD_TOKEN)
        if target in faults.unregistered:
            stats.error("UNREGISTERED")
            return _fcm_error("UNREGISTERED")
        retry_after = faults.throttle()
        if retry_after is not None:
            stats.rate_limited += 1
            stats.error("QUOTA_EXCEEDED")
            return _fcm_error("QUOTA_EXCEEDED", retry_after)
        code = faults.pick_error()
        if code is not None:
            stats.error(code)
            retry = self.config.retry_after_s if code in ("QUOTA_EXCEEDED", "UNAVAILABLE") else None
            return _fcm_error(code, retry)
        name = f"projects/{match.group(1)}/messages/"
        if orjson.loads(req.body).get("validate_only"):
            return json_response(200, {"name": name + "fake_message_id"})
        msg_id = f"0:{time.time_ns() // 1000}%{random_hex(8)}"
        ref = (message.get("data") or {}).get("delivery_id")
        stats.accept(target, msg_id, ref, self.config.record_ids)
        self._shown(target, message)
        if faults.hang():
            return HANG
        return json_response(200, {"name": name + msg_id})
