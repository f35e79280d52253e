"""DigestShard: many keys' windows in one state, their timers, TTL and snapshots."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from herald.catalog import Catalog, load_catalog
from herald.digest import summarize, to_ms
from herald.digest_shard import DigestShard, EventItem

T0 = to_ms(datetime(2026, 5, 1, 12, 0, tzinfo=UTC))
GRACE, TTL = 2_000, 3_600_000
STAR = "大V"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def item(
    event_id: str, type_name: str, actor: str, at: int, recipient: str = STAR, obj: str = "p1"
) -> EventItem:
    otype = None if type_name == "social_follow" else "post"
    key = (recipient, type_name, "" if otype is None else obj)
    return (key, event_id, actor, actor, at, "acme", otype)


def storm() -> list[EventItem]:
    likes = [item(f"like-{i}", "social_like", f"user{i}", T0 + i) for i in range(1, 1201)]
    comments = [item(f"c{i}", "social_comment", f"user{x}", T0) for i, x in enumerate("ABC", 1)]
    follows = [item(f"f{i}", "social_follow", f"user{x}", T0) for i, x in enumerate("DE", 1)]
    return likes + comments + follows


def test_seed_003_storm_in_rounds_with_a_redelivered_round(catalog: Catalog) -> None:
    shard = DigestShard(catalog, GRACE, TTL)
    events = storm()
    for start in range(0, len(events), 200):
        batch = events[start : start + 200]
        assert shard.add(batch, T0) == []
        if start == 400:  # round 3 was processed but not acked: the broker sends it again
            assert shard.add(batch, T0) == []
    assert shard.close_due(T0 + 29_999) == []
    assert shard.next_due() == T0 + 30_000 + GRACE  # the comments' window ends first
    windows = shard.close_due(T0 + 3_600_000)
    lines = sorted(summarize(w, "zh", catalog) for w in windows)
    assert lines == sorted(
        [
            "user1、user2、user3 等 1200 人赞了你",
            "userA、userB、userC 评论了你",
            "userD、userE 关注了你",
        ]
    )
    assert shard.close_due(T0 + 3_600_000) == []  # closed once
    assert len(shard) == 3  # remembered (seen ids) until the idle TTL runs out


def test_timers_close_windows_then_forget_idle_keys(catalog: Catalog) -> None:
    shard = DigestShard(catalog, GRACE, TTL)
    shard.add([item("c1", "social_comment", "a", T0)], T0)
    end = T0 + 30_000
    assert shard.next_due() == end + GRACE
    assert shard.close_due(end + GRACE - 1) == []
    (window,) = shard.close_due(end + GRACE)
    assert (window.total, to_ms(window.window_end)) == (1, end)
    assert shard.next_due() == end + TTL
    shard.add([item("c1", "social_comment", "a", T0)], end + 10_000)  # redelivered: ignored
    assert shard.close_due(end + TTL - 1) == [] and len(shard) == 1
    assert shard.close_due(end + TTL) == [] and len(shard) == 0 and shard.next_due() is None
    shard.add([item("c1", "social_comment", "a", T0)], end + TTL + 1)  # after the TTL: new
    assert len(shard.open_windows()) == 1


def test_an_event_past_the_end_closes_the_window_and_reschedules(catalog: Catalog) -> None:
    shard = DigestShard(catalog, GRACE, TTL)
    shard.add([item("c1", "social_comment", "a", T0)], T0)
    closed = shard.add([item("c2", "social_comment", "b", T0 + 30_000)], T0)
    assert [w.actors for w in closed] == [("a",)]
    assert shard.next_due() == T0 + 30_000 + GRACE  # a stale earlier entry may also be due
    (window,) = shard.close_due(T0 + 60_000 + GRACE)
    assert window.actors == ("b",) and to_ms(window.window_start) == T0 + 30_000


def test_an_overdue_window_settles_before_it_closes(catalog: Catalog) -> None:
    """A backlog read in several batches long after its window ended: one window."""
    shard = DigestShard(catalog, GRACE, TTL)
    now = T0 + 3_600_000
    for i in range(3):
        shard.add([item(f"c{i}", "social_comment", f"a{i}", T0)], now)
        assert shard.close_due(now) == []  # still arriving
        now += 1_000
    assert shard.close_due(now - 1_000 + GRACE - 1) == []
    assert [w.total for w in shard.close_due(now - 1_000 + GRACE)] == [3]


def test_direct_type_emits_at_once(catalog: Catalog) -> None:
    shard = DigestShard(catalog, GRACE, TTL)
    events = [
        item("q1", "qa_invite", "a", T0, obj="question-9"),
        item("q2", "qa_invite", "b", T0, obj="question-9"),
    ]
    windows = shard.add(events, T0)
    assert [w.actors for w in windows] == [("a",), ("b",)]
    assert windows[0].window_id != windows[1].window_id
    assert shard.next_due() == T0 + 1 + TTL  # a stale entry of the first window (harmless)
    assert shard.close_due(T0 + 1 + TTL) == [] and len(shard) == 1
    assert shard.next_due() == T0 + 2 + TTL  # the second 1 ms window ended at T0 + 2


def test_snapshot_restores_windows_dedup_and_timers(catalog: Catalog) -> None:
    shard = DigestShard(catalog, GRACE, TTL)
    events = storm()
    shard.add(events[:600], T0)
    blob = shard.snapshot()
    shard.add(events[600:], T0)  # later folds do not leak into the snapshot taken before
    restored = DigestShard.restore(blob, catalog, GRACE, TTL)
    assert len(restored) == 1 and restored.next_due() == T0 + 1 + 600_000 + GRACE
    restored.add(events[500:], T0)  # redelivery of 500..599, then the rest
    for s in (shard, restored):
        windows = s.close_due(T0 + 3_600_000)
        assert sorted((w.key.notification_type, w.total, w.events) for w in windows) == [
            ("social_comment", 3, 3),
            ("social_follow", 2, 2),
            ("social_like", 1200, 1200),
        ]
    closed = DigestShard.restore(restored.snapshot(), catalog, GRACE, TTL)
    assert closed.next_due() == T0 + 30_000 + TTL  # closed keys keep only their TTL timer
    assert closed.close_due(T0 + 700_000 + TTL) == [] and len(closed) == 0


def test_stale_timers_do_not_pile_up(catalog: Catalog) -> None:
    """Each window leaves a stale TTL entry behind; the heap is compacted, not grown."""
    shard = DigestShard(catalog, GRACE, TTL)
    keys = 50
    for n in range(200):  # 200 consecutive comment windows of 50 keys
        at = T0 + n * 30_000
        shard.add([item(f"c{n}-{k}", "social_comment", "a", at, f"r{k}") for k in range(keys)], at)
        shard.close_due(at + GRACE)
    assert len(shard._heap) <= 2 * keys + 1024 + 1
    assert len(shard) == keys


def test_restore_rejects_an_unknown_version(catalog: Catalog) -> None:
    import pickle

    with pytest.raises(ValueError, match="version"):
        DigestShard.restore(pickle.dumps((1, [])), catalog, GRACE, TTL)
