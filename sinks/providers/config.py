"""Provider client settings: production defaults, overridable (env or code) to simulator URLs.

| class          | env prefix      | production endpoint                         |
|----------------|-----------------|---------------------------------------------|
| ApnsConfig     | HERALD_APNS_    | https://api.push.apple.com (HTTP/2)         |
| FcmConfig      | HERALD_FCM_     | https://fcm.googleapis.com                  |
| TwilioConfig   | HERALD_TWILIO_  | https://api.twilio.com                      |
| VonageConfig   | HERALD_VONAGE_  | https://rest.nexmo.com                      |
| SendGridConfig | HERALD_SENDGRID_| https://api.sendgrid.com                    |

Secrets are `SecretStr`. Load these only in entry points and pass them to the clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "ApnsConfig",
    "FcmConfig",
    "HttpConfig",
    "SendGridConfig",
    "TwilioConfig",
    "VonageConfig",
]


class HttpConfig(BaseSettings):
    """Connection settings shared by every provider client."""

    base_url: str
    ca_path: Path | None = Field(default=None, description="extra CA bundle to trust (simulators)")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=10.0, gt=0, description="read/write timeout of one request")
    pool_timeout_s: float = Field(
        default=5.0, gt=0, description="wait for a free connection/stream"
    )
    max_connections: int = Field(default=16, ge=1)
    max_concurrency: int = Field(default=256, ge=1, description="in-flight requests per client")
    transport: Literal["auto", "lean", "httpcore", "pyreqwest", "aiohttp"] = Field(
        default="auto",
        description="auto: Herald's own HTTP/2 transport (sinks/providers/h2transport.py) for "
        "HTTP/2 providers, aiohttp (httpx-aiohttp) for HTTP/1.1 ones; lean: Herald's own (HTTP/2 "
        "providers only); httpcore: httpx's own; pyreqwest: Rust reqwest "
        "under httpx (extra `bench`). `python -m bench.transports` compares them "
        "(bench/results/transports.md)",
    )


class ApnsConfig(HttpConfig):
    """APNs token-based auth over HTTP/2; one connection multiplexes up to 1000 streams."""

    model_config = SettingsConfigDict(env_prefix="HERALD_APNS_")

    base_url: str = "https://api.push.apple.com"
    team_id: str = ""
    key_id: str = ""
    auth_key: SecretStr | None = Field(default=None, description="the .p8 key (PEM text)")
    auth_key_path: Path | None = Field(default=None, description="or the path of the .p8 key")
    topic: str = Field(default="", description="bundle id (apns-topic)")
    max_connections: int = Field(default=1, ge=1)
    max_concurrency: int = Field(default=1000, ge=1)
    token_refresh_s: float = Field(
        default=2400.0, gt=0, description="mint a new JWT after this age"
    )
    token_min_interval_s: float = Field(
        default=1200.0, ge=0, description="never mint twice within this interval (APNs: 20 min)"
    )

    @model_validator(mode="after")
    def _check(self) -> ApnsConfig:
        if self.token_refresh_s < self.token_min_interval_s:
            raise ValueError("token_refresh_s must be >= token_min_interval_s")
        return self

    def private_key(self) -> str:
        """The PEM text of the signing key (from `auth_key` or `auth_key_path`)."""
        if self.auth_key is not None:
            return self.auth_key.get_secret_value()
        if self.auth_key_path is not None:
            return self.auth_key_path.read_text()
        raise ValueError("APNs needs auth_key or auth_key_path")


class FcmConfig(HttpConfig):
    """FCM HTTP v1 with service-account OAuth (google-auth)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_FCM_")

    base_url: str = "https://fcm.googleapis.com"
    project_id: str = Field(default="", description="default: the service account's project")
    service_account_file: Path | None = None
    service_account_json: SecretStr | None = None
    token_uri: str | None = Field(default=None, description="override the account's token_uri")
    scopes: list[str] = Field(
        default_factory=lambda: ["https://www.googleapis.com/auth/firebase.messaging"]
    )
    http2: bool = True


class TwilioConfig(HttpConfig):
    """Twilio Programmable Messaging (SMS provider A)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_TWILIO_")

    base_url: str = "https://api.twilio.com"
    account_sid: str = ""
    auth_token: SecretStr = SecretStr("")
    from_number: str | None = None
    messaging_service_sid: str | None = None
    status_callback_url: str | None = Field(default=None, description="Herald /v1/callbacks/sms_a")


class VonageConfig(HttpConfig):
    """Vonage SMS API (SMS provider B)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_VONAGE_")

    base_url: str = "https://rest.nexmo.com"
    api_key: str = ""
    api_secret: SecretStr = SecretStr("")
    sender: str = Field(default="Herald", description="`from`: alphanumeric sender id or number")
    callback_url: str | None = Field(
        default=None, description="DLR webhook: Herald /v1/callbacks/sms_b"
    )
    signature_secret: SecretStr | None = Field(default=None, description="verifies signed DLRs")


class SendGridConfig(HttpConfig):
    """SendGrid v3 Mail Send (email)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_SENDGRID_")

    base_url: str = "https://api.sendgrid.com"
    api_key: SecretStr = SecretStr("")
    from_email: str = "notifications@example.com"
    from_name: str | None = None
    webhook_public_key: str | None = Field(default=None, description="verifies Event Webhook posts")
    # How long after a send Email Activity may still not show it: a lookup before that saying
    # "not found" is not believed (reconciliation asks again instead of sending twice).
    activity_lag_s: float = Field(default=120.0, ge=0)
