"""The retry-class policy: every outcome class, failover rules, deadlines and expiry."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from herald.backoff import BackoffPolicy
from herald.outcomes import (
    CONNECT_ERROR,
    Accepted,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
    Unknown,
)
from herald.retry import (
    AttemptContext,
    Done,
    Expire,
    Failover,
    FailPermanent,
    MarkUnknown,
    PausePlatform,
    Retry,
    RetryPolicy,
    TokenCleanup,
    UnknownPolicy,
    decide,
    decide_refused,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(backoff=BackoffPolicy(base_s=1.0, cap_s=60.0, max_attempts=5))


def ctx(**overrides: object) -> AttemptContext:
    values: dict[str, object] = {
        "provider": "sms_a",
        "attempt": 1,
        "now": T0,
        "first_attempt_at": T0,
        "expire_at": T0 + timedelta(minutes=10),
        "alternates": ("sms_b",),
    }
    values.update(overrides)
    return AttemptContext(**values)  # type: ignore[arg-type]


def run(outcome: object, policy: RetryPolicy = POLICY, **overrides: object) -> object:
    return decide(outcome, ctx(**overrides), policy, rng=random.Random(0))  # type: ignore[arg-type]


def test_accepted_is_done() -> None:
    action = run(Accepted(provider="sms_a", provider_msg_id="SM1", status_code=201))
    assert action == Done("SM1") and action.state == "PROVIDER_ACCEPTED"


def test_token_dead_cleans_that_token_and_fails_permanently() -> None:
    action = run(TokenDead(provider="apns", reason="unregistered", status_code=410))
    assert action == TokenCleanup("unregistered") and action.state == "FAILED_PERMANENT"


@pytest.mark.parametrize("reason", ["invalid_number", "status_3", "status_12"])
def test_permanent_for_the_recipient_never_fails_over(reason: str) -> None:
    action = run(Permanent(provider="sms_a", reason=reason, status_code=400))
    assert action == FailPermanent(reason)
    assert not action.dead_letter


@pytest.mark.parametrize("reason", ["21211", "21614", "http_400:personalizations.0.to.0.email"])
def test_a_rejected_address_is_disabled_and_never_fails_over(reason: str) -> None:
    action = run(Permanent(provider="sms_a", reason=reason, status_code=400))
    assert action == TokenCleanup(reason) and action.state == "FAILED_PERMANENT"


@pytest.mark.parametrize("reason", ["http_400:from.email", "http_400:subject", "http_400"])
def test_other_email_rejections_keep_the_address(reason: str) -> None:
    action = run(Permanent(provider="email", reason=reason, status_code=400), alternates=())
    assert action == FailPermanent(reason)


@pytest.mark.parametrize("reason", ["21408", "status_15", "sender_blocked"])
def test_explicit_provider_rejection_fails_over_a_to_b(reason: str) -> None:
    action = run(Permanent(provider="sms_a", reason=reason, status_code=400))
    assert action == Failover("sms_b", f"rejected:{reason}")


def test_provider_rejection_without_eligible_alternate_fails() -> None:
    outcome = Permanent(provider="sms_b", reason="sender_blocked")
    assert run(outcome, provider="sms_b", rejected_by=frozenset({"sms_a"})) == FailPermanent(
        "sender_blocked"
    )
    assert run(outcome, alternates=()) == FailPermanent("sender_blocked")
    assert run(outcome, open_breakers=frozenset({"sms_b"})) == FailPermanent("sender_blocked")


def test_connect_error_fails_over_other_retryables_back_off() -> None:
    connect = Retryable(provider="sms_a", reason=CONNECT_ERROR)
    assert run(connect) == Failover("sms_b", CONNECT_ERROR)
    server = run(Retryable(provider="sms_a", reason="http_503", status_code=503))
    assert isinstance(server, Retry) and server.reason == "http_503"
    assert T0 <= server.at <= T0 + timedelta(seconds=1) and server.counts_as_attempt


def test_connect_error_without_alternate_backs_off() -> None:
    action = run(Retryable(provider="apns", reason=CONNECT_ERROR), provider="apns", alternates=())
    assert isinstance(action, Retry)


def test_429_honours_retry_after_as_floor() -> None:
    action = run(RateLimited(provider="fcm", retry_after=20.0, status_code=429), attempt=2)
    assert isinstance(action, Retry) and action.reason == "rate_limited"
    assert T0 + timedelta(seconds=20) <= action.at <= T0 + timedelta(seconds=40)


def test_429_never_fails_over() -> None:
    action = run(RateLimited(provider="sms_a", retry_after=None))
    assert isinstance(action, Retry)


def test_retries_exhausted_go_to_the_dead_letter_topic() -> None:
    action = run(Retryable(provider="sms_a", reason="http_500"), attempt=5, alternates=())
    assert action == FailPermanent("retries_exhausted:http_500", dead_letter=True)


def test_total_deadline_exceeded_goes_to_dead_letter() -> None:
    policy = RetryPolicy(backoff=BackoffPolicy(max_attempts=50, max_total_s=30.0))
    action = run(
        Retryable(provider="sms_a", reason="http_500"),
        policy,
        now=T0 + timedelta(seconds=31),
        expire_at=None,
        attempt=3,
    )
    assert action == FailPermanent("deadline_exceeded:http_500", dead_letter=True)


def test_expired_before_the_next_retry_is_expired() -> None:
    late = T0 + timedelta(minutes=10)
    assert run(Retryable(provider="sms_a", reason="http_500"), now=late) == Expire()
    # Retry-After floor beyond expire_at: no retry can start in time.
    action = run(RateLimited(provider="sms_a", retry_after=900.0))
    assert action == Expire() and action.state == "EXPIRED"


def test_platform_error_pauses_provider_and_requeues_without_counting() -> None:
    policy = RetryPolicy(platform_pause_s=60.0)
    action = run(PlatformError(provider="apns", reason="invalid_provider_token"), policy,
                 provider="apns", alternates=())  # fmt: skip
    assert isinstance(action, PausePlatform)
    assert action.provider == "apns" and action.pause_s == 60.0 and action.failover_to is None
    assert T0 + timedelta(seconds=60) <= action.requeue_at <= T0 + timedelta(seconds=120)


def test_platform_error_on_sms_a_sends_the_message_through_b() -> None:
    action = run(PlatformError(provider="sms_a", reason="auth_failed", status_code=401))
    assert isinstance(action, PausePlatform) and action.failover_to == "sms_b"


def test_platform_pause_requeues_are_spread_over_the_pause() -> None:
    rng = random.Random(11)
    outcome = PlatformError(provider="apns", reason="auth")
    times = [decide(outcome, ctx(provider="apns", alternates=()), POLICY, rng) for _ in range(500)]
    offsets = sorted((a.requeue_at - T0).total_seconds() for a in times)  # type: ignore[union-attr]
    assert offsets[-1] - offsets[0] > 50.0


def test_unknown_is_recorded_and_reconciled_never_failed_over_by_default() -> None:
    action = run(Unknown(provider="sms_a", reason="read_timeout"))
    assert action == MarkUnknown("read_timeout") and action.state == "UNKNOWN"
    assert action.then is None


def test_unknown_may_fail_over_only_when_the_type_allows_duplicates() -> None:
    policy = RetryPolicy(on_unknown=UnknownPolicy.FAILOVER)
    action = run(Unknown(provider="sms_a", reason="read_timeout"), policy)
    assert isinstance(action, MarkUnknown)
    assert action.then == Failover("sms_b", "unknown:read_timeout")


def test_unknown_retry_policy_retries_the_same_provider() -> None:
    policy = RetryPolicy(on_unknown=UnknownPolicy.RETRY)
    action = run(Unknown(provider="apns", reason="stream_reset"), policy, alternates=())
    assert isinstance(action, MarkUnknown) and isinstance(action.then, Retry)
    # Out of attempts: still UNKNOWN, no follow-up.
    policy = RetryPolicy(backoff=BackoffPolicy(max_attempts=2), on_unknown=UnknownPolicy.RETRY)
    action = run(Unknown(provider="apns", reason="stream_reset"), policy, attempt=2)
    assert action == MarkUnknown("stream_reset")


def test_breaker_refusal_fails_over_or_requeues_without_counting() -> None:
    assert decide_refused(ctx(), POLICY, retry_in_s=20.0) == Failover("sms_b", "breaker_open")
    both_open = ctx(open_breakers=frozenset({"sms_a", "sms_b"}))
    action = decide_refused(both_open, POLICY, retry_in_s=20.0, rng=random.Random(2))
    assert isinstance(action, Retry) and not action.counts_as_attempt
    assert T0 + timedelta(seconds=20) <= action.at <= T0 + timedelta(seconds=40)


def test_breaker_refusal_past_expiry_expires() -> None:
    expired = ctx(alternates=(), expire_at=T0 + timedelta(seconds=5))
    assert decide_refused(expired, POLICY, retry_in_s=30.0, rng=random.Random(1)) == Expire()


@pytest.mark.parametrize(
    "outcome",
    [
        Retryable(provider="sms_a", reason="http_500"),
        RateLimited(provider="sms_a", retry_after=3.0),
        Retryable(provider="sms_a", reason=CONNECT_ERROR),
    ],
)
def test_every_retry_is_before_expiry(outcome: object) -> None:
    rng = random.Random(4)
    expire_at = T0 + timedelta(seconds=30)
    for attempt in range(1, 5):
        c = ctx(attempt=attempt, alternates=(), expire_at=expire_at)
        action = decide(outcome, c, POLICY, rng)  # type: ignore[arg-type]
        assert isinstance(action, Retry | Expire)
        if isinstance(action, Retry):
            assert T0 <= action.at < expire_at
