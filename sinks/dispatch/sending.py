"""Shaped, concurrent provider calls for one round of a dispatch batch.

`ShapedSender.send(items)` groups the items by (provider, tenant), takes rate tokens for each
group in one `RateShaper.acquire` round trip, hands every granted chunk to the partition's event
loop at once (queued for the provider's pool of as many workers as the client takes requests at
once, its `in_flight`: HTTP/2 streams for APNs; each worker sends the next delivery as its
previous one is answered) and keeps taking tokens while those chunks are in flight. When a
group gets fewer tokens than it asks for, the worker sleeps for the shaper's `wait_s` (the
backlog stays in Kafka: backpressure) up to `shape_max_wait_s` per round; what is still not
granted then is returned as `deferred` (the caller requeues it through the retry topic, no
attempt counted). Every `recheck_s` of such waiting, the caller's `recheck` sees the items not
granted yet and withholds those it must no longer send (a paused or cancelled notification:
the caller records their fate).
Outcomes are settled (decided, events built) as chunks complete, inside those waits, so the
worker's own work overlaps the token waits instead of adding a gap after the last chunk.

SENDING events are emitted when a chunk is submitted. A client that raises (a bug) yields
`Unknown("client_error")`: the request may have left, so it is never blindly retried.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, cast

from herald.dispatching import event
from herald.outcomes import Outcome, Unknown
from herald.shaping import RateShaper, TrafficClass
from herald.states import State
from sinks.dispatch.clients import Providers
from sinks.dispatch.work import Item

__all__ = ["ShapedSender"]

log = logging.getLogger(__name__)

Settle = Callable[[Item, Outcome], None]
Settled = Callable[[], None]
Recheck = Callable[[list[Item]], list[Item]]  # the items still to send
Groups = dict[tuple[str, str], list[Item]]  # (provider, tenant) -> items
Pending = tuple[list[Item], concurrent.futures.Future[list[Outcome]]]


class ShapedSender:
    """Token-bucket shaped sends of one sink partition (see the module docstring)."""

    def __init__(
        self,
        providers: Providers,
        shaper: RateShaper,
        shaped: frozenset[str],
        *,
        max_wait_s: float,
        clock: Callable[[], datetime],
        sleep: Callable[[float], None] = time.sleep,
        recheck_s: float = 0.5,
    ) -> None:
        self.providers = providers
        self.shaper = shaper
        self.shaped = shaped
        self.max_wait_s = max_wait_s
        self.recheck_s = recheck_s
        self.clock = clock
        self.sleep = sleep
        self._pools: dict[str, _Pool] = {}  # provider -> its sends (on the loop thread)

    def send(
        self,
        items: list[Item],
        events: list[dict[str, Any]],
        settle: Settle,
        settled: Settled | None = None,
        recheck: Recheck | None = None,
    ) -> list[Item]:
        """Send `items` (SENDING events appended to `events`); `settle(item, outcome)` is called
        for each as its outcome arrives — while the worker waits for tokens too, so deciding
        and building events overlaps the shaping waits — and `settled()` after each chunk's
        outcomes (the caller records them before the next chunk's); `recheck(waiting)` every
        `recheck_s` of waiting for tokens, keeping only what it returns. Returns the items not
        granted tokens within `max_wait_s` (deferred)."""
        if not items:
            return []
        self.providers.ensure([it.provider for it in items])
        groups: Groups = {}
        for it in items:
            groups.setdefault((it.provider, str(it.delivery["tenant_id"])), []).append(it)
        futures: list[Pending] = []
        start = time.monotonic()
        deadline, check_at = start + self.max_wait_s, start + self.recheck_s
        while groups:
            wait = self._grant_round(groups, futures, events)
            if not groups or time.monotonic() + wait > deadline:
                break
            until = time.monotonic() + wait / 2  # wake before the bucket fills: no token lost
            futures = self._harvest(futures, settle, settled, block=False)
            left = until - time.monotonic()
            if left > 0:
                self.sleep(left)
            if recheck is not None and time.monotonic() >= check_at:
                groups = _kept(groups, recheck)
                check_at = time.monotonic() + self.recheck_s
        self._harvest(futures, settle, settled, block=True)
        return [it for group in groups.values() for it in group]

    @staticmethod
    def _harvest(
        futures: list[Pending], settle: Settle, settled: Settled | None, *, block: bool
    ) -> list[Pending]:
        """Settle the finished chunks (all of them when `block`); return the pending ones."""
        pending: list[Pending] = []
        for chunk, future in futures:
            if block or future.done():
                for it, outcome in zip(chunk, future.result(), strict=True):
                    settle(it, outcome)
                if settled is not None:
                    settled()
            else:
                pending.append((chunk, future))
        return pending

    def _grant_round(
        self,
        groups: Groups,
        futures: list[Pending],
        events: list[dict[str, Any]],
    ) -> float:
        """Take tokens for every group once; submit what was granted; return the least wait."""
        wait = float("inf")
        for key in list(groups):
            provider, tenant = key
            group = groups[key]
            granted = len(group)
            if provider in self.shaped:
                cls: TrafficClass = group[0].traffic_class  # type: ignore[assignment]
                grant = self.shaper.acquire(provider, cls, tenant, len(group))
                granted = grant.granted
                if granted < len(group):
                    wait = min(wait, grant.wait_s)
            if granted:
                chunk, groups[key] = group[:granted], group[granted:]
                self._submit(provider, chunk, futures, events)
            if not groups[key]:
                del groups[key]
        return 0.0 if wait == float("inf") else wait

    def _submit(
        self,
        provider: str,
        chunk: list[Item],
        futures: list[Pending],
        events: list[dict[str, Any]],
    ) -> None:
        now = self.clock()
        for it in chunk:
            if it.first_attempt_at is None:
                it.first_attempt_at = now
            events.append(
                event(it.delivery, State.SENDING, attempt=it.attempt, now=now, provider=provider)
            )
        deliveries = [it.delivery for it in chunk]
        futures.append((chunk, self.providers.loop.submit(self._send_all(provider, deliveries))))

    async def _send_all(self, provider: str, deliveries: list[dict[str, Any]]) -> list[Outcome]:
        """Every delivery's outcome, in order, sent on the provider's `_Pool` (loop thread)."""
        pool = self._pools.get(provider)
        if pool is None:
            client = self.providers.client(provider)
            pool = self._pools[provider] = _Pool(provider, client.send, client.in_flight)
        return await pool.send(deliveries)


def _kept(groups: Groups, recheck: Recheck) -> Groups:
    """`groups` without the items `recheck` withholds (one call for all of them)."""
    kept = {id(it) for it in recheck([it for group in groups.values() for it in group])}
    left = {key: [it for it in group if id(it) in kept] for key, group in groups.items()}
    return {key: group for key, group in left.items() if group}


class _Pool:
    """The sends of one provider on the partition's event loop: the deliveries of every chunk
    in flight in one queue, taken in order by at most as many workers as the client takes
    requests at once (`in_flight`), each sending the next delivery as its previous one is
    answered. One task per worker, not per send, and one pool for all chunks: a chunk handed
    over while the previous ones are still sending adds to the queue instead of starting
    workers that would wait on the client's semaphore (the shaper grants a bulk batch in
    pieces of the bucket's depth, so a batch's chunks overlap). Loop thread only."""

    def __init__(
        self, provider: str, send: Callable[[Any], Coroutine[Any, Any, Outcome]], in_flight: int
    ) -> None:
        self.provider = provider
        self._send = send
        self.in_flight = max(1, in_flight)
        # (delivery, its chunk's outcomes, index, the chunk's future, the chunk's count left)
        self._queue: collections.deque[tuple[Any, list[Any], int, asyncio.Future[list[Any]],
                                             list[int]]] = collections.deque()  # fmt: skip
        self._working = 0  # workers taking from the queue (counted down as they leave it)
        self._tasks: set[asyncio.Task[None]] = set()  # held until done (the loop holds weakly)

    async def send(self, deliveries: list[dict[str, Any]]) -> list[Outcome]:
        if not deliveries:
            return []
        done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        out: list[Any] = [None] * len(deliveries)
        left = [len(deliveries)]
        self._queue.extend((d, out, i, done, left) for i, d in enumerate(deliveries))
        for _ in range(min(len(self._queue), self.in_flight - self._working)):
            self._working += 1
            task = asyncio.create_task(self._work())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return cast(list[Outcome], await done)

    async def _work(self) -> None:
        # `_working` drops in the same step that finds the queue empty: a chunk handed over
        # right after sees the worker gone (a done task's callbacks run a loop turn later).
        queue, send = self._queue, self._send
        try:
            while queue:
                delivery, out, i, done, left = queue.popleft()
                try:
                    out[i] = await send(delivery)
                except Exception as exc:  # a client bug: the request may have left
                    log.error("dispatch.client_error provider=%s error=%s",
                              self.provider, type(exc).__name__)  # fmt: skip
                    out[i] = Unknown("client_error", provider=self.provider)
                left[0] -= 1
                if not left[0] and not done.done():
                    done.set_result(out)
        finally:
            self._working -= 1
