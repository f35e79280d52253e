"""Settings of the MessageBird-style SMS client (env prefix HERALD_MESSAGEBIRD_)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from sinks.providers.config import HttpConfig

__all__ = ["MessageBirdConfig"]


class MessageBirdConfig(HttpConfig):
    """MessageBird SMS API (SMS provider C): `POST /messages` with an access key."""

    model_config = SettingsConfigDict(env_prefix="HERALD_MESSAGEBIRD_")

    base_url: str = "https://rest.messagebird.com"
    access_key: SecretStr = SecretStr("")
    originator: str = Field(default="Herald", description="sender: a number or up to 11 chars")
    report_url: str | None = Field(
        default=None, description="status reports: Herald /v1/callbacks/sms_c"
    )
