"""Provider clients over httpx: one `send(delivery) -> Outcome` per provider.

| client         | provider key | wire                                    |
|----------------|--------------|-----------------------------------------|
| ApnsClient     | apns         | HTTP/2 + TLS, ES256 provider token      |
| FcmClient      | fcm          | FCM HTTP v1, google-auth service account |
| TwilioClient   | sms_a        | Twilio Messages API (form, Basic)       |
| VonageClient   | sms_b        | Vonage SMS API (form)                   |
| SendGridClient | email        | SendGrid v3 mail/send (JSON, Bearer)    |

Outcomes are `herald.outcomes`; the API checks webhook signatures (`api.signatures`).
Each client owns one `httpx.AsyncClient` (create one per provider per process, close it with
`aclose()` or `async with`), bounds its in-flight requests (`max_concurrency`) and maps every
response and network failure per PROVIDERS.md §6.
"""

from __future__ import annotations

from sinks.providers.apns import ApnsClient, ApnsTokenSigner
from sinks.providers.base import ProviderClient
from sinks.providers.config import (
    ApnsConfig,
    FcmConfig,
    SendGridConfig,
    TwilioConfig,
    VonageConfig,
)
from sinks.providers.fcm import FcmClient
from sinks.providers.sendgrid import SendGridClient
from sinks.providers.twilio import TwilioClient
from sinks.providers.vonage import VonageClient

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
