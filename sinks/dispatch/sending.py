"""Shaped, concurrent provider calls for one round of a dispatch batch.

`ShapedSender.send(items)` groups the items by (provider, tenant), takes rate tokens for each
group in one `RateShaper.acquire` round trip, hands every granted chunk to the partition's event
loop at once (sent by as many workers as the client takes requests at once, its `in_flight`:
HTTP/2 streams for APNs; each worker sends the next delivery as its previous one is answered)
and keeps taking tokens while those chunks are in flight. When a group gets fewer
tokens than it asks for, the worker sleeps for the shaper's `wait_s` (the backlog stays in
Kafka: backpressure) up to `shape_max_wait_s` per round; what is still not granted then is
returned as `deferred` (the caller requeues it through the retry topic, no attempt counted).
Outcomes are settled (decided, events built) as chunks complete, inside those waits, so the
worker's own work overlaps the token waits instead of adding a gap after the last chunk.

SENDING events are emitted when a chunk is submitted. A client that raises (a bug) yields
`Unknown("client_error")`: the request may have left, so it is never blindly retried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
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
    ) -> None:
        self.providers = providers
        self.shaper = shaper
        self.shaped = shaped
        self.max_wait_s = max_wait_s
        self.clock = clock
        self.sleep = sleep

    def send(
        self,
        items: list[Item],
        events: list[dict[str, Any]],
        settle: Settle,
        settled: Settled | None = None,
    ) -> list[Item]:
        """Send `items` (SENDING events appended to `events`); `settle(item, outcome)` is called
        for each as its outcome arrives — while the worker waits for tokens too, so deciding
        and building events overlaps the shaping waits — and `settled()` after each chunk's
        outcomes (the caller records them before the next chunk's). Returns the items not
        granted tokens within `max_wait_s` (deferred)."""
        if not items:
            return []
        self.providers.ensure([it.provider for it in items])
        groups: dict[tuple[str, str], list[Item]] = {}
        for it in items:
            groups.setdefault((it.provider, str(it.delivery["tenant_id"])), []).append(it)
        futures: list[Pending] = []
        deadline = time.monotonic() + self.max_wait_s
        while groups:
            wait = self._grant_round(groups, futures, events)
            if not groups or time.monotonic() + wait > deadline:
                break
            until = time.monotonic() + wait / 2  # wake before the bucket fills: no token lost
            futures = self._harvest(futures, settle, settled, block=False)
            left = until - time.monotonic()
            if left > 0:
                self.sleep(left)
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
        groups: dict[tuple[str, str], list[Item]],
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
        """Every delivery's outcome, in order: as many workers as the client takes requests
        at once, each sending the next delivery as its previous one is answered (one task
        per worker, not per send: no send waits on the client's semaphore in a queue)."""
        client = self.providers.client(provider)
        send = client.send
        out: list[Outcome | None] = [None] * len(deliveries)
        todo = iter(enumerate(deliveries))

        async def worker() -> None:
            for i, delivery in todo:
                try:
                    out[i] = await send(delivery)
                except Exception as exc:  # a client bug: the request may have left
                    log.error("dispatch.client_error provider=%s error=%s",
                              provider, type(exc).__name__)  # fmt: skip
                    out[i] = Unknown("client_error", provider=provider)

        workers = min(len(deliveries), max(1, client.in_flight))
        await asyncio.gather(*(worker() for _ in range(workers)))
        return cast(list[Outcome], out)
