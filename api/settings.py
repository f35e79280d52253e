"""Settings of the HTTP intake API (pydantic-settings; read only by `python -m api`).

| class            | prefix              | example                                              |
|------------------|---------------------|------------------------------------------------------|
| ApiSettings      | HERALD_API_         | HERALD_API_TENANTS_FILE=/etc/herald/tenants.toml      |
| ProviderSecrets  | HERALD_PROVIDERS_   | HERALD_PROVIDERS_SMS_A_AUTH_TOKEN=...                |

Provider secrets verify callback signatures (PROVIDERS.md): sms_a is Twilio-style (auth token,
HMAC-SHA1 over URL + sorted params), sms_b Vonage-style (signature secret + method), email
SendGrid-style (ECDSA P-256 public key, PEM or base64 DER). A provider whose secret is not set
rejects every callback (never accepts unsigned receipts).

Embedded stack: the provider simulators generate their secrets at start and write them to
`<run_dir>/simulators/<provider>/credentials.json`. With `simulator_dir` set (the API entry point
sets it to `<run_dir>/simulators` when HERALD_PROVIDERS_SIMULATOR_DIR is unset), a provider
without an explicit secret reads it from there. Explicit settings always win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from herald.config import DEFAULT_TENANTS_FILE, SmsLimits, TenantsFile
from herald.providers import CallbackCheck, CallbackCredentials


class ProviderSecrets(BaseSettings):
    """Callback verification secrets per provider."""

    model_config = SettingsConfigDict(env_prefix="HERALD_PROVIDERS_")

    sms_a_auth_token: SecretStr | None = None
    sms_b_signature_secret: SecretStr | None = None
    sms_b_signature_method: str = "sha256"
    email_webhook_public_key: SecretStr | None = None
    # The other providers' callback secrets, by provider (each one's SPEC.callback names it):
    # HERALD_PROVIDERS_SECRETS='{"sms_c": "..."}'.
    secrets: dict[str, SecretStr] = Field(default_factory=dict)
    # Max age of a signed timestamp (Vonage `timestamp`, SendGrid header); replay protection.
    max_skew_seconds: int = 600
    simulator_dir: Path | None = None

    def unsafe_defaults(self) -> list[str]:
        """What herald.config.refuse_unsafe_defaults refuses in these settings."""
        if self.simulator_dir is None:
            return []
        return ["HERALD_PROVIDERS_SIMULATOR_DIR: callbacks verified with the simulators' "
                "credentials; set HERALD_PROVIDERS_SMS_A_AUTH_TOKEN, "
                "HERALD_PROVIDERS_SMS_B_SIGNATURE_SECRET, "
                "HERALD_PROVIDERS_EMAIL_WEBHOOK_PUBLIC_KEY and HERALD_PROVIDERS_SECRETS "
                "instead"]  # fmt: skip

    def simulator_credentials(self, provider: str) -> dict[str, Any]:
        """The credentials.json a simulator wrote for `provider` ({} when absent)."""
        if self.simulator_dir is None:
            return {}
        try:
            data = orjson.loads((self.simulator_dir / provider / "credentials.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def credentials_for(self, provider: str, check: CallbackCheck) -> CallbackCredentials | None:
        """What `provider`'s callback check is given (None: no secret, reject). The secret is
        HERALD_PROVIDERS_SECRETS' entry, else the provider's named setting (NAMED), else its
        simulator's credentials.json entry `check.secret`; each setting of `check.settings` is
        that simulator's entry (when its secret is the one used), else the named setting, else
        its default."""
        named = {key: getattr(self, name) for (p, key), name in NAMED.items() if p == provider}
        explicit = self.secrets.get(provider) or named.get(check.secret)
        creds = {} if explicit is not None else self.simulator_credentials(provider)
        secret = (
            explicit.get_secret_value()
            if isinstance(explicit, SecretStr)
            else str(creds.get(check.secret) or "")
        )
        if not secret:
            return None
        settings = {
            key: str(creds.get(key) or named.get(key) or default)
            for key, default in check.settings.items()
        }
        return CallbackCredentials(secret, settings)


# The settings the first providers had before callback checks lived in the provider folders,
# kept as they are documented: (provider, credentials key) -> ProviderSecrets field.
NAMED: dict[tuple[str, str], str] = {
    ("sms_a", "auth_token"): "sms_a_auth_token",
    ("sms_b", "signature_secret"): "sms_b_signature_secret",
    ("sms_b", "signature_method"): "sms_b_signature_method",
    ("email", "webhook_public_key"): "email_webhook_public_key",
}


class ApiSettings(SmsLimits, TenantsFile):
    """Limits, TTLs and abuse controls of the API."""

    model_config = SettingsConfigDict(env_prefix="HERALD_API_")

    catalog_file: Path | None = None
    # Externally visible base URL (Twilio signs the full URL it posted to); None = request URL.
    public_base_url: str | None = None
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    max_callback_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # How long a request may wait for Kafka's delivery report before 503.
    ack_timeout_seconds: float = Field(default=5.0, gt=0)
    # How long a contact-points change of a user without a Redis copy waits for the users job
    # to restore the copies after a Redis loss before 503 user_state_restoring.
    restore_wait_seconds: float = Field(default=5.0, ge=0)
    idempotency_ttl_seconds: int = Field(default=24 * 3600, ge=60)
    status_ttl_seconds: int = Field(default=30 * 24 * 3600, ge=60)
    send_at_max_past_seconds: int = Field(default=300, ge=0)
    # Longest wait of a cancel or pause for dispatch workers still sending (api/controls.py).
    control_settle_seconds: float = Field(default=15.0, ge=0)
    inbox_max_items: int = Field(default=500, ge=1)
    # Live inbox sockets per user and per tenant on one API process (api/inbox_hub.py), and
    # how long a socket may stay open without an event or a client frame.
    inbox_ws_per_user: int = Field(default=8, ge=1)
    inbox_ws_per_tenant: int = Field(default=20_000, ge=1)
    inbox_ws_idle_seconds: float = Field(default=3600.0, gt=0)
    # Lifetime of an end user's inbox token (POST /v1/users/{id}/inbox/tokens).
    inbox_token_ttl_seconds: int = Field(default=900, ge=60, le=86400)
    # Segments (api/segments.py): the largest upload body, members per ClickHouse insert, uploads
    # and queries filled at once by one process (more wait), a segment query's time limit.
    segment_upload_max_bytes: int = Field(default=4 << 30, ge=1024)
    segment_insert_rows: int = Field(default=100_000, ge=1)
    segment_ingest_workers: int = Field(default=4, ge=1)
    segment_query_timeout_seconds: int = Field(default=300, ge=1)
    # OTP abuse limits: (count, window seconds) per end-user IP and end-user device (per phone
    # and the SMS prefixes: herald.config.SmsLimits, shared with the plan job).
    otp_per_ip: tuple[int, int] = (20, 600)
    otp_per_device: tuple[int, int] = (10, 600)
    trust_forwarded_for: bool = False

    def unsafe_defaults(self) -> list[str]:
        """What herald.config.refuse_unsafe_defaults refuses in these settings."""
        unsafe = []
        if self.tenants_file.resolve() == DEFAULT_TENANTS_FILE.resolve():
            unsafe.append(
                "HERALD_API_TENANTS_FILE: the bundled tenants file holds the public development"
                " key (every scope); give your own file of hashed keys"
            )
        if not self.sms_allowed_prefixes:
            unsafe.append(
                "HERALD_API_SMS_ALLOWED_PREFIXES: SMS to every country (SMS pumping); list the"
                ' E.164 prefixes you serve, e.g. ["+41","+49"] ("+" = all)'
            )
        return unsafe
