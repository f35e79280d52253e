"""The dispatch and retry jobs as real processes, on the embedded Kafka and Redis, with a real
APNs simulator: sends, retries through herald.retry.transactional, token cleanup, bad input, and
a SIGKILL between the provider's acceptance and the SENT mark (at most one duplicate); with the
SMS simulators too: cross-channel fallback SMS → push through the job's own topics, and a
rejected phone number disabled (herald.devices and the API's copy)."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from bytewax.recovery import init_db_dir

from herald import keys
from herald.config import HeraldSettings
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.dispatch.simenv import client_env
from tests.dataflows.helpers import produce
from tests.dataflows.jobs import (
    DEAD_LETTERS,
    EVENTS,
    Job,
    assert_no_job_errors,
    read,
    send,
    wait_for,
)
from tests.sinks.dispatch_helpers import accepted_for, delivery, put_devices, token

ALL_TX = "dataflows.dispatch:build_flow(channel='all', traffic_class='transactional')"
SMS_TX = "herald.deliveries.sms.transactional"

pytestmark = pytest.mark.integration

DISPATCH = "dataflows.dispatch:build_flow(channel='push', traffic_class='transactional')"
RETRY = "dataflows.retry:build_flow(traffic_class='transactional')"
PUSH_TX = "herald.deliveries.push.transactional"
RETRY_TX = "herald.retry.transactional"
TTL = 3.0


@pytest.fixture(scope="module")
def apns_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    with start_simulator("apns", tmp_path_factory.mktemp("sims") / "apns") as sim:
        yield sim


@pytest.fixture
def apns(apns_proc: RunningSimulator) -> RunningSimulator:
    apns_proc.reset(config=True)
    return apns_proc


@pytest.fixture
def env(subprocess_env: dict[str, str], apns: RunningSimulator) -> dict[str, str]:
    backoff = {"transactional": {"base_s": 0.3, "cap_s": 1.0, "max_attempts": 30}}
    return {
        **subprocess_env,
        **client_env("apns", apns.credentials()),
        "HERALD_DISPATCH_STATE_PREFIX": f"t{uuid.uuid4().hex[:8]}:",
        "HERALD_DISPATCH_PENDING_TTL_S": str(TTL),
        "HERALD_DISPATCH_SHAPE_MAX_WAIT_S": "0.5",
        "HERALD_DISPATCH_CALL_TIMEOUT_S": "0.5",
        "HERALD_DISPATCH_BACKOFF": orjson.dumps(backoff).decode(),
        # A 100 % 503 outage opens the breaker (20 failures): keep its cool-down short.
        "HERALD_DISPATCH_BREAKER": orjson.dumps({"cooldown_s": 1.0}).decode(),
    }


def by_state(events: list[dict[str, Any]], state: str) -> dict[str, dict[str, Any]]:
    return {e["delivery_id"]: e for e in events if e["state"] == state}


def test_send_retry_and_token_cleanup(
    settings: HeraldSettings, env: dict[str, str], apns: RunningSimulator, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(settings.redis.url)
    dead, other = token(f"dead-{uuid.uuid4()}"), token(f"other-{uuid.uuid4()}")
    gone = delivery(address=dead)
    put_devices(client, gone["user_id"], [dead, other])
    apns.configure(errors={"ServiceUnavailable": 1.0}, unregistered=[dead], retry_after_s=0)
    batch = [delivery() for _ in range(5)]
    dispatch = Job(env, tmp_path / "dispatch.log", DISPATCH)
    retry = Job(env, tmp_path / "retry.log", RETRY)
    try:
        send(settings, PUSH_TX, [*batch, gone], "delivery_id")
        produce(settings, PUSH_TX, [(b"bad", b"not avro")])
        wait_for(settings, RETRY_TX, lambda r: len(r) >= 5, job=dispatch)
        apns.configure(errors={}, unregistered=[dead])  # the provider recovers
        events = wait_for(
            settings, EVENTS, lambda r: len(by_state(r, "PROVIDER_ACCEPTED")) >= 5, job=retry
        )
    finally:
        out = dispatch.stop() + retry.stop()
    assert_no_job_errors(out)
    accepted = by_state(events, "PROVIDER_ACCEPTED")
    assert {d["delivery_id"] for d in batch} == set(accepted)
    assert all(accepted[d["delivery_id"]]["attempt"] >= 2 for d in batch)
    assert all(accepted_for(apns, d["address"]) == 1 for d in batch)
    assert by_state(events, "FAILED_PERMANENT")[gone["delivery_id"]]["reason"] == "Unregistered"
    [devices] = read(settings, "herald.devices")
    assert [d["token"] for d in devices["devices"]] == [other]  # the other device stays
    copy = orjson.loads(client.get(keys.contact_points(gone["user_id"])))
    assert [d["token"] for d in copy["devices"]] == [other]
    assert [d["reason"] for d in read(settings, DEAD_LETTERS)] == ["bad_magic_byte"]


def test_sigkill_after_the_call_sends_at_most_one_duplicate(
    settings: HeraldSettings, env: dict[str, str], apns: RunningSimulator, tmp_path: Path
) -> None:
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    init_db_dir(recovery, 1)
    marker = tmp_path / "crashed"
    # PENDING would hold the crashed sends for a minute: the restarted worker takes its seat
    # and the PENDINGs over at once (herald.guard leases), so they are sent again within seconds
    crash_env = {**env, "HERALD_TEST_CRASH_MARKER": str(marker),
                 "HERALD_DISPATCH_PENDING_TTL_S": "60"}  # fmt: skip
    crashing = "tests.dataflows.dispatch_crash:build_flow(stage='answered')"
    args = ("-r", str(recovery), "-s", "1", "-b", "0")
    batch = [delivery() for _ in range(4)]
    retry = Job(env, tmp_path / "retry.log", RETRY)
    first = Job(crash_env, tmp_path / "first.log", crashing, *args)
    try:
        send(settings, PUSH_TX, batch, "delivery_id")
        deadline = time.monotonic() + 40
        while first.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists() and not first.running()
        crashed_ids = set(marker.read_text().split(","))
        assert crashed_ids  # the provider accepted these, their SENT marks were not written
        second = Job(crash_env, tmp_path / "second.log", crashing, *args)
        try:
            events = wait_for(
                settings, EVENTS, lambda r: len(by_state(r, "PROVIDER_ACCEPTED")) >= 4, job=second
            )
        finally:
            out = second.stop()
    finally:
        first.stop(signal.SIGKILL)
        out_retry = retry.stop()
    assert_no_job_errors(out + out_retry)
    assert set(by_state(events, "PROVIDER_ACCEPTED")) == {d["delivery_id"] for d in batch}
    for d in batch:
        sends = accepted_for(apns, d["address"])
        assert sends == (2 if d["delivery_id"] in crashed_ids else 1)  # at most one duplicate
    assert "guard.seat_taken" in out and out.count("guard.taken_over") == len(crashed_ids)


@pytest.fixture(scope="module")
def sms_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningSimulator]]:
    tmp = tmp_path_factory.mktemp("sms")
    started = {name: start_simulator(name, tmp / name) for name in ("sms_a", "sms_b")}
    yield started
    for sim in started.values():
        sim.stop()


def test_sms_falls_back_to_push_and_a_rejected_number_is_disabled(
    settings: HeraldSettings,
    env: dict[str, str],
    apns: RunningSimulator,
    sms_procs: dict[str, RunningSimulator],
    tmp_path: Path,
) -> None:
    a, b = sms_procs["sms_a"], sms_procs["sms_b"]
    for sim in (a, b):
        sim.reset(config=True)
    refused, invalid = "+15005550131", "+15005550132"
    a.configure(errors={"21408": 1.0}, invalid=[invalid])  # A refuses; 21211 for `invalid`
    b.configure(errors={"15": 1.0})  # B refuses too
    client = redis.Redis.from_url(settings.redis.url)
    content = {"channel": "push", "locale": "en", "template_version": 2,
               "rendered": {"title": "Login code", "body": "Your code is 1", "subject": None,
                            "data": {}}}  # fmt: skip
    sms = [
        delivery("sms", address=phone, fallback_content=[content]) for phone in (refused, invalid)
    ]
    tokens = [token(uuid.uuid4()) for _ in sms]
    for d, device in zip(sms, tokens, strict=True):
        put_devices(client, d["user_id"], [device])
        copy = orjson.loads(client.get(keys.contact_points(d["user_id"])))
        copy["phone"] = {"e164": d["address"], "verified": True}
        client.set(keys.contact_points(d["user_id"]), orjson.dumps(copy))
    job_env = {
        **env,
        **client_env("sms_a", a.credentials()),
        **client_env("sms_b", b.credentials()),
    }
    dispatch = Job(job_env, tmp_path / "dispatch.log", ALL_TX)
    try:
        send(settings, SMS_TX, sms, "delivery_id")
        events = wait_for(
            settings, EVENTS, lambda r: len(by_state(r, "PROVIDER_ACCEPTED")) >= 2, job=dispatch
        )
    finally:
        out = dispatch.stop()
    assert_no_job_errors(out)
    failed = by_state(events, "FAILED_PERMANENT")
    assert failed[sms[0]["delivery_id"]]["reason"] == "status_15"
    assert failed[sms[1]["delivery_id"]]["reason"] == "21211"
    assert all(failed[d["delivery_id"]]["attributes"]["fallback_to"] == "push" for d in sms)
    accepted = by_state(events, "PROVIDER_ACCEPTED")
    assert {e["channel"] for e in accepted.values()} == {"push"}
    assert all(accepted_for(apns, device) == 1 for device in tokens)
    planned = [e for e in events if e["state"] == "PLANNED" and e["reason"] == "fallback"]
    assert {e["attributes"]["from_delivery_id"] for e in planned} == {d["delivery_id"] for d in sms}
    [devices] = read(settings, "herald.devices")  # only the rejected number is disabled
    assert devices["user_id"] == sms[1]["user_id"] and devices["phone"] is None
    assert [d["token"] for d in devices["devices"]] == [tokens[1]]  # push stays
    copy = orjson.loads(client.get(keys.contact_points(sms[1]["user_id"])))
    assert copy["phone"] is None
    kept = orjson.loads(client.get(keys.contact_points(sms[0]["user_id"])))
    assert kept["phone"]["e164"] == refused  # a provider's own refusal disables nothing
