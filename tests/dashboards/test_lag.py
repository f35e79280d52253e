"""Committed positions read from Bytewax recovery stores (dashboards/lag.py), on stores written
the way Bytewax writes them: the latest epoch of each input step's partition, whatever the
job names its input step."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

from dashboards.lag import behind, committed_offsets


def store(path: Path, rows: list[tuple[str, str, int, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE snaps (step_id TEXT, state_key TEXT, snap_epoch INTEGER, ser_change BLOB)"
        )
        conn.executemany(
            "INSERT INTO snaps VALUES (?, ?, ?, ?)",
            [(step, key, epoch, pickle.dumps(value)) for step, key, epoch, value in rows],
        )


def test_every_input_step_counts_at_its_latest_epoch_and_no_other_state(tmp_path: Path) -> None:
    store(
        tmp_path / "plan_transactional" / "part-0.sqlite3",
        [
            ("plan.requests_in", "0-herald.requests.transactional", 1, (4, ())),
            ("plan.requests_in", "0-herald.requests.transactional", 2, (7, ("cursor",))),
            ("plan.requests_in", "1-herald.requests.transactional", 2, (3, ())),
            ("plan.guard", "2-herald.requests.transactional", 2, 99),  # not an input step
        ],
    )
    store(
        tmp_path / "dispatch_transactional" / "part-0.sqlite3",
        [("dispatch.kafka_in.read", "3-herald.deliveries.sms.transactional", 5, 12)],
    )
    assert committed_offsets(tmp_path) == {
        "dispatch_transactional": {("herald.deliveries.sms.transactional", 3): 12},
        "plan_transactional": {
            ("herald.requests.transactional", 0): 7,
            ("herald.requests.transactional", 1): 3,
        },
    }


def test_behind_names_the_partitions_short_of_their_ends_and_skips_empty_ones(
    tmp_path: Path,
) -> None:
    store(
        tmp_path / "receipts" / "part-0.sqlite3",
        [("receipts.raw_in.read", "0-herald.receipts.raw", 3, 10)],
    )
    ends = {("herald.receipts.raw", 0): 10, ("herald.receipts.raw", 1): 4}
    ends_empty = {("herald.receipts.raw", 2): 0}
    assert behind(tmp_path, "receipts", ends) == {("herald.receipts.raw", 1): (None, 4)}
    assert behind(tmp_path, "receipts", {**ends_empty, ("herald.receipts.raw", 0): 10}) == {}
    assert behind(tmp_path, "receipts", {("herald.receipts.raw", 0): 11}) == {
        ("herald.receipts.raw", 0): (10, 11)
    }
