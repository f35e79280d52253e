"""MessageBird SMS API: the provider `sms_c` (a third SMS vendor).

Everything of it is in this folder: its client (client.py), settings (config.py, env
HERALD_MESSAGEBIRD_*), status-report parser (receipts.py) and report signature check
(signature.py); `SPEC` registers them (sinks/provider_registry.py). Its simulator is
infra/simulators/messagebird.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herald.providers import CallbackCheck
from sinks.provider_registry import ProviderSpec
from sinks.providers.messagebird import receipts, signature

__all__ = ["SPEC"]


def _client() -> Any:
    """A MessageBirdClient configured from the environment (in the dispatch worker)."""
    from sinks.providers.messagebird.client import MessageBirdClient
    from sinks.providers.messagebird.config import MessageBirdConfig

    return MessageBirdClient(MessageBirdConfig())


def _simulator_env(c: Mapping[str, str], callback_base: str | None) -> dict[str, str]:
    env = {"HERALD_MESSAGEBIRD_BASE_URL": c["base_url"],
           "HERALD_MESSAGEBIRD_ACCESS_KEY": c["access_key"]}  # fmt: skip
    if callback_base:
        env["HERALD_MESSAGEBIRD_REPORT_URL"] = f"{callback_base}/v1/callbacks/sms_c"
    return env


SPEC = ProviderSpec(
    "sms_c", _client,
    rate=2_000, reserved=600, client_env=_simulator_env,
    receipts=receipts.FORMAT,
    callback=CallbackCheck("signing_key", signature.verify),
)  # fmt: skip
