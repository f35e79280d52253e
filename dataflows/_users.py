"""The plan job's user table: changelog records as table updates, and the keyed shard logic.

    ChangelogDecoder       KafkaMessage | CaughtUp -> TableUpdate | CaughtUp | dead-letter dict
    ShardRouter            a batch of changelog items -> (shard, TableChanges) per shard touched
                           (a CaughtUp goes to every shard), and the batch's dead letters
    UserShardLogic         Bytewax state of one shard: UserTable + tasks waiting for readiness

Keys: `shard_of(user_id, n)` (crc32), so a user's preferences, contact points and planning tasks
meet on the one worker that owns the shard, in any number of processes. A shard key holds many
users because Bytewax's per-key overhead grows with the number of live keys (measured: 300k live
keys run ~3x slower than 10k) and every key touched in an epoch is snapshotted.

A batch of changelog records travels as one `TableChanges` item per shard, in its order: the
dataflow's per-item cost (a Python call per step, and with several processes a pickled message
per item) is paid per shard and batch instead of per record. Measured with 2 processes and 100k
users: the table loaded in 4.8-5.5 s instead of 8.3-8.8 s (bench/plan.py --processes 2).

Readiness: the table is rebuilt from the changelogs on every start (dataflows/_changelog.py) and
is not part of the snapshot. A shard plans nothing until every changelog partition has reported
`CaughtUp`; tasks arriving before that wait in the shard (and in its snapshot, so none is lost),
so a user's opt-out is never missed because the table was still loading. A partition reports it
at once when the Redis copies hold every user (the planner reads them for every user it plans,
dataflows/_copies.py, and takes the newer of copy and table). The snapshot is only that short
list of waiting tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import bytewax.operators as op

from dataflows._runtime import keep_long_lived
from herald.catalog import InvalidLocale
from herald.errors import SerdeError
from herald.planning import CaughtUp, Planned, TableUpdate, UserTable, UserTasks, shard_of
from herald.policy import ContactPoints, Preferences
from herald.quiet_hours import InvalidTimeOfDay, InvalidTimezone
from sources.kafka import KafkaMessage

__all__ = ["ChangelogDecoder", "ShardRouter", "TableChanges", "UserShardLogic"]

log = logging.getLogger(__name__)


class TableChanges(NamedTuple):
    """Changelog items of one shard from one batch, in their order."""

    items: list[TableUpdate | CaughtUp]


ShardItem = UserTasks | TableChanges
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
        parsed = self.record(item)
        if isinstance(parsed, dict):
            return parsed
        value = parsed[1]
        return TableUpdate(kind, value.user_id, value)

    def record(
        self, item: KafkaMessage
    ) -> tuple[dict[str, Any], Preferences | ContactPoints] | dict[str, Any]:
        """A record with a value: (decoded record, validated state), or its dead letter."""
        try:
            rec = self.deserializer(item.value)
        except SerdeError as exc:
            return item.dead_letter(exc.reason, exc.detail, self.job)
        try:
            value: Preferences | ContactPoints = (
                Preferences.from_record(rec)
                if item.topic == self.preferences_topic
                else ContactPoints.from_record(rec)
            )
        except (InvalidTimezone, InvalidTimeOfDay, InvalidLocale) as exc:
            log.warning(
                "%s.bad_record topic=%s offset=%d reason=%s",
                self.job,
                item.topic,
                item.offset,
                exc.code,
            )
            return item.dead_letter(exc.code, str(exc), self.job)
        return rec, value


@dataclass(frozen=True)
class ShardRouter:
    """Decode a batch of changelog items (`decoder`) and group them by user shard (a
    `flat_map_batch` mapper): `(shard, TableChanges)` for every shard touched, a `CaughtUp`
    in every shard's changes, then the batch's dead letters."""

    decoder: ChangelogDecoder
    shards: int

    def __call__(
        self, batch: list[KafkaMessage | CaughtUp]
    ) -> list[tuple[str, TableChanges] | dict[str, Any]]:
        groups: dict[str, TableChanges] = {}
        letters: list[dict[str, Any]] = []
        for message in batch:
            item = self.decoder(message)
            if type(item) is TableUpdate:
                key = shard_of(item.user_id, self.shards)
                changes = groups.get(key)
                if changes is None:
                    changes = groups[key] = TableChanges([])
                changes.items.append(item)
            elif type(item) is CaughtUp:
                for shard in range(self.shards):
                    groups.setdefault(str(shard), TableChanges([])).items.append(item)
            else:
                letters.append(cast(dict[str, Any], item))
        return [*groups.items(), *letters]


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
                continue
            for change in item.items:
                if isinstance(change, TableUpdate):
                    self.table.apply(change)
                    keep_long_lived(1)
                else:
                    out.extend(self._caught_up(change))
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
