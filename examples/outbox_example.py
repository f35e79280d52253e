"""An order service using the transactional outbox: `python -m examples.outbox_example`.

1. In ONE SQLite transaction it marks orders shipped and adds an outbox row per order
   (`api.outbox.enqueue`): either both are committed or neither is.
2. It runs the relay (`api.outbox.OutboxRelay`) until the outbox is drained: each row is
   published to herald.requests.{class} (Avro, acks=all) and marked sent after the ack.
3. It prints the notification ids, which equal what POST /v1/notifications would return for
   the same tenant and request_id.

Kafka and the registry come from the HERALD_* environment (as `herald up` exports it), e.g.
`HERALD_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 HERALD_REGISTRY_URL=http://127.0.0.1:8081` (the
`registry_url` of `herald status --json`).
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import tempfile
from pathlib import Path

from api.outbox import OutboxRelay, create_table, enqueue
from api.producer import HeraldProducer
from herald import ids
from herald.config import HeraldSettings

TENANT = "orders"


def ship_orders(db: Path, order_ids: list[int]) -> None:
    """The business transaction: order state change + outbox rows, committed together."""
    conn = sqlite3.connect(db)
    create_table(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, state TEXT)")
    with conn:  # one transaction
        for order_id in order_ids:
            conn.execute("INSERT OR REPLACE INTO orders VALUES (?, 'shipped')", (order_id,))
            enqueue(conn, "notification", TENANT, {
                "request_id": f"order-{order_id}-shipped",
                "notification_type": "order_shipped",
                "recipients": {"user_ids": [f"user-{order_id}"]},
                "params": {"order_id": str(order_id), "carrier": "Swiss Post"},
            })  # fmt: skip
    conn.close()


def relay_all(settings: HeraldSettings, db: Path) -> int:
    """Run relay rounds until nothing is pending; returns the rows sent."""
    producer = HeraldProducer.from_settings(settings, TENANT, source="outbox")
    relay = OutboxRelay(
        lambda: sqlite3.connect(db, timeout=10, isolation_level=None), lambda _: producer
    )
    sent = 0
    while (round_ := relay.run_once()).claimed:
        sent += round_.sent
    return sent


def main(argv: list[str] | None = None) -> int:
    """Ship a few orders and relay their notifications."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="SQLite file (default: a temporary one)")
    parser.add_argument("--orders", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="herald-outbox-") as tmp:
        db = args.db or Path(tmp) / "orders.db"  # the temporary one is removed at the end
        order_ids = list(range(1, args.orders + 1))
        ship_orders(db, order_ids)
        sent = relay_all(HeraldSettings(), db)
        for order_id in order_ids:
            nid = ids.notification_id(TENANT, f"order-{order_id}-shipped")
            print(f"order {order_id}: notification_id {nid}")
        print(f"relayed {sent} outbox rows from {db}")
    return 0 if sent == len(order_ids) else 1


if __name__ == "__main__":
    raise SystemExit(main())
