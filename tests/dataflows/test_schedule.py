"""The schedule job as a real process: releases when due, expiry, bad input, SIGKILL + restart."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from bytewax.recovery import init_db_dir

from dataflows.schedule import expired_event
from herald import ids
from herald.config import HeraldSettings
from herald.scheduling import ScheduledEntry
from infra.process import free_port
from tests.dataflows.helpers import produce
from tests.dataflows.jobs import (
    DEAD_LETTERS,
    EVENTS,
    Job,
    assert_no_job_errors,
    now,
    read,
    read_timed,
    send,
    stop_all,
    wait_for,
)
from tests.schemas.examples import example

pytestmark = pytest.mark.integration

IMPORT = "dataflows.schedule:build_flow()"
PUSH_BULK = "herald.deliveries.push.bulk"
SMS_TX = "herald.deliveries.sms.transactional"


def held(did: str, wait: float, **changes: Any) -> dict[str, Any]:
    base = {**example("delivery"), "delivery_id": did, "attempt": 0, "next_attempt_at": None}
    base.update(channel="push", traffic_class="bulk", expire_at=now() + timedelta(hours=1))
    return {**base, "not_before": now() + timedelta(seconds=wait), **changes}


def bucket_snapshots(recovery: Path) -> int:
    total = 0
    for db in recovery.glob("*.sqlite3"):
        with sqlite3.connect(db) as conn:
            query = (
                "SELECT count(*) FROM snaps"
                " WHERE step_id LIKE '%buckets%' AND ser_change IS NOT NULL"
            )
            total += conn.execute(query).fetchone()[0]
    return total


def released(settings: HeraldSettings, topic: str) -> list[str]:
    return [d["delivery_id"] for d in read(settings, topic)]


def test_release_expiry_and_restart(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    init_db_dir(recovery, 1)
    args = ["-r", str(recovery), "-s", "1", "-b", "0"]
    env = {**subprocess_env, "HERALD_PLANNING_SCHEDULE_JITTER_SECONDS": "2"}
    soon = [held(f"soon-{i}", 3) for i in range(20)]
    later = [held(f"later-{i}", 12) for i in range(20)]
    due = held("otp-1", -5, channel="sms", traffic_class="transactional")
    expiring = held("exp-1", 2, expire_at=now() + timedelta(seconds=1))
    too_far = held("far-1", 40 * 86400)

    job = Job(env, tmp_path / "job1.log", IMPORT, *args)
    try:
        send(settings, "herald.scheduled", [*soon, *later, due, expiring, too_far], "delivery_id")
        produce(settings, "herald.scheduled", [(b"x", b"garbage")])
        assert (
            wait_for(settings, SMS_TX, lambda r: len(r) == 1, job=job)[0]["delivery_id"] == "otp-1"
        )
        got = wait_for(settings, PUSH_BULK, lambda r: len(r) >= 20, job=job)
        assert {d["delivery_id"] for d in got} == {d["delivery_id"] for d in soon}
        for stamp, d in read_timed(settings, PUSH_BULK):  # released at or after not_before
            assert d["not_before"] <= stamp < d["not_before"] + timedelta(seconds=5)
        deadline = time.monotonic() + 20
        while bucket_snapshots(recovery) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        job.stop(signal.SIGKILL)

    job = Job(env, tmp_path / "job2.log", IMPORT, *args)
    try:
        got = wait_for(
            settings, PUSH_BULK, lambda r: len({d["delivery_id"] for d in r}) >= 40, job=job
        )
        events = wait_for(settings, EVENTS, lambda r: len(r) >= 1, job=job)
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    assert {d["delivery_id"] for d in got} == {d["delivery_id"] for d in soon + later}
    assert [(e["delivery_id"], e["state"], e["reason"]) for e in events] == [
        ("exp-1", "EXPIRED", "expired")
    ]
    letters = Counter(d["reason"] for d in read(settings, DEAD_LETTERS))
    assert letters == {"schedule_too_far": 1, "bad_magic_byte": 1}


def test_two_processes_release_each_delivery_once(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """`-i 0/1 -a ...`: buckets on both processes, every delivery released exactly once."""
    deliveries = [held(f"d-{i}", 2 + i % 4) for i in range(40)]
    send(settings, "herald.scheduled", deliveries, "delivery_id")
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    env = {**subprocess_env, "HERALD_PLANNING_SCHEDULE_JITTER_SECONDS": "1"}
    jobs = [
        Job(env, tmp_path / f"p{i}.log", IMPORT, "-i", str(i), "-a", addresses) for i in range(2)
    ]
    try:
        got = wait_for(settings, PUSH_BULK, lambda r: len(r) >= 40, timeout=50)
        time.sleep(1)
        got = read(settings, PUSH_BULK)
    finally:
        outputs = stop_all(jobs)
    for output in outputs:
        assert_no_job_errors(output)
    assert sorted(d["delivery_id"] for d in got) == sorted(d["delivery_id"] for d in deliveries)


def test_an_entry_expired_while_held_keeps_the_generation_of_its_delivery() -> None:
    """A DLQ replay (generation 1) that expires in the retry or schedule job: its EXPIRED event
    is of generation 1 (else the receipts fold and ClickHouse would rank it below the replay's
    own states and the delivery would never show EXPIRED)."""
    now = datetime.now(UTC)
    entry = ScheduledEntry(now, "d-1", "herald.deliveries.sms.transactional", b"", now,
                           "n-1", "u-1", "t-1", "otp", "sms", "transactional", 1)  # fmt: skip
    event = expired_event(entry, now)
    assert event["generation"] == 1
    assert event["event_id"] == ids.event_id("d-1", "EXPIRED", 0, "", 1)
    assert event["event_id"] != ids.event_id("d-1", "EXPIRED", 0)
