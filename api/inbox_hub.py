"""Live inbox updates for every WebSocket of one API process, from one Redis subscription.

    hub = InboxHub(redis, per_user=8, per_tenant=20_000)
    refused = hub.refusal(tenant_id, user_id)   # None, or why the socket is over a cap
    queue = await hub.join(tenant_id, user_id)  # events of the user's channel (str), None = end
    ...
    await hub.leave(tenant_id, user_id, queue)

A socket used to hold a pooled Redis connection of its own (subscribed to its user's channel):
the pool's 256 connections were the process's limit, and the next socket was an HTTP 500. The
hub subscribes the one connection it holds to a user's channel (`keys.inbox_channel`) when the
first socket of that user joins and unsubscribes when the last one leaves; one reader task
hands each message to the queues of that user's sockets. A socket whose queue is full (a
client that does not read) gets None and is closed; so does every socket when the subscription
cannot be kept (Redis gone: the clients reconnect and read their inbox again).

Caps: at most `per_user` sockets per user and `per_tenant` per tenant in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from herald import keys

__all__ = ["InboxHub"]

log = logging.getLogger(__name__)

QUEUE_SIZE = 256  # events waiting for one socket before it counts as not reading
READ_TIMEOUT_S = 1.0  # how long the reader waits for a message before looking again


class InboxHub:
    """One subscription, many sockets (see the module docstring)."""

    def __init__(self, redis: Redis, per_user: int, per_tenant: int) -> None:
        self._redis = redis
        self.per_user = per_user
        self.per_tenant = per_tenant
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one subscription change at a time
        self._queues: dict[str, set[asyncio.Queue[str | None]]] = {}
        self._users: dict[str, str] = {}  # channel -> user
        self._tenants: Counter[str] = Counter()

    @property
    def sockets(self) -> int:
        """Sockets joined now."""
        return sum(self._tenants.values())

    def refusal(self, tenant_id: str, user_id: str) -> str | None:
        """Why one more socket of `user_id` (of `tenant_id`) is refused, or None."""
        if len(self._queues.get(user_id, ())) >= self.per_user:
            return f"at most {self.per_user} live connections per user"
        if self._tenants[tenant_id] >= self.per_tenant:
            return f"at most {self.per_tenant} live connections per tenant on this server"
        return None

    async def join(self, tenant_id: str, user_id: str) -> asyncio.Queue[str | None]:
        """A queue of `user_id`'s events, subscribed before this returns."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUE_SIZE)
        self._tenants[tenant_id] += 1
        queues = self._queues.setdefault(user_id, set())
        queues.add(queue)
        if len(queues) == 1:
            try:
                await self._subscribe(user_id)
            except BaseException:
                await self.leave(tenant_id, user_id, queue)
                raise
        return queue

    async def leave(self, tenant_id: str, user_id: str, queue: asyncio.Queue[str | None]) -> None:
        """Forget `queue`; the last socket of a user unsubscribes the user's channel."""
        self._tenants[tenant_id] -= 1
        if self._tenants[tenant_id] <= 0:
            del self._tenants[tenant_id]
        queues = self._queues.get(user_id)
        if queues is None:
            return
        queues.discard(queue)
        if not queues:
            del self._queues[user_id]
            with contextlib.suppress(RedisError, RuntimeError):
                await self._unsubscribe(user_id)

    async def close(self) -> None:
        """Stop the reader and drop the subscription (the app's shutdown)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError):
                await self._reader
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, RuntimeError):
                await self._pubsub.aclose()

    async def _subscribe(self, user_id: str) -> None:
        channel = keys.inbox_channel(user_id)
        async with self._lock:
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub()
            self._users[channel] = user_id
            await self._pubsub.subscribe(channel)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read(), name="inbox-hub")

    async def _unsubscribe(self, user_id: str) -> None:
        channel = keys.inbox_channel(user_id)
        async with self._lock:
            if user_id in self._queues:  # a socket of the user joined meanwhile
                return
            self._users.pop(channel, None)
            if self._pubsub is not None:
                await self._pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        """Hand every message to its user's sockets, while any socket is joined."""
        while self._queues:
            try:
                msg = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=READ_TIMEOUT_S
                )
            except (RedisError, OSError, RuntimeError) as exc:
                log.warning("api.inbox_hub_lost error=%s sockets=%d", type(exc).__name__,
                            self.sockets)  # fmt: skip
                await self._end_all()
                return
            if msg is None or msg.get("type") != "message":
                continue
            user = self._users.get(str(msg["channel"]))
            for queue in list(self._queues.get(user or "", ())):
                try:
                    queue.put_nowait(str(msg["data"]))
                except asyncio.QueueFull:
                    _end(queue)

    async def _end_all(self) -> None:
        """Close every socket (the subscription is gone; clients reconnect)."""
        for queues in self._queues.values():
            for queue in queues:
                _end(queue)
        async with self._lock:
            lost, self._pubsub = self._pubsub, None  # a new one on the next join
            self._users.clear()
        with contextlib.suppress(RedisError, OSError, RuntimeError):
            await lost.aclose()


def _end(queue: asyncio.Queue[str | None]) -> None:
    """Tell the socket of `queue` to close, ahead of what it has not read."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(None)
