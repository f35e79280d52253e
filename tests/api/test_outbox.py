"""api.outbox: the transactional outbox relay (SQLite) → Kafka, safe to run twice."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from pathlib import Path

from api.outbox import OutboxRelay, create_table, enqueue
from api.producer import HeraldProducer
from herald.config import HeraldSettings
from tests.api.conftest import read_topic


def notification(i: int) -> dict[str, object]:
    return {
        "request_id": f"order-{i}-shipped",
        "notification_type": "order_shipped",
        "recipients": {"user_ids": [f"u-{i}"]},
        "params": {"order_id": str(i)},
    }


def make_db(path: Path, n: int) -> None:
    conn = sqlite3.connect(path)
    create_table(conn)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
    for i in range(n):  # business change + outbox row in one transaction
        conn.execute("INSERT INTO orders VALUES (?, 'shipped')", (i,))
        enqueue(conn, "notification", "orders", notification(i))
        conn.commit()
    conn.close()


def relay(settings: HeraldSettings, path: Path, **kw: object) -> OutboxRelay:
    producers: dict[str, HeraldProducer] = {}

    def producer(tenant: str) -> HeraldProducer:
        if tenant not in producers:
            producers[tenant] = HeraldProducer.from_settings(settings, tenant, source="outbox")
        return producers[tenant]

    return OutboxRelay(
        lambda: sqlite3.connect(path, timeout=10, isolation_level=None),
        producer,
        **kw,  # type: ignore[arg-type]
    )


def counts(path: Path) -> tuple[int, int, int]:
    conn = sqlite3.connect(path)
    row = conn.execute(
        "SELECT SUM(sent_at IS NOT NULL), SUM(failed_at IS NOT NULL), SUM(sent_at IS NULL AND "
        "failed_at IS NULL) FROM herald_outbox"
    ).fetchone()
    conn.close()
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)


def test_two_relays_at_once_send_every_row_once(settings: HeraldSettings, tmp_path: Path) -> None:
    path = tmp_path / "orders.db"
    make_db(path, 120)
    relays = [relay(settings, path, batch_size=25) for _ in range(2)]
    threads = [
        threading.Thread(target=lambda r=r: [r.run_once() for _ in range(6)]) for r in relays
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts(path) == (120, 0, 0)
    records = read_topic(settings, "herald.requests.normal", 120, settle=1.0)
    assert len(records) == 120
    assert len({r["notification_id"] for _, r in records}) == 120
    assert {r["source"] for _, r in records} == {"outbox"}


def test_a_crashed_relay_is_redone_after_its_lease(
    settings: HeraldSettings, tmp_path: Path
) -> None:
    path = tmp_path / "orders.db"
    make_db(path, 3)
    crashed = relay(settings, path, lease_seconds=0.5, ack_timeout=0.4)
    conn = sqlite3.connect(path, isolation_level=None)
    rows = crashed._claim(conn, uuid.uuid4().hex)  # claimed, never published: "crash"
    conn.close()
    assert len(rows) == 3
    assert relay(settings, path).run_once().claimed == 0  # leased to the crashed relay
    threading.Event().wait(0.6)
    assert relay(settings, path).run_once().sent == 3
    assert counts(path) == (3, 0, 0)


def test_bad_rows_are_marked_failed_and_do_not_block(
    settings: HeraldSettings, tmp_path: Path
) -> None:
    path = tmp_path / "orders.db"
    make_db(path, 2)
    conn = sqlite3.connect(path)
    enqueue(conn, "notification", "orders", {**notification(9), "notification_type": "nope"})
    conn.execute(
        "INSERT INTO herald_outbox (kind, tenant_id, payload, created_at) "
        "VALUES ('notification', 'orders', '{not json', 0)"
    )
    conn.commit()
    result = relay(settings, path).run_once()
    assert (result.sent, result.failed) == (2, 2)
    errors = [
        r[0]
        for r in conn.execute("SELECT last_error FROM herald_outbox WHERE failed_at IS NOT NULL")
    ]
    assert any("unknown_notification_type" in e for e in errors)
    conn.close()


def test_the_runnable_example(subprocess_env: dict[str, str], settings: HeraldSettings) -> None:
    """`python -m examples.outbox_example` against the session's Kafka."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "examples.outbox_example", "--orders", "2"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "relayed 2 outbox rows" in out.stdout
    assert len(read_topic(settings, "herald.requests.normal", 2)) == 2
