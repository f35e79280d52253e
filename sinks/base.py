"""Batching, backpressure and epoch-boundary flushing, shared by Herald's sinks.

How Bytewax 0.21 orders sink calls (read from its Rust runtime, checked by tests/sinks):

    per epoch, per sink partition:  write_batch(items) ... write_batch(items)
    when the epoch closes:          snapshot()   (only for partitions written in that epoch)
    then:                           the epoch's snapshots are stored; the epoch is committed
                                    (recovery resumes after the last committed epoch)

A `FixedPartitionedSink` partition that blocks in `snapshot()` until every item it was handed
is durable (and raises if one is not) therefore never lets an epoch commit with records still in
flight. A `DynamicSink` has no such hook: it can only be correct by flushing inside every
`write_batch`, which serializes the client's network round trips with the dataflow.

So Herald's asynchronous sinks are `EpochFlushSink`s:
- `write_batch` hands items to an asynchronous client (e.g. librdkafka) and returns;
- `snapshot()` (the epoch boundary) and `close()` block until everything is acknowledged and
  raise `DeliveryError` for anything that was not;
- on a crash the job resumes from the last committed epoch and writes those items again:
  at-least-once, so every sink needs an idempotent consumer (event id, delivery id, window id).

Backpressure lives here too: `retry_while_full` waits (bounded) for a full client queue to drain,
and never drops an item.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition

from herald.errors import DeliveryError

__all__ = [
    "DeliveryTracker",
    "EpochFlushPartition",
    "EpochFlushSink",
    "retry_while_full",
]

log = logging.getLogger(__name__)

X = TypeVar("X")


class EpochFlushPartition(StatefulSinkPartition[X, None], ABC, Generic[X]):
    """One sink partition over an asynchronous client, made durable at every epoch boundary.

    Subclasses implement `submit` (hand items over, may block for backpressure but should not
    wait for acknowledgements), `flush` (block until everything submitted is acknowledged, raise
    `DeliveryError` otherwise) and optionally `release` (free the client).
    """

    @abstractmethod
    def submit(self, items: list[X]) -> None:
        """Hand `items` to the client; raise `DeliveryError` for earlier failed items."""

    @abstractmethod
    def flush(self) -> None:
        """Block until every submitted item is acknowledged; raise `DeliveryError` if not."""

    def release(self) -> None:
        """Free the client; called once from `close()` after the final flush."""
        return

    _failed = False

    def write_batch(self, values: list[X]) -> None:
        """Called by Bytewax with the items of one epoch, in epoch order."""
        try:
            self.submit(values)
        except BaseException:
            self._failed = True
            raise

    def snapshot(self) -> None:
        """Called by Bytewax when an epoch closes: the epoch commits only after this returns."""
        try:
            self.flush()
        except BaseException:
            self._failed = True
            raise
        return None

    def close(self) -> None:
        """Called when a finite dataflow completes, and when Bytewax drops the partition.

        Bytewax 0.21 also calls this while unwinding from an earlier error; raising again there
        would abort the process, so a partition that already failed only releases its client.
        """
        try:
            if not self._failed:
                self.flush()
        finally:
            self.release()


class EpochFlushSink(FixedPartitionedSink[X, None], ABC, Generic[X]):
    """A sink of `parts` logical partitions, each an `EpochFlushPartition`.

    Items must be `(routing_key: str, item)`: the key picks the partition (adler32, stable across
    processes), so items with the same key keep their order through one client. Each partition
    lives on one worker (Bytewax assigns a primary); use `parts >= workers` to spread the load.
    The partition count is part of the recovery state: change it only with a fresh recovery store.
    """

    def __init__(self, parts: int = 1) -> None:
        if parts < 1:
            raise ValueError("parts must be >= 1")
        self.parts = parts

    def list_parts(self) -> list[str]:
        """Every worker may host every partition; Bytewax picks one primary for each."""
        return [f"part-{i}" for i in range(self.parts)]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> EpochFlushPartition[X]:
        """Called once per partition per execution; nothing to resume (state is always None)."""
        return self.build_writer(step_id, for_part)

    @abstractmethod
    def build_writer(self, step_id: str, part: str) -> EpochFlushPartition[X]:
        """Create the client-owning partition `part` of output step `step_id`."""


class DeliveryTracker:
    """Collects the failures a client reports from its delivery callbacks (any thread).

    The writer's client knows how many items are still unacknowledged (librdkafka's queue
    length); this only keeps what failed, the first few in detail, until `raise_if_failed()`
    turns them into one `DeliveryError`.
    """

    _KEEP = 5

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._failed = 0
        self._examples: list[str] = []

    def fail(self, error: str) -> None:
        """Record one failure: an item the client gave up on, or a client-level error."""
        with self._lock:
            self._failed += 1
            if len(self._examples) < self._KEEP:
                self._examples.append(error)

    def raise_if_failed(self) -> None:
        """Raise `DeliveryError` if any item failed since this tracker was created."""
        if self._failed:
            with self._lock:
                failed, examples = self._failed, list(self._examples)
            log.error("sink.delivery_failed sink=%s failed=%d", self.name, failed)
            raise DeliveryError(
                f"{self.name}: {failed} record(s) not delivered: {'; '.join(examples)}"
            )


def retry_while_full(
    attempt: Callable[[], Any],
    drain: Callable[[float], Any],
    *,
    max_block: float,
    what: str,
    poll_interval: float = 0.05,
) -> None:
    """Call `attempt()`; while it raises `BufferError` (client queue full), drain and retry.

    `drain(timeout)` must serve the client's callbacks (e.g. `producer.poll`). Waits at most
    `max_block` seconds in total, then raises `DeliveryError`: the item is never dropped, the job
    fails and resumes from its last snapshot.
    """
    try:
        attempt()
        return
    except BufferError:
        pass
    started = time.monotonic()
    log.debug("sink.backpressure what=%s", what)
    while True:
        drain(poll_interval)
        try:
            attempt()
            return
        except BufferError:
            if time.monotonic() - started > max_block:
                raise DeliveryError(
                    f"{what}: client queue still full after {max_block:.0f}s"
                ) from None
