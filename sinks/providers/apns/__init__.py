"""Apple Push Notification service (token auth, HTTP/2): the provider `apns`.

Its registration is `SPEC` (sinks/provider_registry.py); the client is in client.py, loaded only
when a dispatch worker builds one; its settings: ApnsConfig (sinks/providers/config.py),
env HERALD_APNS_*.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.provider_registry import ProviderSpec

__all__ = ["SPEC"]


def _client() -> Any:
    """A ApnsClient configured from the environment (in the dispatch worker)."""
    from herald.config import LinksSettings
    from sinks.providers.apns.client import ApnsClient
    from sinks.providers.config import ApnsConfig

    return ApnsClient(ApnsConfig(), links=LinksSettings())


def _simulator_env(c: Mapping[str, str], callback_base: str | None) -> dict[str, str]:
    return {
        "HERALD_APNS_BASE_URL": c["base_url"], "HERALD_APNS_CA_PATH": c["ca_path"],
        "HERALD_APNS_TEAM_ID": c["team_id"], "HERALD_APNS_KEY_ID": c["key_id"],
        "HERALD_APNS_AUTH_KEY_PATH": c["auth_key_path"], "HERALD_APNS_TOPIC": c["topic"],
    }  # fmt: skip


SPEC = ProviderSpec(
    "apns", _client,
    rate=50_000, reserved=10_000, client_env=_simulator_env,
)  # fmt: skip
