"""A source over compacted changelog topics, for a job that keeps their table in a store.

    ChangelogSource(kafka, topics, held=...)   items: KafkaMessage, then CaughtUp(part) once per
                                               partition

The users job (dataflows/users.py) keeps the latest preferences and contact points of every user
in Redis (the copies every stage reads) and reads herald.preferences / herald.devices into them
(Kafka Streams' changelog-restore model: the compacted topic *is* the table's durable form).
Each partition emits one `CaughtUp` when it first reaches the end of the partition (librdkafka's
partition EOF): everything that was in the topic when it started reading has then been emitted
before it.

The store says where it holds each partition up to (`held`, a `HeldTable`): a partition resumes
there when the store holds the whole table, else at the beginning. A partition marks itself in
the store before it reads (`remember`). Every `CHECK_EVERY_S` it looks again, also while idle:
- a store that lost its data (Redis flushed or restarted empty) has lost the mark, even if a
  record that came since has already written a new position: the partition reads again from
  the beginning (and emits `CaughtUp` again at its end);
- a store whose position went back (a Redis failover to a replica that had not received the
  last writes: a replica holds a prefix of its primary's writes, so the copies written after
  that position are the ones lost with it) is read again from that position.

With `bounded=True` a partition ends at its first end (tests, benchmarks). Partitions keep no
resume state of their own: the store's positions are it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from herald.config import KafkaSettings
from herald.errors import InfraError
from herald.kafka_records import KafkaMessage
from sources.consumer import SharedConsumer, worker_consumer
from sources.kafka import KafkaSource, consumer_config

__all__ = ["CHANGELOG_FETCH_WAIT_MS", "CaughtUp", "ChangelogSource", "HeldTable"]

CHANGELOG_FETCH_WAIT_MS = 1000
CHECK_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """A changelog partition reached the end it had when it started reading (`part` names it)."""

    part: str


class HeldTable(Protocol):
    """A store that holds the table read from the changelog (see the module docstring)."""

    def position(self, part: str) -> int | None:
        """The next offset of `part` the store holds up to; None when the store lost what it
        knew of `part` (it must not count on records written since: see `remember`)."""

    def holds(self) -> bool:
        """Whether the store holds the whole table (False while it is being filled)."""

    def remember(self, part: str, from_start: bool) -> None:
        """Mark `part` as being read into the store, from its beginning (position 0) or from
        its position. The mark is what a loss of the store's data loses."""


log = logging.getLogger(__name__)


class ChangelogSource(FixedPartitionedSource[KafkaMessage | CaughtUp, None]):
    """Read physical `topics` into the `held` store; see the module docstring."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: Sequence[str],
        *,
        held: HeldTable,
        bounded: bool = False,
        batch_size: int = 2000,
    ) -> None:
        self.kafka = kafka
        self.topics = list(topics)
        self.held = held
        self.bounded = bounded
        self.batch_size = batch_size

    def list_parts(self) -> list[str]:
        """`"{partition}-{topic}"` for every partition of every topic (as KafkaSource)."""
        return KafkaSource(self.kafka, self.topics).list_parts()

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _ChangelogPartition:
        """From the beginning, or where the `held` store has it up to: a changelog partition
        has no resume state of its own."""
        idx, topic = for_part.split("-", 1)
        config = consumer_config(self.kafka, step_id)
        # Not on the latency path (the API writes a user's copy itself): a long wait costs the
        # broker fewer looks (sources/consumer.py).
        config["fetch.wait.max.ms"] = max(CHANGELOG_FETCH_WAIT_MS, self.kafka.fetch_wait_ms)
        start = self.held.position(for_part) if self.held.holds() else None
        self.held.remember(for_part, from_start=start is None)
        tp = TopicPartition(topic, int(idx))
        part = _ChangelogPartition(for_part, worker_consumer(config), tp, self, start)
        return part


class _ChangelogPartition(StatefulSourcePartition[KafkaMessage | CaughtUp, None]):
    """One topic-partition read from offset 0 or the store's position (through the worker's
    shared consumer)."""

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
        self._seen = start or 0  # the highest position of the store seen for this partition
        self._next_check = time.monotonic() + CHECK_EVERY_S
        if start is not None:
            log.info("changelog.resume part=%s offset=%d", part, start)
        offset = OFFSET_BEGINNING if start is None else start
        self._feed = shared.attach(TopicPartition(tp.topic, tp.partition, offset))

    def next_batch(self) -> list[KafkaMessage | CaughtUp]:
        """Records as they come; `CaughtUp` after the records of the first end of partition."""
        if self._caught_up and self._bounded:
            raise StopIteration
        if time.monotonic() >= self._next_check:
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
            out.append(CaughtUp(self._part))
        return out

    def _check_held(self, held: HeldTable) -> None:
        """Read again where the store holds this partition up to, when that went back (see
        the module docstring)."""
        position = held.position(self._part)
        if position is not None and position >= self._seen:
            self._seen = position
            return
        if position is None:
            log.warning("changelog.table_lost part=%s: reading it again from the beginning",
                        self._part)  # fmt: skip
            held.remember(self._part, from_start=True)
        else:
            log.warning("changelog.table_behind part=%s position=%d was=%d: reading again from"
                        " there", self._part, position, self._seen)  # fmt: skip
        self._seen = position or 0
        offset = OFFSET_BEGINNING if position is None else position
        # replaces the feed (closing it first would close the consumer with its last feed)
        self._feed = self._shared.attach(TopicPartition(self._tp.topic, self._tp.partition, offset))
        self._caught_up = False
        self._read = 0

    def next_awake(self) -> None:
        """Bytewax's default (an idle worker waits in the shared consumer's poll)."""
        return None

    def snapshot(self) -> None:
        """Nothing: the store's positions are the resume state (module docstring)."""
        return None

    def close(self) -> None:
        """Stop reading the partition (the consumer closes with its last one)."""
        self._feed.close()
