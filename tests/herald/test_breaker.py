"""Circuit breaker shared through a real Redis: open on error rate, half-open probes, close."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis

from herald.breaker import (
    Admission,
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    counts_as_failure,
)
from herald.outcomes import (
    Accepted,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
    TokenDead,
    Unknown,
)

# Two timings, so that no assertion depends on the machine being fast: tests that check
# "still open" use a long cool-down; tests that need half-open use a short one (and a long probe
# timeout unless they test it).
CFG = BreakerConfig(
    window_s=5.0,
    bucket_s=0.5,
    min_volume=10,
    error_rate=0.5,
    cooldown_s=10.0,
    probes=2,
    probe_timeout_s=10.0,
    sync_interval_s=0.05,
    flush_every=5,
)
FAST = replace(CFG, cooldown_s=0.3)


@pytest.fixture
def url(stack) -> str:  # type: ignore[no-untyped-def]
    return str(stack.settings.redis.url)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def make(url: str, prefix: str) -> Callable[..., CircuitBreaker]:
    """A breaker as one worker process builds it: its own client and local cache."""

    def build(config: BreakerConfig = CFG) -> CircuitBreaker:
        return CircuitBreaker(redis.Redis.from_url(url), config, prefix=prefix)

    return build


def feed(breaker: CircuitBreaker, provider: str, ok: int, failed: int) -> None:
    for _ in range(ok):
        breaker.record(provider, True)
    for _ in range(failed):
        breaker.record(provider, False)
    breaker.flush()


def open_breaker(breaker: CircuitBreaker, provider: str) -> None:
    feed(breaker, provider, ok=4, failed=8)
    assert breaker.state(provider) is BreakerState.OPEN


def test_stays_closed_below_the_minimum_volume(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make()
    feed(breaker, "sms_a", ok=0, failed=9)
    assert breaker.state("sms_a") is BreakerState.CLOSED
    assert breaker.allow("sms_a").allowed


def test_stays_closed_below_the_error_rate(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make()
    feed(breaker, "sms_a", ok=12, failed=8)
    snap = breaker.snapshot(["sms_a"])[0]
    assert snap.state is BreakerState.CLOSED
    assert (snap.successes, snap.failures) == (12, 8) and snap.error_rate == pytest.approx(0.4)


def test_opens_on_error_rate_and_every_process_sees_it(
    make: Callable[..., CircuitBreaker],
) -> None:
    worker_a, worker_b = make(), make()
    assert worker_b.allow("sms_a").allowed  # b caches "closed"
    open_breaker(worker_a, "sms_a")
    refused = worker_a.allow("sms_a")
    assert not refused.allowed and refused.state is BreakerState.OPEN
    assert CFG.cooldown_s - 5 < refused.retry_in_s <= CFG.cooldown_s
    time.sleep(CFG.sync_interval_s)  # the documented staleness bound of b's cache
    assert not worker_b.allow("sms_a").allowed
    snap = worker_b.snapshot(["sms_a"])[0]
    assert snap.trips == 1 and snap.reason == "error_rate"


def test_errors_from_several_processes_add_up(make: Callable[..., CircuitBreaker]) -> None:
    workers = [make() for _ in range(4)]
    for w in workers:
        feed(w, "apns", ok=1, failed=2)  # 3 calls each: no single process reaches min_volume
    assert workers[0].state("apns") is BreakerState.OPEN


def test_half_open_lets_exactly_n_probes_through_across_processes(
    make: Callable[..., CircuitBreaker],
) -> None:
    workers = [make(FAST) for _ in range(3)]
    open_breaker(workers[0], "fcm")
    time.sleep(FAST.cooldown_s + 0.05)
    admissions = [w.allow("fcm") for w in workers for _ in range(2)]
    probes = [a for a in admissions if a.allowed]
    assert len(probes) == CFG.probes and all(a.probe for a in probes)
    assert all(a.state is BreakerState.HALF_OPEN for a in admissions)
    assert workers[0].state("fcm") is BreakerState.HALF_OPEN


def test_probe_success_closes(make: Callable[..., CircuitBreaker]) -> None:
    a, b = make(FAST), make(FAST)
    open_breaker(a, "sms_b")
    time.sleep(FAST.cooldown_s + 0.05)
    probe = a.allow("sms_b")
    assert probe.probe
    a.record("sms_b", True, probe=True)
    assert a.state("sms_b") is BreakerState.CLOSED
    assert a.allow("sms_b") == Admission(True, BreakerState.CLOSED)
    time.sleep(CFG.sync_interval_s)
    assert b.allow("sms_b").allowed
    assert a.snapshot(["sms_b"])[0].failures == 0  # the window restarts empty


def test_probe_failure_reopens_for_a_new_cooldown(make: Callable[..., CircuitBreaker]) -> None:
    open_breaker(make(FAST), "email")
    time.sleep(FAST.cooldown_s + 0.05)
    breaker = make()  # the cool-down travels with each call: this one re-opens for CFG's
    assert breaker.allow("email").probe
    breaker.record("email", False, probe=True)
    snap = breaker.snapshot(["email"])[0]
    assert snap.state is BreakerState.OPEN and snap.reason == "probe_failed" and snap.trips == 2
    assert snap.retry_in_s > CFG.cooldown_s - 5


def test_lost_probes_are_reissued_after_the_probe_timeout(
    make: Callable[..., CircuitBreaker],
) -> None:
    config = replace(FAST, probe_timeout_s=1.0)
    breaker = make(config)
    open_breaker(breaker, "sms_a")
    time.sleep(config.cooldown_s + 0.05)
    assert breaker.allow("sms_a").probe and breaker.allow("sms_a").probe  # both never reported
    assert not make(config).allow("sms_a").allowed
    time.sleep(config.probe_timeout_s + 0.05)
    assert make(config).allow("sms_a").probe


def test_trip_pauses_a_provider_then_probes(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make()
    breaker.trip("apns", "auth_failed", for_s=60.0)
    refused = make().allow("apns")
    assert not refused.allowed and 50.0 < refused.retry_in_s <= 60.0
    assert breaker.snapshot(["apns"])[0].reason == "auth_failed"
    breaker.trip("apns", "auth_failed", for_s=0.2)  # a short pause, then probes as usual
    time.sleep(0.25)
    assert make().allow("apns").probe
    breaker.reset("apns")
    assert breaker.state("apns") is BreakerState.CLOSED


def test_closed_fast_path_needs_no_round_trip_per_call(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    calls = {"n": 0}
    real = client.evalsha

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return real(*args, **kwargs)

    client.evalsha = counting  # type: ignore[method-assign]
    config = BreakerConfig(sync_interval_s=10.0, flush_every=100, min_volume=1000)
    # a clock that stands still: a slow machine must not make the sync interval come due
    breaker = CircuitBreaker(client, config, prefix=prefix, clock=lambda: 1000.0)
    for _ in range(1000):
        assert breaker.allow("push").allowed
        breaker.record("push", True)
    assert calls["n"] <= 11  # one first sync, then one flush per 100 recorded calls


def test_outcome_classification() -> None:
    assert counts_as_failure(Retryable(provider="p", reason="http_503")) is True
    assert counts_as_failure(Unknown(provider="p", reason="timeout")) is True
    assert counts_as_failure(PlatformError(provider="p", reason="auth")) is True
    assert counts_as_failure(Accepted(provider="p", provider_msg_id="x")) is False
    assert counts_as_failure(Permanent(provider="p", reason="invalid_number")) is False
    assert counts_as_failure(TokenDead(provider="p", reason="unregistered")) is False
    assert counts_as_failure(RateLimited(provider="p", retry_after=1.0)) is None


def test_record_outcome_reports_probes(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(FAST)
    open_breaker(breaker, "sms_a")
    time.sleep(FAST.cooldown_s + 0.05)
    admission = breaker.allow("sms_a")
    breaker.record_outcomes([(Accepted(provider="sms_a", provider_msg_id="m"), admission)])
    assert breaker.state("sms_a") is BreakerState.CLOSED


def test_a_batch_of_answers_is_synced_once_and_can_open_the_breaker(
    make: Callable[..., CircuitBreaker], monkeypatch: pytest.MonkeyPatch
) -> None:
    breaker = make()
    closed = breaker.allow("sms_a")
    ops: list[str] = []
    run = breaker._run
    monkeypatch.setattr(breaker, "_run", lambda provider, op, *a, **kw: (
        ops.append(op), run(provider, op, *a, **kw))[1])  # fmt: skip
    answers = [
        *((Accepted(provider="sms_a", provider_msg_id=f"m{i}"), closed) for i in range(4)),
        *((Retryable(provider="sms_a", reason="http_503"), closed) for _ in range(8)),
        (RateLimited(provider="sms_a", retry_after=1.0), closed),  # not counted
    ]
    breaker.record_outcomes(answers)  # 12 counted: more than flush_every (5), one sync
    assert ops == ["sync"]
    breaker.record_outcomes([(Retryable(provider="sms_a", reason="http_503"), closed)])
    assert ops == ["sync"]  # open now: a stale admission's answer is not counted
    snap = breaker.snapshot(["sms_a"])[0]
    assert snap.state is BreakerState.OPEN and snap.trips == 1 and snap.reason == "error_rate"


def _fail_from_another_process(url: str, prefix: str) -> None:
    breaker = CircuitBreaker(redis.Redis.from_url(url), CFG, prefix=prefix)
    feed(breaker, "sms_a", ok=2, failed=10)


def test_state_is_shared_with_a_real_other_process(url: str, prefix: str) -> None:
    local = CircuitBreaker(redis.Redis.from_url(url), CFG, prefix=prefix)
    assert local.allow("sms_a").allowed
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_fail_from_another_process, args=(url, prefix))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    time.sleep(CFG.sync_interval_s)
    assert not local.allow("sms_a").allowed
