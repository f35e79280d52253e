"""ClickHouse output: every batch Bytewax hands a worker becomes one INSERT.

    ClickHouseSink(settings, table, columns)    Bytewax sink; items are dict rows

Guarantee: at-least-once. `write_batch` returns only after ClickHouse acknowledged the insert,
so an epoch never commits with rows in flight (a `DynamicSink` has no epoch hook, see
sinks/base.py; a synchronous insert per batch is what makes it correct). After a crash the job
resumes from its last committed epoch and inserts some rows again: the target table must make
that harmless. `delivery_events` does (ReplacingMergeTree whose sorting key ends with event_id,
read with FINAL), and so must every table this sink writes to.

Transient transport failures (connection refused/reset, a server restart) are retried with
backoff for a bounded time, which is safe because the insert is idempotent; a ClickHouse error
(bad type, unknown table) raises at once and stops the job: rows are validated upstream, so that
is a bug, not bad input.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bytewax.outputs import DynamicSink, StatelessSinkPartition
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError
from clickhouse_connect.driver.insert import InsertContext

from herald.clickhouse import herald_client
from herald.config import ClickHouseSettings

__all__ = ["ClickHouseSink"]

log = logging.getLogger(__name__)

Row = Mapping[str, Any]
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ClickHouseSink(DynamicSink[Row]):
    """Insert dict rows into `table` (in `settings.database`), one INSERT per batch per worker.

    `columns` names the columns written, in order; every row must have a key for each (extra
    keys are ignored). Values follow clickhouse-connect's Python conversions: tz-aware
    `datetime` for DateTime64, `None` for NULL, `dict` for Map. Retries transient transport
    failures for up to `retry_for` seconds.
    """

    def __init__(
        self,
        settings: ClickHouseSettings,
        table: str,
        columns: Sequence[str],
        *,
        retry_for: float = 30.0,
    ) -> None:
        if not _IDENTIFIER_RE.fullmatch(table):
            raise ValueError(f"invalid table name {table!r}")
        bad = [c for c in columns if not _IDENTIFIER_RE.fullmatch(c)]
        if not columns or bad or len(set(columns)) != len(columns):
            raise ValueError(f"columns must be distinct identifiers, got {list(columns)!r}")
        if retry_for < 0:
            raise ValueError("retry_for must be >= 0")
        self.settings = settings
        self.table = table
        self.columns = tuple(columns)
        self.retry_for = retry_for

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ClickHousePartition:
        """Called once per worker: each worker gets its own client."""
        return _ClickHousePartition(
            herald_client(self.settings), self.table, self.columns, self.retry_for
        )


class _ClickHousePartition(StatelessSinkPartition[Row]):
    """One worker's writer: owns a clickhouse-connect client."""

    def __init__(
        self, client: Client, table: str, columns: tuple[str, ...], retry_for: float
    ) -> None:
        self._client = client
        self._table = table
        self._columns = columns
        self._retry_for = retry_for
        self._context: InsertContext | None = None  # column types, fetched on the first write

    def write_batch(self, items: list[Row]) -> None:
        """Insert `items` in one INSERT; return only once ClickHouse acknowledged it."""
        if not items:
            return
        try:
            rows = [[item[c] for c in self._columns] for item in items]
        except KeyError as exc:
            raise ValueError(f"{self._table}: row without column {exc.args[0]!r}") from None
        deadline = time.monotonic() + self._retry_for
        delay = 0.1
        while True:
            try:
                if self._context is None:
                    self._context = self._client.create_insert_context(
                        self._table, list(self._columns)
                    )
                self._context.data = rows
                self._client.insert(context=self._context)
                return
            except OperationalError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("sink.clickhouse_retry table=%s rows=%d error=%s",
                            self._table, len(rows), type(exc).__name__)  # fmt: skip
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def close(self) -> None:
        """Release the client's connections."""
        self._client.close()
