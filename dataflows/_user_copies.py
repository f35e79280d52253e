"""The users' state for the plan job: the Redis copies the users job and the API keep.

    UserState(client, topic_prefix)   .views(batches): every user of the audience batches with
                                      the preferences and contact points of their copies
                                      (`prefs:{user}`, `cp:{user}`, herald/keys.py): one MGET a
                                      chunk; waits while the copies are being restored
    CopyCache(users)                  parsed copies by their bytes, bounded
    RedisHeld(redis, topic_prefix)    where the copies stand: whether they hold every user, and
                                      up to which changelog offsets (dataflows/users.py)

The plan job holds no user table. The users job (dataflows/users.py) keeps a copy of every
user's preferences and contact points equal to the compacted changelogs, and the API writes a
user's copy after Kafka acknowledged the change and before it answers. So the copies are the
newest state there is: a request accepted after the API answered a preferences or
contact-points write is planned with it (read-your-writes), and a (re)started plan process plans
at once, whatever the number of users, with a memory that does not grow with them.

A missing copy means the user has none of that state (default preferences, no contact points)
only while `users:{<prefix>}:restored` exists, which the users job sets once the copies hold
every user and which goes with the copies when Redis loses its data. It is read in the same
MGET as the copies; while it is missing the chunk waits (logged), so an opt-out or a contact
point is never missed because Redis was being refilled from the changelogs.

Parsing a copy (JSON, then validation: time zone, quiet hours, locale) costs more than planning
the user from a template; the process keeps the last `users` copies of each kind it parsed, by
their bytes (a copy's bytes change with every write: its version), in two generations (the
newer one is searched first, a hit found in the older one moves up, and the older one is dropped
when the newer is full: at most 2 x `users` of each kind, whatever the number of users). Users
who share their preferences but for their id and version share one validation (`_PrefsShapes`).
A copy that fails validation (written by something else than the API or the users job) is
reported as a bad user: the plan job dead-letters that user's task instead of planning it
with defaults.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import orjson
import redis

from dataflows._redis import redis_client
from herald import keys
from herald.config import RedisSettings
from herald.errors import HeraldError
from herald.planning import AudienceBatch, Planned, PlanRequest, UserView
from herald.policy import ContactPoints, Device, Preferences

__all__ = ["BadCopy", "CopyCache", "RedisHeld", "UserState"]

log = logging.getLogger(__name__)

S = TypeVar("S", Preferences, ContactPoints)
PARSE_ERRORS = (orjson.JSONDecodeError, HeraldError, KeyError, TypeError, ValueError)
WAIT_LOG_EVERY_S = 10.0


class BadCopy(NamedTuple):
    """A user whose copy cannot be planned with: the plan job dead-letters the user's task."""

    request: PlanRequest
    user_id: str
    detail: str


class CopyCache(Generic[S]):
    """`parse(raw)` results by `raw`, at most 2 x `size` of them (module docstring)."""

    def __init__(self, parse: Callable[[bytes], S], size: int) -> None:
        self.parse: Callable[[bytes], S] = parse
        self.size = max(1, size)
        self.newer: dict[bytes, S] = {}
        self.older: dict[bytes, S] = {}

    def get(self, raw: bytes) -> S:
        """The parsed copy; raises what `parse` raises for a bad one (never cached)."""
        found = self.newer.get(raw)
        if found is not None:
            return found
        found = self.older.get(raw)
        if found is None:
            found = self.parse(raw)
        if len(self.newer) >= self.size:
            self.older, self.newer = self.newer, {}
        self.newer[raw] = found
        return found


class _PrefsShapes:
    """Preferences from a copy's bytes: one validation and one object per distinct set of
    choices (all the fields but user_id and version), shared by the users who made them. Its
    user_id is "" and its version 0: planning reads neither (the view's user_id is the user's),
    and a user's own Preferences would cost one more object per user read."""

    MAX_SHAPES = 100_000

    def __init__(self) -> None:
        self._shapes: dict[tuple[Any, ...], Preferences] = {}

    def __call__(self, raw: bytes) -> Preferences:
        rec = orjson.loads(raw)
        quiet = rec.get("quiet_hours")
        shape = (
            rec.get("global_opt_out"), tuple(rec.get("category_opt_out") or ()),
            tuple(rec.get("channel_opt_out") or ()),
            tuple(rec.get("category_channel_opt_out") or ()),
            (quiet["start"], quiet["end"]) if quiet else None, rec.get("timezone"),
            rec.get("locale"),
        )  # fmt: skip
        made = self._shapes.get(shape)
        if made is None:
            made = Preferences.from_record(rec).for_user("", 0)  # nobody's: see the class doc
            if len(self._shapes) < self.MAX_SHAPES:
                self._shapes[shape] = made
        return made


class _ContactsShapes:
    """Contact points from a copy's bytes: validated once per distinct shape (each device's
    platform, app, validity and verification; which of phone and email are there and verified;
    what is disabled), then each user's made with their own ids and addresses."""

    MAX_SHAPES = 100_000

    def __init__(self) -> None:
        self._shapes: dict[tuple[Any, ...], ContactPoints] = {}

    def __call__(self, raw: bytes) -> ContactPoints:
        rec = orjson.loads(raw)
        phone, email = rec.get("phone") or {}, rec.get("email") or {}
        devices = rec.get("devices") or ()
        number, address = phone.get("e164"), email.get("address")
        shape = (
            tuple([(d["platform"], d.get("app_id"), d.get("valid", True),
                    d.get("verified", False)) for d in devices]),
            bool(number), phone.get("verified", False), bool(address),
            email.get("verified", False), tuple(rec.get("disabled") or ()),
        )  # fmt: skip
        made = self._shapes.get(shape)
        if made is None:
            made = ContactPoints.from_record(rec)
            if len(self._shapes) < self.MAX_SHAPES:
                self._shapes[shape] = made
            return made
        new = tuple.__new__  # a Device, without its __new__'s arguments handling
        return made.with_addresses(
            rec["user_id"], int(rec.get("version", 0)),
            tuple([new(Device, (d["device_id"], d["platform"], d["token"], d.get("app_id"),
                                d.get("valid", True), d.get("verified", False)))
                   for d in devices]),
            number, address,
        )  # fmt: skip


_NO_PREFS, _NO_CONTACTS = Preferences(""), ContactPoints("")  # a user without a copy


class UserState:
    """Planned users from the Redis copies (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        topic_prefix: str,
        cache_users: int,
        wait_s: float = 0.2,
    ) -> None:
        self._client = client
        self._restored = keys.users_restored(topic_prefix)
        self._wait_s = wait_s
        self._prefs: CopyCache[Preferences] = CopyCache(_PrefsShapes(), cache_users)
        self._contacts: CopyCache[ContactPoints] = CopyCache(_ContactsShapes(), cache_users)
        self._mget: Callable[[list[str]], list[Any]]
        if isinstance(client, redis.RedisCluster):
            self._mget = client.mget_nonatomic
        else:
            self._mget = client.mget

    def views(self, batches: Sequence[AudienceBatch]) -> tuple[list[Planned], list[BadCopy]]:
        """Each batch as `Planned` (its users with their state, in order), and the users whose
        copies are bad (left out of their batch)."""
        return self.parse(batches, self.read(batches))

    def read(self, batches: Sequence[AudienceBatch]) -> list[Any]:
        """The copies of the batches' users (all preferences, then all contact points), once
        the copies hold every user: the Redis half of `views` (the plan job runs it on its
        Redis thread)."""
        users = [user for batch in batches for user, _params in batch.users]
        return self._read(users) if users else []

    def parse(
        self, batches: Sequence[AudienceBatch], values: list[Any]
    ) -> tuple[list[Planned], list[BadCopy]]:
        """The parsing half of `views` (the plan job runs it on its worker thread: parsing is
        CPU work, and two threads that both need the GIL slow each other down)."""
        n = (len(values) - 1) // 2
        prefs_of, contacts_of = self._prefs.get, self._contacts.get
        planned: list[Planned] = []
        bad: list[BadCopy] = []
        i = 0
        for batch in batches:
            views: list[UserView] = []
            for user, params in batch.users:
                raw_prefs, raw_contacts = values[i], values[n + i]
                i += 1
                try:
                    prefs = _NO_PREFS if raw_prefs is None else prefs_of(raw_prefs)
                    contacts = (
                        _NO_CONTACTS.for_user(user, 0)
                        if raw_contacts is None
                        else contacts_of(raw_contacts)
                    )
                except PARSE_ERRORS as exc:
                    log.warning("plan.bad_user_copy user=%s error=%s", user, type(exc).__name__)
                    bad.append(BadCopy(batch.request, user, f"{type(exc).__name__}: {exc}"))
                    continue
                views.append(UserView(user, params, prefs, contacts))
            planned.append(Planned(batch.request, batch.batch_no, tuple(views)))
        return planned, bad

    def _read(self, users: list[str]) -> list[Any]:
        names = [keys.prefs(u) for u in users]
        names += [keys.contact_points(u) for u in users]
        names.append(self._restored)
        since, logged = time.monotonic(), 0.0
        while True:
            values = self._mget(names)
            if values[-1] is not None:
                return values
            waited = time.monotonic() - since
            if waited >= logged:
                log.warning("plan.waiting_for_user_state waited_s=%.1f (being restored)", waited)
                logged += WAIT_LOG_EVERY_S
            time.sleep(self._wait_s)


_MARK = "@"  # suffix of a partition's mark in the positions hash (RedisHeld.remember)


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
        """The next offset of `part` the copies do not hold; None when the hash has lost the
        partition's mark (`remember`): a position written after Redis lost its data (the
        copy sink writes the offsets of new records) does not stand for the records before."""
        raw, mark = self._redis().hmget(self.positions, [part, f"{part}{_MARK}"])
        return None if mark is None else int(raw or 0)

    def holds(self) -> bool:
        """Whether the copies hold every user (`users:{<prefix>}:restored`)."""
        return bool(self._redis().exists(self.restored))

    def remember(self, part: str, from_start: bool) -> None:
        """Mark `part` as read into the copies (from the beginning: position 0)."""
        mapping = {f"{part}{_MARK}": 1, **({part: 0} if from_start else {})}
        self._redis().hset(self.positions, mapping=mapping)  # type: ignore[arg-type]
