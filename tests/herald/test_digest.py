"""Digest aggregation: the seed-003 storm, window rules, dedup, late events, summaries."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herald.catalog import Catalog, load_catalog
from herald.digest import (
    DigestKey,
    DigestState,
    DigestWindow,
    SocialEvent,
    from_ms,
    notification_request,
    step,
    summarize,
    to_ms,
)
from herald.errors import UnknownNotificationType
from herald.render import render

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def ev(
    event_id: str,
    kind: str,
    actor: str,
    at: datetime = T0,
    recipient: str = "大V",
    obj: str | None = "post-1",
) -> SocialEvent:
    return SocialEvent(
        event_id=event_id,
        event_type=kind,
        actor_id=actor,
        recipient_id=recipient,
        occurred_at=at,
        tenant_id="social",
        object_id=None if kind == "follow" else obj,
        object_type=None if kind == "follow" else "post",
    )


class Job:
    """A tiny stand-in for the digest dataflow: keyed states, step, clock-driven close."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.states: dict[str, DigestState] = {}
        self.out: list[DigestWindow] = []

    def feed(self, event: SocialEvent) -> None:
        key = DigestKey.of(event, self.catalog).as_str()
        state, closed = step(self.states.get(key), event, self.catalog)
        self.states[key] = state
        self.out.extend(closed)

    def tick(self, now: datetime) -> None:
        for state in self.states.values():
            if state.should_close(to_ms(now)):
                window = state.close()
                assert window is not None
                self.out.append(window)


def seed_events() -> list[SocialEvent]:
    events = [
        ev(f"like-{i}", "like", f"user{i}", T0 + timedelta(milliseconds=i)) for i in range(1, 1201)
    ]
    later = T0 + timedelta(seconds=2)
    events += [ev(f"c{i}", "comment", f"user{x}", later) for i, x in enumerate("ABC", 1)]
    events += [ev(f"f{i}", "follow", f"user{x}", later) for i, x in enumerate("DE", 1)]
    return events


def test_seed_003_storm_with_redelivery_gives_exactly_three_summaries(catalog: Catalog) -> None:
    """1,205 events in 200-event rounds; round 3 crashes before ack and is redelivered."""
    events = seed_events()
    job = Job(catalog)
    cursor, redelivered = 0, 0
    for round_no in range(1, 100):
        if cursor >= len(events):
            break
        batch = events[cursor : cursor + 200]
        for event in batch:
            job.feed(event)
        if round_no == 3:  # processed but not acked: the broker redelivers the same 200
            for event in batch:
                job.feed(event)
            redelivered += len(batch)
        cursor += len(batch)
    assert redelivered == 200
    assert job.out == []  # every window is still open
    job.tick(T0 + timedelta(hours=1))
    assert len(job.out) == 3
    zh = sorted(summarize(w, "zh", catalog) for w in job.out)
    assert zh == sorted(
        [
            "user1、user2、user3 等 1200 人赞了你",
            "userA、userB、userC 评论了你",
            "userD、userE 关注了你",
        ]
    )
    en = {w.key.notification_type: summarize(w, "en", catalog) for w in job.out}
    assert en == {
        "social_like": "user1, user2, user3 and 1,197 others liked your post",
        "social_comment": "userA, userB and userC commented on your post",
        "social_follow": "userD and userE followed you",
    }
    likes = next(w for w in job.out if w.key.notification_type == "social_like")
    assert (likes.total, likes.events) == (1200, 1200)
    assert likes.first_event_at == T0 + timedelta(milliseconds=1)
    assert likes.last_event_at == T0 + timedelta(milliseconds=1200)


def test_summary_through_the_plan_templates(catalog: Catalog) -> None:
    job = Job(catalog)
    for event in seed_events()[:1200]:
        job.feed(event)
    job.tick(T0 + timedelta(hours=1))
    (window,) = job.out
    push = render(catalog, "social_like", "push", "zh-CN", None, window.params())
    assert push.body == "user1、user2、user3 等 1200 人赞了你"
    assert push.title == "新的赞"


def test_windows_have_per_type_lengths(catalog: Catalog) -> None:
    job = Job(catalog)
    job.feed(ev("l1", "like", "a", T0))
    job.feed(ev("l2", "like", "b", T0 + timedelta(seconds=599)))
    job.feed(ev("c1", "comment", "a", T0))
    job.tick(T0 + timedelta(seconds=30))
    assert [w.key.notification_type for w in job.out] == ["social_comment"]
    job.feed(ev("l3", "like", "c", T0 + timedelta(seconds=600)))  # closes the first like window
    assert [w.total for w in job.out if w.key.notification_type == "social_like"] == [2]
    job.tick(T0 + timedelta(seconds=1200))
    likes = [w for w in job.out if w.key.notification_type == "social_like"]
    assert [w.total for w in likes] == [2, 1]
    assert likes[1].window_start == T0 + timedelta(seconds=600)


def test_direct_type_emits_each_event_with_distinct_window_ids(catalog: Catalog) -> None:
    job = Job(catalog)
    job.feed(ev("q1", "qa_invite", "a", T0, obj="question-9"))
    job.feed(ev("q2", "qa_invite", "b", T0, obj="question-9"))  # same millisecond
    assert [w.actors for w in job.out] == [("a",), ("b",)]
    assert job.out[0].window_id != job.out[1].window_id
    assert summarize(job.out[0], "en", catalog) == "a invited you to answer a question"


def test_late_events_go_into_the_next_window(catalog: Catalog) -> None:
    job = Job(catalog)
    job.feed(ev("c1", "comment", "a", T0 + timedelta(seconds=10)))
    job.feed(ev("c0", "comment", "z", T0))  # older than window_start: merged into the open one
    job.tick(T0 + timedelta(seconds=40))
    assert [w.actors for w in job.out] == [("a", "z")]
    first = job.out[0]
    job.feed(ev("c-late", "comment", "b", T0 + timedelta(seconds=5)))  # its window already closed
    state = next(iter(job.states.values()))
    assert state.window_start is not None  # the next window starts where the last ended:
    assert from_ms(state.window_start) == first.window_end
    job.tick(T0 + timedelta(seconds=80))
    assert [w.actors for w in job.out] == [("a", "z"), ("b",)]
    assert job.out[1].window_id != first.window_id


def test_duplicates_are_ignored_across_windows(catalog: Catalog) -> None:
    job = Job(catalog)
    job.feed(ev("c1", "comment", "a"))
    job.tick(T0 + timedelta(minutes=5))
    job.feed(ev("c1", "comment", "a"))  # redelivered after its window was emitted
    job.tick(T0 + timedelta(minutes=10))
    assert len(job.out) == 1


def test_same_actor_counts_once_and_is_shown_once(catalog: Catalog) -> None:
    job = Job(catalog)
    for i, actor in enumerate(["a", "a", "b", "a", "c", "d"]):
        job.feed(ev(f"l{i}", "like", actor))
    job.tick(T0 + timedelta(hours=1))
    (window,) = job.out
    assert window.actors == ("a", "b", "c") and window.total == 4 and window.events == 6
    assert summarize(window, "en", catalog) == "a, b, c and 1 other liked your post"


def test_seen_ids_are_bounded(catalog: Catalog) -> None:
    """The newest `max_seen_ids` ids are always remembered; the set never outgrows the cap by
    more than `seen_slack`, and older ids are forgotten."""
    config = catalog.get("social_comment").digest
    assert config is not None
    small = type(config)(config.event_type, 30, 3, 16, config.texts)
    assert small.seen_slack == 2
    state = DigestState(DigestKey("u", "social_comment", "p"), small)
    at = to_ms(T0)
    for i in range(100):
        state.fold(f"e{i}", f"a{i}", f"a{i}", at, "t", "post")
        assert len(state.seen_events) <= 16 + 2
        assert all(state.seen(f"e{j}") for j in range(max(0, i - 15), i + 1))
    assert not state.seen("e0") and not state.seen("e80")
    assert state.fold("e99", "a99", "a99", at, "t", "post") == ()  # a redelivery: ignored
    assert state.events == 100


def test_display_names_idle_and_pickle(catalog: Catalog) -> None:
    event = SocialEvent("e1", "follow", "u-17", "r", T0, "t", actor_name="Ann")
    state, closed = step(None, event, catalog)
    assert closed == [] and state.actors == [("u-17", "Ann")]
    hour = 3_600_000
    assert not state.idle(to_ms(T0 + timedelta(days=1)), hour)  # a window is open
    clone = pickle.loads(pickle.dumps(state))
    assert clone == state
    frozen = pickle.loads(pickle.dumps(state.freeze()))
    assert DigestState.thaw(state.key, state.config, frozen) == state
    window = state.close()
    assert window is not None and summarize(window, "en", catalog) == "Ann followed you"
    assert state.close() is None
    assert not state.idle(to_ms(window.window_end) + hour - 60_000, hour)
    assert state.idle(to_ms(window.window_end) + hour, hour)


def test_social_event_from_record() -> None:
    millis = int(T0.timestamp() * 1000)
    rec = {
        "event_id": "e",
        "event_type": "like",
        "actor_id": "a",
        "recipient_id": "r",
        "occurred_at": millis,
        "tenant_id": "t",
        "actor_name": None,
        "object_id": "p",
        "object_type": "post",
    }
    event = SocialEvent.from_record(rec)
    assert event.occurred_at == T0 and event.display_name == "a" and event.object_id == "p"
    assert SocialEvent.from_record({**rec, "occurred_at": T0}).occurred_at == T0
    with pytest.raises(ValueError):
        SocialEvent.from_record({**rec, "occurred_at": datetime(2026, 1, 1)})


def test_unknown_event_type_is_rejected(catalog: Catalog) -> None:
    with pytest.raises(UnknownNotificationType):
        step(None, ev("x", "poke", "a"), catalog)


def test_notification_request_matches_the_avro_contract(catalog: Catalog) -> None:
    job = Job(catalog)
    job.feed(ev("l1", "like", "a"))
    job.tick(T0 + timedelta(hours=1))
    (window,) = job.out
    req = notification_request(window, catalog, accepted_at=T0)
    schema = json.loads((SCHEMAS / "notification_request.avsc").read_text())
    assert set(req) == {f["name"] for f in schema["fields"]}
    assert req["request_id"] == window.window_id
    assert req["notification_type"] == "social_like" and req["traffic_class"] == "normal"
    assert req["recipients"]["user_ids"] == ["大V"]
    assert req["params"]["digest_total"] == "1" and req["params"]["object_id"] == "post-1"
    again = notification_request(window, catalog, accepted_at=T0 + timedelta(seconds=5))
    assert again["notification_id"] == req["notification_id"]


@settings(max_examples=100, deadline=None)
@given(
    offsets=st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=60),
    dup_every=st.integers(min_value=2, max_value=5),
)
def test_every_distinct_event_is_counted_exactly_once(
    catalog: Catalog, offsets: list[int], dup_every: int
) -> None:
    job = Job(catalog)
    events = [
        ev(f"e{i}", "comment", f"a{i}", T0 + timedelta(seconds=s)) for i, s in enumerate(offsets)
    ]
    for i, event in enumerate(events):
        job.feed(event)
        if i % dup_every == 0:
            job.feed(event)
        job.tick(event.occurred_at)
    job.tick(T0 + timedelta(hours=1))
    assert sum(w.events for w in job.out) == len(events)
    starts = [w.window_start for w in job.out]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    for a, b in zip(job.out, job.out[1:], strict=False):
        assert a.window_end <= b.window_start
