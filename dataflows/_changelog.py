"""A source over compacted changelog topics, re-read from the beginning on every start.

    ChangelogSource(kafka, topics)   items: KafkaMessage, then CaughtUp(part) once per partition

The plan job keeps its user table (latest preferences and contact points) in memory and rebuilds
it from herald.preferences / herald.devices each time it starts, instead of writing the whole
table into every recovery snapshot (Kafka Streams' changelog-restore model: the compacted topic
*is* the table's durable form). So partitions keep no resume state, and each partition emits one
`CaughtUp` when it first reaches the end of the partition (librdkafka's partition EOF): everything
that was in the topic when the job started has then been emitted before it. The plan job holds
its requests until every partition has caught up (dataflows/_users.py).

With `bounded=True` a partition ends at that point (tests, benchmarks).

A job whose table is also held elsewhere passes `ready` (the plan job: the Redis copies the
users job keeps hold every user, dataflows/users.py): when it says so at the start, each
partition emits its `CaughtUp` at once, before its first record, and the job plans from the
copies while its own table loads behind (a restarted plan job plans within its start time,
whatever the number of users; the copies are read for every planned user anyway,
dataflows/_copies.py).

A job that keeps the table in a store of its own (the users job, dataflows/users.py, keeps the
Redis copies) passes `held`: where that store holds each partition up to (resume there rather
than at the beginning, when the store holds the whole table). A partition makes sure the store
has a position for it before it reads (`remember`); a store that lost its data (Redis flushed or
restarted empty) has none any more, which the partition notices within `CHECK_EVERY_S`: it then
reads again from the beginning (and emits `CaughtUp` again at its end).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from herald.config import KafkaSettings
from herald.errors import InfraError
from herald.planning import CaughtUp
from sources.consumer import SharedConsumer, worker_consumer
from sources.kafka import KafkaMessage, KafkaSource, consumer_config

__all__ = ["CHANGELOG_FETCH_WAIT_MS", "ChangelogSource", "HeldTable"]

CHANGELOG_FETCH_WAIT_MS = 1000
CHECK_EVERY_S = 1.0


class HeldTable(Protocol):
    """A store that holds the table read from the changelog (see the module docstring)."""

    def position(self, part: str) -> int | None:
        """The next offset of `part` the store does not hold; None: it has no position."""

    def holds(self) -> bool:
        """Whether the store holds the whole table (False while it is being filled)."""

    def remember(self, part: str) -> None:
        """Give `part` a position (0) unless it has one."""


log = logging.getLogger(__name__)


class ChangelogSource(FixedPartitionedSource[KafkaMessage | CaughtUp, None]):
    """Read physical `topics` from their beginning; see the module docstring."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: Sequence[str],
        *,
        bounded: bool = False,
        batch_size: int = 2000,
        held: HeldTable | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.kafka = kafka
        self.topics = list(topics)
        self.bounded = bounded
        self.batch_size = batch_size
        self.held = held
        self.ready = ready

    def list_parts(self) -> list[str]:
        """`"{partition}-{topic}"` for every partition of every topic (as KafkaSource)."""
        return KafkaSource(self.kafka, self.topics).list_parts()

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _ChangelogPartition:
        """From the beginning, or where the `held` table's store has it up to: a changelog
        partition has no resume state of its own."""
        idx, topic = for_part.split("-", 1)
        config = consumer_config(self.kafka, step_id)
        # Not on the latency path (writes through the API reach plan by the Redis copy): a long
        # wait costs the broker fewer looks, and another consumer keeps these partitions out of
        # the fetches of the job's latency-critical one (sources/consumer.py).
        config["fetch.wait.max.ms"] = max(CHANGELOG_FETCH_WAIT_MS, self.kafka.fetch_wait_ms)
        start = None
        if self.held is not None:
            if self.held.holds():
                start = self.held.position(for_part)
            self.held.remember(for_part)
        tp = TopicPartition(topic, int(idx))
        part = _ChangelogPartition(for_part, worker_consumer(config), tp, self, start)
        return part


class _ChangelogPartition(StatefulSourcePartition[KafkaMessage | CaughtUp, None]):
    """One topic-partition read from offset 0 or the held table's position (through the
    worker's shared consumer)."""

    def __init__(
        self,
        part: str,
        shared: SharedConsumer,
        tp: TopicPartition,
        source: ChangelogSource,
        start: int | None,
    ) -> None:
        self._part = part
        self._shared = shared
        self._tp = tp
        self._batch_size = source.batch_size
        self._bounded = source.bounded
        self._held = source.held
        self._caught_up = False
        self._read = 0
        # CaughtUp was (or is to be) emitted before the end: the table is held elsewhere.
        self._early = source.ready is not None and source.ready()
        self._reported = False
        self._next_check = time.monotonic() + CHECK_EVERY_S
        if start is not None:
            log.info("changelog.resume part=%s offset=%d", part, start)
        offset = OFFSET_BEGINNING if start is None else start
        self._feed = shared.attach(TopicPartition(tp.topic, tp.partition, offset))

    def next_batch(self) -> list[KafkaMessage | CaughtUp]:
        """Records as they come; `CaughtUp` after the records of the first end of partition."""
        if self._caught_up and self._bounded:
            raise StopIteration
        if self._held is not None and time.monotonic() >= self._next_check:
            self._check_held(self._held)
            self._next_check = time.monotonic() + CHECK_EVERY_S
        # Never blocks before the first end: a rebuild runs at full speed.
        msgs = self._feed.take(self._batch_size, may_block=self._caught_up)
        out: list[KafkaMessage | CaughtUp] = []
        eof = False
        for msg in msgs:
            err = msg.error()
            if err is None:
                ts_type, ts = msg.timestamp()
                out.append(
                    KafkaMessage(
                        cast(str, msg.topic()),
                        cast(int, msg.partition()),
                        cast(int, msg.offset()),
                        cast(bytes | None, msg.key()),
                        cast(bytes | None, msg.value()),
                        ts if ts_type else None,
                    )  # fmt: skip
                )
            elif err.code() == KafkaError._PARTITION_EOF:
                eof = True
            elif err.fatal():
                raise InfraError(f"changelog {self._part}: {err.name()}: {err.str()}")
        self._read += len(out)
        if eof and not self._caught_up:
            self._caught_up = True
            log.info("changelog.caught_up part=%s records=%d", self._part, self._read)
            if not (self._reported or self._early):  # an early one is emitted below
                out.append(CaughtUp(self._part))
        if self._early and not self._reported:
            log.info("changelog.ready_early part=%s (the table is held elsewhere)", self._part)
            out.insert(0, CaughtUp(self._part))
        self._reported = self._reported or self._early or self._caught_up
        return out

    def _check_held(self, held: HeldTable) -> None:
        """Read again from the beginning when the store lost its position for this partition."""
        if held.position(self._part) is not None:
            return
        log.warning("changelog.table_lost part=%s: reading it again from the beginning", self._part)
        held.remember(self._part)
        self._feed.close()
        self._feed = self._shared.attach(
            TopicPartition(self._tp.topic, self._tp.partition, OFFSET_BEGINNING)
        )
        self._caught_up = False
        self._reported = self._early = False
        self._read = 0

    def next_awake(self) -> None:
        """Bytewax's default (an idle worker waits in the shared consumer's poll)."""
        return None

    def snapshot(self) -> None:
        """Nothing: the table is rebuilt from the beginning of the changelog on every start."""
        return None

    def close(self) -> None:
        """Stop reading the partition (the consumer closes with its last one)."""
        self._feed.close()
