"""Firebase Cloud Messaging HTTP v1 (service account): the provider `fcm`.

Its registration is `SPEC` (sinks/provider_registry.py); the client is in client.py, loaded only
when a dispatch worker builds one; its settings: FcmConfig (sinks/providers/config.py),
env HERALD_FCM_*.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.provider_registry import ProviderSpec

__all__ = ["SPEC"]


def _client() -> Any:
    """A FcmClient configured from the environment (in the dispatch worker)."""
    from herald.config import LinksSettings
    from sinks.providers.config import FcmConfig
    from sinks.providers.fcm.client import FcmClient

    return FcmClient(FcmConfig(), links=LinksSettings())


def _simulator_env(c: Mapping[str, str], callback_base: str | None) -> dict[str, str]:
    return {
        "HERALD_FCM_BASE_URL": c["base_url"], "HERALD_FCM_PROJECT_ID": c["project_id"],
        "HERALD_FCM_TOKEN_URI": c["token_uri"],
        "HERALD_FCM_SERVICE_ACCOUNT_FILE": c["service_account_path"],
    }  # fmt: skip


SPEC = ProviderSpec(
    "fcm", _client,
    rate=10_000, reserved=2_000,  # FCM allows 600k/min per project
    client_env=_simulator_env,
)  # fmt: skip
