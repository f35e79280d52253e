"""Transactional outbox relay: rows of an upstream service's outbox table → Kafka → marked sent.

Seed 000 §5.1: the business change and the "notify" intent are written in ONE local transaction
(`enqueue()` adds the outbox row on the caller's connection and does not commit); this relay
then publishes the rows with `HeraldProducer` (Avro, idempotent, acks=all) and marks a row sent
only after Kafka acknowledged it. A crash between ack and mark re-publishes the row later: the
record carries the same notification_id (`ids.notification_id(tenant, request_id)`), and
downstream jobs deduplicate by it — at-least-once, never lost.

Safe to run several relays (or one twice) at once: each round claims a batch with one atomic
UPDATE that sets `claimed_by` (a fresh token per round) and a lease `claimed_until`; a row is
claimable only when unsent, not failed, and unclaimed or with an expired lease. Rows are
published in id order within a claim. A row whose payload is invalid (bad JSON, unknown type,
schema violation) is marked `failed_at` with `last_error` and never retried; a row Kafka refused
keeps `sent_at` NULL and is retried after its lease.

Table (SQLite, as in the tests; `create_table()` creates it):

    CREATE TABLE herald_outbox (
      id            INTEGER PRIMARY KEY AUTOINCREMENT,
      kind          TEXT NOT NULL,          -- 'notification' | 'social_event'
      tenant_id     TEXT NOT NULL,
      payload       TEXT NOT NULL,          -- JSON: the POST /v1/notifications body, or a
                                            --       social_event record
      created_at    REAL NOT NULL,          -- epoch seconds
      claimed_by    TEXT, claimed_until REAL,
      attempts      INTEGER NOT NULL DEFAULT 0,
      sent_at       REAL, failed_at REAL, last_error TEXT)

PostgreSQL (`dialect="postgres"`, psycopg connection): the same columns with
`id BIGSERIAL PRIMARY KEY`, `payload JSONB`, timestamps as DOUBLE PRECISION (or TIMESTAMPTZ
with the obvious changes), plus a partial index for the claim query:

    CREATE INDEX herald_outbox_pending ON herald_outbox (id)
      WHERE sent_at IS NULL AND failed_at IS NULL;

and the claim uses row locks so concurrent relays skip each other's rows:

    UPDATE herald_outbox SET claimed_by = %s, claimed_until = %s, attempts = attempts + 1
     WHERE id IN (SELECT id FROM herald_outbox
                   WHERE sent_at IS NULL AND failed_at IS NULL
                     AND (claimed_until IS NULL OR claimed_until < %s)
                   ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)

Sent rows can be deleted by a periodic `DELETE ... WHERE sent_at < now - 7 days`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from api.producer import HeraldProducer
from herald.errors import DeliveryError, InvalidRequest

__all__ = ["OutboxRelay", "RelayRound", "create_table", "enqueue"]

log = logging.getLogger(__name__)

Kind = Literal["notification", "social_event"]

DDL_SQLITE = """
CREATE TABLE IF NOT EXISTS herald_outbox (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL CHECK (kind IN ('notification', 'social_event')),
  tenant_id TEXT NOT NULL,
  payload TEXT NOT NULL,
  created_at REAL NOT NULL,
  claimed_by TEXT,
  claimed_until REAL,
  attempts INTEGER NOT NULL DEFAULT 0,
  sent_at REAL,
  failed_at REAL,
  last_error TEXT
)"""
_INDEX_SQLITE = (
    "CREATE INDEX IF NOT EXISTS herald_outbox_pending ON herald_outbox (id) "
    "WHERE sent_at IS NULL AND failed_at IS NULL"
)
_CLAIM = """
UPDATE herald_outbox SET claimed_by = {p}, claimed_until = {p}, attempts = attempts + 1
 WHERE id IN (SELECT id FROM herald_outbox
               WHERE sent_at IS NULL AND failed_at IS NULL
                 AND (claimed_until IS NULL OR claimed_until < {p})
               ORDER BY id LIMIT {p}{lock})"""


class Connection(Protocol):
    """The DB-API subset the relay uses (sqlite3, psycopg)."""

    def cursor(self) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


def create_table(conn: sqlite3.Connection) -> None:
    """Create the SQLite outbox table and its index (idempotent)."""
    conn.execute(DDL_SQLITE)
    conn.execute(_INDEX_SQLITE)
    conn.commit()


def enqueue(
    conn: Any, kind: Kind, tenant_id: str, payload: Mapping[str, Any], paramstyle: str = "?"
) -> None:
    """Add an outbox row in the caller's open transaction (the caller commits)."""
    p = paramstyle
    columns = "kind, tenant_id, payload, created_at"
    conn.cursor().execute(
        f"INSERT INTO herald_outbox ({columns}) VALUES ({p}, {p}, {p}, {p})",
        (kind, tenant_id, json.dumps(dict(payload)), time.time()),
    )


@dataclass(frozen=True)
class RelayRound:
    """What one `run_once` did."""

    claimed: int
    sent: int
    failed: int
    retry: int


class OutboxRelay:
    """Moves outbox rows to Kafka. `producers(tenant_id)` gives the tenant's HeraldProducer."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        producers: Callable[[str], HeraldProducer],
        *,
        batch_size: int = 500,
        lease_seconds: float = 30.0,
        ack_timeout: float = 20.0,
        dialect: Literal["sqlite", "postgres"] = "sqlite",
    ) -> None:
        if ack_timeout >= lease_seconds:
            raise ValueError("ack_timeout must be shorter than the lease")
        self.connect = connect
        self.producers = producers
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds
        self.ack_timeout = ack_timeout
        self.dialect = dialect
        self.p = "?" if dialect == "sqlite" else "%s"
        self._claim_sql = _CLAIM.format(
            p=self.p, lock="" if dialect == "sqlite" else " FOR UPDATE SKIP LOCKED"
        )

    def _claim(self, conn: Connection, token: str) -> list[tuple[int, str, str, str]]:
        now = time.time()
        cur = conn.cursor()
        if self.dialect == "sqlite":
            cur.execute("BEGIN IMMEDIATE")  # take the write lock before reading candidates
        cur.execute(self._claim_sql, (token, now + self.lease_seconds, now, self.batch_size))
        conn.commit()
        cur.execute(
            f"SELECT id, kind, tenant_id, payload FROM herald_outbox WHERE claimed_by = {self.p}"
            " ORDER BY id",
            (token,),
        )
        return [(int(r[0]), str(r[1]), str(r[2]), r[3]) for r in cur.fetchall()]

    def _publish(
        self, rows: list[tuple[int, str, str, str]]
    ) -> tuple[list[int], dict[int, str], dict[int, str]]:
        """(acked ids, {id: permanent error}, {id: delivery error})."""
        acked: list[int] = []
        bad: dict[int, str] = {}
        undelivered: dict[int, str] = {}
        used: dict[str, HeraldProducer] = {}
        lock = threading.Lock()
        for row_id, kind, tenant_id, raw in rows:
            producer = used.setdefault(tenant_id, self.producers(tenant_id))

            def report(_: str, err: Exception | None, row_id: int = row_id) -> None:
                with lock:
                    if err is None:
                        acked.append(row_id)
                    else:
                        undelivered[row_id] = str(err)[:500]

            try:
                payload = raw if isinstance(raw, dict) else json.loads(raw)
                if kind == "notification":
                    producer.send_notification(payload, report)
                else:
                    producer.publish_social_event(payload, report)
            except (InvalidRequest, ValueError, TypeError) as exc:
                bad[row_id] = f"{getattr(exc, 'code', type(exc).__name__)}: {exc}"[:500]
        for producer in used.values():
            try:
                producer.flush(self.ack_timeout)
            except DeliveryError as exc:  # per-row outcomes were recorded by the callbacks
                log.warning("outbox.flush_incomplete error=%s", exc)
        pending = {r[0] for r in rows} - set(acked) - set(bad) - set(undelivered)
        undelivered.update(dict.fromkeys(pending, "no acknowledgement"))
        return acked, bad, undelivered

    def run_once(self) -> RelayRound:
        """Claim a batch, publish it, mark what Kafka acknowledged."""
        token = uuid.uuid4().hex
        conn = self.connect()
        try:
            rows = self._claim(conn, token)
            if not rows:
                return RelayRound(0, 0, 0, 0)
            acked, bad, undelivered = self._publish(rows)
            now, p, cur = time.time(), self.p, conn.cursor()
            if self.dialect == "sqlite":
                cur.execute("BEGIN IMMEDIATE")
            cur.executemany(
                f"UPDATE herald_outbox SET sent_at = {p}, claimed_by = NULL, claimed_until = NULL"
                f" WHERE id = {p} AND claimed_by = {p}",
                [(now, row_id, token) for row_id in acked],
            )
            cur.executemany(
                f"UPDATE herald_outbox SET failed_at = {p}, last_error = {p}, claimed_by = NULL"
                f" WHERE id = {p} AND claimed_by = {p}",
                [(now, err, row_id, token) for row_id, err in bad.items()],
            )
            cur.executemany(  # lease kept: retried once it expires
                f"UPDATE herald_outbox SET last_error = {p} WHERE id = {p} AND claimed_by = {p}",
                [(err, row_id, token) for row_id, err in undelivered.items()],
            )
            conn.commit()
            result = RelayRound(len(rows), len(acked), len(bad), len(undelivered))
            log.info(
                "outbox.round claimed=%d sent=%d failed=%d retry=%d",
                result.claimed, result.sent, result.failed, result.retry,
            )  # fmt: skip
            return result
        finally:
            conn.close()

    def run(self, stop: threading.Event, idle_sleep: float = 0.2) -> None:
        """Relay until `stop` is set (sleeping `idle_sleep` when nothing was pending)."""
        while not stop.is_set():
            if self.run_once().claimed == 0:
                stop.wait(idle_sleep)
