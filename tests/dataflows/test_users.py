"""The users job (dataflows/users.py): the changelogs -> the Redis copies, resumable, and read
again from the beginning when Redis lost them."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import orjson
import redis
from bytewax.testing import run_main

from api import keys
from dataflows._changelog import ChangelogSource
from dataflows.users import build_flow
from herald.config import HeraldSettings
from herald.planning import CaughtUp
from sources.kafka import KafkaMessage
from tests.conftest import child_env
from tests.dataflows.helpers import produce
from tests.dataflows.jobs import (
    DEAD_LETTERS,
    Job,
    assert_no_job_errors,
    contacts,
    prefs,
    read,
    send,
)

PREFS = "herald.preferences"
DEVICES = "herald.devices"


def _run(settings: HeraldSettings) -> None:
    run_main(build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))


def _copy(client: redis.Redis, key: str) -> dict | None:  # type: ignore[type-arg]
    raw = client.get(key)
    return None if raw is None else orjson.loads(raw)


def test_copies_follow_the_changelog_and_never_go_back(settings: HeraldSettings) -> None:
    """Valid records become copies (timestamps as epoch ms); a copy newer than a record is kept;
    a tombstone deletes; a record plan could not read is dead-lettered and not copied; the
    positions and the restored marker are written."""
    hot = redis.Redis.from_url(settings.redis.url)
    prefix = settings.kafka.topic_prefix
    hot.delete(keys.users_restored(prefix))
    newer = {"user_id": "u-newer", "devices": [], "phone": None, "email": None,
             "updated_at": 0, "version": 10**15}  # fmt: skip
    hot.set(keys.contact_points("u-newer"), orjson.dumps(newer))
    send(
        settings, PREFS, [prefs("u-a", version=3, locale="de", timezone="Europe/Zurich")], "user_id"
    )
    send(settings, PREFS, [prefs("u-bad", timezone="Mars/Olympus_Mons")], "user_id")
    send(settings, DEVICES, [contacts("u-a", push=2), contacts("u-newer", version=5),
                             contacts("u-gone")], "user_id")  # fmt: skip
    produce(settings, DEVICES, [(b"u-gone", None)])

    _run(settings)

    a = _copy(hot, keys.prefs("u-a"))
    assert a is not None and a["version"] == 3 and a["locale"] == "de"
    assert isinstance(a["updated_at"], int)
    cp = _copy(hot, keys.contact_points("u-a"))
    assert cp is not None and len(cp["devices"]) == 2
    assert all(isinstance(d["registered_at"], int) for d in cp["devices"])
    assert _copy(hot, keys.contact_points("u-newer")) == newer
    assert hot.get(keys.contact_points("u-gone")) is None
    assert hot.get(keys.prefs("u-bad")) is None
    letters = read(settings, DEAD_LETTERS)
    assert [(d["reason"], d["job"]) for d in letters] == [("invalid_timezone", "users")], letters
    assert hot.exists(keys.users_restored(prefix))
    positions = {k.decode(): int(v) for k, v in hot.hgetall(keys.users_positions(prefix)).items()}
    assert sum(positions.values()) == 6, positions  # every record read, once


def test_a_restart_resumes_and_a_lost_store_is_read_again(settings: HeraldSettings) -> None:
    """With the marker present a run resumes at the positions (a copy removed behind its back
    stays removed); without it (Redis lost its data) every partition is read again."""
    hot = redis.Redis.from_url(settings.redis.url)
    prefix = settings.kafka.topic_prefix
    hot.delete(keys.users_restored(prefix))
    send(settings, DEVICES, [contacts(f"u{i}") for i in range(20)], "user_id")
    _run(settings)
    assert all(hot.exists(keys.contact_points(f"u{i}")) for i in range(20))

    hot.delete(keys.contact_points("u3"))
    send(settings, DEVICES, [contacts("u-late")], "user_id")
    _run(settings)
    assert hot.exists(keys.contact_points("u-late"))
    assert not hot.exists(keys.contact_points("u3"))  # resumed: u3's record was not read again

    hot.delete(keys.users_restored(prefix), keys.users_positions(prefix), keys.users_ready(prefix))
    _run(settings)
    assert hot.exists(keys.contact_points("u3")) and hot.exists(keys.users_restored(prefix))


def _wait(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_running_job_restores_what_redis_lost(settings: HeraldSettings, tmp_path: Path) -> None:
    """The job as a process: idle and caught up, its copies and markers are deleted (what a
    flushed Redis leaves of them); it notices, reads the changelogs again, and the copies and
    the marker come back without a restart."""
    hot = redis.Redis.from_url(settings.redis.url)
    prefix = settings.kafka.topic_prefix
    hot.delete(keys.users_restored(prefix))
    users = [f"run-{i}" for i in range(50)]
    send(settings, DEVICES, [contacts(u) for u in users], "user_id")
    job = Job(child_env(settings), tmp_path / "users.log", "dataflows.users:build_flow()")
    try:
        _wait(lambda: hot.exists(keys.users_restored(prefix)))
        assert all(hot.exists(keys.contact_points(u)) for u in users)
        send(settings, PREFS, [prefs("run-0", category_opt_out=["marketing"])], "user_id")
        _wait(lambda: hot.exists(keys.prefs("run-0")))

        lost = [keys.contact_points(u) for u in users] + [keys.prefs("run-0")]
        hot.delete(*lost, keys.users_restored(prefix), keys.users_positions(prefix),
                   keys.users_ready(prefix))  # fmt: skip
        _wait(lambda: hot.exists(keys.users_restored(prefix)))
        assert all(hot.exists(key) for key in lost)
        assert _copy(hot, keys.prefs("run-0"))["category_opt_out"] == ["marketing"]  # type: ignore[index]
    finally:
        output = job.stop()
    assert "changelog.table_lost" in output, output[-3000:]
    assert_no_job_errors(output)


def _drain(source: ChangelogSource) -> dict[str, list[object]]:
    """Every item of every partition of a bounded source, per partition."""
    out: dict[str, list[object]] = {}
    for part in source.list_parts():
        partition = source.build_part("t", part, None)
        items = out.setdefault(part, [])
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                items.extend(partition.next_batch())
        except StopIteration:
            pass
        finally:
            partition.close()
    return out


def test_plan_is_ready_before_its_table_loads_when_the_copies_hold_every_user(
    settings: HeraldSettings,
) -> None:
    """The plan job's changelog source: while the copies hold every user, each partition says
    `CaughtUp` before its first record (the job plans from the copies at once); otherwise only
    after its last one. Either way every record is read, and `CaughtUp` comes once."""
    send(settings, DEVICES, [contacts(f"r{i}") for i in range(40)], "user_id")
    topics = [settings.kafka.topic(DEVICES), settings.kafka.topic(PREFS)]  # PREFS: empty
    for ready, first in ((True, 0), (False, -1)):
        source = ChangelogSource(settings.kafka, topics, bounded=True, ready=lambda r=ready: r)
        parts = _drain(source)
        records = [i for items in parts.values() for i in items if isinstance(i, KafkaMessage)]
        assert len(records) == 40
        for part, items in parts.items():
            assert items[first] == CaughtUp(part), (ready, part, items[:2])
            assert sum(isinstance(i, CaughtUp) for i in items) == 1
