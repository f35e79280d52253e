"""Local-time rules: quiet hours, local-time campaigns and local days, in IANA time zones.

Pure functions over `zoneinfo`; every instant in and out is a timezone-aware `datetime` (inputs
may be in any zone, outputs are UTC). A naive datetime is a bug and raises `ValueError`.

Resolving a local wall-clock time on a local date (`resolve_local`) follows one rule everywhere:

- **gap** (the time does not exist, e.g. 02:30 on 2026-03-08 in America/New_York): the result is
  the next valid instant, i.e. the transition instant where the gap ends (03:00 EDT);
- **overlap** (the time exists twice, e.g. 01:30 on 2026-11-01 in New York): the result is the
  first occurrence (01:30 EDT = 05:30 UTC, `fold=0`).

Quiet hours are a daily window `[start, end)` of local wall-clock times; `start > end` wraps
midnight (22:00-08:00) and `start == end` means no quiet hours. Membership is decided on instants:
the window of local date D runs from `resolve_local(D, start)` to `resolve_local(D or D+1, end)`.
So on a fall-back night a window ending at 01:30 ends at the *first* 01:30; the repeated hour
after it is not quiet (a held delivery released then is not held again). A window whose both ends
fall in one DST gap is empty.

A user without a time zone gets the catalog's explicit default, never the server's zone:
`localtime`, `posixrules` and `Factory` are rejected like unknown names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from herald.errors import InvalidTimeOfDay, InvalidTimezone

__all__ = [
    "QuietWindow",
    "end_of_local_day",
    "get_zone",
    "local_day",
    "next_local_time",
    "parse_hhmm",
    "quiet_until",
    "resolve_local",
]

_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
_REJECTED_KEYS = frozenset({"localtime", "posixrules", "Factory", "posix/localtime"})
_ONE_DAY = timedelta(days=1)
_ONE_SECOND = timedelta(seconds=1)


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    if name in _REJECTED_KEYS or name != name.strip():
        raise InvalidTimezone(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidTimezone(name) from exc


def get_zone(tz: str | ZoneInfo) -> ZoneInfo:
    """The cached `ZoneInfo` for an IANA name; raises `InvalidTimezone` for anything else."""
    if isinstance(tz, ZoneInfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise InvalidTimezone(tz)
    return _zone(tz)


@lru_cache(maxsize=4096)
def parse_hhmm(value: str) -> time:
    """`"22:00"` → `time(22, 0)`; raises `InvalidTimeOfDay` for anything but `HH:MM`."""
    m = _HHMM.match(value) if isinstance(value, str) else None
    if m is None:
        raise InvalidTimeOfDay(value)
    return time(int(m.group(1)), int(m.group(2)))


@dataclass(frozen=True, slots=True)
class QuietWindow:
    """A daily quiet-hours window `[start, end)` in local wall-clock time."""

    start: time
    end: time

    @classmethod
    def parse(cls, start: str, end: str) -> QuietWindow:
        """Build from `HH:MM` strings (the `QuietHours` record of user_preferences)."""
        return cls(parse_hhmm(start), parse_hhmm(end))

    @property
    def empty(self) -> bool:
        """True when start == end: the window never applies."""
        return self.start == self.end

    @property
    def wraps(self) -> bool:
        """True when the window crosses local midnight (e.g. 22:00-08:00)."""
        return self.start > self.end


def _require_aware(value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a timezone-aware datetime is required (got a naive one)")


@lru_cache(maxsize=65536)
def _resolve(day: date, wall: time, zone: ZoneInfo) -> datetime:
    naive = datetime.combine(day, wall)
    first = naive.replace(tzinfo=zone, fold=0)
    second = naive.replace(tzinfo=zone, fold=1)
    first_utc = first.astimezone(UTC)
    second_utc = second.astimezone(UTC)
    if first_utc <= second_utc:
        # Normal time (equal) or overlap (fold=0 is the earlier instant): first occurrence.
        return first_utc
    # Gap: fold=1 maps before the transition, fold=0 after it; find the transition instant.
    return _transition_between(second_utc, first_utc, zone)


def _transition_between(lo: datetime, hi: datetime, zone: ZoneInfo) -> datetime:
    """The first instant in (lo, hi] whose UTC offset differs from lo's (1 s resolution)."""
    before = lo.astimezone(zone).utcoffset()
    while hi - lo > _ONE_SECOND:
        mid = lo + (hi - lo) / 2
        mid = mid.replace(microsecond=0)
        if mid <= lo:
            break
        if mid.astimezone(zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi


def resolve_local(day: date, wall: time, tz: str | ZoneInfo) -> datetime:
    """The UTC instant at which `tz`'s wall clock reads `wall` on `day` (gap/overlap rule above)."""
    return _resolve(day, wall, get_zone(tz))


@lru_cache(maxsize=65536)
def _window_bounds(day: date, window: QuietWindow, zone: ZoneInfo) -> tuple[datetime, datetime]:
    end_day = day + _ONE_DAY if window.wraps else day
    return _resolve(day, window.start, zone), _resolve(end_day, window.end, zone)


def quiet_until(
    now_utc: datetime, window: QuietWindow | None, tz: str | ZoneInfo
) -> datetime | None:
    """None when `now_utc` is outside quiet hours; else the UTC instant the window ends (> now)."""
    _require_aware(now_utc)
    zone = get_zone(tz)
    if window is None or window.empty:
        return None
    today = now_utc.astimezone(zone).date()
    for day in (today - _ONE_DAY, today):
        start, end = _window_bounds(day, window, zone)
        if start <= now_utc < end:
            return end
    return None


def next_local_time(now_utc: datetime, wall: str | time, tz: str | ZoneInfo) -> datetime:
    """The first instant at or after `now_utc` when `tz`'s clock reads `wall`, in UTC.

    At most once per local day: a nonexistent time moves to the next valid instant of that day,
    an ambiguous one counts only at its first occurrence.
    """
    _require_aware(now_utc)
    zone = get_zone(tz)
    at = parse_hhmm(wall) if isinstance(wall, str) else wall
    today = now_utc.astimezone(zone).date()
    candidate = _resolve(today, at, zone)
    if candidate >= now_utc:
        return candidate
    return _resolve(today + _ONE_DAY, at, zone)


def local_day(now_utc: datetime, tz: str | ZoneInfo) -> date:
    """The user's local calendar date at `now_utc` (frequency caps count per local day)."""
    _require_aware(now_utc)
    return now_utc.astimezone(get_zone(tz)).date()


def end_of_local_day(now_utc: datetime, tz: str | ZoneInfo) -> datetime:
    """The UTC instant the user's current local day ends (next local midnight, gap rule applied)."""
    zone = get_zone(tz)
    return _resolve(local_day(now_utc, zone) + _ONE_DAY, time(0, 0), zone)
