"""Deterministic ids: stable across calls, distinct across inputs and kinds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herald.ids import delivery_id, digest_window_id, event_id, notification_id


def test_notification_id_is_deterministic_per_tenant_and_request() -> None:
    a = notification_id("tenant-1", "order-123-shipped")
    assert a == notification_id("tenant-1", "order-123-shipped")
    assert a != notification_id("tenant-2", "order-123-shipped")
    assert a != notification_id("tenant-1", "order-124-shipped")
    assert uuid.UUID(a).version == 5 and len(a) == 36


def test_delivery_id_is_user_x_channel_and_per_device_for_push() -> None:
    nid = notification_id("t", "r")
    sms = delivery_id(nid, "u1", "sms")
    assert sms == delivery_id(nid, "u1", "sms")
    assert sms != delivery_id(nid, "u1", "push")
    assert sms != delivery_id(nid, "u2", "sms")
    assert delivery_id(nid, "u1", "push", "dev-a") != delivery_id(nid, "u1", "push", "dev-b")
    assert delivery_id(nid, "u1", "push", "dev-a") == delivery_id(nid, "u1", "push", "dev-a")


def test_inputs_are_unambiguous() -> None:
    assert notification_id("ab", "c") != notification_id("a", "bc")
    assert delivery_id("n", "u:1", "sms") != delivery_id("n", "u", "1:sms")
    assert delivery_id("n", "u", "push", "") != delivery_id("n", "u", "push")


def test_kinds_do_not_collide() -> None:
    assert notification_id("x", "y") != event_id("x", "y", 0)


def test_event_id_dedups_the_same_transition() -> None:
    did = delivery_id("n", "u", "sms")
    assert event_id(did, "DELIVERED", 1) == event_id(did, "DELIVERED", 1)
    assert event_id(did, "DELIVERED", 1) != event_id(did, "DELIVERED", 2)
    assert event_id(did, "DELIVERED", 1) != event_id(did, "READ", 1)
    assert event_id(did, "CLICKED", 1, "evt-1") != event_id(did, "CLICKED", 1, "evt-2")


def test_event_id_of_a_replay_generation_differs_and_generation_0_is_unchanged() -> None:
    # The ids of before generations existed (computed then), so stored events keep theirs.
    assert event_id("d-1", "SENDING", 1) == "04685d92-91fe-53ac-ad85-3b71618ce06f"
    assert event_id("d-1", "FAILED_PERMANENT", 1, "retries_exhausted", generation=0) == (
        "1f08c383-ba8b-57a8-81ff-c9e8fdb777a5"
    )
    first, replay = (event_id("d-1", "SENDING", 1, "", g) for g in (0, 1))
    assert first != replay == event_id("d-1", "SENDING", 1, "", 1)
    assert replay != event_id("d-1", "SENDING", 1, "", 2)
    assert replay != event_id("d-1", "SENDING", 1, "1")  # not the discriminator "1"
    assert event_id("d-1", "SENDING", 1, "1") != event_id("d-1", "SENDING", 1, "", 11)


def test_digest_window_id_uses_the_instant_not_its_zone() -> None:
    start = datetime(2026, 5, 1, 12, tzinfo=UTC)
    same = start.astimezone(timezone(timedelta(hours=8)))
    assert digest_window_id("u", "social_like", "p1", start) == digest_window_id(
        "u", "social_like", "p1", same
    )
    later = start + timedelta(milliseconds=1)
    assert digest_window_id("u", "social_like", "p1", start) != digest_window_id(
        "u", "social_like", "p1", later
    )
    assert digest_window_id("u", "social_follow", None, start) == digest_window_id(
        "u", "social_follow", "", start
    )
    with pytest.raises(ValueError):
        digest_window_id("u", "t", "o", datetime(2026, 5, 1))


def test_non_str_inputs_are_rejected() -> None:
    with pytest.raises(TypeError):
        delivery_id("n", 42, "sms")  # type: ignore[arg-type]


@given(st.lists(st.text(max_size=8), min_size=3, max_size=3, unique=True))
def test_distinct_users_get_distinct_ids(users: list[str]) -> None:
    ids = {delivery_id("n", user, "email") for user in users}
    assert len(ids) == len(users)


@given(st.text(max_size=40))
def test_fast_uuid5_is_rfc4122_uuid5(name: str) -> None:
    from herald.ids import _uuid5

    namespace = uuid.UUID("6ba7b811-9dad-11d1-80b4-00c04fd430c8")
    assert _uuid5(namespace.bytes, name) == str(uuid.uuid5(namespace, name))
