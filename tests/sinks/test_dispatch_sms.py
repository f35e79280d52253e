"""SMS failover A→B and the circuit breaker, against real Twilio- and Vonage-shaped simulators."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from herald.breaker import BreakerState
from infra.process import free_port
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.providers import TwilioClient
from tests.conftest import RunningStack
from tests.sinks.dispatch_helpers import accepted_for, delivery, factories, harness, states
from tests.sinks.providers.helpers import twilio_config

pytestmark = pytest.mark.integration

PHONE = "+15005550006"


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningSimulator]]:
    tmp = tmp_path_factory.mktemp("sims")
    started = {name: start_simulator(name, tmp / name) for name in ("sms_a", "sms_b")}
    yield started
    for sim in started.values():
        sim.stop()


@pytest.fixture
def fresh(sims: dict[str, RunningSimulator]) -> dict[str, RunningSimulator]:
    for sim in sims.values():
        sim.reset(config=True)
    return sims


@pytest.fixture
def url(stack: RunningStack) -> str:
    return stack.settings.redis.url


def providers_of(events: list[dict]) -> list[tuple[str, str | None, int]]:
    return [(e["state"], e["provider"], e["attempt"]) for e in events]


def test_explicit_rejection_fails_over_to_b(fresh: dict, url: str) -> None:
    fresh["sms_a"].configure(errors={"21408": 1.0})  # region disabled: A's own refusal
    d = delivery("sms", address="+15005550101")
    with harness(url, factories(fresh, url)) as h:
        out = h.run([d])
    assert providers_of(out.events) == [
        ("SENDING", "sms_a", 1), ("RETRY_SCHEDULED", "sms_a", 1),
        ("SENDING", "sms_b", 2), ("PROVIDER_ACCEPTED", "sms_b", 2),
    ]  # fmt: skip
    assert out.events[1]["reason"] == "failover:rejected:21408"
    assert accepted_for(fresh["sms_b"], "15005550101") == 1  # Vonage numbers lose the "+"


def test_recipient_rejection_never_fails_over(fresh: dict, url: str) -> None:
    fresh["sms_a"].configure(errors={"21211": 1.0})  # invalid number: B would refuse it too
    with harness(url, factories(fresh, url)) as h:
        out = h.run([delivery("sms")])
    assert states(out)[-1] == ("FAILED_PERMANENT", "21211")
    assert fresh["sms_b"].stats()["requests"] == 0


def test_connection_failure_fails_over(fresh: dict, url: str) -> None:
    fac = factories(fresh, url)
    dead = free_port("127.0.0.1")
    fac["sms_a"] = lambda: TwilioClient(
        twilio_config(fresh["sms_a"]).model_copy(update={"base_url": f"http://127.0.0.1:{dead}"})
    )
    with harness(url, fac) as h:
        out = h.run([delivery("sms")])
    assert out.events[1]["reason"] == "failover:connect_error"
    assert providers_of(out.events)[-1] == ("PROVIDER_ACCEPTED", "sms_b", 2)


def test_open_breaker_fails_over_without_calling_a(fresh: dict, url: str) -> None:
    with harness(url, factories(fresh, url)) as h:
        h.breaker.trip("sms_a", "test", 30.0)
        out = h.run([delivery("sms")])
    assert providers_of(out.events) == [
        ("RETRY_SCHEDULED", "sms_a", 1), ("SENDING", "sms_b", 1), ("PROVIDER_ACCEPTED", "sms_b", 1),
    ]  # fmt: skip
    assert out.events[0]["reason"] == "failover:breaker_open"
    assert fresh["sms_a"].stats()["requests"] == 0


def test_unknown_fails_over_only_when_the_type_allows(fresh: dict, url: str) -> None:
    fresh["sms_a"].configure(timeout_after_accept=1.0)
    otp = delivery("sms", address="+15005550111")  # otp_login: failover_on_unknown = false
    alert = delivery("sms", address="+15005550112", notification_type="security_alert")
    fac = factories(fresh, url, sms_a={"timeout_s": 0.5})
    with harness(url, fac) as h:
        out = h.run([otp, alert])
    assert states(out, otp["delivery_id"]) == [("SENDING", None), ("UNKNOWN", "timeout")]
    assert [s for s, _ in states(out, alert["delivery_id"])] == [
        "SENDING", "UNKNOWN", "RETRY_SCHEDULED", "SENDING", "PROVIDER_ACCEPTED",
    ]  # fmt: skip
    assert accepted_for(fresh["sms_b"], "15005550111") == 0  # never sent twice
    assert accepted_for(fresh["sms_b"], "15005550112") == 1  # the type accepts a duplicate


def test_retry_after_failover_stays_on_b(fresh: dict, url: str) -> None:
    fresh["sms_a"].configure(errors={"21408": 1.0})
    fresh["sms_b"].configure(errors={"500": 1.0})
    with harness(url, factories(fresh, url)) as h:
        out = h.run([delivery("sms")])
    [retry] = out.retries
    assert retry["provider"] == "sms_b" and retry["attempt"] == 2
    assert retry["fallback"] == ["push"]  # provider step consumed: never back to A


def test_breaker_opens_half_opens_and_closes(fresh: dict, url: str) -> None:
    a = fresh["sms_a"]
    a.configure(errors={"500": 1.0})
    no_failover = {"fallback": [], "notification_type": "payment_result"}
    with harness(url, factories(fresh, url)) as h:
        failing = h.run([delivery("sms", **no_failover) for _ in range(8)])
        assert {s for s, _ in states(failing)} == {"SENDING", "RETRY_SCHEDULED"}
        assert h.breaker.state("sms_a") is BreakerState.OPEN
        calls = a.stats()["requests"]
        refused = h.run([delivery("sms", **no_failover) for _ in range(4)])
        assert states(refused) == [("RETRY_SCHEDULED", "breaker_open")] * 4
        assert a.stats()["requests"] == calls
        a.configure(errors={})  # the provider recovers
        time.sleep(1.2)  # cool-down (1 s) elapses → half-open
        probing = h.run([delivery("sms", **no_failover) for _ in range(4)])
        got = [s for s, _ in states(probing)]
        assert got.count("PROVIDER_ACCEPTED") == 2  # two probes let through
        assert got.count("RETRY_SCHEDULED") == 2
        assert h.breaker.state("sms_a") is BreakerState.CLOSED
        closed = h.run([delivery("sms", **no_failover) for _ in range(4)])
        assert [s for s, _ in states(closed)].count("PROVIDER_ACCEPTED") == 4
