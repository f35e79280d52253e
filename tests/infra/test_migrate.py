"""Migrations against a fresh embedded ClickHouse (the real service, over HTTP)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from herald.clickhouse import herald_client
from herald.config import ClickHouseSettings
from herald.errors import MigrationError
from infra.migrate import (
    MIGRATIONS_DIR,
    apply_migrations,
    load_migrations,
    pending,
    split_statements,
)
from tests.infra.test_clickhouse_server import running_server

DELIVERY_EVENT_COLUMNS = {
    "event_id": "String",
    "delivery_id": "String",
    "notification_id": "String",
    "user_id": "String",
    "tenant_id": "String",
    "notification_type": "LowCardinality(String)",
    "channel": "LowCardinality(String)",
    "traffic_class": "LowCardinality(String)",
    "state": "LowCardinality(String)",
    "reason": "Nullable(String)",
    "provider": "LowCardinality(Nullable(String))",
    "provider_msg_id": "Nullable(String)",
    "attempt": "UInt16",
    "latency_ms": "Nullable(Int64)",
    "occurred_at": "DateTime64(3, 'UTC')",
    "recorded_at": "DateTime64(3, 'UTC')",
    "attributes": "Map(String, String)",
    "generation": "UInt16",
    "traceparent": "Nullable(String)",
}


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("chmigrate") / "data") as url:
        yield url


@pytest.fixture
def client(dsn: str, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A client of a database that does not exist yet (one per test)."""
    database = "m_" + re.sub(r"\W", "_", request.node.name)[:40]
    c = herald_client(ClickHouseSettings(dsn=dsn, database=database))
    yield c
    c.close()


def test_all_migrations_apply_to_a_fresh_database_then_nothing_is_pending(client: Client) -> None:
    names = [m.name for m in load_migrations()]
    assert names[:2] == ["0001_schema_migrations.sql", "0002_delivery_events.sql"]
    assert pending(client, client.database) == names
    assert apply_migrations(client, client.database) == names
    assert pending(client, client.database) == []
    assert apply_migrations(client, client.database) == []  # second apply is a no-op
    recorded = client.query("SELECT name FROM schema_migrations FINAL ORDER BY name")
    assert [r[0] for r in recorded.result_rows] == names


def test_delivery_events_matches_the_avro_contract(client: Client) -> None:
    apply_migrations(client, client.database)
    columns = client.query(
        "SELECT name, type, comment FROM system.columns"
        " WHERE database = currentDatabase() AND table = 'delivery_events' ORDER BY position"
    ).result_rows
    assert {name: type_ for name, type_, _ in columns} == DELIVERY_EVENT_COLUMNS
    assert list(DELIVERY_EVENT_COLUMNS) == [name for name, _, _ in columns]
    assert all(comment for _, _, comment in columns), "every column carries a COMMENT"
    engine, key = client.query(
        "SELECT engine_full, sorting_key FROM system.tables"
        " WHERE database = currentDatabase() AND name = 'delivery_events'"
    ).result_rows[0]
    assert engine.startswith("ReplacingMergeTree(recorded_at)")
    assert key.endswith("event_id")
    assert "TTL toDateTime(occurred_at) + toIntervalDay(30)" in engine


def test_every_file_is_idempotent_and_commented() -> None:
    for migration in load_migrations():
        for statement in migration.statements("herald"):
            head = statement.split("(", 1)[0]
            if head.lstrip().upper().startswith(("CREATE", "ALTER")):
                assert "IF NOT EXISTS" in head.upper() or "IF EXISTS" in head.upper(), statement
            if "ORDER BY" in statement:
                before = statement[: statement.index("ORDER BY")].rstrip().splitlines()
                assert before[-1].lstrip().startswith("--"), f"{migration.name}: comment ORDER BY"


def test_tampered_checksum_is_refused(client: Client, tmp_path: Path) -> None:
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory)
    apply_migrations(client, client.database, directory)
    edited = directory / "0002_delivery_events.sql"
    edited.write_text(edited.read_text() + "\n-- an innocent-looking edit\n")
    with pytest.raises(MigrationError, match="0002_delivery_events.sql changed"):
        apply_migrations(client, client.database, directory)
    with pytest.raises(MigrationError, match="changed"):
        pending(client, client.database, directory)
    edited.unlink()
    with pytest.raises(MigrationError, match="missing"):
        apply_migrations(client, client.database, directory)


def test_a_new_file_is_applied_alone_and_a_failing_one_is_not_recorded(
    client: Client, tmp_path: Path
) -> None:
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory)
    apply_migrations(client, client.database, directory)
    (directory / "9001_extra.sql").write_text(
        "CREATE TABLE IF NOT EXISTS {database}.extra (x UInt8 COMMENT 'x')\n"
        "ENGINE = MergeTree\n-- by x\nORDER BY x;\n"
    )
    assert apply_migrations(client, client.database, directory) == ["9001_extra.sql"]
    (directory / "9002_broken.sql").write_text(
        "CREATE TABLE {database}.nope (x Nope) ENGINE = Log;"
    )
    with pytest.raises(MigrationError, match=r"9002_broken.sql, statement 1"):
        apply_migrations(client, client.database, directory)
    assert pending(client, client.database, directory) == ["9002_broken.sql"]


def test_bad_names_are_refused(tmp_path: Path, client: Client) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="already used"):
        load_migrations(tmp_path)
    (tmp_path / "0001_b.sql").rename(tmp_path / "2-bad.sql")
    with pytest.raises(MigrationError, match="NNNN_snake_name"):
        load_migrations(tmp_path)
    with pytest.raises(MigrationError, match="invalid database name"):
        apply_migrations(client, "herald; DROP TABLE x", MIGRATIONS_DIR)


def test_split_statements_respects_quotes_and_comments() -> None:
    sql = """
    -- a comment; with a semicolon
    CREATE TABLE a (x String COMMENT 'it''s; fine', y String DEFAULT 'a\\';b');
    /* block; comment */
    SELECT `we;ird`, "quo;ted" FROM a;
    -- trailing comment only
    """
    statements = split_statements(sql)
    assert len(statements) == 2
    assert statements[0].endswith("DEFAULT 'a\\';b')")
    assert statements[1].startswith("/* block; comment */")
    assert split_statements("  ;  -- nothing\n;") == []
