"""Read-your-writes for the plan job: the API's Redis copies of preferences and contact points.

    ApiCopies(client).fresh(batch)   (shard, Planned) items with each user's newest state
    RedisHeld(redis, topic_prefix)   where the copies stand: whether they hold every user, and
                                     up to which changelog offsets (the users job keeps them,
                                     dataflows/users.py)

The user table follows the herald.preferences / herald.devices changelogs, which the job reads
a little behind the writes (another topic than the requests, its own consumer). The API answers
PUT /v1/users/{id}/contact-points, POST/DELETE /v1/devices and PUT /v1/users/{id}/preferences
only after the record was acked by Kafka *and* written to its Redis copy (`cp:{user}`,
`prefs:{user}`, api/keys.py). So a request accepted after that 200 is planned with the write
if, just before the policy runs, the job reads both copies of each user of the batch (one MGET
per batch, not per user) and takes whichever of table and copy has the higher `version`.

The changelog stays the source of truth: the copy is only consulted, never put into the table,
and a replay plans with the changelog state (plus any newer copy). A user deleted by a
changelog tombstone keeps the deleted record's version as a floor (herald.planning.UserTable),
so an old copy does not bring it back. A copy that fails validation is ignored (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import orjson
import redis

from api import keys
from dataflows._redis import redis_client
from herald.config import RedisSettings
from herald.errors import HeraldError
from herald.planning import Planned, UserView
from herald.policy import ContactPoints, Preferences

__all__ = ["ApiCopies", "RedisHeld"]

log = logging.getLogger(__name__)

S = TypeVar("S", Preferences, ContactPoints)


class ApiCopies:
    """Overlay the API's newer copies on the table's views (see the module docstring)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster) -> None:
        self._client = client
        self._mget: Callable[[list[str]], list[Any]]
        if isinstance(client, redis.RedisCluster):
            self._mget = client.mget_nonatomic
        else:
            self._mget = client.mget

    def fresh(self, batch: Sequence[tuple[str, Planned]]) -> list[tuple[str, Planned]]:
        """`batch` with every user whose copy is newer than the table's state replaced."""
        views = [v for _shard, planned in batch for v in planned.users]
        if not views:
            return list(batch)
        names = [keys.prefs(v.user_id) for v in views]
        names += [keys.contact_points(v.user_id) for v in views]
        values = self._mget(names)
        n = len(views)
        replaced: dict[int, UserView] = {}
        for i, view in enumerate(views):
            raw_prefs, raw_contacts = values[i], values[n + i]
            if raw_prefs is None and raw_contacts is None:
                continue
            prefs = _newer(view.prefs, raw_prefs, Preferences.from_record)
            contacts = _newer(view.contacts, raw_contacts, ContactPoints.from_record)
            if prefs is not view.prefs or contacts is not view.contacts:
                replaced[i] = replace(view, prefs=prefs, contacts=contacts)
        if not replaced:
            return list(batch)
        return _rebuild(batch, replaced)


def _newer(held: S, raw: bytes | None, parse: Callable[[Any], S]) -> S:
    """The copy when it is newer than `held`, else `held`."""
    if raw is None:
        return held
    try:
        record = orjson.loads(raw)
        if int(record.get("version", 0)) <= held.version:
            return held
        return parse(record)
    except (orjson.JSONDecodeError, HeraldError, KeyError, TypeError, ValueError) as exc:
        log.warning("plan.bad_api_copy kind=%s error=%s", type(held).__name__, type(exc).__name__)
        return held


def _rebuild(
    batch: Sequence[tuple[str, Planned]], replaced: dict[int, UserView]
) -> list[tuple[str, Planned]]:
    out: list[tuple[str, Planned]] = []
    index = 0
    for shard, planned in batch:
        users = planned.users
        if any(index + j in replaced for j in range(len(users))):
            users = tuple(replaced.get(index + j, v) for j, v in enumerate(users))
            planned = replace(planned, users=users)
        index += len(planned.users)
        out.append((shard, planned))
    return out


class RedisHeld:
    """Where the copies are, for the changelog source (dataflows/_changelog.py `HeldTable`)."""

    def __init__(self, settings: RedisSettings, topic_prefix: str) -> None:
        self.settings = settings
        self.positions = keys.users_positions(topic_prefix)
        self.ready = keys.users_ready(topic_prefix)
        self.restored = keys.users_restored(topic_prefix)
        self._client: redis.Redis | redis.RedisCluster | None = None

    def _redis(self) -> redis.Redis | redis.RedisCluster:
        if self._client is None:
            self._client = redis_client(self.settings)
        return self._client

    def position(self, part: str) -> int | None:
        """The next offset of `part` the copies do not hold (None: from the beginning)."""
        raw = self._redis().hget(self.positions, part)
        return None if raw is None else int(raw)

    def holds(self) -> bool:
        """Whether the copies hold every user (`users:{<prefix>}:restored`)."""
        return bool(self._redis().exists(self.restored))

    def remember(self, part: str) -> None:
        """Position 0 for `part` unless it has one: a loss of Redis' data shows as none."""
        self._redis().hsetnx(self.positions, part, 0)
