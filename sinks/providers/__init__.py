"""Provider clients over httpx: one `send(delivery) -> Outcome` per provider, one folder each,
registered in sinks/provider_registry.py. The first five, whose names load from here too:

| client         | provider | folder     | wire                                     |
|----------------|----------|------------|------------------------------------------|
| ApnsClient     | apns     | apns/      | HTTP/2 + TLS, ES256 provider token       |
| FcmClient      | fcm      | fcm/       | FCM HTTP v1, google-auth service account |
| TwilioClient   | sms_a    | twilio/    | Twilio Messages API (form, Basic)        |
| VonageClient   | sms_b    | vonage/    | Vonage SMS API (form)                    |
| SendGridClient | email    | sendgrid/  | SendGrid v3 mail/send (JSON, Bearer)     |

A provider's folder holds its client (`client.py`), its registration (`SPEC` in `__init__.py`,
read through sinks/provider_registry.py) and, for a provider that posts receipts, their parser
(`receipts.py`) and signature check (`signature.py`, which the API runs). Outcomes are
`herald.outcomes`. Each client owns one `httpx.AsyncClient` (create one
per provider per process, close it with `aclose()` or `async with`), bounds its in-flight
requests (`max_concurrency`) and maps every response and network failure per PROVIDERS.md §6.

The names below load on first use: importing one provider's folder (its registration) loads no
client.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinks.providers.apns.client import ApnsClient, ApnsTokenSigner
    from sinks.providers.base import ProviderClient
    from sinks.providers.config import (
        ApnsConfig,
        FcmConfig,
        SendGridConfig,
        TwilioConfig,
        VonageConfig,
    )
    from sinks.providers.fcm.client import FcmClient
    from sinks.providers.sendgrid.client import SendGridClient
    from sinks.providers.twilio.client import TwilioClient
    from sinks.providers.vonage.client import VonageClient

_WHERE = {
    "ApnsClient": "sinks.providers.apns.client",
    "ApnsTokenSigner": "sinks.providers.apns.client",
    "FcmClient": "sinks.providers.fcm.client",
    "SendGridClient": "sinks.providers.sendgrid.client",
    "TwilioClient": "sinks.providers.twilio.client",
    "VonageClient": "sinks.providers.vonage.client",
    "ProviderClient": "sinks.providers.base",
    "ApnsConfig": "sinks.providers.config",
    "FcmConfig": "sinks.providers.config",
    "SendGridConfig": "sinks.providers.config",
    "TwilioConfig": "sinks.providers.config",
    "VonageConfig": "sinks.providers.config",
}

__all__ = [
    "ApnsClient",
    "ApnsConfig",
    "ApnsTokenSigner",
    "FcmClient",
    "FcmConfig",
    "ProviderClient",
    "SendGridClient",
    "SendGridConfig",
    "TwilioClient",
    "TwilioConfig",
    "VonageClient",
    "VonageConfig",
]


def __getattr__(name: str) -> Any:
    """Load `name` from its module on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
