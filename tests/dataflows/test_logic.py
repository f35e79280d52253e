"""The planning jobs' keyed logics, driven directly and through Bytewax's testing runner."""

from __future__ import annotations

import gc
import pickle
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

from dataflows import _runtime as runtime
from dataflows._settings import Clock
from dataflows._users import ChangelogDecoder, ShardRouter, TableChanges, UserShardLogic
from dataflows.plan import CHUNK_USERS, _chunks
from dataflows.schedule import BucketLogic
from herald.catalog import load_catalog
from herald.planning import (
    CaughtUp,
    Planned,
    TableUpdate,
    UserTasks,
    UserView,
    admit_request,
    shard_of,
)
from herald.policy import ContactPoints, Preferences
from herald.scheduling import ScheduledEntry
from sources.kafka import KafkaMessage

CATALOG = load_catalog()
T0 = datetime(2026, 3, 8, 9, 0, tzinfo=UTC)


class FakeClock(Clock):
    """A settable job clock."""

    def __init__(self, now: datetime) -> None:
        super().__init__()  # offset 0: notify_at's system-clock instants equal job-clock ones
        object.__setattr__(self, "at", now)

    def now(self) -> datetime:
        return self.at  # type: ignore[attr-defined,no-any-return]

    def set(self, now: datetime) -> None:
        object.__setattr__(self, "at", now)


def tasks(*users: str) -> UserTasks:
    rec = {
        "notification_id": "n-1", "request_id": "r", "tenant_id": "t",
        "notification_type": "inbox_announcement", "traffic_class": "bulk",
        "recipients": {"user_ids": list(users), "segment_id": None},
        "params": {"title": "t", "body": "b"}, "accepted_at": T0, "source": "api",
    }  # fmt: skip
    return UserTasks(admit_request(rec, CATALOG, "t:0:0"), 0, tuple((u, None) for u in users))


def test_user_shard_waits_for_every_changelog_partition() -> None:
    logic = UserShardLogic(frozenset({"0-prefs", "0-devices"}), None)
    out, _ = logic.on_batch(
        [tasks("u1"), TableChanges([TableUpdate("preferences", "u1", Preferences("u1", True))])]
    )
    assert out == [] and logic.snapshot() == (tasks("u1"),)  # waiting, and kept in the snapshot
    out, _ = logic.on_batch([TableChanges([CaughtUp("0-prefs")])])
    assert out == []
    out, _ = logic.on_batch([TableChanges([CaughtUp("0-devices")]), tasks("u2")])
    assert [v.user_id for p in out for v in p.users] == ["u1", "u2"]
    assert out[0].users[0].prefs.global_opt_out  # the update that came after the task applies
    assert logic.snapshot() == ()
    restored = UserShardLogic(frozenset({"0-prefs"}), (tasks("u3"),))
    released, _ = restored.on_batch([TableChanges([CaughtUp("0-prefs")])])
    assert [v.user_id for p in released for v in p.users] == ["u3"]


def test_a_long_table_load_and_readiness_freeze_the_table_out_of_the_collector() -> None:
    gc.unfreeze()
    logic = UserShardLogic(frozenset({"0-prefs"}), None)
    before = gc.get_freeze_count()
    updates = [TableUpdate("preferences", f"u{i}", Preferences(f"u{i}")) for i in range(10)]
    logic.on_batch([TableChanges(updates)])
    assert gc.get_freeze_count() == before  # not yet FREEZE_EVERY updates
    try:
        with patch.object(runtime, "FREEZE_EVERY", 20):
            logic.on_batch(
                [TableChanges([TableUpdate("preferences", f"v{i}", Preferences(f"v{i}"))
                               for i in range(10)])]
            )  # fmt: skip
            assert gc.get_freeze_count() > before  # the 20th update froze what the table holds
            gc.unfreeze()
            logic.on_batch([TableChanges([CaughtUp("0-prefs")])])
            assert gc.get_freeze_count() > 0  # ready: the loaded table is long-lived
    finally:
        gc.unfreeze()


def test_plan_chunks_take_the_batch_request_by_request() -> None:
    def planned(nid: str, shard: int, users: int) -> tuple[str, Planned]:
        t = tasks(*(f"{nid}-{shard}-{i}" for i in range(users)))
        request = replace(t.request, notification_id=nid)
        views = tuple(UserView(u, None, Preferences(u), ContactPoints(u)) for u, _p in t.users)
        return str(shard), Planned(request, 0, views)

    # shard order, as the user shards emit them: every request's users spread over the shards
    batch = [planned(nid, shard, 600) for shard in range(5) for nid in ("a", "b", "c")]
    chunks = list(_chunks(batch))
    assert [item for chunk in chunks for item in chunk] == sorted(
        batch, key=lambda item: item[1].request.notification_id
    )  # every item once, request by request, each request's items in their order
    sizes = [sum(len(p.users) for _s, p in chunk) for chunk in chunks]
    assert sizes == [CHUNK_USERS + 400] * 3 + [1800]
    assert list(_chunks([])) == []


def test_changelog_records_route_to_shards_and_bad_ones_are_dead_letters() -> None:
    decode = ChangelogDecoder(lambda b: {"user_id": "u1", "timezone": "Mars/Base"}, "p.prefs")
    bad = decode(KafkaMessage("p.prefs", 0, 5, b"u1", b"x"))
    assert isinstance(bad, dict) and bad["reason"] == "invalid_timezone"
    tombstone = decode(KafkaMessage("p.devices", 1, 9, b"u1", None))
    assert tombstone == TableUpdate("contacts", "u1", None)

    route = ShardRouter(decode, 8)
    out = route([KafkaMessage("p.devices", 1, 9, b"u1", None),
                 KafkaMessage("p.prefs", 0, 5, b"u1", b"x"),
                 KafkaMessage("p.devices", 1, 10, b"u2", None), CaughtUp("0-p"),
                 KafkaMessage("p.devices", 1, 11, b"u1", None)])  # fmt: skip
    letters = [item for item in out if isinstance(item, dict)]
    routed = dict(item for item in out if isinstance(item, tuple))
    assert [letter["offset"] for letter in letters] == [5]
    assert len(routed) == 8  # the CaughtUp reaches every shard
    u1, u2 = shard_of("u1", 8), shard_of("u2", 8)
    assert u1 != u2
    assert routed[u1].items == [tombstone, CaughtUp("0-p"), tombstone]  # in the batch's order
    assert routed[u2].items == [TableUpdate("contacts", "u2", None), CaughtUp("0-p")]


def test_bucket_logic_releases_when_due_and_disappears() -> None:
    clock = FakeClock(T0)
    logic = BucketLogic(clock, None)
    entries = [ScheduledEntry(T0 + timedelta(seconds=s), f"d{s}", "x", b"v") for s in (5, 1, 9)]
    assert logic.on_batch(entries) == ([], False)
    assert logic.notify_at() == T0 + timedelta(seconds=1)
    clock.set(T0 + timedelta(seconds=6))
    restored = BucketLogic(clock, pickle.loads(pickle.dumps(logic.snapshot())))
    for state in (logic, restored):
        released, empty = state.on_notify()
        assert [e.delivery_id for e in released] == ["d1", "d5"] and not empty
    clock.set(T0 + timedelta(seconds=9))
    assert [e.delivery_id for e in logic.on_notify()[0]] == ["d9"]
    assert logic.on_notify() == ([], True)
