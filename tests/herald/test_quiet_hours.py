"""Quiet hours, local-time campaigns and local days across DST gaps, overlaps and odd offsets."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herald.errors import InvalidTimeOfDay, InvalidTimezone
from herald.quiet_hours import (
    QuietWindow,
    end_of_local_day,
    get_zone,
    local_day,
    next_local_time,
    parse_hhmm,
    quiet_until,
    resolve_local,
)

NY = "America/New_York"
NIGHT = QuietWindow.parse("22:00", "08:00")


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)


def local(tz: str, y: int, mo: int, d: int, h: int = 0, mi: int = 0, fold: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=get_zone(tz), fold=fold)


# --- parsing and zones -------------------------------------------------------------------------


def test_parse_hhmm_accepts_24h_and_rejects_everything_else() -> None:
    assert parse_hhmm("00:00") == time(0, 0)
    assert parse_hhmm("23:59") == time(23, 59)
    for bad in ["24:00", "7:00", "07:60", "0700", " 07:00", "", "07:00:00"]:
        with pytest.raises(InvalidTimeOfDay) as exc:
            parse_hhmm(bad)
        assert exc.value.code == "invalid_time_of_day"


@pytest.mark.parametrize(
    "name", ["Mars/Olympus", "", "localtime", "posixrules", "../etc/passwd", "Europe/London "]
)
def test_invalid_timezone_is_a_clear_error(name: str) -> None:
    with pytest.raises(InvalidTimezone) as exc:
        quiet_until(utc(2026, 1, 1, 12), NIGHT, name)
    assert exc.value.code == "invalid_timezone"
    assert "invalid_timezone" in str(exc.value)


def test_naive_datetime_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        quiet_until(datetime(2026, 1, 1, 23), NIGHT, "UTC")


# --- the basic window --------------------------------------------------------------------------


def test_outside_window_is_none_and_inside_returns_the_end() -> None:
    assert quiet_until(utc(2026, 6, 1, 12), NIGHT, "UTC") is None
    assert quiet_until(utc(2026, 6, 1, 23), NIGHT, "UTC") == utc(2026, 6, 2, 8)
    assert quiet_until(utc(2026, 6, 2, 3), NIGHT, "UTC") == utc(2026, 6, 2, 8)


def test_start_is_inclusive_and_end_exclusive() -> None:
    assert quiet_until(utc(2026, 6, 1, 22), NIGHT, "UTC") == utc(2026, 6, 2, 8)
    assert quiet_until(utc(2026, 6, 2, 8), NIGHT, "UTC") is None
    assert quiet_until(utc(2026, 6, 2, 7, 59, 59), NIGHT, "UTC") == utc(2026, 6, 2, 8)


def test_non_wrapping_window_and_empty_window() -> None:
    lunch = QuietWindow.parse("12:00", "13:30")
    assert quiet_until(utc(2026, 6, 1, 12, 15), lunch, "UTC") == utc(2026, 6, 1, 13, 30)
    assert quiet_until(utc(2026, 6, 1, 11, 59), lunch, "UTC") is None
    assert quiet_until(utc(2026, 6, 1, 12), QuietWindow.parse("12:00", "12:00"), "UTC") is None
    assert quiet_until(utc(2026, 6, 1, 12), None, "UTC") is None


def test_window_is_evaluated_in_the_users_zone_not_utc() -> None:
    # 03:00 UTC is 23:00 EDT the previous evening in New York: quiet until 08:00 EDT = 12:00 UTC.
    assert quiet_until(utc(2026, 6, 2, 3), NIGHT, NY) == utc(2026, 6, 2, 12)
    # 13:00 UTC is 09:00 EDT: not quiet, though it would be "quiet" nowhere in UTC either.
    assert quiet_until(utc(2026, 6, 2, 13), NIGHT, NY) is None


# --- America/New_York DST ----------------------------------------------------------------------


def test_new_york_spring_forward_end_in_gap_moves_to_next_valid_instant() -> None:
    window = QuietWindow.parse("22:00", "02:30")  # 02:30 does not exist on 2026-03-08
    now = local(NY, 2026, 3, 8, 1, 15)  # EST
    assert quiet_until(now, window, NY) == utc(2026, 3, 8, 7)  # 03:00 EDT
    assert resolve_local(date(2026, 3, 8), time(2, 30), NY) == local(NY, 2026, 3, 8, 3, 0)


def test_new_york_spring_forward_night_is_one_hour_shorter() -> None:
    now = local(NY, 2026, 3, 7, 23, 0)  # EST
    end = quiet_until(now, NIGHT, NY)
    assert end == local(NY, 2026, 3, 8, 8, 0) == utc(2026, 3, 8, 12)
    assert end is not None and end - now == timedelta(hours=8)


def test_new_york_fall_back_ambiguous_end_is_first_occurrence() -> None:
    window = QuietWindow.parse("22:00", "01:30")  # 01:30 happens twice on 2026-11-01
    first_0130 = utc(2026, 11, 1, 5, 30)  # 01:30 EDT
    assert quiet_until(local(NY, 2026, 11, 1, 0, 45), window, NY) == first_0130
    # The repeated hour after the first 01:30 is not quiet, so a released delivery stays released.
    assert quiet_until(local(NY, 2026, 11, 1, 1, 10, fold=1), window, NY) is None
    assert quiet_until(first_0130, window, NY) is None


def test_new_york_fall_back_night_is_one_hour_longer() -> None:
    now = local(NY, 2026, 10, 31, 23, 0)  # EDT
    end = quiet_until(now, NIGHT, NY)
    assert end == utc(2026, 11, 1, 13)  # 08:00 EST
    assert end is not None and end - now == timedelta(hours=10)


def test_new_york_window_starting_in_gap_starts_at_gap_end() -> None:
    window = QuietWindow.parse("02:15", "06:00")
    assert quiet_until(local(NY, 2026, 3, 8, 1, 59), window, NY) is None
    assert quiet_until(utc(2026, 3, 8, 7), window, NY) == local(NY, 2026, 3, 8, 6, 0)


def test_window_entirely_inside_gap_is_empty_that_day() -> None:
    window = QuietWindow.parse("02:05", "02:55")
    for minute in range(0, 60, 5):
        assert quiet_until(utc(2026, 3, 8, 6, 30) + timedelta(minutes=minute), window, NY) is None
    assert quiet_until(local(NY, 2026, 3, 9, 2, 10), window, NY) == local(NY, 2026, 3, 9, 2, 55)


# --- odd offsets -------------------------------------------------------------------------------


def test_asia_kolkata_half_hour_offset() -> None:
    # 16:45 UTC = 22:15 IST (+05:30): quiet until 08:00 IST = 02:30 UTC.
    assert quiet_until(utc(2026, 1, 10, 16, 45), NIGHT, "Asia/Kolkata") == utc(2026, 1, 11, 2, 30)
    assert quiet_until(utc(2026, 1, 10, 16, 29), NIGHT, "Asia/Kolkata") is None


def test_asia_kathmandu_45_minute_offset() -> None:
    # 16:15 UTC = 22:00 NPT (+05:45): quiet until 08:00 NPT = 02:15 UTC.
    assert quiet_until(utc(2026, 1, 10, 16, 15), NIGHT, "Asia/Kathmandu") == utc(2026, 1, 11, 2, 15)
    assert quiet_until(utc(2026, 1, 10, 16, 14), NIGHT, "Asia/Kathmandu") is None


def test_lord_howe_half_hour_spring_forward_gap() -> None:
    tz = "Australia/Lord_Howe"  # 2026-10-04 02:00 +10:30 -> 02:30 +11:00
    window = QuietWindow.parse("22:00", "02:15")
    now = local(tz, 2026, 10, 4, 1, 0)
    assert quiet_until(now, window, tz) == utc(2026, 10, 3, 15, 30)  # 02:30 +11:00
    assert resolve_local(date(2026, 10, 4), time(2, 15), tz) == local(tz, 2026, 10, 4, 2, 30)


def test_lord_howe_half_hour_fall_back_overlap() -> None:
    tz = "Australia/Lord_Howe"  # 2026-04-05 02:00 +11:00 -> 01:30 +10:30
    window = QuietWindow.parse("22:00", "01:45")
    assert quiet_until(local(tz, 2026, 4, 5, 1, 0), window, tz) == utc(2026, 4, 4, 14, 45)
    assert quiet_until(local(tz, 2026, 4, 5, 1, 40, fold=1), window, tz) is None


def test_europe_london_gmt_and_bst() -> None:
    tz = "Europe/London"
    assert quiet_until(utc(2026, 1, 15, 22, 30), NIGHT, tz) == utc(2026, 1, 16, 8)
    assert quiet_until(utc(2026, 7, 15, 21, 30), NIGHT, tz) == utc(2026, 7, 16, 7)  # BST
    assert quiet_until(utc(2026, 7, 15, 20, 59), NIGHT, tz) is None
    # 2026-03-29 01:00 GMT -> 02:00 BST: a 01:30 end resolves to 02:00 BST = 01:00 UTC.
    window = QuietWindow.parse("23:00", "01:30")
    assert quiet_until(utc(2026, 3, 29, 0, 10), window, tz) == utc(2026, 3, 29, 1)


# --- next_local_time ---------------------------------------------------------------------------


def test_next_local_time_today_or_tomorrow() -> None:
    assert next_local_time(utc(2026, 6, 1, 12), "09:00", NY) == utc(2026, 6, 1, 13)
    assert next_local_time(utc(2026, 6, 1, 14), "09:00", NY) == utc(2026, 6, 2, 13)
    assert next_local_time(utc(2026, 6, 1, 13), "09:00", NY) == utc(2026, 6, 1, 13)


def test_next_local_time_nonexistent_moves_to_next_valid_once_per_day() -> None:
    # 02:30 on 2026-03-08 does not exist: 03:00 EDT that day, then 02:30 EDT the day after.
    first = next_local_time(local(NY, 2026, 3, 8, 0, 0), "02:30", NY)
    assert first == local(NY, 2026, 3, 8, 3, 0)
    second = next_local_time(first + timedelta(seconds=1), "02:30", NY)
    assert second == local(NY, 2026, 3, 9, 2, 30)


def test_next_local_time_ambiguous_fires_only_at_first_occurrence() -> None:
    first = next_local_time(local(NY, 2026, 11, 1, 0, 0), "01:30", NY)
    assert first == utc(2026, 11, 1, 5, 30)
    # During the repeated hour the next 01:30 is tomorrow's, not the second occurrence today.
    again = next_local_time(first + timedelta(minutes=1), "01:30", NY)
    assert again == local(NY, 2026, 11, 2, 1, 30)


def test_next_local_time_for_campaign_across_zones() -> None:
    now = utc(2026, 10, 19, 20)
    assert next_local_time(now, "09:00", "Asia/Kolkata") == utc(2026, 10, 20, 3, 30)
    assert next_local_time(now, "09:00", "Asia/Kathmandu") == utc(2026, 10, 20, 3, 15)
    assert next_local_time(now, "09:00", "Australia/Lord_Howe") == utc(2026, 10, 19, 22)


# --- local days --------------------------------------------------------------------------------


def test_local_day_and_end_of_local_day() -> None:
    now = utc(2026, 3, 8, 3)  # 22:00 EST on the 7th
    assert local_day(now, NY) == date(2026, 3, 7)
    assert local_day(now, "Asia/Kolkata") == date(2026, 3, 8)
    assert end_of_local_day(now, NY) == utc(2026, 3, 8, 5)
    # The spring-forward day has 23 hours.
    start = end_of_local_day(now, NY)
    assert end_of_local_day(start, NY) - start == timedelta(hours=23)


# --- properties --------------------------------------------------------------------------------

ZONES = [NY, "Asia/Kolkata", "Asia/Kathmandu", "Australia/Lord_Howe", "Europe/London", "UTC"]


@settings(max_examples=300, deadline=None)
@given(
    minutes=st.integers(min_value=0, max_value=2 * 365 * 24 * 60),
    start=st.integers(min_value=0, max_value=23 * 60 + 59),
    end=st.integers(min_value=0, max_value=23 * 60 + 59),
    tz=st.sampled_from(ZONES),
)
def test_quiet_until_is_in_the_future_and_release_is_final(
    minutes: int, start: int, end: int, tz: str
) -> None:
    window = QuietWindow(time(start // 60, start % 60), time(end // 60, end % 60))
    now = utc(2026, 1, 1) + timedelta(minutes=minutes)
    until = quiet_until(now, window, tz)
    if until is not None:
        assert until > now
        assert until - now <= timedelta(hours=25)
        assert quiet_until(until, window, tz) is None  # releasing never re-holds


@settings(max_examples=300, deadline=None)
@given(
    minutes=st.integers(min_value=0, max_value=2 * 365 * 24 * 60),
    wall=st.integers(min_value=0, max_value=23 * 60 + 59),
    tz=st.sampled_from(ZONES),
)
def test_next_local_time_is_at_or_after_now_and_within_a_day(
    minutes: int, wall: int, tz: str
) -> None:
    now = utc(2026, 1, 1) + timedelta(minutes=minutes)
    at = next_local_time(now, time(wall // 60, wall % 60), tz)
    assert now <= at <= now + timedelta(hours=26)
