"""The digest job as a real process: seed 003's storm with a SIGKILL in the middle."""

from __future__ import annotations

import json
import pickle
import signal
import sqlite3
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from bytewax.recovery import init_db_dir

from dashboards.lag import behind, topic_ends
from herald.config import HeraldSettings
from infra.process import free_port
from tests.dataflows.helpers import produce
from tests.dataflows.jobs import (
    DEAD_LETTERS,
    Job,
    assert_no_job_errors,
    now,
    read,
    send,
    stop_all,
    wait_for,
)

pytestmark = pytest.mark.integration

IMPORT = "dataflows.digest:build_flow()"
REQUESTS = "herald.requests.normal"
# Every window of the storm ends this long after the test starts (events are backdated by
# window length - MARGIN), so the test waits MARGIN seconds instead of ten minutes.
MARGIN = 90


def event(
    event_id: str, kind: str, actor: str, recipient: str, at: datetime, obj: str | None
) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "event_type": kind,
        "actor_id": actor,
        "actor_name": actor,
        "recipient_id": recipient,
        "object_id": obj,
        "object_type": "post" if obj else None,
        "occurred_at": at,
        "tenant_id": "acme",
    }


def snapshots(recovery: Path) -> int:
    """Digest keys in the largest committed shard snapshot (0 until the first snapshot)."""
    most = 0
    for db in recovery.glob("*.sqlite3"):
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT ser_change FROM snaps WHERE step_id LIKE '%shard_windows%'"
            ).fetchall()
        for (change,) in rows:
            blob = pickle.loads(change) if change is not None else None
            if blob is not None:
                _version, frozen = pickle.loads(blob)
                most = max(most, len(frozen))
    return most


def wait_snapshot(recovery: Path, keys: int, job: Job, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while snapshots(recovery) < keys:
        assert job.running(), job.output()[-3000:]
        assert time.monotonic() < deadline, "no snapshot of the window state"
        time.sleep(0.2)


def last_epoch(recovery: Path) -> int:
    """The latest epoch the job committed a snapshot of."""
    epochs = [0]
    for db in recovery.glob("*.sqlite3"):
        with sqlite3.connect(db) as conn:
            epochs.append(conn.execute("SELECT max(snap_epoch) FROM snaps").fetchone()[0] or 0)
    return max(epochs)


def wait_all_read(settings: HeraldSettings, recovery: Path, job: Job, timeout: float = 60) -> None:
    """Until the job has committed every social event now on the topic, and one epoch after
    that: whatever those events make it emit (a window they reopen closes at once, its time
    long past) is on the requests topic by then."""
    ends = topic_ends(settings.kafka, [settings.kafka.topic("herald.social-events")])
    deadline = time.monotonic() + timeout
    while short := behind(recovery.parent, recovery.name, ends):
        assert job.running(), job.output()[-3000:]
        assert time.monotonic() < deadline, short
        time.sleep(0.2)
    epoch = last_epoch(recovery)
    while last_epoch(recovery) <= epoch:
        assert job.running(), job.output()[-3000:]
        assert time.monotonic() < deadline, "no epoch committed after the last event"
        time.sleep(0.2)


def test_seed_003_storm_survives_sigkill(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """1,200 likes + 3 comments + 2 follows for one user -> exactly 3 notifications."""
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    init_db_dir(recovery, 1)
    args = ["-r", str(recovery), "-s", "1", "-b", "0"]
    env = {**subprocess_env, "HERALD_PLANNING_DIGEST_GRACE_SECONDS": "1"}
    t0 = now()
    star = f"{settings.kafka.topic_prefix}star"
    like_at = t0 - timedelta(seconds=600 - MARGIN)
    likes = [
        event(f"like-{i}", "like", f"user{i}", star, like_at, "post-1") for i in range(1, 1201)
    ]
    comment_at = t0 - timedelta(seconds=30 - MARGIN)
    comments = [
        event(f"c{i}", "comment", f"user{c}", star, comment_at, "post-1")
        for i, c in enumerate("ABC", 1)
    ]
    follow_at = t0 - timedelta(seconds=300 - MARGIN)
    follows = [
        event(f"f{i}", "follow", f"user{c}", star, follow_at, None) for i, c in enumerate("DE", 1)
    ]
    unknown = event("s1", "share", "userX", star, t0, "post-1")

    job = Job(env, tmp_path / "job1.log", IMPORT, *args)
    try:
        send(settings, "herald.social-events", likes[:600] + comments + [unknown], "recipient_id")
        produce(settings, "herald.social-events", [(star.encode(), b"not avro")])
        wait_snapshot(recovery, 2, job)  # the like and comment keys are in a committed epoch
    finally:
        job.stop(signal.SIGKILL)
    redelivered = likes[500:600]  # an upstream redelivery of ids already counted
    send(settings, "herald.social-events", likes[600:] + redelivered + follows, "recipient_id")

    job = Job(env, tmp_path / "job2.log", IMPORT, *args)
    try:
        requests = wait_for(
            settings, REQUESTS, lambda rs: len(rs) >= 3, timeout=MARGIN + 30, job=job
        )
        wait_all_read(settings, recovery, job)  # a duplicate would be out by then
        requests = read(settings, REQUESTS)
    finally:
        output = job.stop()
    assert_no_job_errors(output)

    ids = [r["notification_id"] for r in requests]
    assert len(ids) == 3 and len(set(ids)) == 3, ids
    by_type = {r["notification_type"]: r for r in requests}
    assert set(by_type) == {"social_like", "social_comment", "social_follow"}
    like = by_type["social_like"]
    assert like["params"]["digest_total"] == "1200"
    assert json.loads(like["params"]["digest_actors"]) == ["user1", "user2", "user3"]
    assert like["params"]["object_id"] == "post-1" and like["source"] == "digest"
    assert like["recipients"] == {"user_ids": [star], "segment_id": None}
    assert like["request_id"] == like["params"]["digest_window_id"]
    assert by_type["social_comment"]["params"]["digest_total"] == "3"
    assert by_type["social_follow"]["params"]["digest_total"] == "2"
    letters = Counter(d["reason"] for d in read(settings, DEAD_LETTERS))
    assert letters == {"unknown_event_type": 1, "bad_magic_byte": 1}


def test_two_processes_one_window_per_key(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """`-i 0/1 -a ...`: keys live on either process, each window is still one notification."""
    p = settings.kafka.topic_prefix
    at = now() - timedelta(seconds=600 - 8)  # the windows end 8 s from now
    recipients = [f"{p}r{i}" for i in range(12)]
    likes = [
        event(f"{r}-like-{n}", "like", f"user{n}", r, at, "post-1")
        for i, r in enumerate(recipients)
        for n in range(i + 1)
    ]
    send(settings, "herald.social-events", likes + likes[:5], "recipient_id")  # with redeliveries
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    env = {**subprocess_env, "HERALD_PLANNING_DIGEST_GRACE_SECONDS": "1"}
    jobs = [
        Job(env, tmp_path / f"p{i}.log", IMPORT, "-i", str(i), "-a", addresses) for i in range(2)
    ]
    try:
        requests = wait_for(settings, REQUESTS, lambda rs: len(rs) >= len(recipients), timeout=50)
        time.sleep(1)
        requests = read(settings, REQUESTS)
    finally:
        outputs = stop_all(jobs)
    for output in outputs:
        assert_no_job_errors(output)
    totals = {r["recipients"]["user_ids"][0]: r["params"]["digest_total"] for r in requests}
    assert len(requests) == len(recipients)
    assert totals == {r: str(i + 1) for i, r in enumerate(recipients)}
