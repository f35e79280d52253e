"""The in-app channel as a provider: the Redis inbox of the API (herald/inbox.py).

`InboxClient.send(delivery)` stores the item with `herald.inbox.add_inbox_item_async` (item id =
delivery_id, so a redelivered delivery is stored once), which also bumps the unread count and
publishes `{"type": "item", ...}` on the user's pub/sub channel for the API's WebSockets.
Outcomes: stored or already stored → Accepted(delivery_id); Redis unreachable before sending →
Retryable(connect_error); a timeout once the command was sent → Unknown. Sends wait for one of
`max_connections` pooled connections (Redis is single-threaded: a few dozen saturate it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

import redis.exceptions
from redis.asyncio import BlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis

from herald.inbox import add_inbox_item_async, inbox_item
from herald.outcomes import CONNECT_ERROR, Accepted, Outcome, Permanent, Retryable, Unknown

__all__ = ["InboxClient"]

log = logging.getLogger(__name__)


def _ms(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value) if value is not None else int(time.time() * 1000)


class InboxClient:
    """Writes in-app items; one async Redis client (create it on the loop that uses it)."""

    provider: ClassVar[str] = "inbox"

    def __init__(
        self,
        redis_url: str,
        *,
        max_items: int = 500,
        timeout_s: float = 5.0,
        max_connections: int = 32,
    ) -> None:
        pool = BlockingConnectionPool.from_url(
            redis_url, max_connections=max_connections, timeout=timeout_s,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        )  # fmt: skip
        self.redis = AsyncRedis(connection_pool=pool)
        self.in_flight = max_connections  # one write per pooled connection at a time
        self.max_items = max_items

    async def send(self, delivery: Mapping[str, Any]) -> Outcome:
        """Store the item for `delivery["user_id"]` (the address of an inapp delivery)."""
        start = time.perf_counter()
        user = delivery.get("address") or delivery.get("user_id")
        if not user:
            return Permanent("missing_address", provider=self.provider)
        rendered: Mapping[str, Any] = delivery.get("rendered") or {}
        item = inbox_item(
            str(delivery["delivery_id"]), str(rendered.get("title") or ""),
            str(rendered.get("body") or ""), _ms(delivery.get("created_at")),
            notification_id=delivery.get("notification_id"),
            notification_type=delivery.get("notification_type"),
            data=dict(rendered.get("data") or {}), tenant_id=delivery.get("tenant_id"),
            traffic_class=delivery.get("traffic_class"),
        )  # fmt: skip
        try:
            await add_inbox_item_async(self.redis, str(user), item, self.max_items)
        except redis.exceptions.TimeoutError:
            return Unknown("timeout", provider=self.provider, latency_ms=_since(start))
        except redis.exceptions.ConnectionError:
            return Retryable(CONNECT_ERROR, provider=self.provider, latency_ms=_since(start))
        return Accepted(
            str(delivery["delivery_id"]), provider=self.provider, latency_ms=_since(start)
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.redis.aclose()


def _since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
