"""The plan job's user table: changelog records as table updates, and the keyed shard logic.

    ChangelogDecoder       KafkaMessage | CaughtUp -> TableUpdate | CaughtUp | dead-letter dict
    to_shards(item, n)     a TableUpdate to its user's shard; a CaughtUp to every shard
    UserShardLogic         Bytewax state of one shard: UserTable + tasks waiting for readiness

Keys: `shard_of(user_id, n)` (crc32), so a user's preferences, contact points and planning tasks
meet on the one worker that owns the shard, in any number of processes. A shard key holds many
users because Bytewax's per-key overhead grows with the number of live keys (measured: 300k live
keys run ~3x slower than 10k) and every key touched in an epoch is snapshotted.

Readiness: the table is rebuilt from the changelogs on every start (dataflows/_changelog.py) and
is not part of the snapshot. A shard plans nothing until every changelog partition has reported
`CaughtUp`; tasks arriving before that wait in the shard (and in its snapshot, so none is lost),
so a user's opt-out is never missed because the table was still loading. The snapshot is only
that short list of waiting tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bytewax.operators as op

from dataflows._runtime import keep_long_lived
from herald.catalog import InvalidLocale
from herald.errors import SerdeError
from herald.planning import CaughtUp, Planned, TableUpdate, UserTable, UserTasks, shard_of
from herald.policy import ContactPoints, Preferences
from herald.quiet_hours import InvalidTimeOfDay, InvalidTimezone
from sources.kafka import KafkaMessage

__all__ = ["ChangelogDecoder", "UserShardLogic", "to_shards"]

log = logging.getLogger(__name__)

ShardItem = UserTasks | TableUpdate | CaughtUp
Pending = tuple[UserTasks, ...]


@dataclass(frozen=True)
class ChangelogDecoder:
    """Decode a preferences or devices record into a `TableUpdate` (tombstone: value None).

    Records that cannot be decoded or validated (bad time zone, quiet hours, locale) become dead
    letters; the user keeps the state held before.
    """

    deserializer: Callable[[bytes | None], dict[str, Any]]
    preferences_topic: str
    job: str = "plan"

    def __call__(self, item: KafkaMessage | CaughtUp) -> TableUpdate | CaughtUp | dict[str, Any]:
        if isinstance(item, CaughtUp):
            return item
        kind: Any = "preferences" if item.topic == self.preferences_topic else "contacts"
        if item.value is None:
            if not item.key:
                return item.dead_letter("tombstone_without_key", "null value and no key", self.job)
            return TableUpdate(kind, item.key.decode(errors="replace"), None)
        try:
            rec = self.deserializer(item.value)
        except SerdeError as exc:
            return item.dead_letter(exc.reason, exc.detail, self.job)
        try:
            value: Preferences | ContactPoints = (
                Preferences.from_record(rec)
                if kind == "preferences"
                else ContactPoints.from_record(rec)
            )
        except (InvalidTimezone, InvalidTimeOfDay, InvalidLocale) as exc:
            log.warning(
                "plan.bad_preferences topic=%s offset=%d reason=%s",
                item.topic,
                item.offset,
                exc.code,
            )
            return item.dead_letter(exc.code, str(exc), self.job)
        return TableUpdate(kind, value.user_id, value)


def to_shards(
    item: TableUpdate | CaughtUp, shards: int
) -> list[tuple[str, TableUpdate | CaughtUp]]:
    """Route an update to its user's shard; broadcast a CaughtUp to every shard."""
    if isinstance(item, CaughtUp):
        return [(str(s), item) for s in range(shards)]
    return [(shard_of(item.user_id, shards), item)]


class UserShardLogic(op.StatefulBatchLogic[ShardItem, Planned, Pending]):
    """One shard: apply table updates, join tasks with the table once ready (module doc)."""

    def __init__(self, parts: frozenset[str], pending: Pending | None) -> None:
        self.parts = parts
        self.caught_up: set[str] = set()
        self.ready = not parts
        self.table = UserTable()
        self.pending: list[UserTasks] = list(pending or ())

    def on_batch(self, values: list[ShardItem]) -> tuple[list[Planned], bool]:
        """Called with the items of one activation, in order."""
        out: list[Planned] = []
        for item in values:
            if isinstance(item, UserTasks):
                if self.ready:
                    out.append(self.table.join(item))
                else:
                    self.pending.append(item)
            elif isinstance(item, TableUpdate):
                self.table.apply(item)
                keep_long_lived(1)
            else:
                out.extend(self._caught_up(item))
        return out, op.StatefulBatchLogic.RETAIN

    def _caught_up(self, item: CaughtUp) -> list[Planned]:
        self.caught_up.add(item.part)
        if self.ready or not self.parts <= self.caught_up:
            return []
        self.ready = True
        keep_long_lived()
        released = [self.table.join(t) for t in self.pending]
        if released:
            log.info("plan.shard_ready waiting_tasks=%d", len(released))
        self.pending.clear()
        return released

    def snapshot(self) -> Pending:
        """Only the tasks still waiting for readiness (the table is rebuilt on start)."""
        return tuple(self.pending)
