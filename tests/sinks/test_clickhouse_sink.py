"""ClickHouseSink in real Bytewax flows against the embedded ClickHouse service."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSource, cluster_main, run_main

from herald.clickhouse import herald_client
from herald.config import ClickHouseSettings
from infra.migrate import apply_migrations
from sinks.clickhouse import ClickHouseSink
from tests.infra.test_clickhouse_server import free_port, running_server, start_server, stop_server

REPO = Path(__file__).resolve().parents[2]
# The sink writes exactly the fields of the Avro contract, in its order.
COLUMNS = [
    f["name"] for f in json.loads((REPO / "schemas/delivery_event.avsc").read_text())["fields"]
]
DATABASE = "sink_test"


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseSettings]:
    with running_server(tmp_path_factory.mktemp("chsink") / "data") as dsn:
        settings = ClickHouseSettings(dsn=dsn, database=DATABASE)
        client = herald_client(settings)
        apply_migrations(client, DATABASE)
        client.close()
        yield settings


@pytest.fixture(autouse=True)
def empty_table(settings: ClickHouseSettings) -> None:
    client = herald_client(settings)
    client.command("TRUNCATE TABLE delivery_events")
    client.close()


def events(count: int, *, start: int = 0) -> list[dict[str, Any]]:
    """Valid delivery events (recent: the table keeps 30 days), ids start..start+count-1."""
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    return [
        {
            "event_id": f"ev-{i}", "delivery_id": f"d-{i // 3}", "notification_id": f"n-{i // 30}",
            "user_id": f"u-{i // 3}", "tenant_id": "acme", "notification_type": "otp_login",
            "channel": ("sms", "push", "email")[i % 3], "traffic_class": "transactional",
            "state": "PROVIDER_ACCEPTED", "reason": None if i % 2 else "quiet_hours",
            "provider": None if i % 5 == 0 else "sms_a", "provider_msg_id": None,
            "attempt": i % 4, "latency_ms": None if i % 7 == 0 else i,
            "occurred_at": now + timedelta(milliseconds=i), "recorded_at": now,
            "attributes": {"http_status": "200"} if i % 2 else {}, "generation": i % 2,
            "traceparent": None if i % 2 else f"00-{i:032x}-{i + 1:016x}-01",
        }
        for i in range(start, start + count)
    ]  # fmt: skip


def flow_of(items: list[dict[str, Any]], sink: ClickHouseSink) -> Dataflow:
    flow = Dataflow("clickhouse_sink_test")
    rows = op.input("in", flow, TestingSource(items, batch_size=100))  # dict rows
    op.output("clickhouse_out", rows, sink)
    return flow


def counts(settings: ClickHouseSettings) -> tuple[int, int]:
    """(rows as stored, rows after deduplication by the table engine)."""
    client = herald_client(settings)
    try:
        stored = client.command("SELECT count() FROM delivery_events")
        final = client.command("SELECT count() FROM delivery_events FINAL")
    finally:
        client.close()
    return int(stored), int(final)


def test_replayed_events_are_not_double_counted(settings: ClickHouseSettings) -> None:
    batch = events(1000)
    sink = ClickHouseSink(settings, "delivery_events", COLUMNS)
    run_main(flow_of(batch + batch, sink), epoch_interval=timedelta(milliseconds=50))
    run_main(flow_of(batch[:300], sink))  # a job resumed from an older snapshot
    stored, final = counts(settings)
    assert final == 1000
    assert 1000 <= stored <= 2300  # duplicates were written; merges may already have folded some
    client = herald_client(settings)
    per_state = client.query(
        "SELECT channel, count(), uniqExact(event_id) FROM delivery_events FINAL"
        " GROUP BY channel ORDER BY channel"
    ).result_rows
    client.close()
    assert per_state == [("email", 333, 333), ("push", 333, 333), ("sms", 334, 334)]


def test_values_round_trip(settings: ClickHouseSettings) -> None:
    batch = events(20)
    run_main(flow_of(batch, ClickHouseSink(settings, "delivery_events", COLUMNS)))
    client = herald_client(settings)
    got = client.query(
        f"SELECT {', '.join(COLUMNS)} FROM delivery_events FINAL ORDER BY occurred_at"
    ).named_results()
    client.close()
    for row, event in zip(got, batch, strict=True):
        for at in ("occurred_at", "recorded_at"):
            event[at] = event[at].replace(tzinfo=None)  # read back as naive UTC
        assert row == event


def test_two_workers_each_with_a_client(settings: ClickHouseSettings) -> None:
    batch = events(600)
    sink = ClickHouseSink(settings, "delivery_events", COLUMNS)
    cluster_main(flow_of(batch + batch, sink), addresses=[], proc_id=0, worker_count_per_proc=2)
    assert counts(settings)[1] == 600


def test_transport_failures_are_retried_across_a_server_restart(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    proc = start_server(data_dir, port)
    settings = ClickHouseSettings(dsn=f"http://127.0.0.1:{port}", database=DATABASE)
    client = herald_client(settings)
    apply_migrations(client, DATABASE)
    client.close()
    partition = ClickHouseSink(settings, "delivery_events", COLUMNS, retry_for=60).build("s", 0, 1)
    partition.write_batch(events(10))
    assert stop_server(proc) == 0
    restarted: list[Any] = []
    threading.Timer(1.0, lambda: restarted.append(start_server(data_dir, port))).start()
    started = time.monotonic()
    partition.write_batch(events(10, start=10))  # blocks, retrying, until the server is back
    assert time.monotonic() - started >= 1.0
    partition.close()
    assert counts(settings) == (20, 20)
    assert stop_server(restarted[0]) == 0


def test_bad_config_and_rows_are_refused(settings: ClickHouseSettings) -> None:
    with pytest.raises(ValueError, match="table"):
        ClickHouseSink(settings, "delivery_events; DROP", COLUMNS)
    with pytest.raises(ValueError, match="columns"):
        ClickHouseSink(settings, "delivery_events", ["event_id", "event_id"])
    partition = ClickHouseSink(settings, "delivery_events", COLUMNS).build("s", 0, 1)
    row = events(1)[0]
    del row["state"]
    with pytest.raises(ValueError, match="'state'"):
        partition.write_batch([row])
    partition.close()
