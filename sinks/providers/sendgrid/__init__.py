"""SendGrid v3 Mail Send: the provider `email`.

Its registration is `SPEC` (sinks/provider_registry.py); the client is in client.py, loaded only
when a dispatch worker builds one; its settings: SendGridConfig (sinks/providers/config.py),
env HERALD_SENDGRID_*; its event-webhook parser: receipts.py;
its webhook signature check: signature.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herald.providers import CallbackCheck
from sinks.provider_registry import ProviderSpec
from sinks.providers.sendgrid import receipts, signature

__all__ = ["SPEC"]


def _client() -> Any:
    """A SendGridClient configured from the environment (in the dispatch worker)."""
    from herald.config import LinksSettings
    from sinks.providers.config import SendGridConfig
    from sinks.providers.sendgrid.client import SendGridClient

    return SendGridClient(SendGridConfig(), LinksSettings())


def _simulator_env(c: Mapping[str, str], callback_base: str | None) -> dict[str, str]:
    env = {"HERALD_SENDGRID_BASE_URL": c["base_url"], "HERALD_SENDGRID_API_KEY": c["api_key"]}
    if "webhook_public_key" in c:
        env["HERALD_SENDGRID_WEBHOOK_PUBLIC_KEY"] = c["webhook_public_key"]
    return env


SPEC = ProviderSpec(
    "email", _client,
    rate=1_000, reserved=200, client_env=_simulator_env,
    receipts=receipts.FORMAT,
    callback=CallbackCheck("webhook_public_key", signature.verify),
)  # fmt: skip
