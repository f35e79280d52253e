"""The provider registry: each provider's parts, found through one line per provider.

    MODULES["sms_b"]        ("sinks.providers.vonage", "infra.simulators.vonage:VonageSimulator")
    spec("sms_b")           the module's `SPEC`: a ProviderSpec (imported on first use)
    specs()                 every provider's ProviderSpec, in MODULES order
    register_receipt_formats()   herald.receipts reads every provider's receipts from then on

A provider's folder (sinks/providers/<vendor>/: its client in client.py) has its `SPEC` in
`__init__.py`: how a dispatch worker builds its client (settings from its own env prefix), its
default budget, and the environment that points that client at its simulator. The dispatch
sinks, the dispatch settings, the embedded stack and the simulators read them here, so adding a
provider is its module, its simulator and its line below, plus its line in herald/providers.py
(channel, webhook) — see "Adding a provider" in the README.

Kept free of imports of the provider modules themselves, so the simulators and the launcher
read `MODULES` without loading any provider client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import import_module
from typing import Any

from herald.providers import CallbackCheck
from herald.receipts import ReceiptFormat, register_format

__all__ = ["MODULES", "ProviderSpec", "load_clients", "register_receipt_formats", "spec", "specs"]

# provider -> (its module, its simulator "module:Class"); herald/providers.py says its channel
MODULES: Mapping[str, tuple[str, str]] = {
    "apns": ("sinks.providers.apns", "infra.simulators.apns:ApnsSimulator"),
    "fcm": ("sinks.providers.fcm", "infra.simulators.fcm:FcmSimulator"),
    "sms_a": ("sinks.providers.twilio", "infra.simulators.twilio:TwilioSimulator"),
    "sms_b": ("sinks.providers.vonage", "infra.simulators.vonage:VonageSimulator"),
    "sms_c": ("sinks.providers.messagebird", "infra.simulators.messagebird:MessageBirdSimulator"),
    "email": ("sinks.providers.sendgrid", "infra.simulators.sendgrid:SendGridSimulator"),
}


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """What the rest of Herald needs from one provider's module.

    `client()` builds its client in a dispatch worker (it reads its own HERALD_<VENDOR>_*
    settings); `rate` and `reserved` are its default budget in sends/s, `reserved` of it kept for
    transactional traffic (HERALD_DISPATCH_RATES overrides both); `client_env(credentials,
    callback_base)` is the environment that points the client at its simulator (the
    simulator's credentials.json; Herald's API URL for status callbacks, if it sends them).
    A provider that posts receipts to /v1/callbacks/{name} and keeps their format in its folder
    gives `receipts` (registered by the receipts job, herald.receipts.register_format) and
    `callback` (how the API verifies them).
    """

    name: str
    client: Callable[[], Any]
    rate: float
    reserved: float
    client_env: Callable[[Mapping[str, str], str | None], dict[str, str]]
    receipts: ReceiptFormat | None = None
    callback: CallbackCheck | None = None


@cache
def spec(name: str) -> ProviderSpec:
    """The ProviderSpec of provider `name` (KeyError for an unknown one)."""
    module, _ = MODULES[name]
    found: ProviderSpec = import_module(module).SPEC
    if found.name != name:
        raise ValueError(f"{module}.SPEC is for {found.name!r}, registered as {name!r}")
    return found


def specs() -> list[ProviderSpec]:
    """Every registered provider's ProviderSpec."""
    return [spec(name) for name in MODULES]


def load_clients() -> None:
    """Import every registered provider's client module (its folder's client.py) now: a
    dispatch worker does it when it starts, so that its first send (an OTP) does not wait for
    the imports (httpx, aiohttp, jh2, google-auth... up to a second on a busy machine)."""
    for module, _ in MODULES.values():
        import_module(f"{module}.client")


def register_receipt_formats() -> None:
    """Have herald.receipts read every registered provider's receipts (their formats live in
    the providers' folders): the receipts job calls it when it builds its dataflow."""
    for found in specs():
        if found.receipts is not None:
            register_format(found.name, found.receipts)
