"""Consumer lag of every Bytewax job, read from outside the jobs.

Herald's Kafka source joins no consumer group and commits nothing to Kafka: a job's position
is the snapshot of its input partitions in its Bytewax recovery store
(`<run_dir>/recovery/<job>/part-*.sqlite3`, table `snaps`, state of the input step: `read`
in `sources.kafka`, `<name>_in` where a job has its own source, such as plan's `requests_in`;
keyed `<partition>-<topic>`, value = next offset to read, or a tuple that starts with it).
Lag is the partition's end (`sources.kafka.partition_ends`: Tansu's high watermark is the last
batch's base offset + 1) minus that offset, as of the job's last committed epoch (`-s` snapshot
interval). Reading the stores is read-only SQLite; the values are pickles Bytewax
wrote in this run directory (trusted).

    committed_offsets(recovery_root) -> {job: {(topic, partition): next offset}}
    consumer_lag(kafka, offsets)     -> [Lag(job, topic, partition, offset, end, lag)]
    topic_ends(kafka, topics)        -> {(topic, partition): end}
    behind(recovery_root, job, ends) -> {(topic, partition): (position, end)} not reached yet
"""

from __future__ import annotations

import logging
import pickle
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer

from herald.config import KafkaSettings
from sources.kafka import partition_ends

__all__ = ["Lag", "behind", "committed_offsets", "consumer_lag", "topic_ends"]

log = logging.getLogger(__name__)

_LATEST = r"""
SELECT s.step_id, s.state_key, s.ser_change FROM snaps AS s
JOIN (SELECT step_id, state_key, max(snap_epoch) AS epoch FROM snaps
      WHERE step_id LIKE '%.read' OR step_id LIKE '%\_in' ESCAPE '\'
      GROUP BY step_id, state_key) AS m
  ON s.step_id = m.step_id AND s.state_key = m.state_key AND s.snap_epoch = m.epoch
"""


@dataclass(frozen=True, slots=True)
class Lag:
    """Records a job has not processed yet on one partition."""

    job: str
    topic: str
    partition: int
    offset: int
    end: int
    lag: int


def committed_offsets(recovery_root: Path) -> dict[str, dict[tuple[str, int], int]]:
    """Next offsets of every job's input partitions, from the recovery stores under the root."""
    out: dict[str, dict[tuple[str, int], int]] = {}
    if not recovery_root.is_dir():
        return out
    for job_dir in sorted(p for p in recovery_root.iterdir() if p.is_dir()):
        offsets: dict[tuple[str, int], int] = {}
        for db in sorted(job_dir.glob("part-*.sqlite3")):
            try:
                conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
                try:
                    rows = conn.execute(_LATEST).fetchall()
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                log.warning("dashboards.lag_read_failed job=%s error=%s", job_dir.name, exc)
                continue
            for _step, key, blob in rows:
                partition, _, topic = str(key).partition("-")
                value = pickle.loads(blob) if blob is not None else None  # noqa: S301 (own data)
                if isinstance(value, tuple) and value:
                    value = value[0]  # (next offset, extra state), e.g. plan's audience cursors
                if isinstance(value, int) and partition.isdigit():
                    offsets[(topic, int(partition))] = value
        out[job_dir.name] = offsets
    return out


def topic_ends(
    kafka: KafkaSettings, topics: list[str], partitions: set[tuple[str, int]] | None = None
) -> dict[tuple[str, int], int]:
    """The end of each partition of `topics` (of those in `partitions` when given); a partition
    whose end could not be read is left out."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": "herald-dashboards",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }  # the tails are there: no long poll
    )
    ends: dict[tuple[str, int], int] = {}
    try:
        for topic in sorted(set(topics)):
            if partitions is None:
                meta = consumer.list_topics(topic, timeout=5).topics[topic]
                wanted = sorted(meta.partitions)
            else:
                wanted = sorted(p for t, p in partitions if t == topic)
            found = partition_ends(consumer, topic, wanted, 5)
            ends.update({(topic, p): end for p, end in found.items()})
    finally:
        consumer.close()
    return ends


def consumer_lag(kafka: KafkaSettings, offsets: dict[str, dict[tuple[str, int], int]]) -> list[Lag]:
    """Lag per job and partition (the partition's end minus the committed next offset); a
    partition whose end could not be read is left out."""
    pairs = {tp for job in offsets.values() for tp in job}
    if not pairs:
        return []
    ends = topic_ends(kafka, [t for t, _ in pairs], pairs)
    pairs = {tp for tp in pairs if tp in ends}
    return [
        Lag(job, topic, partition, offset, ends[(topic, partition)],
            max(0, ends[(topic, partition)] - offset))
        for job, positions in sorted(offsets.items())
        for (topic, partition), offset in sorted(positions.items())
        if (topic, partition) in pairs
    ]  # fmt: skip


def behind(
    recovery_root: Path, job: str, ends: dict[tuple[str, int], int]
) -> dict[tuple[str, int], tuple[int | None, int]]:
    """The partitions whose `ends` (from `topic_ends`) `job` has not committed a position at or
    past yet, with (position, end); empty partitions never count. Empty: the job has read,
    processed and committed everything up to `ends` (the barrier tests wait on)."""
    held = committed_offsets(recovery_root).get(job, {})
    return {
        tp: (held.get(tp), end) for tp, end in ends.items() if end > 0 and held.get(tp, -1) < end
    }
