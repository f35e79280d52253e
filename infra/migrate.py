"""ClickHouse migrations: numbered, idempotent SQL files applied once each, in order.

    load_migrations(directory)                the files NNNN_name.sql, in order, with checksums
    split_statements(sql)                     `;`-separated statements, quotes and comments kept
    pending(client, database)                 names of files not applied yet
    apply_migrations(client, database)        apply the pending ones; returns their names

Each applied file is recorded in `{database}.schema_migrations` (name, sha256 checksum,
applied_at), created by 0001. A file is recorded only after all its statements succeeded; as
every statement is idempotent (`IF NOT EXISTS`), a file that failed half-way is simply applied
again next time. An applied file whose checksum changed, or that disappeared, is refused with
MigrationError: write a new migration instead of editing an old one.

`{database}` in a file is replaced by the target database; all names are qualified with it, so
the client may be connected to any database (the target need not exist before 0001).

Run by hand: `python -m infra.migrate` (uses HERALD_CLICKHOUSE_* settings).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from herald.clickhouse import herald_client
from herald.config import ClickHouseSettings
from herald.errors import MigrationError
from infra.sqltext import split_statements

__all__ = [
    "MIGRATIONS_DIR",
    "Migration",
    "apply_migrations",
    "herald_client",
    "load_migrations",
    "pending",
    "split_statements",
]

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE_RE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Migration:
    """One migration file: its name, text and sha256 checksum (hex) of its bytes."""

    name: str
    sql: str
    checksum: str

    def statements(self, database: str) -> list[str]:
        """The file's statements with `{database}` replaced by `database`."""
        return split_statements(self.sql.replace("{database}", database))


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The `NNNN_name.sql` files of `directory` in number order; duplicate numbers are refused."""
    migrations: list[Migration] = []
    seen: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.fullmatch(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_snake_name.sql")
        if match.group(1) in seen:
            raise MigrationError(f"{path.name}: number already used by {seen[match.group(1)]}")
        seen[match.group(1)] = path.name
        raw = path.read_bytes()
        migrations.append(Migration(path.name, raw.decode(), hashlib.sha256(raw).hexdigest()))
    return migrations


def pending(
    client: Client, database: str = "herald", directory: Path = MIGRATIONS_DIR
) -> list[str]:
    """Names of the migrations not applied to `database` yet (after checking the applied ones)."""
    migrations = load_migrations(directory)
    done = _check_applied(migrations, _applied(client, _checked(database)))
    return [m.name for m in migrations if m.name not in done]


def apply_migrations(
    client: Client, database: str = "herald", directory: Path = MIGRATIONS_DIR
) -> list[str]:
    """Apply the pending migrations to `database` in order; return the names applied.

    Idempotent: a second call applies nothing. Raises MigrationError when a statement fails
    (naming file and statement) or an applied file changed or disappeared.
    """
    database = _checked(database)
    migrations = load_migrations(directory)
    done = _check_applied(migrations, _applied(client, database))
    applied: list[str] = []
    for migration in migrations:
        if migration.name in done:
            continue
        for index, statement in enumerate(migration.statements(database), start=1):
            try:
                client.command(statement, use_database=False)
            except ClickHouseError as exc:
                raise MigrationError(f"{migration.name}, statement {index}: {exc}") from exc
        _record(client, database, migration)
        log.info("clickhouse.migration_applied name=%s database=%s", migration.name, database)
        applied.append(migration.name)
    return applied


def _checked(database: str) -> str:
    if not _IDENTIFIER_RE.fullmatch(database):
        raise MigrationError(f"invalid database name {database!r}")
    return database


def _applied(client: Client, database: str) -> dict[str, str]:
    """name -> checksum of the migrations recorded in `database` (empty before 0001)."""
    try:
        exists = client.command(f"EXISTS TABLE {database}.schema_migrations", use_database=False)
        if not exists:
            return {}
        body = client.command(
            f"SELECT name, checksum FROM {database}.schema_migrations FINAL FORMAT JSONEachRow",
            use_database=False,
        )
    except ClickHouseError as exc:
        raise MigrationError(f"cannot read {database}.schema_migrations: {exc}") from exc
    rows = [json.loads(line) for line in str(body).splitlines() if line.strip()]
    return {row["name"]: row["checksum"] for row in rows}


def _check_applied(migrations: list[Migration], done: dict[str, str]) -> dict[str, str]:
    on_disk = {m.name: m for m in migrations}
    for name, checksum in sorted(done.items()):
        if name not in on_disk:
            raise MigrationError(f"{name} was applied but is missing from the migrations")
        if on_disk[name].checksum != checksum:
            raise MigrationError(
                f"{name} changed after it was applied (checksum {checksum[:12]}… recorded, "
                f"{on_disk[name].checksum[:12]}… on disk): add a new migration instead"
            )
    return done


def _record(client: Client, database: str, migration: Migration) -> None:
    try:
        client.command(
            f"INSERT INTO {database}.schema_migrations (name, checksum, applied_at)"
            " SELECT {name:String}, {checksum:String}, now64(3, 'UTC')",
            parameters={"name": migration.name, "checksum": migration.checksum},
            use_database=False,
        )
    except ClickHouseError as exc:
        raise MigrationError(f"{migration.name}: applied but not recorded: {exc}") from exc


def main() -> int:
    """`python -m infra.migrate`: apply pending migrations to the configured ClickHouse."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = ClickHouseSettings()
    client = herald_client(settings)
    try:
        applied = apply_migrations(client, settings.database)
    finally:
        client.close()
    print(f"{len(applied)} migration(s) applied: {', '.join(applied) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
