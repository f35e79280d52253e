"""Audience snapshots: segment members in ClickHouse, read in keyset pages.

Where audiences live: table `{database}.segment_members(segment_id, user_id, params)`, one row per
member, sorted by (segment_id, user_id). A segment_id names an immutable snapshot (the marketing
side writes a new segment_id for new membership), so a campaign reads exactly the audience it was
accepted with, and a page is `user_id > cursor ORDER BY user_id LIMIT n`: a primary-key range read
whose cursor (the last user id of the previous page) is all the plan job needs to resume a 50M
audience at the next unfinished batch. `params` carries per-user template params (first_name).

The same client code reads the embedded ClickHouse (the `clickhouse` service) and a production
cluster. The table is created by migration infra/migrations/0008_segment_members.sql
(`herald migrate`, and at every `herald up`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from herald.config import ClickHouseSettings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "AudienceStore",
    "ClickHouseAudience",
    "load_segment",
]

log = logging.getLogger(__name__)

_PAGE = """
SELECT user_id, params FROM {database}.segment_members
WHERE segment_id = {{segment:String}} AND user_id > {{after:String}}
ORDER BY user_id
LIMIT 1 BY user_id
LIMIT {{limit:UInt32}}
"""

Member = tuple[str, Mapping[str, str] | None]


class AudienceStore(Protocol):
    """Pages of a segment's members in user_id order."""

    def page(self, segment_id: str, after: str, limit: int) -> list[Member]:
        """Up to `limit` members with user_id > `after` ("" = from the start)."""
        ...

    def close(self) -> None:
        """Release the client."""
        ...


class ClickHouseAudience:
    """`AudienceStore` over `segment_members`; the client is created on first use."""

    def __init__(self, settings: ClickHouseSettings) -> None:
        self._settings = settings
        self._client: Client | None = None

    def _ready(self) -> Client:
        if self._client is None:
            self._client = _client(self._settings)
        return self._client

    def page(self, segment_id: str, after: str, limit: int) -> list[Member]:
        """One keyset page (see the module docstring)."""
        result = self._ready().query(
            _PAGE.format(database=self._settings.database),
            parameters={"segment": segment_id, "after": after, "limit": limit},
        )
        return [(str(user), dict(params) or None) for user, params in result.result_rows]

    def close(self) -> None:
        """Release the HTTP client."""
        if self._client is not None:
            self._client.close()
            self._client = None


def _client(settings: ClickHouseSettings) -> Client:
    """A ClickHouse client, its driver imported on first use: clickhouse_connect takes ~0.2 s
    to import, which a restarted plan job would otherwise add to its first OTP (a
    transactional plan job rarely expands a segment)."""
    from herald.clickhouse import herald_client

    return herald_client(settings)


def load_segment(
    settings: ClickHouseSettings,
    segment_id: str,
    members: Iterable[str | tuple[str, Mapping[str, str]]],
    chunk: int = 100_000,
) -> int:
    """Write a segment snapshot (tests, demos, benchmarks); returns the number of rows."""
    client = _client(settings)
    try:
        rows: list[list[object]] = []
        total = 0
        for member in members:
            user, params = (member, {}) if isinstance(member, str) else member
            rows.append([segment_id, user, dict(params)])
            if len(rows) >= chunk:
                client.insert("segment_members", rows, ["segment_id", "user_id", "params"])
                total, rows = total + len(rows), []
        if rows:
            client.insert("segment_members", rows, ["segment_id", "user_id", "params"])
            total += len(rows)
        log.info("audience.segment_loaded rows=%d", total)
        return total
    finally:
        client.close()
