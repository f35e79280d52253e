"""Vonage SMS API: the provider `sms_b`.

Its registration is `SPEC` (sinks/provider_registry.py); the client is in client.py, loaded only
when a dispatch worker builds one; its settings: VonageConfig (sinks/providers/config.py),
env HERALD_VONAGE_*; its DLR parser: receipts.py; its DLR signature check: signature.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herald.providers import CallbackCheck
from sinks.provider_registry import ProviderSpec
from sinks.providers.vonage import receipts, signature

__all__ = ["SPEC"]


def _client() -> Any:
    """A VonageClient configured from the environment (in the dispatch worker)."""
    from sinks.providers.config import VonageConfig
    from sinks.providers.vonage.client import VonageClient

    return VonageClient(VonageConfig())


def _simulator_env(c: Mapping[str, str], callback_base: str | None) -> dict[str, str]:
    env = {
        "HERALD_VONAGE_BASE_URL": c["base_url"], "HERALD_VONAGE_API_KEY": c["api_key"],
        "HERALD_VONAGE_API_SECRET": c["api_secret"],
    }  # fmt: skip
    if "signature_secret" in c:
        env["HERALD_VONAGE_SIGNATURE_SECRET"] = c["signature_secret"]
    if callback_base:
        env["HERALD_VONAGE_CALLBACK_URL"] = f"{callback_base}/v1/callbacks/sms_b"
    return env


SPEC = ProviderSpec(
    "sms_b", _client,
    rate=2_000, reserved=600, client_env=_simulator_env,
    receipts=receipts.FORMAT,
    callback=CallbackCheck("signature_secret", signature.verify,
                           settings={"signature_method": signature.DEFAULT_METHOD}),
)  # fmt: skip
