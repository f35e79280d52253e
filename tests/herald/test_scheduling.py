"""herald.scheduling: local send times across DST, jitter, buckets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from herald.scheduling import (
    Bucket,
    ScheduledEntry,
    bucket_key,
    jitter_fraction,
    local_send_at,
    release_at,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "wall", "tz", "expected"),
    [
        # New York springs forward at 02:00 on 2026-03-08: 02:30 does not exist -> 03:00 EDT
        (utc(2026, 3, 8, 5, 0), "02:30", "America/New_York", utc(2026, 3, 8, 7, 0)),
        # ... and falls back at 02:00 on 2026-11-01: 01:30 happens twice -> the first (EDT)
        (utc(2026, 11, 1, 4, 0), "01:30", "America/New_York", utc(2026, 11, 1, 5, 30)),
        # Kolkata: +05:30, no DST
        (utc(2026, 3, 8, 0, 0), "09:00", "Asia/Kolkata", utc(2026, 3, 8, 3, 30)),
        # Lord Howe springs forward by 30 min at 02:00 on 2026-10-04: 02:15 -> 02:30 (+11)
        (utc(2026, 10, 3, 14, 0), "02:15", "Australia/Lord_Howe", utc(2026, 10, 3, 15, 30)),
        # ... and falls back 02:00 -> 01:30 on 2026-04-05: 01:45 twice -> the first (+11)
        (utc(2026, 4, 4, 13, 0), "01:45", "Australia/Lord_Howe", utc(2026, 4, 4, 14, 45)),
    ],
)
def test_local_send_time_follows_the_dst_rule(
    now: datetime, wall: str, tz: str, expected: datetime
) -> None:
    assert local_send_at(now, None, wall, tz) == expected


def test_local_send_time_is_at_most_once_per_local_day() -> None:
    # 01:45 Lord Howe occurs twice on 2026-04-05; after the first one, the next is the next day
    after_first = utc(2026, 4, 4, 14, 50)
    assert local_send_at(after_first, None, "01:45", "Australia/Lord_Howe") == utc(
        2026,
        4,
        5,
        15,
        15,  # 01:45 LHST (+10:30) on 6 April
    )


def test_local_send_time_never_precedes_send_at() -> None:
    send_at = utc(2026, 3, 10, 12, 0)
    assert local_send_at(utc(2026, 3, 8), send_at, "09:00", "Asia/Kolkata") == utc(
        2026, 3, 11, 3, 30
    )


def test_release_jitter_is_deterministic_bounded_and_skips_transactional() -> None:
    nb = utc(2026, 3, 8, 9, 0)
    window = timedelta(minutes=5)
    releases = [release_at(nb, f"d-{i}", "bulk", window) for i in range(200)]
    assert all(nb <= r < nb + window for r in releases)
    assert max(releases) - min(releases) > timedelta(minutes=4)  # spread over the window
    assert release_at(nb, "d-7", "bulk", window) == releases[7]
    assert release_at(nb, "d-7", "transactional", window) == nb
    assert release_at(nb, "d-7", "bulk", window, expire_at=nb + timedelta(seconds=1)) in (
        nb,
        nb + window * jitter_fraction("d-7"),
    )
    late = [release_at(nb, f"d-{i}", "bulk", window, nb + timedelta(seconds=10)) for i in range(50)]
    assert all(r < nb + timedelta(seconds=10) for r in late)


def test_bucket_keys_group_by_slot_and_shard() -> None:
    at = utc(2026, 3, 8, 9, 0, 30)
    index, shard = bucket_key(at, "d-1", 60, 8).split(":")
    assert int(index) == int(at.timestamp()) // 60 and 0 <= int(shard) < 8
    assert bucket_key(at + timedelta(seconds=20), "d-1", 60, 8) == bucket_key(at, "d-1", 60, 8)


def entry(did: str, at: datetime) -> ScheduledEntry:
    return ScheduledEntry(at, did, "herald.deliveries.push.bulk", b"\x00")


def test_bucket_releases_due_entries_in_order_once() -> None:
    bucket = Bucket()
    t = utc(2026, 3, 8, 9, 0)
    for did, offset in (("b", 2), ("a", 1), ("c", 5), ("a", 1)):
        bucket.add(entry(did, t + timedelta(seconds=offset)))
    assert len(bucket) == 3 and bucket.next_release() == t + timedelta(seconds=1)
    assert [e.delivery_id for e in bucket.due(t + timedelta(seconds=3))] == ["a", "b"]
    assert bucket.next_release() == t + timedelta(seconds=5)
    assert [e.delivery_id for e in bucket.due(t + timedelta(seconds=9))] == ["c"]
    assert len(bucket) == 0 and bucket.next_release() is None
