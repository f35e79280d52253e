"""The panel queries of dashboards/sql/*.sql, run over ClickHouse's HTTP interface.

    load_sql(name)                          the text of dashboards/sql/<name>.sql
    run_panel(client, name, params)         rows as dicts, JSON-ready (numbers, str, None)
    PANELS                                  every panel file name

Parameters are bound server-side (`{from:DateTime64(3)}` ...), never formatted into the SQL.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

__all__ = ["PANELS", "SQL_DIR", "load_sql", "run_panel", "window"]

SQL_DIR = Path(__file__).with_name("sql")
PANELS = tuple(sorted(p.stem for p in SQL_DIR.glob("*.sql")))


@cache
def load_sql(name: str) -> str:
    """The SQL of one panel; KeyError for a name that is not a panel file."""
    if name not in PANELS:
        raise KeyError(name)
    return (SQL_DIR / f"{name}.sql").read_text()


def window(minutes: int, tenant: str = "", now: datetime | None = None) -> dict[str, Any]:
    """Parameters for the last `minutes` (bucket size chosen for ~60 points)."""
    end = (now or datetime.now(UTC)).replace(microsecond=0)
    start = end.timestamp() - minutes * 60
    return {
        "from": datetime.fromtimestamp(start, UTC).replace(tzinfo=None),
        "to": end.replace(tzinfo=None) if end.tzinfo else end,
        "tenant": tenant,
        "bucket_s": max(60, minutes // 60 * 60),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    return value


def run_panel(client: Client, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one panel query; rows as plain dicts."""
    sql = load_sql(name)
    used = {k: v for k, v in params.items() if "{" + k + ":" in sql}
    result = client.query(sql, parameters=used)
    names = result.column_names
    return [{n: _plain(v) for n, v in zip(names, row, strict=True)} for row in result.result_rows]
