"""The planning jobs' logics, driven directly and through Bytewax's testing runner."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

from dataflows._settings import Clock
from dataflows.plan.flow import CHUNK_USERS, _chunks
from dataflows.schedule import BucketLogic
from dataflows.users import ChangelogDecoder
from herald.catalog import load_catalog
from herald.kafka_records import KafkaMessage
from herald.planning import AudienceBatch, admit_request
from herald.policy import Preferences
from herald.scheduling import ScheduledEntry

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


def batch(nid: str, batch_no: int, users: int) -> AudienceBatch:
    rec = {
        "notification_id": nid, "request_id": "r", "tenant_id": "t",
        "notification_type": "inbox_announcement", "traffic_class": "bulk",
        "recipients": {"user_ids": ["x"], "segment_id": None},
        "params": {"title": "t", "body": "b"}, "accepted_at": T0, "source": "api",
    }  # fmt: skip
    request = admit_request(rec, CATALOG, "t:0:0")
    return AudienceBatch(
        request, batch_no, tuple((f"{nid}-{batch_no}-{i}", None) for i in range(users)), False
    )


def test_plan_chunks_take_the_batch_request_by_request() -> None:
    # requests interleaved, as their partitions and expansions emit them
    items = [batch(nid, n, 600) for n in range(5) for nid in ("a", "b", "c")]
    chunks = list(_chunks(items))
    assert [item for chunk in chunks for item in chunk] == sorted(
        items, key=lambda item: item.request.notification_id
    )  # every item once, request by request, each request's items in their order
    sizes = [sum(len(b.users) for b in chunk) for chunk in chunks]
    assert sizes == [CHUNK_USERS + 400] * 3 + [1800]
    assert list(_chunks([])) == []


def test_changelog_records_are_validated_and_bad_ones_are_dead_letters() -> None:
    good = {"user_id": "u1", "timezone": "Europe/Zurich", "version": 3}
    decode = ChangelogDecoder(lambda b: good if b == b"ok" else {**good, "timezone": "Mars/Base"},
                              "p.prefs")  # fmt: skip
    bad = decode.record(KafkaMessage("p.prefs", 0, 5, b"u1", b"x"))
    assert isinstance(bad, dict) and bad["reason"] == "invalid_timezone" and bad["offset"] == 5
    assert decode.record(KafkaMessage("p.prefs", 0, 6, b"u1", b"ok")) == (
        good, Preferences("u1", timezone="Europe/Zurich", version=3)
    )  # fmt: skip


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
