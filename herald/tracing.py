"""W3C trace context: the `traceparent` a notification was accepted with.

    traceparent(value)         the value if it is a valid traceparent, else None
    from_headers(headers)      the valid `traceparent` among Kafka record headers, else None

A notification may arrive with a `traceparent` (https://www.w3.org/TR/trace-context/): the
API's `traceparent` header, the request record's `traceparent` field, or a `traceparent` header
on the Kafka record (the field wins when both are there). Herald carries it unchanged on every
record made from the notification: the request, its deliveries (plan, fallback, retries,
scheduled releases) and every delivery_event (accepted, plan, dispatch, schedule, receipts), so
`WHERE substring(traceparent, 4, 32) = '<trace id>'` in ClickHouse's delivery_events follows
one notification across the pipeline. Herald exports no spans of its own (no OpenTelemetry
dependency); an invalid value is dropped, as the W3C recommendation says, never refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["HEADER", "from_headers", "of_request", "traceparent"]

HEADER = "traceparent"
# version - trace id - parent id - flags, lowercase hex; version ff is invalid. A version after
# 00 may append fields ("-..."), which are kept as given.
_FORMAT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE, _ZERO_PARENT = "0" * 32, "0" * 16
MAX_LENGTH = 512


def traceparent(value: str | bytes | None) -> str | None:
    """`value` when it is a valid traceparent; None for anything else."""
    if value is None or len(value) > MAX_LENGTH:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    match = _FORMAT.fullmatch(value)  # `$` alone would let a trailing newline through
    if match is None:
        return None
    version, trace, parent, _flags, rest = match.groups()
    if version == "ff" or trace == _ZERO_TRACE or parent == _ZERO_PARENT:
        return None
    if version == "00" and rest is not None:
        return None  # version 00 has exactly four fields
    return value


def of_request(
    record: Mapping[str, Any], headers: Sequence[tuple[str, bytes | None]] | None
) -> str | None:
    """A request's traceparent: its record's field, else its Kafka record's header."""
    return traceparent(record.get("traceparent")) or from_headers(headers)


def from_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
    """The first valid `traceparent` header of a Kafka record (case-insensitive name)."""
    for name, value in headers or ():
        if name.lower() == HEADER:
            found = traceparent(value)
            if found is not None:
                return found
    return None
