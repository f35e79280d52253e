"""The in-app inbox in Redis: bounded per user, newest first, unread set, pub/sub for pushes.

Layout (herald/keys.py): `inbox:{user}:items` zset (item_id by created_at ms), `inbox:{user}:data`
hash (item_id → JSON), `inbox:{user}:unread` set, `inbox:{user}:undelivered` set (items no app
has fetched or been pushed yet: `take_undelivered` says which of a page are delivered now, for
the DELIVERED event), channel `inbox:{user}:events`.

`add_inbox_item` is what the dispatch inbox sink calls (sync client, at-least-once safe: an
item_id seen before is ignored, so use the delivery_id). It keeps the newest `max_items`
(default 500) and publishes `{"type": "item", "unread": n, "item": {...}}` for WebSockets.

Durability: the embedded Redis runs with `appendonly yes` / `appendfsync everysec`
(infra/services.py), so inbox items survive a Redis restart, losing at most ~1 s of writes;
production Redis needs the same AOF setting (or a replica) for the inbox.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis
from redis.asyncio import Redis as AsyncRedis

from herald import keys

DEFAULT_MAX_ITEMS = 500

_ADD_SCRIPT = """
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3]) == 0 then return -1 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
local max = tonumber(ARGV[4])
if n > max then
  local old = redis.call('ZRANGE', KEYS[1], 0, n - max - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - max - 1)
  for _, id in ipairs(old) do
    redis.call('HDEL', KEYS[2], id)
    redis.call('SREM', KEYS[3], id)
    redis.call('SREM', KEYS[4], id)
  end
end
local unread = redis.call('SCARD', KEYS[3])
redis.call('PUBLISH', ARGV[5], '{"type":"item","unread":' .. unread .. ',"item":' .. ARGV[3] .. '}')
return unread
"""


def inbox_item(
    item_id: str, title: str, body: str, created_at_ms: int, *,
    notification_id: str | None = None, notification_type: str | None = None,
    data: dict[str, str] | None = None, tenant_id: str | None = None,
    traffic_class: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """An inbox item in the stored shape (tenant and class: for its delivered and read
    events, api/engagement.py)."""
    return {
        "item_id": item_id, "notification_id": notification_id,
        "notification_type": notification_type, "title": title, "body": body,
        "data": data or {}, "created_at": created_at_ms, "tenant_id": tenant_id,
        "traffic_class": traffic_class,
    }  # fmt: skip


def add_inbox_item(
    client: redis.Redis, user_id: str, item: dict[str, Any], max_items: int = DEFAULT_MAX_ITEMS
) -> int:
    """Store `item` (needs `item_id`, `created_at` ms); returns the unread count, -1 if seen."""
    return int(
        client.eval(  # type: ignore[no-untyped-call]
            _ADD_SCRIPT,
            4,
            keys.inbox_items(user_id),
            keys.inbox_data(user_id),
            keys.inbox_unread(user_id),
            keys.inbox_undelivered(user_id),
            item["item_id"],
            int(item["created_at"]),
            orjson.dumps(item),
            max_items,
            keys.inbox_channel(user_id),
        )  # fmt: skip
    )


async def add_inbox_item_async(
    client: AsyncRedis, user_id: str, item: dict[str, Any], max_items: int = DEFAULT_MAX_ITEMS
) -> int:
    """`add_inbox_item` for asyncio clients."""
    return int(
        await client.eval(
            _ADD_SCRIPT,
            4,
            keys.inbox_items(user_id),
            keys.inbox_data(user_id),
            keys.inbox_unread(user_id),
            keys.inbox_undelivered(user_id),
            item["item_id"],
            int(item["created_at"]),
            orjson.dumps(item),
            max_items,
            keys.inbox_channel(user_id),
        )  # fmt: skip
    )


def encode_cursor(score: int, item_id: str) -> str:
    return f"{score}:{item_id}"


def decode_cursor(cursor: str) -> tuple[int, str] | None:
    score, sep, item_id = cursor.partition(":")
    if not sep or not score.isdigit() or not item_id:
        return None
    return int(score), item_id


async def list_items(
    client: AsyncRedis, user_id: str, limit: int, cursor: tuple[int, str] | None
) -> tuple[list[dict[str, Any]], str | None, int]:
    """(items newest first with `read`, next cursor, unread count)."""
    zkey = keys.inbox_items(user_id)
    entries: list[Any]
    raw: Any
    if cursor is None:
        entries = await client.zrange(zkey, "+inf", "-inf", desc=True, byscore=True,
                                      offset=0, num=limit + 1, withscores=True)  # fmt: skip
    else:
        score, last_id = cursor
        ties = int(await client.zcount(zkey, score, score))
        raw = await client.zrange(zkey, score, "-inf", desc=True, byscore=True,
                                  offset=0, num=limit + ties + 1, withscores=True)  # fmt: skip
        entries = [(str(m), s) for m, s in raw if not (int(s) == score and str(m) >= last_id)]
    page: list[tuple[str, float]] = [(str(e[0]), float(e[1])) for e in entries[:limit]]
    more = len(entries) > limit
    ids = [m for m, _ in page]
    items: list[dict[str, Any]] = []
    if ids:
        pipe = client.pipeline(transaction=False)
        pipe.hmget(keys.inbox_data(user_id), ids)
        pipe.smismember(keys.inbox_unread(user_id), ids)
        data, unread_flags = await pipe.execute()
        for raw_item, is_unread in zip(data, unread_flags, strict=True):
            if raw_item is not None:
                items.append({**orjson.loads(raw_item), "read": not is_unread})
    unread = await client.scard(keys.inbox_unread(user_id))
    next_cursor = encode_cursor(int(page[-1][1]), page[-1][0]) if more and page else None
    return items, next_cursor, int(unread)


async def publish_unread(client: AsyncRedis, user_id: str, unread: int) -> None:
    """Tell WebSockets of `user_id` the new unread count."""
    await client.publish(
        keys.inbox_channel(user_id), orjson.dumps({"type": "unread", "unread": unread})
    )


async def mark_read(
    client: AsyncRedis, user_id: str, item_id: str
) -> tuple[int, dict[str, Any] | None] | None:
    """Mark one item read: (the unread count, the item if it was unread until now); None when
    the item does not exist."""
    raw = await client.hget(keys.inbox_data(user_id), item_id)
    if raw is None:
        return None
    pipe = client.pipeline(transaction=True)
    pipe.srem(keys.inbox_unread(user_id), item_id)
    pipe.scard(keys.inbox_unread(user_id))
    removed, unread = await pipe.execute()
    await publish_unread(client, user_id, int(unread))
    return int(unread), (orjson.loads(raw) if removed else None)


async def mark_all_read(client: AsyncRedis, user_id: str) -> list[dict[str, Any]]:
    """Mark every item read; returns the items that were unread."""
    pipe = client.pipeline(transaction=True)
    pipe.smembers(keys.inbox_unread(user_id))
    pipe.delete(keys.inbox_unread(user_id))
    ids, _ = await pipe.execute()
    await publish_unread(client, user_id, 0)
    if not ids:
        return []
    raw = await client.hmget(keys.inbox_data(user_id), sorted(str(i) for i in ids))
    return [orjson.loads(r) for r in raw if r is not None]


async def take_undelivered(client: AsyncRedis, user_id: str, item_ids: list[str]) -> set[str]:
    """Which of `item_ids` no app had received before (now delivered: removed from the set)."""
    if not item_ids:
        return set()
    pipe = client.pipeline(transaction=False)
    for item_id in item_ids:
        pipe.srem(keys.inbox_undelivered(user_id), item_id)
    removed = await pipe.execute()
    return {i for i, n in zip(item_ids, removed, strict=True) if n}


async def unread_count(client: AsyncRedis, user_id: str) -> int:
    """Unread items of `user_id`."""
    return int(await client.scard(keys.inbox_unread(user_id)))
