"""The plan job as real processes: resumable fan-out, opt-out mid-campaign, 2 processes, SIGKILL."""

from __future__ import annotations

import pickle
import re
import signal
import sqlite3
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from bytewax.recovery import init_db_dir

from dataflows.plan.audience import load_segment
from herald import ids
from herald.config import HeraldSettings
from herald.status_keys import header_key, request_header
from infra.process import free_port
from tests.dataflows.helpers import produce
from tests.dataflows.jobs import (
    DEAD_LETTERS,
    EVENTS,
    USERS,
    Job,
    assert_no_job_errors,
    load_users,
    prefs,
    read,
    request,
    send,
    stop_all,
    wait_for,
)

pytestmark = pytest.mark.integration

IMPORT = "dataflows.plan:build_flow(traffic_class='bulk')"
INBOX = "herald.deliveries.inapp.bulk"
ANNOUNCEMENT = {"title": "News", "body": "Something happened"}


@pytest.fixture(autouse=True)
def _users_restored(settings: HeraldSettings) -> None:
    """The copies hold every user (none yet), as the users job says on the stack."""
    load_users(settings)


def announcement(nid: str, **recipients: Any) -> dict[str, Any]:
    """An in-app announcement (marketing, no cap, no contact point needed)."""
    return request(nid, "inbox_announcement", params=ANNOUNCEMENT, **recipients)


def recovery_dir(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "recovery"
    path.mkdir()
    init_db_dir(path, 1)
    return path, ["-r", str(path), "-s", "1", "-b", "0"]


def snapshotted_batch(recovery: Path) -> int:
    """The highest next-batch number of a segment expansion in the request source's snapshots
    (of any epoch written so far, committed or not)."""
    best = -1
    for db in recovery.glob("*.sqlite3"):
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT ser_change FROM snaps WHERE step_id LIKE '%requests_in%'"
                " AND ser_change IS NOT NULL"
            ).fetchall()
        for (blob,) in rows:
            _offset, expansions = pickle.loads(blob)
            best = max([best, *(e.batch_no for e in expansions)])
    return best


def planned_users(events: list[dict[str, Any]], nid: str) -> set[str]:
    return {e["user_id"] for e in events if e["notification_id"] == nid}


def test_segment_fan_out_resumes_after_sigkill(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """A 5,000-user segment: killed mid-way, resumed at its batch, every user planned once."""
    p = settings.kafka.topic_prefix
    users = [f"{p}m{i:05d}" for i in range(5000)]
    load_segment(settings.clickhouse, f"{p}seg", users)
    recovery, args = recovery_dir(tmp_path)
    env = {**subprocess_env, "HERALD_PLANNING_FANOUT_BATCHES_PER_SECOND": "1"}
    nid = f"{p}announce"

    job = Job(env, tmp_path / "job1.log", IMPORT, *args)
    try:
        send(
            settings,
            "herald.requests.bulk",
            [announcement(nid, segment=f"{p}seg")],
            "notification_id",
        )
        deadline = time.monotonic() + 45
        while snapshotted_batch(recovery) < 3:  # written; its epoch may not be committed yet
            assert job.running() and time.monotonic() < deadline, job.output()[-3000:]
            time.sleep(0.2)
    finally:
        job.stop(signal.SIGKILL)

    job = Job(env, tmp_path / "job2.log", IMPORT, *args)
    try:
        events = wait_for(settings, EVENTS, lambda r: len(planned_users(r, nid)) >= 5000, job=job)
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    resumed = re.search(rf"plan.audience_resume notification_id={nid} batch=(\d+)", output)
    assert resumed is not None and 1 <= int(resumed.group(1)) <= 4, output[-3000:]
    assert planned_users(events, nid) == set(users)
    assert {e["state"] for e in events} == {"PLANNED"}
    assert len(events) <= 5000 + 2000, "the restart re-planned more than the unfinished batches"
    delivered = {d["delivery_id"] for d in read(settings, INBOX)}
    assert delivered == {ids.delivery_id(nid, u, "inapp") for u in users}


def test_unpaced_segment_is_read_in_pages_of_several_batches(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """12,345 users, unpaced: the first batch alone, then pages of 10 batches; each user planned
    once, in batches of 1,000 numbered 0-12 (the last one short)."""
    p = settings.kafka.topic_prefix
    users = [f"{p}m{i:05d}" for i in range(12_345)]
    load_segment(settings.clickhouse, f"{p}seg", users)
    nid = f"{p}announce"
    job = Job(subprocess_env, tmp_path / "job.log", IMPORT)
    try:
        send(settings, "herald.requests.bulk", [announcement(nid, segment=f"{p}seg")],
             "notification_id")  # fmt: skip
        events = wait_for(settings, EVENTS, lambda r: len(planned_users(r, nid)) >= 12_345, job=job)
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    assert f"plan.audience_done notification_id={nid} batches=13 users=12345" in output
    planned = Counter(e["user_id"] for e in events if e["notification_id"] == nid)
    assert set(planned) == set(users) and set(planned.values()) == {1}


def test_opt_out_mid_campaign_stops_remaining_deliveries(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """An unsubscribe one batch into a campaign: the user's not yet planned delivery is stopped."""
    p = settings.kafka.topic_prefix
    users = [f"{p}m{i:05d}" for i in range(3000)]
    load_segment(settings.clickhouse, f"{p}seg", users)
    env = {**subprocess_env, "HERALD_PLANNING_FANOUT_BATCHES_PER_SECOND": "0.5"}
    nid = f"{p}announce"
    early, late = users[10], users[2500]  # batches 0 and 2

    job = Job(env, tmp_path / "job.log", IMPORT)
    users_job = Job(subprocess_env, tmp_path / "users.log", USERS)  # changelog -> copies
    try:
        send(
            settings,
            "herald.requests.bulk",
            [announcement(nid, segment=f"{p}seg")],
            "notification_id",
        )
        wait_for(settings, EVENTS, lambda r: len(planned_users(r, nid)) >= 1, job=job)
        opt_outs = [prefs(u, category_opt_out=["marketing"]) for u in (early, late)]
        send(settings, "herald.preferences", opt_outs, "user_id")
        events = wait_for(settings, EVENTS, lambda r: len(planned_users(r, nid)) >= 3000, job=job)
    finally:
        output, users_output = stop_all([job, users_job])
    assert_no_job_errors(output)
    assert_no_job_errors(users_output)
    outcome = {e["user_id"]: (e["state"], e["reason"]) for e in events}
    assert outcome[late] == ("SUPPRESSED", "category_opt_out")
    assert outcome[early] == ("PLANNED", None)  # already planned: dispatch re-checks before sending
    assert Counter(outcome.values())[("PLANNED", None)] == 2999


def test_two_processes_plan_every_users_preferences(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """`-i 0/1 -a ...`: every user's preferences are honoured whichever process plans them."""
    p = settings.kafka.topic_prefix
    users = [f"{p}u{i}" for i in range(40)]
    opted_out = users[::2]
    send(
        settings,
        "herald.preferences",
        [prefs(u, category_opt_out=["marketing"]) for u in opted_out],
        "user_id",
    )
    load_users(settings)
    nid = f"{p}announce"
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    jobs = [
        Job(subprocess_env, tmp_path / f"p{i}.log", IMPORT, "-i", str(i), "-a", addresses)
        for i in range(2)
    ]
    try:
        send(settings, "herald.requests.bulk", [announcement(nid, users=users)], "notification_id")
        events = wait_for(settings, EVENTS, lambda r: len(planned_users(r, nid)) >= 40)
    finally:
        outputs = stop_all(jobs)
    for output in outputs:
        assert_no_job_errors(output)
    outcome = {e["user_id"]: (e["state"], e["reason"]) for e in events}
    assert {u for u, o in outcome.items() if o == ("SUPPRESSED", "category_opt_out")} == set(
        opted_out
    )
    assert {u for u, o in outcome.items() if o == ("PLANNED", None)} == set(users) - set(opted_out)


def test_sigkill_and_restart_lose_nothing(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL mid-stream, restart from recovery: every delivery once after delivery_id dedup."""
    p = settings.kafka.topic_prefix
    users = [f"{p}u{i}" for i in range(100)]
    first = [announcement(f"{p}a{i}", users=users) for i in range(10)]
    second = [announcement(f"{p}b{i}", users=users) for i in range(10)]
    expected = {
        ids.delivery_id(r["notification_id"], u, "inapp") for r in first + second for u in users
    }
    recovery, args = recovery_dir(tmp_path)

    job = Job(subprocess_env, tmp_path / "job1.log", IMPORT, *args)
    try:
        send(settings, "herald.requests.bulk", first, "notification_id")
        produce(settings, "herald.requests.bulk", [(b"x", b"garbage")])
        wait_for(settings, INBOX, lambda r: len(r) >= 300, job=job)
    finally:
        job.stop(signal.SIGKILL)
    send(settings, "herald.requests.bulk", second, "notification_id")

    job = Job(subprocess_env, tmp_path / "job2.log", IMPORT, *args)
    try:
        done = lambda r: {d["delivery_id"] for d in r} >= expected  # noqa: E731
        deliveries = wait_for(settings, INBOX, done, job=job)
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    copies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in deliveries:
        copies[d["delivery_id"]].append({k: v for k, v in d.items() if k != "created_at"})
    assert set(copies) == expected  # nothing lost, nothing unexpected
    assert all(all(c == cs[0] for c in cs) for cs in copies.values())  # replays are identical
    letters = {d["dead_letter_id"] for d in read(settings, DEAD_LETTERS)}
    assert len(letters) == 1


def _header(settings: HeraldSettings, nid: str, control: str) -> redis.Redis:
    """The notification's status header (as the API writes it at accept) with a control."""
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    header = request_header("acme", f"r-{nid}", "inbox_announcement", "bulk", 0, 0, "s", False)
    client.hset(header_key(nid), mapping={**header, "control": control})
    return client


def test_a_paused_segment_waits_and_a_cancelled_one_ends_suppressed(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Two 1,500-user segment campaigns (herald.controls): the paused one is not expanded
    until resumed, then planned in full; every user of the cancelled one ends SUPPRESSED
    `cancelled`, and the header says how many users were planned."""
    p = settings.kafka.topic_prefix
    users = [f"{p}m{i:05d}" for i in range(1500)]
    load_segment(settings.clickhouse, f"{p}seg", users)
    paused, cancelled = f"{p}paused", f"{p}cancelled"
    client = _header(settings, paused, "paused")
    _header(settings, cancelled, "cancelled").close()
    job = Job(subprocess_env, tmp_path / "job.log", IMPORT)
    try:
        send(settings, "herald.requests.bulk",
             [announcement(nid, segment=f"{p}seg") for nid in (paused, cancelled)],
             "notification_id")  # fmt: skip
        events = wait_for(settings, EVENTS, lambda r: len(planned_users(r, cancelled)) >= 1500,
                          job=job)  # fmt: skip
        # the source looked at the paused one (it records the users planned when it looks)
        # and holds it: nothing of it was planned
        deadline = time.monotonic() + 20
        while client.hget(header_key(paused), "users_planned") is None:
            assert time.monotonic() < deadline, "the source never looked at the paused one"
            time.sleep(0.1)
        assert client.hget(header_key(paused), "users_planned") == "0"
        assert planned_users(read(settings, EVENTS), paused) == set()
        client.hset(header_key(paused), "control", "running")
        events = wait_for(settings, EVENTS, lambda r: len(planned_users(r, paused)) >= 1500,
                          job=job)  # fmt: skip
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    of = {nid: [e for e in events if e["notification_id"] == nid] for nid in (paused, cancelled)}
    assert {(e["state"], e["reason"]) for e in of[cancelled]} == {("SUPPRESSED", "cancelled")}
    assert {e["state"] for e in of[paused]} == {"PLANNED"}
    assert planned_users(events, paused) == planned_users(events, cancelled) == set(users)
    for nid in (paused, cancelled):
        assert client.hmget(header_key(nid), "users_planned", "users_total") == ["1500", "1500"]
    client.close()
