"""Frequency-cap keys, local days and TTLs."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from herald.caps import CAP_INCR_SCRIPT, cap_bucket, cap_key, ttl_seconds, user_tag
from herald.catalog import Catalog, load_catalog
from herald.errors import InvalidTimezone


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)


def test_key_format_and_hash_tag() -> None:
    assert cap_key("u42", "marketing", date(2026, 3, 8)) == "cap:{u42}:marketing:2026-03-08"
    assert user_tag("a{b}c%") == "{a%7Bb%7Dc%25}"
    assert user_tag("a{b") != user_tag("a%7Bb")


def test_marketing_bucket_in_users_local_day(catalog: Catalog) -> None:
    nt = catalog.get("marketing_campaign")
    now = utc(2026, 3, 8, 3)  # 22:00 EST on 2026-03-07 in New York, 08:30 on the 8th in Kolkata
    ny = cap_bucket("u1", nt, now, "America/New_York")
    assert ny is not None
    assert ny.key == "cap:{u1}:marketing:2026-03-07"
    assert (ny.daily_limit, ny.bucket, ny.local_date) == (3, "marketing", date(2026, 3, 7))
    assert ny.ttl_seconds == 2 * 3600 + 3600  # midnight EST is 05:00 UTC, plus the margin
    kolkata = cap_bucket("u1", nt, now, "Asia/Kolkata")
    assert kolkata is not None and kolkata.local_date == date(2026, 3, 8)


def test_allows(catalog: Catalog) -> None:
    bucket = cap_bucket("u1", catalog.get("promo_weekly"), utc(2026, 1, 1), "UTC")
    assert bucket is not None
    assert [bucket.allows(n) for n in range(5)] == [True, True, True, False, False]


def test_transactional_and_uncapped_types_have_no_bucket(catalog: Catalog) -> None:
    now = utc(2026, 1, 1)
    for name in ("otp_login", "order_shipped", "social_like", "inbox_announcement"):
        assert cap_bucket("u1", catalog.get(name), now, "UTC") is None


def test_ttl_follows_dst_day_lengths() -> None:
    tz = "America/New_York"
    start_of_spring_day = utc(2026, 3, 8, 5)  # local midnight, EST
    assert ttl_seconds(start_of_spring_day, tz, timedelta(0)) == 23 * 3600
    start_of_fall_day = utc(2026, 11, 1, 4)  # local midnight, EDT
    assert ttl_seconds(start_of_fall_day, tz, timedelta(0)) == 25 * 3600
    assert ttl_seconds(utc(2026, 1, 1, 23, 59, 59, 999999), "UTC", timedelta(0)) == 1


def test_invalid_timezone(catalog: Catalog) -> None:
    with pytest.raises(InvalidTimezone):
        cap_bucket("u1", catalog.get("promo_weekly"), utc(2026, 1, 1), "Nowhere/City")


def test_script_is_atomic_check_and_increment() -> None:
    assert "INCR" in CAP_INCR_SCRIPT and "EXPIRE" in CAP_INCR_SCRIPT
    assert CAP_INCR_SCRIPT.index("GET") < CAP_INCR_SCRIPT.index("INCR")


@pytest.mark.integration
def test_script_against_real_redis(stack: Any) -> None:
    import redis

    client = redis.Redis.from_url(stack.settings.redis.url)
    incr = client.register_script(CAP_INCR_SCRIPT)
    key = cap_key(f"cap-test-{uuid.uuid4()}", "marketing", date(2026, 3, 8))
    assert [incr(keys=[key], args=[3, 600]) for _ in range(5)] == [1, 2, 3, -1, -1]
    assert int(client.get(key) or 0) == 3
    assert 0 < int(client.ttl(key)) <= 600
    client.close()
