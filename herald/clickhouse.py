"""The one way Herald processes get a ClickHouse client.

Every process (dataflows, API, dashboards, CLI, tests) talks HTTP to ClickHouse: in the embedded
stack to the `clickhouse` service (infra/clickhouse_server.py, the single owner of the chDB data
directory), in production to a ClickHouse server or cluster. Nothing else opens chDB.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from herald.config import ClickHouseSettings

__all__ = ["herald_client"]

_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def herald_client(settings: ClickHouseSettings, *, database: str | None = None) -> Client:
    """A clickhouse-connect HTTP client for `settings.dsn` whose queries use `database`.

    `database` defaults to `settings.database`. The client connects through the `default`
    database and only then switches, so it can be created before migrations have created the
    Herald database (`apply_migrations` does not need it to exist). Compression is off on
    loopback (it only costs CPU there) and on for remote servers. No session id is sent, so one
    client may be shared by threads. The caller closes it (`client.close()`).
    """
    host = urlsplit(settings.dsn).hostname or ""
    client = clickhouse_connect.get_client(
        dsn=settings.dsn,
        database="default",
        compress=not host.startswith(_LOOPBACK),
        autogenerate_session_id=False,
    )
    client.database = database or settings.database
    return client
