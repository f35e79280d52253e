"""The accepted job: pure event mapping, a bounded run in-process, and the real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from bytewax.recovery import init_db_dir
from bytewax.testing import run_main

from dataflows.accepted import EVENTS_TOPIC, accepted_event, build_flow, event_columns
from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from herald.ids import event_id
from herald.status_keys import header_key
from infra.process import free_port, reset_sigint
from schemas import load_schema
from tests.dataflows.helpers import consume, decoder, encoder, opened, produce
from tests.schemas.examples import NOW, example

REPO = Path(__file__).resolve().parents[2]
DEAD_LETTERS = "herald.dead-letters"


def request(notification_id: str, **changes: Any) -> dict[str, Any]:
    """A valid request accepted now (delivery_events keeps 30 days: old rows are dropped)."""
    now = datetime.now(UTC).replace(microsecond=0)
    base = {**example("notification_request"), "notification_id": notification_id}
    return {**base, "accepted_at": now, **changes}


def test_accepted_event_is_a_valid_idempotent_delivery_event() -> None:
    from fastavro.validation import validate

    req = request("n-7", recipients={"user_ids": ["u-1"], "segment_id": None}, accepted_at=NOW)
    event = accepted_event(req, recorded_at=NOW + timedelta(seconds=1))

    assert validate(event, load_schema("delivery_event"), strict=True)
    assert event["event_id"] == event_id("n-7", "ACCEPTED", 0)
    assert accepted_event(req, recorded_at=NOW)["event_id"] == event["event_id"]  # idempotent
    assert (event["delivery_id"], event["notification_id"], event["user_id"]) == ("n-7",) * 2 + (
        "u-1",
    )
    assert (event["state"], event["channel"], event["occurred_at"]) == ("ACCEPTED", "", NOW)
    assert event["attributes"] == {"request_id": "r-1", "source": "api", "recipient_count": "1"}
    assert event_columns()[0] == "event_id" and "attributes" in event_columns()


def test_segment_request_has_no_user() -> None:
    req = request("n-8", recipients={"user_ids": [], "segment_id": "seg-1"})
    event = accepted_event(req, recorded_at=NOW)
    assert event["user_id"] == "" and event["attributes"]["segment_id"] == "seg-1"


def produce_requests(settings: HeraldSettings) -> list[str]:
    """Two good requests on two classes with poison records between them; returns their ids."""
    ids = [f"{settings.kafka.topic_prefix}n-1", f"{settings.kafka.topic_prefix}n-2"]
    encode = encoder(settings, "herald.requests.normal")
    good_1 = encode(request(ids[0], traffic_class="normal"))
    good_2 = encode(request(ids[1], traffic_class="transactional"))
    produce(settings, "herald.requests.normal", [(b"n-1", good_1), (b"x", b"garbage")])
    produce(settings, "herald.requests.normal", [(b"y", b"\x00\x00\x00\x00")])
    produce(settings, "herald.requests.transactional", [(b"n-2", good_2)])
    return ids


def events_and_letters(
    settings: HeraldSettings, wait: bool
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    decode = decoder(settings)
    events = consume(settings, EVENTS_TOPIC, at_least=2 if wait else None)
    letters = consume(settings, DEAD_LETTERS, at_least=2 if wait else None)
    by_id = {decode(v)["notification_id"]: decode(v) for _k, v in events}
    return by_id, [decode(v) for _k, v in letters]


def clickhouse_rows(settings: HeraldSettings, notification_ids: list[str]) -> list[tuple[Any, ...]]:
    client = herald_client(settings.clickhouse)
    try:
        result = client.query(
            "SELECT notification_id, event_id, state, traffic_class FROM herald.delivery_events"
            " WHERE notification_id IN {ids:Array(String)} ORDER BY notification_id",
            parameters={"ids": notification_ids},
        )
        return [tuple(row) for row in result.result_rows]
    finally:
        client.close()


def assert_outputs(settings: HeraldSettings, ids: list[str], wait: bool = False) -> None:
    events, letters = events_and_letters(settings, wait)
    assert sorted(events) == ids
    assert {e["event_id"] for e in events.values()} == {event_id(i, "ACCEPTED", 0) for i in ids}
    assert events[ids[1]]["traffic_class"] == "transactional"
    assert sorted((d["reason"], opened(settings, d["value"])) for d in letters) == [
        ("bad_magic_byte", b"garbage"),
        ("truncated", b"\x00\x00\x00\x00"),
    ]
    assert {d["job"] for d in letters} == {"accepted"}
    assert {d["source_topic"] for d in letters} == {settings.kafka.topic("herald.requests.normal")}


@pytest.mark.integration
def test_bounded_run_in_process(settings: HeraldSettings) -> None:
    ids = produce_requests(settings)
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    client.hset(header_key(ids[1]), mapping={"tenant_id": "acme", "request_id": "by-api"})

    run_main(build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))

    assert_outputs(settings, ids)
    # the status API's header: written for the request no API recorded, the API's one kept
    produced = client.hgetall(header_key(ids[0]))
    assert produced["tenant_id"] == example("notification_request")["tenant_id"]
    assert produced["recipients"].startswith(("users:", "segment:"))
    assert client.ttl(header_key(ids[0])) > 29 * 24 * 3600
    assert client.hgetall(header_key(ids[1])) == {"tenant_id": "acme", "request_id": "by-api"}
    client.close()
    assert clickhouse_rows(settings, ids) == [
        (ids[0], event_id(ids[0], "ACCEPTED", 0), "ACCEPTED", "normal"),
        (ids[1], event_id(ids[1], "ACCEPTED", 0), "ACCEPTED", "transactional"),
    ]


def wait_for_rows(settings: HeraldSettings, ids: list[str], n: int, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = clickhouse_rows(settings, ids)
        if len(rows) >= n:
            break
        time.sleep(0.2)
    return rows


class Job:
    """`python -m bytewax.run "dataflows.accepted:build_flow()"` as a real process."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        argv = [sys.executable, "-m", "bytewax.run", "dataflows.accepted:build_flow()", *args]
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**env, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=reset_sigint,  # SIGINT is the clean stop, even from a background shell
        )

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGINT) -> str:
        """Signal the job's process group; return its output. SIGINT is Bytewax's clean stop."""
        if self.running():
            os.killpg(self.proc.pid, sig)
        try:
            output, _ = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            output, _ = self.proc.communicate()
        return output.decode(errors="replace")


def accepted_ids(settings: HeraldSettings, expected: set[str], timeout: float = 30) -> set[str]:
    """notification_ids with an event on herald.delivery-events, once `expected` are all seen."""
    decode = decoder(settings)
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while not expected <= seen and time.monotonic() < deadline:
        seen = {decode(value)["notification_id"] for _k, value in consume(settings, EVENTS_TOPIC)}
    return seen


def assert_no_job_errors(output: str) -> None:
    for error in ("DeliveryError", "InfraError", "RegistryError", "SerdeError", "KafkaException"):
        assert error not in output, output[-3000:]


@pytest.mark.integration
def test_end_to_end_smoke(settings: HeraldSettings, subprocess_env: dict[str, str]) -> None:
    """The job as it runs in production: `python -m bytewax.run`, settings from the env, its
    counts on /metrics."""
    port = free_port("127.0.0.1")
    job = Job({**subprocess_env, "HERALD_METRICS_PORT": str(port)}, "-s", "1")
    try:
        ids = produce_requests(settings)
        assert_outputs(settings, ids, wait=True)
        rows = wait_for_rows(settings, ids, 2, timeout=20)
        assert [row[:2] for row in rows] == [(i, event_id(i, "ACCEPTED", 0)) for i in ids]
        assert job.running(), "the job must keep running after poison records"
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'herald_events_total{job="accepted",state="ACCEPTED"} 2.0' in metrics
        letters = [m for m in metrics.splitlines()
                   if m.startswith('herald_dead_letters_total{job="accepted"')]  # fmt: skip
        assert sum(float(m.rsplit(" ", 1)[1]) for m in letters) == 2.0  # the two poison records
    finally:
        output = job.stop()
    assert "signal received" in output, output[-4000:]  # stopped by us, not crashed
    assert_no_job_errors(output)


@pytest.mark.integration
def test_killed_job_resumes_without_losing_requests(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL mid-stream, restart from the recovery store: every request gets its event."""
    init_db_dir(tmp_path, 1)
    recovery = ["-r", str(tmp_path), "-s", "1", "-b", "0"]
    encode = encoder(settings, "herald.requests.bulk")
    first = [f"a-{i}" for i in range(20)]
    second = [f"b-{i}" for i in range(20)]

    job = Job(subprocess_env, *recovery)
    try:
        produce(settings, "herald.requests.bulk", [(i.encode(), encode(request(i))) for i in first])
        consume(settings, EVENTS_TOPIC, at_least=len(first))
    finally:
        job.stop(signal.SIGKILL)
    produce(settings, "herald.requests.bulk", [(i.encode(), encode(request(i))) for i in second])

    job = Job(subprocess_env, *recovery)
    try:
        assert accepted_ids(settings, expected=set(first + second)) == set(first + second)
    finally:
        assert_no_job_errors(job.stop())
