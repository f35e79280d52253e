"""The retry-class policy: one provider outcome + the delivery's context → the next action.

Pure logic, no I/O (SPEC §4, seed 001). The dispatch sink calls `decide()` after every provider
call and `decide_refused()` when the provider's circuit breaker refused the call, then carries
the action out (events, guard, retry topic, DLQ, token store, breaker):

    outcome                           action
    Accepted                          Done                 → PROVIDER_ACCEPTED
    TokenDead                         TokenCleanup         → FAILED_PERMANENT, remove that token
    Permanent, provider-level reason  Failover if an alternate is eligible, else FailPermanent
    Permanent, recipient/message      FailPermanent        → FAILED_PERMANENT
    PlatformError (auth/config)       PausePlatform        pause provider + alert; re-queue the
                                                           message, not counted as an attempt
    Retryable(connect_error)          Failover if eligible, else Retry (backoff)
    Retryable (5xx, network)          Retry with full-jitter backoff (honouring retry_after)
    RateLimited (429)                 Retry, Retry-After as the floor of the jittered delay
    Unknown (post-send timeout)       MarkUnknown → UNKNOWN, reconcile; `then` is a Retry or a
                                      Failover only if the type's policy accepts duplicates
    past expire_at                    Expire               → EXPIRED
    retries exhausted / deadline      FailPermanent(dead_letter=True) → DLQ (replayable)

Failover (SMS A→B) happens only when the first provider certainly did not send: an explicit
rejection for a provider-level reason, a connection failure before the request left, or an open
breaker — never after `Unknown` unless `RetryPolicy.on_unknown` is FAILOVER.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import ClassVar

from herald.backoff import BackoffPolicy, Rng, deadline_of, next_attempt_at
from herald.outcomes import (
    Accepted,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
    Unknown,
)

__all__ = [
    "RECIPIENT_REASONS",
    "DEAD_ADDRESS_REASONS",
    "Action",
    "AttemptContext",
    "Done",
    "Expire",
    "FailPermanent",
    "Failover",
    "MarkUnknown",
    "PausePlatform",
    "Retry",
    "RetryPolicy",
    "TokenCleanup",
    "UnknownPolicy",
    "decide",
    "decide_refused",
    "is_dead_address",
]

RECIPIENT_REASONS: frozenset[str] = frozenset(
    {
        # generic names
        "missing_address", "invalid_number", "invalid_recipient", "invalid_address",
        "invalid_token", "unregistered", "landline", "opted_out", "unsubscribed",
        "invalid_payload", "payload_too_large", "message_too_long", "http_413",
        # Twilio error codes (PROVIDERS.md §6): invalid To, not SMS-capable
        "21211", "21614",
        # Vonage statuses: missing params, invalid params, invalid message, too long
        "status_2", "status_3", "status_6", "status_12",
    }
)  # fmt: skip
"""`Permanent.reason`s about the recipient or the message: another provider would refuse them
too, so they never fail over. Every other Permanent reason is taken as the provider's own
explicit rejection (Twilio 21408 region disabled, Vonage status_15 invalid sender, a content
filter, a bare http_400) and may fail over: an unknown reason costs at most one refused attempt
on the alternate, never a duplicate (the first provider explicitly did not send)."""


DEAD_ADDRESS_REASONS: frozenset[str] = frozenset({"21211", "21614"})
"""`Permanent.reason`s that reject the address itself (Twilio: invalid To number, number not
SMS-capable): like a dead device token, the address is disabled (`TokenCleanup`). Reasons that
already come as `TokenDead` (Twilio 21610/30006, Vonage status 7, APNs 410...) need no entry.
Vonage's status 3 ("invalid params") is not here: it does not say the number is at fault."""


def is_dead_address(reason: str, policy: RetryPolicy) -> bool:
    """Whether a permanent rejection disables the address (see DEAD_ADDRESS_REASONS).

    SendGrid's 400 naming a recipient's address field (`personalizations.N.to.M.email`) is the
    email equivalent: the address itself is invalid.
    """
    if reason in policy.dead_address_reasons:
        return True
    field = reason.partition(":")[2]
    return (
        reason.startswith("http_400:")
        and field.startswith("personalizations.")
        and (".to." in field and field.endswith(".email"))
    )


_SYSTEM_RNG: Rng = random.SystemRandom()


class UnknownPolicy(StrEnum):
    """What a type does after `Unknown` (the provider may already have sent it)."""

    RECONCILE = "reconcile"  # record UNKNOWN, wait for receipts/reconciliation (default)
    RETRY = "retry"  # also retry the same provider (type accepts duplicates)
    FAILOVER = "failover"  # also fail over to an alternate (type accepts duplicates)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The retry/failover rules of one notification type (from the type catalog)."""

    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    on_unknown: UnknownPolicy = UnknownPolicy.RECONCILE
    recipient_reasons: frozenset[str] = RECIPIENT_REASONS
    dead_address_reasons: frozenset[str] = DEAD_ADDRESS_REASONS
    platform_pause_s: float = 60.0  # provider pause (breaker forced open) after a PlatformError


@dataclass(frozen=True, slots=True)
class AttemptContext:
    """Where a delivery stands after an attempt (or a refused one).

    `attempt` is the 1-based number of the attempt just made (`Delivery.attempt + 1`).
    `alternates` lists the providers of the same channel this delivery may fail over to, in
    order (from the type's failover rules / the delivery's fallback steps); `rejected_by` those
    that explicitly rejected it already; `open_breakers` the providers whose breaker is open now.
    `first_attempt_at` None means no attempt was made before this one (it starts now).
    All datetimes are timezone-aware.
    """

    provider: str
    attempt: int
    now: datetime
    first_attempt_at: datetime | None = None
    expire_at: datetime | None = None
    alternates: tuple[str, ...] = ()
    rejected_by: frozenset[str] = frozenset()
    open_breakers: frozenset[str] = frozenset()

    @property
    def started_at(self) -> datetime:
        """Start of the total-deadline clock."""
        return self.first_attempt_at or self.now


@dataclass(frozen=True, slots=True)
class Done:
    """The provider accepted the message (→ PROVIDER_ACCEPTED; mark the guard SENT)."""

    state: ClassVar[str] = "PROVIDER_ACCEPTED"
    provider_msg_id: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Schedule another attempt at `at` via the retry topic (→ RETRY_SCHEDULED).

    `counts_as_attempt` is False when no provider attempt was made (breaker refused the call).
    """

    state: ClassVar[str] = "RETRY_SCHEDULED"
    at: datetime
    reason: str
    counts_as_attempt: bool = True


@dataclass(frozen=True, slots=True)
class Failover:
    """Send now through `to_provider` (same delivery_id; the first certainly did not send)."""

    state: ClassVar[str] = "RETRY_SCHEDULED"
    to_provider: str
    reason: str


@dataclass(frozen=True, slots=True)
class FailPermanent:
    """Stop (→ FAILED_PERMANENT); `dead_letter` also writes the DLQ for a later replay."""

    state: ClassVar[str] = "FAILED_PERMANENT"
    reason: str
    dead_letter: bool = False


@dataclass(frozen=True, slots=True)
class TokenCleanup:
    """The address is dead (→ FAILED_PERMANENT): remove that device token/address only."""

    state: ClassVar[str] = "FAILED_PERMANENT"
    reason: str


@dataclass(frozen=True, slots=True)
class PausePlatform:
    """Auth/config failure: pause `provider` (trip its breaker for `pause_s`) and alert.

    The message itself goes to `failover_to` now when an alternate is eligible (the provider
    refused it explicitly), else it is re-queued for `requeue_at` (jittered over the pause)
    without counting an attempt: no per-message retries hammer a misconfigured provider.
    """

    state: ClassVar[str] = "RETRY_SCHEDULED"
    provider: str
    reason: str
    pause_s: float
    requeue_at: datetime
    failover_to: str | None = None


@dataclass(frozen=True, slots=True)
class MarkUnknown:
    """Outcome unknown (→ UNKNOWN): reconcile from receipts/polls; `then` is a follow-up attempt
    only when the type accepts duplicates (None otherwise). Keep the send guard (don't release)."""

    state: ClassVar[str] = "UNKNOWN"
    reason: str
    then: Retry | Failover | None = None


@dataclass(frozen=True, slots=True)
class Expire:
    """`expire_at` passed, or will pass before any allowed retry (→ EXPIRED)."""

    state: ClassVar[str] = "EXPIRED"
    reason: str = "expired"


Action = (
    Done | Retry | Failover | FailPermanent | TokenCleanup | PausePlatform | MarkUnknown | Expire
)


def decide(
    outcome: Outcome, ctx: AttemptContext, policy: RetryPolicy, rng: Rng | None = None
) -> Action:
    """The next action after `outcome` of attempt `ctx.attempt` through `ctx.provider`."""
    if isinstance(outcome, Accepted):
        return Done(outcome.provider_msg_id)
    if isinstance(outcome, TokenDead):
        return TokenCleanup(outcome.reason)
    if isinstance(outcome, Permanent):
        if is_dead_address(outcome.reason, policy):
            return TokenCleanup(outcome.reason)
        return _on_permanent(outcome, ctx, policy)
    if isinstance(outcome, Unknown):
        return _on_unknown(outcome, ctx, policy, rng)
    if _expired(ctx):
        return Expire()
    if isinstance(outcome, PlatformError):
        return _pause(outcome, ctx, policy, rng)
    if isinstance(outcome, Retryable) and outcome.before_send:
        target = _failover_target(ctx)
        if target is not None:
            return Failover(target, outcome.reason)
    if isinstance(outcome, RateLimited):
        return _backoff(ctx, policy, "rate_limited", outcome.retry_after, rng)
    return _backoff(ctx, policy, outcome.reason, outcome.retry_after, rng)


def decide_refused(
    ctx: AttemptContext, policy: RetryPolicy, retry_in_s: float, rng: Rng | None = None
) -> Action:
    """The breaker of `ctx.provider` refused the call (open, or half-open with no probe left).

    No attempt was made, so `ctx.attempt` is the number of the attempt that was refused and is
    not counted: fail over to an eligible alternate now, else re-queue for when the breaker may
    let calls through again (jittered, so a closing breaker does not meet a synchronized wave).
    """
    if _expired(ctx):
        return Expire()
    target = _failover_target(ctx)
    if target is not None:
        return Failover(target, "breaker_open")
    floor = max(retry_in_s, 0.0)
    at = ctx.now + timedelta(seconds=floor + _uniform(rng, max(floor, policy.backoff.base_s)))
    deadline = deadline_of(policy.backoff, ctx.started_at, ctx.expire_at)
    if deadline is not None and at >= deadline:
        return _give_up(ctx, policy, "breaker_open", counted=False)
    return Retry(at, "breaker_open", counts_as_attempt=False)


def _on_permanent(outcome: Permanent, ctx: AttemptContext, policy: RetryPolicy) -> Action:
    if outcome.reason not in policy.recipient_reasons and not _expired(ctx):
        target = _failover_target(ctx, rejected=ctx.provider)
        if target is not None:
            return Failover(target, f"rejected:{outcome.reason}")
    return FailPermanent(outcome.reason)


def _on_unknown(
    outcome: Unknown, ctx: AttemptContext, policy: RetryPolicy, rng: Rng | None
) -> MarkUnknown:
    then: Retry | Failover | None = None
    if policy.on_unknown is UnknownPolicy.FAILOVER and not _expired(ctx):
        target = _failover_target(ctx)
        if target is not None:
            then = Failover(target, f"unknown:{outcome.reason}")
    if then is None and policy.on_unknown is not UnknownPolicy.RECONCILE:
        follow = _backoff(ctx, policy, f"unknown:{outcome.reason}", None, rng)
        then = follow if isinstance(follow, Retry) else None
    return MarkUnknown(outcome.reason, then)


def _pause(
    outcome: PlatformError, ctx: AttemptContext, policy: RetryPolicy, rng: Rng | None
) -> PausePlatform:
    pause = policy.platform_pause_s
    requeue_at = ctx.now + timedelta(seconds=pause + _uniform(rng, pause))
    target = _failover_target(ctx)
    return PausePlatform(ctx.provider, outcome.reason, pause, requeue_at, failover_to=target)


def _backoff(
    ctx: AttemptContext,
    policy: RetryPolicy,
    reason: str,
    retry_after: float | None,
    rng: Rng | None,
) -> Action:
    at = next_attempt_at(
        policy.backoff,
        attempt=ctx.attempt,
        now=ctx.now,
        first_attempt_at=ctx.started_at,
        expire_at=ctx.expire_at,
        retry_after=retry_after,
        rng=rng,
    )
    if at is None:
        return _give_up(ctx, policy, reason)
    return Retry(at, reason)


def _give_up(
    ctx: AttemptContext, policy: RetryPolicy, reason: str, *, counted: bool = True
) -> Action:
    """Out of attempts → dead-letter; out of time → EXPIRED when expire_at is the binding limit
    (it comes no later than the total deadline), else dead-letter as deadline_exceeded."""
    if counted and ctx.attempt >= policy.backoff.max_attempts:
        return FailPermanent(f"retries_exhausted:{reason}", dead_letter=True)
    deadline = deadline_of(policy.backoff, ctx.started_at, ctx.expire_at)
    if ctx.expire_at is not None and ctx.expire_at == deadline:
        return Expire()
    return FailPermanent(f"deadline_exceeded:{reason}", dead_letter=True)


def _failover_target(ctx: AttemptContext, rejected: str | None = None) -> str | None:
    excluded = ctx.rejected_by | {ctx.provider} | ctx.open_breakers
    if rejected is not None:
        excluded = excluded | {rejected}
    return next((p for p in ctx.alternates if p not in excluded), None)


def _expired(ctx: AttemptContext) -> bool:
    return ctx.expire_at is not None and ctx.now >= ctx.expire_at


def _uniform(rng: Rng | None, spread: float) -> float:
    return (rng or _SYSTEM_RNG).uniform(0.0, spread)
