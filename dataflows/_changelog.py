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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from herald.config import KafkaSettings
from herald.errors import InfraError
from herald.planning import CaughtUp
from sources.consumer import Feed, worker_consumer
from sources.kafka import KafkaMessage, KafkaSource, consumer_config

__all__ = ["CHANGELOG_FETCH_WAIT_MS", "ChangelogSource"]

CHANGELOG_FETCH_WAIT_MS = 1000

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
    ) -> None:
        self.kafka = kafka
        self.topics = list(topics)
        self.bounded = bounded
        self.batch_size = batch_size

    def list_parts(self) -> list[str]:
        """`"{partition}-{topic}"` for every partition of every topic (as KafkaSource)."""
        return KafkaSource(self.kafka, self.topics).list_parts()

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _ChangelogPartition:
        """Always from the beginning: a changelog partition has no resume state."""
        idx, topic = for_part.split("-", 1)
        config = consumer_config(self.kafka, step_id)
        # Not on the latency path (writes through the API reach plan by the Redis copy): a long
        # wait costs the broker fewer looks, and another consumer keeps these partitions out of
        # the fetches of the job's latency-critical one (sources/consumer.py).
        config["fetch.wait.max.ms"] = max(CHANGELOG_FETCH_WAIT_MS, self.kafka.fetch_wait_ms)
        shared = worker_consumer(config)
        feed = shared.attach(TopicPartition(topic, int(idx), OFFSET_BEGINNING))
        return _ChangelogPartition(for_part, feed, self.batch_size, self.bounded)


class _ChangelogPartition(StatefulSourcePartition[KafkaMessage | CaughtUp, None]):
    """One topic-partition read from offset 0 (through the worker's shared consumer)."""

    def __init__(self, part: str, feed: Feed, batch_size: int, bounded: bool) -> None:
        self._part = part
        self._feed = feed
        self._batch_size = batch_size
        self._bounded = bounded
        self._caught_up = False
        self._read = 0

    def next_batch(self) -> list[KafkaMessage | CaughtUp]:
        """Records as they come; `CaughtUp` after the records of the first end of partition."""
        if self._caught_up and self._bounded:
            raise StopIteration
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

    def next_awake(self) -> None:
        """Bytewax's default (an idle worker waits in the shared consumer's poll)."""
        return None

    def snapshot(self) -> None:
        """Nothing: the table is rebuilt from the beginning of the changelog on every start."""
        return None

    def close(self) -> None:
        """Stop reading the partition (the consumer closes with its last one)."""
        self._feed.close()
