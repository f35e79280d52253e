"""The digest states of many keys with their timers: what the digest job keeps per shard.

Why shards: with one Bytewax state per (recipient, type, object) key, every event pays for a
Python call into its key's logic, a timer query and, once per epoch, a snapshot of the key;
at 20k active keys that costs more than the aggregation itself. The job instead routes each
recipient to one of a fixed number of shards and hands a shard all its events of a batch at
once; the shard folds them (`DigestState.fold`) in one loop.

    shard = DigestShard(catalog, grace_ms=2000, ttl_ms=3_600_000)
    windows = shard.add(events, now_ms)     # events: (key, id, actor, name, at_ms, tenant, otype)
    windows += shard.close_due(now_ms)      # when `next_due()` has passed
    blob = shard.snapshot(); DigestShard.restore(blob, catalog, grace_ms, ttl_ms)

Timers (all in epoch ms; "now" is the job clock, event times are `occurred_at`):

- an open window closes at `max(window_end, last arrival of an event of its key) + grace`:
  normally at its end plus grace; a window already overdue when its events come in (a backlog
  replayed after downtime) waits until its key has been quiet for `grace`, so a backlog read in
  many batches still becomes one window;
- a key whose last window closed is forgotten `ttl` after that window's end (its seen event ids
  go with it): every piece of state has a TTL.

One heap of `(due, key)` holds the timers; an entry whose due is no longer the key's scheduled
one is stale and skipped, so a timer costs O(log n) per window, never per event. Arrival times
are not snapshotted: after a restart an open window closes at its end plus grace.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Iterable, Sequence

from herald.catalog import Catalog
from herald.digest import DigestConfig, DigestKey, DigestState, DigestWindow

__all__ = ["EventItem", "DigestShard"]

# (key fields, event_id, actor_id, display name, occurred_at ms, tenant_id, object_type)
EventItem = tuple[tuple[str, str, str], str, str, str, int, str, str | None]

_SNAPSHOT_VERSION = 2
_NEVER = -(2**62)


class DigestShard:
    """Digest states of the keys of one shard, their timers, and their snapshot."""

    def __init__(self, catalog: Catalog, grace_ms: int, ttl_ms: int) -> None:
        self.catalog = catalog
        self.grace_ms = grace_ms
        self.ttl_ms = ttl_ms
        self.states: dict[tuple[str, str, str], DigestState] = {}
        self._configs: dict[str, DigestConfig] = {}
        self._heap: list[tuple[int, tuple[str, str, str]]] = []
        self._scheduled: dict[tuple[str, str, str], int] = {}
        self._arrived: dict[tuple[str, str, str], int] = {}  # job time of a key's last event

    def __len__(self) -> int:
        return len(self.states)

    def add(self, events: Iterable[EventItem], now_ms: int) -> list[DigestWindow]:
        """Fold events (in order) that arrived at job time `now_ms`; returns windows they closed
        (an event past its window's end closes it; direct types close at once)."""
        out: list[DigestWindow] = []
        states, arrived, scheduled = self.states, self._arrived, self._scheduled
        for key, event_id, actor_id, name, at, tenant_id, object_type in events:
            state = states.get(key)
            if state is None:
                state = states[key] = DigestState(DigestKey(*key), self._config(key[1]))
            end = state.window_end
            closed = state.fold(event_id, actor_id, name, at, tenant_id, object_type)
            arrived[key] = now_ms
            if closed:
                out.extend(closed)
                self._schedule(key, state)
            elif state.window_end != end or key not in scheduled:
                self._schedule(key, state)
        return out

    def close_due(self, now_ms: int) -> list[DigestWindow]:
        """Close every window whose timer has passed and forget keys idle for `ttl`."""
        out: list[DigestWindow] = []
        scheduled = self._scheduled
        while self._heap and self._heap[0][0] <= now_ms:  # (`_push` may compact the heap)
            due, key = heapq.heappop(self._heap)
            if scheduled.get(key) != due:
                continue  # stale: the key was rescheduled or forgotten since
            state = self.states[key]
            if state.window_end is None:  # the idle TTL ran out
                del self.states[key], scheduled[key]
                self._arrived.pop(key, None)
                continue
            settle = max(state.window_end, self._arrived.get(key, _NEVER)) + self.grace_ms
            if settle > now_ms:  # events of an overdue window are still arriving
                self._push(key, settle)
                continue
            window = state.close()
            assert window is not None
            out.append(window)
            self._schedule(key, state)
        return out

    def next_due(self) -> int | None:
        """The earliest timer in ms (possibly a stale one: an early wake-up is harmless)."""
        return self._heap[0][0] if self._heap else None

    def snapshot(self) -> bytes:
        """Every key's state, pickled now (later folds cannot leak into the snapshot).

        The catalog's digest config is left out and looked up again on restore, so a catalog
        change applies to restored windows.
        """
        frozen = [(key, state.freeze()) for key, state in self.states.items()]
        return pickle.dumps((_SNAPSHOT_VERSION, frozen), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def restore(cls, blob: bytes, catalog: Catalog, grace_ms: int, ttl_ms: int) -> DigestShard:
        """A shard from `snapshot()` bytes, with every key's timer scheduled again."""
        version, frozen = pickle.loads(blob)
        if version != _SNAPSHOT_VERSION:
            raise ValueError(f"digest shard snapshot version {version}, not {_SNAPSHOT_VERSION}")
        shard = cls(catalog, grace_ms, ttl_ms)
        for key, values in frozen:
            key = tuple(key)
            state = DigestState.thaw(DigestKey(*key), shard._config(key[1]), values)
            shard.states[key] = state
            shard._schedule(key, state)
        return shard

    def open_windows(self) -> Sequence[DigestState]:
        """The states with an open window (for tests and inspection)."""
        return [s for s in self.states.values() if s.window_end is not None]

    def _config(self, type_name: str) -> DigestConfig:
        config = self._configs.get(type_name)
        if config is None:
            config = self.catalog.get(type_name).digest
            if config is None:
                raise ValueError(f"{type_name} is not a digest type of the catalog")
            self._configs[type_name] = config
        return config

    def _schedule(self, key: tuple[str, str, str], state: DigestState) -> None:
        """The key's next timer: its open window's end + grace, else its idle TTL."""
        if state.window_end is not None:
            due = state.window_end + self.grace_ms
        else:
            assert state.closed_until is not None
            due = state.closed_until + self.ttl_ms
        if self._scheduled.get(key) != due:
            self._push(key, due)

    def _push(self, key: tuple[str, str, str], due: int) -> None:
        self._scheduled[key] = due
        heapq.heappush(self._heap, (due, key))
        if len(self._heap) > 2 * len(self._scheduled) + 1024:  # mostly stale entries: compact
            self._heap = [(d, k) for k, d in self._scheduled.items()]
            heapq.heapify(self._heap)
