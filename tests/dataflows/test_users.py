"""The users job (dataflows/users.py): the changelogs -> the Redis copies, resumable, and read
again from the beginning when Redis lost them."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from bytewax.testing import run_main

from dataflows import _changelog as changelog
from dataflows._changelog import CaughtUp, ChangelogSource
from dataflows._user_copies import RedisHeld
from dataflows.users import build_flow
from herald import keys
from herald.config import HeraldSettings
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
    held = hot.hgetall(keys.users_positions(prefix))
    positions = {k.decode(): int(v) for k, v in held.items() if not k.endswith(b"@")}
    assert sum(positions.values()) == 6, positions  # every record read, once
    assert {k.decode() for k in held if k.endswith(b"@")} == {f"{p}@" for p in positions}


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


def test_a_position_written_after_a_loss_does_not_hide_it(settings: HeraldSettings) -> None:
    """Redis flushed, then a new record's copy and position written before the partition
    looked: the partition's mark is gone, so the loss still shows (the records before it are
    read again)."""
    held = RedisHeld(settings.redis, settings.kafka.topic_prefix)
    hot = redis.Redis.from_url(settings.redis.url)
    held.remember("0-t", from_start=True)
    hot.hset(held.positions, "0-t", 7)
    assert held.position("0-t") == 7
    hot.delete(held.positions)  # the loss
    hot.hset(held.positions, "0-t", 8)  # the copy sink, for a record that came since
    assert held.position("0-t") is None
    held.remember("0-t", from_start=True)
    assert held.position("0-t") == 0


class _Held:
    """A `HeldTable` in memory (the users job's is Redis: dataflows/_user_copies.py `RedisHeld`)."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}

    def position(self, part: str) -> int | None:
        return self.positions.get(part)

    def holds(self) -> bool:
        return True

    def remember(self, part: str, from_start: bool) -> None:
        if from_start or part not in self.positions:
            self.positions[part] = 0


def _until_caught_up(partition: Any) -> list[int]:
    """The offsets a partition emits up to its next `CaughtUp`."""
    offsets: list[int] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for item in partition.next_batch():
            if isinstance(item, CaughtUp):
                return offsets
            offsets.append(item.offset)
    raise AssertionError(f"no CaughtUp after {offsets}")


def test_a_store_whose_position_went_back_is_read_again_from_there(
    settings: HeraldSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis failover to a replica that missed the last writes: the positions went back with
    the copies. The partition notices at its next look and reads again from that position."""
    monkeypatch.setattr(changelog, "CHECK_EVERY_S", 0.0)
    send(settings, DEVICES, [contacts(f"b{i}") for i in range(40)], "user_id")
    held = _Held()
    source = ChangelogSource(settings.kafka, [settings.kafka.topic(DEVICES)], held=held)
    checked = 0
    for part in source.list_parts():
        partition = source.build_part("t", part, None)
        try:
            offsets = _until_caught_up(partition)
            if len(offsets) < 3:
                continue
            held.positions[part] = offsets[-1] + 1  # the copies hold them all
            assert partition.next_batch() == []  # seen at the next look: nothing to read
            held.positions[part] = offsets[1]  # a failover lost what came after offsets[1]
            assert _until_caught_up(partition) == offsets[1:]
            checked += 1
        finally:
            partition.close()
    assert checked >= 1
