"""The providers Herald sends through, in one table every layer reads.

    PROVIDERS["sms_b"].channel          "sms"
    providers_of("sms")                 ("sms_a", "sms_b")
    DEFAULT_PROVIDER["sms"]             the provider of an SMS delivery that names none
    EXTERNAL                            providers reached over the network (each one simulated
                                        in the embedded stack: infra/simulators)
    WEBHOOK                             providers that post receipts to /v1/callbacks/{name}
    CallbackCheck, CallbackRequest,     how the API verifies a provider's callbacks (a provider
    CallbackCredentials                 folder's SPEC.callback, sinks/provider_registry.py)

What a provider *does* (its client, config, receipt parser, signature check) lives with its
code (sinks/providers/<vendor>/); which providers exist and which channel each serves is said
here once. A push delivery carries its provider (the device's platform), so push has no default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_PROVIDER",
    "CallbackCheck",
    "CallbackCredentials",
    "CallbackRequest",
    "EXTERNAL",
    "PROVIDERS",
    "WEBHOOK",
    "Provider",
    "providers_of",
]


@dataclass(frozen=True, slots=True)
class Provider:
    """One provider: the channel it serves, what it speaks, how its outcomes come back."""

    name: str
    channel: str
    speaks: str  # the wire format (PROVIDERS.md)
    webhook: bool = False  # receipts arrive signed at /v1/callbacks/{name}
    external: bool = True  # False: Herald's own (the in-app inbox), no network call


PROVIDERS: Mapping[str, Provider] = {
    p.name: p
    for p in (
        Provider("apns", "push", "APNs token auth over HTTP/2"),
        Provider("fcm", "push", "FCM HTTP v1"),
        Provider("sms_a", "sms", "Twilio Messages API", webhook=True),
        Provider("sms_b", "sms", "Vonage SMS API", webhook=True),
        Provider("sms_c", "sms", "MessageBird SMS API", webhook=True),
        Provider("email", "email", "SendGrid v3 mail/send", webhook=True),
        Provider("inbox", "inapp", "Herald's in-app inbox (Redis)", external=False),
    )
}

DEFAULT_PROVIDER: Mapping[str, str] = {"sms": "sms_a", "email": "email", "inapp": "inbox"}

EXTERNAL: tuple[str, ...] = tuple(n for n, p in PROVIDERS.items() if p.external)
WEBHOOK: tuple[str, ...] = tuple(n for n, p in PROVIDERS.items() if p.webhook)


def providers_of(channel: str) -> tuple[str, ...]:
    """The providers serving `channel`, in the table's order (empty for an unknown channel)."""
    return tuple(n for n, p in PROVIDERS.items() if p.channel == channel)


@dataclass(frozen=True, slots=True)
class CallbackRequest:
    """A provider's callback as the API received it, for its signature check."""

    url: str  # the public URL it was posted to (what a provider signs)
    headers: Mapping[str, str]  # lower-case names
    query: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class CallbackCredentials:
    """What a provider's callback check is given: its secret, and its non-secret settings
    (e.g. the Vonage signature method), each resolved by the API (api/settings.py)."""

    secret: str
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallbackCheck:
    """How the API verifies one provider's callbacks.

    `secret` names its secret: the key in its simulator's credentials.json, and its entry in
    HERALD_PROVIDERS_SECRETS (api/settings.py). `settings` are its non-secret settings with
    their defaults, read from the same credentials.json. `verify(request, credentials,
    max_skew_s)` returns None for an authentic callback, else why not: "missing_signature"
    (answered 401), "invalid_signature" or "stale_timestamp" (403). It never raises on
    malformed input.
    """

    secret: str
    verify: Callable[[CallbackRequest, CallbackCredentials, int], str | None]
    settings: Mapping[str, str] = field(default_factory=dict)
