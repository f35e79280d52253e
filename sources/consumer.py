"""One Kafka consumer per worker, shared by every topic-partition the worker reads.

    feed = worker_consumer(config).attach(TopicPartition(topic, partition, start))
    feed.take(n, may_block=True) -> list[Message]                    records and partition events
    feed.ripe(n, linger_s) -> bool               a lingering partition: take now (n held, or waited)
    feed.close()

Why: Bytewax calls `next_batch` on each source partition separately, and each partition used
to own a `Consumer` and poll it every 10-20 ms. With a dozen partitions per job and 20 jobs the
idle stack woke hundreds of times a second, and the broker answered a long-poll fetch of every
one of some 150 consumers (its own CPU grew with their count). Now the partitions a worker
thread reads share one `Consumer` per client configuration (librdkafka fetches all of them in
one request), and each keeps a buffer that the shared consumer fills.

Waking: when the worker is idle (the last poll in this thread returned nothing, no buffer holds
anything) the first partition of the *primary* consumer asked for records in a new activation
blocks in `poll()` for up to `IDLE_BLOCK_S` with the GIL released: the broker wakes the worker
when data arrives, instead of the worker waking every few milliseconds to look. The primary
consumer is the thread's one with the shortest broker fetch wait (`fetch.wait.max.ms`): the
latency-critical topics; a consumer with a longer wait (the plan job's changelogs) is polled
without blocking, so its records wait for the primary's next wake (at most `IDLE_BLOCK_S`).
Partitions called within `SAME_ACTIVATION_S` of the end of a block never block, so a worker
blocks at most once per activation. Timers of the job's other operators (windows, schedule
buckets) fire at most `IDLE_BLOCK_S` late while it waits. A caller with other work pending
(e.g. an audience expansion) passes `may_block=False`.

Backpressure: a partition whose buffer exceeds `HIGH_WATER` records is paused in the consumer
until the worker has taken its buffer below half of that.

Threads: the registry is per thread (a Bytewax worker is one thread); feeds must be used from
the thread that attached them.

A Bytewax cluster (`-i/-a`, or `-w` above 1) runs each worker on a thread Rust started. Each
call into Python there takes the GIL through `PyGILState_Ensure` and gives it back through
`PyGILState_Release`, and the release deletes the thread's Python state when it made it. So
every call started from an empty thread state: the registry and the idle flag were gone at the
next call, no worker ever blocked, and each idle cluster process spun at Bytewax's 1 ms source
cooldown (a 2-process stack took both cores doing nothing). `keep_thread_state` takes one more
reference on the state, so it lives as long as the thread. It also makes every later call from
that thread cheaper: a 2-worker flow of small batches ran 5-6x as many items per second.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

__all__ = [
    "IDLE_BLOCK_S",
    "PERMANENT",
    "Feed",
    "SharedConsumer",
    "keep_thread_state",
    "worker_consumer",
]

log = logging.getLogger(__name__)

IDLE_BLOCK_S = 0.2
SAME_ACTIVATION_S = 0.0005
HIGH_WATER = 20_000
# Not retriable by waiting: the job cannot make progress on this partition.
PERMANENT = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._SSL,
        KafkaError._AUTHENTICATION,
    }
)
# Settings that name one client instance; they do not make two configurations different.
_INSTANCE_KEYS = frozenset({"client.id", "group.id", "error_cb"})


class _Thread(threading.local):
    """What one worker thread shares: its consumers and whether it is idle."""

    def __init__(self) -> None:
        self.consumers: dict[tuple[tuple[str, str], ...], SharedConsumer] = {}
        self.idle = False
        self.last_block = 0.0


_local = _Thread()
_kept = threading.local()


def keep_thread_state() -> None:
    """Keep this thread's Python thread state until the thread ends (module docstring).

    Once per thread: after the first call the state persists, and with it this marker."""
    if not getattr(_kept, "done", False):
        ctypes.pythonapi.PyGILState_Ensure()
        _kept.done = True


def worker_consumer(config: Mapping[str, Any]) -> SharedConsumer:
    """This thread's consumer for `config` (made on first use; closed with its last feed)."""
    keep_thread_state()
    key = tuple(sorted((k, str(v)) for k, v in config.items() if k not in _INSTANCE_KEYS))
    shared = _local.consumers.get(key)
    if shared is None:
        shared = _local.consumers[key] = SharedConsumer(config, key)
    return shared


def _primary() -> SharedConsumer | None:
    """The thread's consumer with the shortest fetch wait (see the module docstring)."""
    return min(_local.consumers.values(), key=lambda c: c.fetch_wait_ms, default=None)


class SharedConsumer:
    """A `Consumer` with manually assigned partitions, each read through its `Feed`."""

    def __init__(self, config: Mapping[str, Any], key: tuple[tuple[str, str], ...]) -> None:
        self._key = key
        self.fetch_wait_ms = int(config.get("fetch.wait.max.ms", 500))
        self.fatal: str | None = None
        self._last_warning: dict[str, float] = {}
        self._consumer = Consumer({**config, "error_cb": self._on_error})
        self._feeds: dict[tuple[str, int], Feed] = {}
        self._paused: set[tuple[str, int]] = set()

    @property
    def consumer(self) -> Consumer:
        """The underlying client (watermarks, metadata)."""
        return self._consumer

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() or err.code() in PERMANENT:
            self.fatal = f"{err.name()}: {err.str()}"
        else:
            self.warn(err, "client")

    def warn(self, err: KafkaError, where: str) -> None:
        """Log a transient error, at most every 10 s per error code (librdkafka retries it)."""
        now = time.monotonic()
        if now - self._last_warning.get(err.name(), 0.0) > 10:
            self._last_warning[err.name()] = now
            log.warning("kafka_source.transient_error where=%s code=%s", where, err.name())

    def attach(self, tp: TopicPartition) -> Feed:
        """Assign `tp` from its offset; a feed left attached by an aborted run is replaced."""
        ident = (tp.topic, tp.partition)
        if self._feeds.pop(ident, None) is not None:
            self._paused.discard(ident)
            self._consumer.incremental_unassign([TopicPartition(*ident)])
        feed = Feed(self, ident)
        self._feeds[ident] = feed
        self._consumer.incremental_assign([tp])
        return feed

    def detach(self, feed: Feed) -> None:
        """Unassign the feed's partition; the last one closes the consumer."""
        if self._feeds.get(feed.ident) is not feed:
            return
        del self._feeds[feed.ident]
        self._paused.discard(feed.ident)
        self._consumer.incremental_unassign([TopicPartition(*feed.ident)])
        if not self._feeds:
            self._consumer.close()
            if _local.consumers.get(self._key) is self:
                del _local.consumers[self._key]

    def fill(self, max_messages: int, timeout: float) -> int:
        """Consume up to `max_messages` (waiting up to `timeout` s for the first) into the
        feeds' buffers; the number of messages read."""
        if timeout > 0:
            # consume() waits for a whole batch or the timeout; poll() returns with the first
            first = self._consumer.poll(timeout)
            if first is None:
                return 0
            more = self._consumer.consume(max_messages - 1, 0) if max_messages > 1 else []
            msgs = [first, *more]
        else:
            msgs = self._consumer.consume(max_messages, 0)
        for msg in msgs:
            ident = (msg.topic(), msg.partition())
            feed = self._feeds.get(ident)  # type: ignore[arg-type]
            if feed is not None:
                feed.buffer.append(msg)
            elif msg.error() is not None:
                # a client-wide event (no partition): give it to every feed to judge
                for each in self._feeds.values():
                    each.buffer.append(msg)
        if msgs:
            self._pause_full()
        return len(msgs)

    def _pause_full(self) -> None:
        feeds = self._feeds.items()
        full = [i for i, f in feeds if i not in self._paused and len(f.buffer) > HIGH_WATER]
        if full:
            self._paused.update(full)
            self._consumer.pause([TopicPartition(*i) for i in full])

    def resume_if_drained(self, feed: Feed) -> None:
        """Resume a paused partition once its buffer is below half the high-water mark."""
        if feed.ident in self._paused and len(feed.buffer) < HIGH_WATER // 2:
            self._paused.discard(feed.ident)
            self._consumer.resume([TopicPartition(*feed.ident)])

    def buffered(self) -> bool:
        """Whether any feed holds records not taken yet."""
        return any(f.buffer for f in self._feeds.values())

    def lingering_since(self) -> float | None:
        """When the oldest message held by a lingering feed came (`Feed.ripe`); None: none is."""
        return min((f.since for f in self._feeds.values() if f.since is not None), default=None)


class Feed:
    """One topic-partition's view of a shared consumer."""

    def __init__(self, shared: SharedConsumer, ident: tuple[str, int]) -> None:
        self.shared = shared
        self.ident = ident
        self.buffer: deque[Message] = deque()
        # When the oldest message of a lingering partition's buffer came (`ripe`); None: empty.
        self.since: float | None = None

    def take(self, max_messages: int, may_block: bool = True) -> list[Message]:
        """Up to `max_messages` of this partition's messages (records and partition events).

        Polls the shared consumer when the buffer is empty; blocks (see the module docstring)
        only if `may_block` and the worker is idle at the start of an activation.
        """
        if not self.buffer:
            self._fill(max_messages, may_block)
        buf = self.buffer
        n = min(max_messages, len(buf))
        out = [buf.popleft() for _ in range(n)]
        if out:
            _local.idle = False
            self.shared.resume_if_drained(self)
        return out

    def ripe(self, max_messages: int, linger_s: float, may_block: bool = True) -> bool:
        """Whether a lingering partition should take its buffer now: once it holds
        `max_messages`, or once its oldest message has waited `linger_s` (`since`). Tops the
        buffer up without blocking while it holds anything; polls as `take` does when empty."""
        if len(self.buffer) < max_messages:
            self._fill(max_messages, may_block and not self.buffer)
        if not self.buffer:
            self.since = None
            return False
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if len(self.buffer) >= max_messages or now - self.since >= linger_s:
            self.since = None
            return True
        return False

    def _fill(self, max_messages: int, may_block: bool) -> None:
        started = time.monotonic()
        block = (
            may_block
            and _local.idle
            and started - _local.last_block > SAME_ACTIVATION_S
            and self.shared is _primary()
            and not any(c.buffered() for c in _local.consumers.values())
        )
        read = self.shared.fill(max_messages, IDLE_BLOCK_S if block else 0.0)
        _local.idle = read == 0
        if block:
            _local.last_block = time.monotonic()

    def close(self) -> None:
        """Stop reading this partition (the consumer closes with its last feed)."""
        self.shared.detach(self)
