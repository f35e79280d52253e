"""The API's ClickHouse side of segments: the `segments` registry and `segment_members` rows.

    SegmentStore(settings, workers)   one per app (AppState.segments): a shared client made on
                                      first use, and the threads that run the ingests
    SegmentRow                        one registry row (migration 0010_segments.sql)
    Segment, SegmentPage              the HTTP views

Every method but `run`/`ingest` blocks: call them through `run` (the default thread pool, for
statements that take milliseconds) or `ingest` (the store's own `workers` threads, for a whole
upload or query, so long ingests never starve the short statements). A ClickHouse that cannot
be reached or fails a statement is 503 `clickhouse_unavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from clickhouse_connect.driver.exceptions import ClickHouseError
from pydantic import BaseModel

from api.problems import ProblemError
from herald.config import ClickHouseSettings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)
T = TypeVar("T")

Source = Literal["upload", "query"]
ROW_COLUMNS = ["tenant_id", "segment_id", "size", "source", "created_at", "deleted", "version"]
MEMBER_COLUMNS = ["segment_id", "user_id", "params"]

_FIND = """
SELECT tenant_id, segment_id, size, source, created_at, deleted, version
FROM {db}.segments FINAL
WHERE segment_id = {{segment:String}}
ORDER BY deleted, version DESC
LIMIT 1
"""
_PAGE = """
SELECT tenant_id, segment_id, size, source, created_at, deleted, version
FROM {db}.segments FINAL
WHERE tenant_id = {{tenant:String}} AND segment_id > {{after:String}} AND deleted = 0 {allowed}
ORDER BY segment_id
LIMIT {{limit:UInt32}}
"""
_HAS_MEMBERS = "SELECT 1 FROM {db}.segment_members WHERE segment_id = {{segment:String}} LIMIT 1"
_SIZE = "SELECT uniqExact(user_id) FROM {db}.segment_members WHERE segment_id = {{segment:String}}"
_PURGE = "DELETE FROM {db}.segment_members WHERE segment_id = {{segment:String}}"


class Segment(BaseModel):
    """A segment as the API shows it."""

    segment_id: str
    size: int
    source: Source
    created_at: datetime


class SegmentPage(BaseModel):
    """`GET /v1/segments`: segment_id order; pass `next_cursor` back as `cursor`."""

    segments: list[Segment]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class SegmentRow:
    """One version of a segment's registry row (`deleted`: not targetable, see 0010)."""

    tenant_id: str
    segment_id: str
    size: int
    source: str
    created_at: datetime
    deleted: bool
    version: int

    def view(self) -> Segment:
        return Segment(
            segment_id=self.segment_id, size=self.size, source=self.source,  # type: ignore[arg-type]
            created_at=self.created_at,
        )  # fmt: skip

    def next(self, **changes: object) -> SegmentRow:
        """The next version of this row: `changes` applied, a version above this one."""
        return replace(self, **changes, version=max(now_us(), self.version + 1))  # type: ignore[arg-type]


def now_us() -> int:
    """The version clock: microseconds since the epoch."""
    return time.time_ns() // 1000


def clickhouse_unavailable(exc: Exception) -> ProblemError:
    """The 503 problem when ClickHouse failed (the message names no server address)."""
    log.warning("api.segments_clickhouse_failed error=%s", type(exc).__name__)
    return ProblemError(
        503, "clickhouse_unavailable",
        f"segments are unavailable, retry later ({type(exc).__name__})",
        headers={"Retry-After": "5"},
    )  # fmt: skip


class SegmentStore:
    """The registry and members of segments in ClickHouse (see the module docstring)."""

    def __init__(self, settings: ClickHouseSettings, workers: int = 4) -> None:
        self._settings = settings
        self._db = settings.database
        self._client: Client | None = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="segments")

    def client(self) -> Client:
        """The shared client, made on first use (thread-safe; it may be shared by threads)."""
        with self._lock:
            if self._client is None:
                from herald.clickhouse import herald_client  # clickhouse_connect: 0.2 s to import

                self._client = herald_client(self._settings)
            return self._client

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the default thread pool; 503 when ClickHouse fails."""
        try:
            return await asyncio.to_thread(fn, *args)
        except ClickHouseError as exc:
            raise clickhouse_unavailable(exc) from exc

    async def ingest(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the store's ingest threads (waits for a free one); errors propagate."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Stop the ingest threads (after the running ones) and close the client."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- the registry ---------------------------------------------------------------------

    def find(self, segment_id: str) -> SegmentRow | None:
        """The current registry row of `segment_id` (any tenant), None when unregistered."""
        rows = self.client().query(_FIND.format(db=self._db), parameters={"segment": segment_id})
        return _row(rows.result_rows[0]) if rows.result_rows else None

    def page(
        self, tenant_id: str, after: str, limit: int, allowed: frozenset[str] | None
    ) -> list[SegmentRow]:
        """Up to `limit` of the tenant's targetable segments after `after`, within `allowed`."""
        params: dict[str, object] = {"tenant": tenant_id, "after": after, "limit": limit}
        only = ""
        if allowed is not None:
            only, params["allowed"] = "AND segment_id IN {allowed:Array(String)}", sorted(allowed)
        sql = _PAGE.format(db=self._db, allowed=only)
        return [_row(r) for r in self.client().query(sql, parameters=params).result_rows]

    def write(self, row: SegmentRow) -> None:
        """Insert a version of a registry row."""
        values = [row.tenant_id, row.segment_id, row.size, row.source, row.created_at,
                  int(row.deleted), row.version]  # fmt: skip
        self.client().insert(f"{self._db}.segments", [values], ROW_COLUMNS)

    # -- the members ----------------------------------------------------------------------

    def has_members(self, segment_id: str) -> bool:
        """Whether segment_members holds any row of `segment_id`."""
        sql = _HAS_MEMBERS.format(db=self._db)
        return bool(self.client().query(sql, parameters={"segment": segment_id}).result_rows)

    def insert_members(self, segment_id: str, members: Iterable[tuple[str, dict[str, str]]]) -> int:
        """Insert one chunk of members; returns the rows inserted."""
        rows = [[segment_id, user, params] for user, params in members]
        if rows:
            self.client().insert(f"{self._db}.segment_members", rows, MEMBER_COLUMNS)
        return len(rows)

    def size(self, segment_id: str) -> int:
        """Distinct users of `segment_id` in segment_members."""
        sql = _SIZE.format(db=self._db)
        return int(self.client().command(sql, parameters={"segment": segment_id}))  # type: ignore[arg-type]

    def purge(self, segment_id: str) -> None:
        """Delete every member row of `segment_id` (a lightweight DELETE)."""
        self.client().command(_PURGE.format(db=self._db), parameters={"segment": segment_id})

    def discard(self, segment_id: str) -> None:
        """`purge` when there is any row to delete (a DELETE is a mutation: not for nothing)."""
        if self.has_members(segment_id):
            self.purge(segment_id)


def _row(values: Sequence[Any]) -> SegmentRow:
    tenant, segment, size, source, created_at, deleted, version = values
    return SegmentRow(tenant, segment, int(size), source, created_at, bool(deleted), int(version))
