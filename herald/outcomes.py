"""Typed outcomes of one provider call, as returned by every client in `sinks/providers/`.

Pure module (no dependencies): the dispatch sinks, retry policy and circuit breakers branch on
these classes; events and dead letters use `kind` and `as_dict()`.

    Outcome = Accepted        provider took the message (provider_msg_id for receipts)
            | Retryable       transient (5xx, network, connect error): back off and retry
            | RateLimited     429-style throttling: wait `retry_after` (if given), then retry
            | Permanent       this message can never succeed (bad payload, invalid number)
            | TokenDead       the address is gone (APNs 410, FCM UNREGISTERED): remove it
            | PlatformError   credentials/config/account problem: pause the provider, alert
            | Unknown         request may have been sent but no answer: do not blindly retry

`Lookup` is what a provider's own records say of a message whose outcome was Unknown
(reconciliation, sinks/dispatch/reconcile.py): found (sent), not found (never got it), or
cannot tell.

Every outcome carries `provider`, `status_code` (None when no HTTP response was read) and
`latency_ms` (wall time of the call, including an internal auth refresh retry).

`Retryable(reason=CONNECT_ERROR)` means the request never left this process (connection refused,
TLS or DNS failure, pool timeout): SMS failover may apply. A timeout or reset after the request
was written is `Unknown`, never `Retryable`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

__all__ = [
    "CONNECT_ERROR",
    "Accepted",
    "Outcome",
    "Permanent",
    "PlatformError",
    "RateLimited",
    "Retryable",
    "TokenDead",
    "Unknown",
    "Lookup",
    "is_retryable",
]

CONNECT_ERROR = "connect_error"
"""`Retryable.reason` for failures before any byte of the request reached the provider."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _OutcomeBase:
    """Fields shared by every outcome."""

    kind: ClassVar[str] = "outcome"

    provider: str
    status_code: int | None = None
    latency_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict with `kind` first (for delivery events and logs; holds no message data)."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True, slots=True)
class Accepted(_OutcomeBase):
    """The provider accepted the message; `provider_msg_id` correlates later receipts."""

    kind: ClassVar[str] = "accepted"
    provider_msg_id: str


@dataclass(frozen=True, slots=True)
class Retryable(_OutcomeBase):
    """A transient failure: retry with backoff; honour `retry_after` seconds when not None."""

    kind: ClassVar[str] = "retryable"
    reason: str
    retry_after: float | None = None

    @property
    def before_send(self) -> bool:
        """True when the request certainly never reached the provider (failover is safe)."""
        return self.reason == CONNECT_ERROR


@dataclass(frozen=True, slots=True)
class RateLimited(_OutcomeBase):
    """The provider throttled us; wait `retry_after` seconds (None = not told) and retry."""

    kind: ClassVar[str] = "rate_limited"
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Permanent(_OutcomeBase):
    """This message can never succeed as sent (→ FAILED_PERMANENT); never retry."""

    kind: ClassVar[str] = "permanent"
    reason: str


@dataclass(frozen=True, slots=True)
class TokenDead(_OutcomeBase):
    """The address (device token, number, mailbox) is dead: disable it; never retry."""

    kind: ClassVar[str] = "token_dead"
    reason: str


@dataclass(frozen=True, slots=True)
class PlatformError(_OutcomeBase):
    """Auth/config/account failure on our side: pause the provider and alert, don't retry."""

    kind: ClassVar[str] = "platform_error"
    reason: str


@dataclass(frozen=True, slots=True)
class Unknown(_OutcomeBase):
    """The request may have been sent but no answer came (→ UNKNOWN, reconcile)."""

    kind: ClassVar[str] = "unknown"
    reason: str


Outcome = Accepted | Retryable | RateLimited | Permanent | TokenDead | PlatformError | Unknown


def is_retryable(outcome: Outcome) -> bool:
    """Whether the retry policy may schedule another attempt (Retryable or RateLimited)."""
    return isinstance(outcome, Retryable | RateLimited)


@dataclass(frozen=True, slots=True)
class Lookup:
    """A provider's answer about one delivery: `found` True (it has the message, id
    `provider_msg_id`), False (it never got it) or None (cannot tell: no lookup, an error)."""

    found: bool | None
    provider_msg_id: str = ""
