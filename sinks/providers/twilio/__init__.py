"""Twilio Programmable Messaging: the provider `sms_a`.

Its registration is `SPEC` (sinks/provider_registry.py); the client is in client.py, loaded only
when a dispatch worker builds one; its settings: TwilioConfig (sinks/providers/config.py),
env HERALD_TWILIO_*; its status-callback parser: receipts.py;
its callback signature check: signature.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herald.providers import CallbackCheck
from sinks.provider_registry import ProviderSpec
from sinks.providers.twilio import receipts, signature

__all__ = ["SPEC"]


def _client() -> Any:
    """A TwilioClient configured from the environment (in the dispatch worker)."""
    from sinks.providers.config import TwilioConfig
    from sinks.providers.twilio.client import TwilioClient

    return TwilioClient(TwilioConfig())


SENDER_NUMBER = "+15005550006"  # the simulator's (Twilio's magic test number)


def _simulator_env(c: Mapping[str, str], callback_base: str | None) -> dict[str, str]:
    env = {
        "HERALD_TWILIO_BASE_URL": c["base_url"], "HERALD_TWILIO_ACCOUNT_SID": c["account_sid"],
        "HERALD_TWILIO_AUTH_TOKEN": c["auth_token"], "HERALD_TWILIO_FROM_NUMBER": SENDER_NUMBER,
    }  # fmt: skip
    if callback_base:
        env["HERALD_TWILIO_STATUS_CALLBACK_URL"] = f"{callback_base}/v1/callbacks/sms_a"
    return env


SPEC = ProviderSpec(
    "sms_a", _client,
    rate=10_000, reserved=3_000, client_env=_simulator_env,
    receipts=receipts.FORMAT,
    callback=CallbackCheck("auth_token", signature.verify),
)  # fmt: skip
