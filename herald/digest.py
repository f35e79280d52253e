"""Digest aggregation: many social events → one notification per (recipient, type, object) window.

Pure logic for the `digest` dataflow: one `DigestState` per key folds events (`fold`, or `step`
for a `SocialEvent`); `herald.digest_shard.DigestShard` holds the states of many keys with their
timers, which is what the job keeps per shard. Times inside the state are epoch milliseconds.

Windows (per key, event time, length = the type's `digest.window_seconds`):

- The first event opens a window at `max(event.occurred_at, end of the previous window)`; it
  lasts `window_seconds` (0 = direct: every event is its own 1 ms window, closed at once).
- An event merges into the open window when `occurred_at < window_end`, including events older
  than `window_start`. An event at or after `window_end` closes the open window first.
- **Late events go into the next window**: once a window is closed it is never reopened; an event
  that belonged to it in event time opens (or joins) the next window, which starts at the closed
  window's end. Nothing is dropped, and every window of a key has a distinct start, hence a
  distinct `digest_window_id`, which is the digest notification's request_id (idempotent sinks).
- Duplicates: upstream event ids are remembered per key across windows in a bounded FIFO set
  (at least the newest `max_seen_ids`, default 4096, trimmed in bulk once it holds 1/8 more);
  a redelivered event is ignored. `total` counts distinct actors
  (exact up to `max_seen_ids` actors per window; beyond that each new event counts as one).
- `DigestState` is mutable (O(1) per event at 100k events/s) and `freeze`s to plain values for
  recovery snapshots. Discard a key's state when `idle(now_ms, ttl_ms)`.

`summarize(window, locale, catalog)` gives "user1, user2, user3 and 1,197 others liked your
post" (en) or "user1、user2、user3 等 1200 人赞了你" (zh); `DigestWindow.params()` carries the
same facts to the plan job, whose templates render the line in the recipient's locale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from herald.catalog import Catalog
from herald.digest_config import DigestConfig, DigestText, parse_digest_config
from herald.ids import digest_window_id, notification_id
from herald.planning import DIGEST_SOURCE
from herald.render import DIGEST_ACTORS, DIGEST_TOTAL, digest_line, encode_actors

__all__ = [
    "DigestConfig",
    "DigestKey",
    "DigestState",
    "DigestText",
    "DigestWindow",
    "SocialEvent",
    "from_ms",
    "notification_request",
    "parse_digest_config",
    "step",
    "summarize",
    "to_ms",
]

_DIRECT = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NO_WINDOWS: tuple[DigestWindow, ...] = ()  # what `fold` returns when nothing closed


def to_ms(at: datetime) -> int:
    """A timezone-aware datetime as epoch milliseconds (exact, no float rounding)."""
    return (at - _EPOCH) // _DIRECT


def from_ms(ms: int) -> datetime:
    """Epoch milliseconds as a UTC datetime."""
    return _EPOCH + timedelta(milliseconds=ms)


@dataclass(frozen=True, slots=True)
class SocialEvent:
    """One `SocialEvent` record (herald.social-events); `occurred_at` is timezone-aware."""

    event_id: str
    event_type: str
    actor_id: str
    recipient_id: str
    occurred_at: datetime
    tenant_id: str
    actor_name: str | None = None
    object_id: str | None = None
    object_type: str | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> SocialEvent:
        """From a decoded Avro record (`occurred_at` as datetime or epoch milliseconds)."""
        at = rec["occurred_at"]
        if isinstance(at, int):
            at = datetime.fromtimestamp(at / 1000, UTC)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValueError("occurred_at must be a timezone-aware datetime or epoch millis")
        return cls(
            event_id=rec["event_id"],
            event_type=rec["event_type"],
            actor_id=rec["actor_id"],
            recipient_id=rec["recipient_id"],
            occurred_at=at,
            tenant_id=rec["tenant_id"],
            actor_name=rec.get("actor_name"),
            object_id=rec.get("object_id"),
            object_type=rec.get("object_type"),
        )

    @property
    def display_name(self) -> str:
        """The name shown in digest lines (actor_name, else actor_id)."""
        return self.actor_name or self.actor_id

    @property
    def at_ms(self) -> int:
        """`occurred_at` in epoch milliseconds."""
        return to_ms(self.occurred_at)

    def fold_args(self) -> tuple[str, str, str, int, str, str | None]:
        """The arguments of `DigestState.fold` for this event."""
        return (
            self.event_id, self.actor_id, self.display_name, self.at_ms, self.tenant_id,
            self.object_type,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class DigestKey:
    """What a digest aggregates over: recipient × notification type × object ("" = none)."""

    recipient_id: str
    notification_type: str
    object_id: str = ""

    @classmethod
    def of(cls, event: SocialEvent, catalog: Catalog) -> DigestKey:
        """The key of `event`; raises `UnknownNotificationType` for an unknown event type."""
        nt = catalog.for_event(event.event_type)
        return cls(event.recipient_id, nt.name, event.object_id or "")

    def as_str(self) -> str:
        """A string key for Bytewax state (fields joined by U+001F)."""
        return f"{self.recipient_id}\x1f{self.notification_type}\x1f{self.object_id}"


@dataclass(frozen=True, slots=True)
class DigestWindow:
    """A closed window: what one digest notification says."""

    key: DigestKey
    tenant_id: str
    window_id: str
    window_start: datetime
    window_end: datetime
    actors: tuple[str, ...]
    actor_ids: tuple[str, ...]
    total: int
    events: int
    first_event_at: datetime
    last_event_at: datetime
    object_type: str | None

    def params(self) -> dict[str, str]:
        """Template params of the digest notification (see `herald.render`)."""
        params = {
            DIGEST_ACTORS: encode_actors(self.actors),
            DIGEST_TOTAL: str(self.total),
            "digest_window_id": self.window_id,
        }
        if self.key.object_id:
            params["object_id"] = self.key.object_id
        if self.object_type:
            params["object_type"] = self.object_type
        return params


class DigestState:
    """Mutable per-key aggregation state (see the module docstring for the window rules).

    Times are epoch milliseconds (ints): the job folds ~100k events/s and a datetime per event
    would cost more than the rest of the fold. `fold` is the whole per-event path.
    """

    __slots__ = (
        "key", "config", "tenant_id", "object_type", "window_start", "window_end",
        "closed_until", "actors", "total", "events", "first_at", "last_at", "seen_events",
        "seen_actors",
    )  # fmt: skip

    def __init__(self, key: DigestKey, config: DigestConfig) -> None:
        self.key = key
        self.config = config
        self.tenant_id = ""
        self.object_type: str | None = None
        self.window_start: int | None = None
        self.window_end: int | None = None
        self.closed_until: int | None = None
        self.actors: list[tuple[str, str]] = []
        self.total = 0
        self.events = 0
        self.first_at = 0
        self.last_at = 0
        # Upstream event ids in arrival order, across windows (a dict keeps the order).
        self.seen_events: dict[str, None] = {}
        self.seen_actors: dict[str, None] = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DigestState):
            return NotImplemented
        return self.freeze() == other.freeze() and self.config == other.config

    def __repr__(self) -> str:
        return f"DigestState({self.key!r}, window_end={self.window_end}, total={self.total})"

    @property
    def is_open(self) -> bool:
        """True while a window holds at least one event."""
        return self.window_end is not None

    def seen(self, event_id: str) -> bool:
        """True when this upstream event id was already counted (a redelivery)."""
        return event_id in self.seen_events

    def fold(
        self,
        event_id: str,
        actor_id: str,
        name: str,
        at: int,
        tenant_id: str,
        object_type: str | None,
    ) -> Sequence[DigestWindow]:
        """Fold one event (`at` in epoch ms); returns the windows it closed (usually none).

        A redelivered id is ignored. An event at or after the open window's end closes that
        window first; a direct type (window 0) closes its 1 ms window at once.
        """
        seen = self.seen_events
        if event_id in seen:
            return _NO_WINDOWS
        closed: Sequence[DigestWindow] = _NO_WINDOWS
        config = self.config
        seen[event_id] = None
        if len(seen) > config.max_seen_ids:
            self._trim_seen()
        if self.window_end is not None and at >= self.window_end:
            closed = [self._close()]
        if self.window_end is None:
            self._open(at, tenant_id, object_type)
        else:
            if at < self.first_at:
                self.first_at = at
            elif at > self.last_at:
                self.last_at = at
        self.events += 1
        actors = self.seen_actors
        if actor_id not in actors:
            if len(actors) < config.max_seen_ids:
                actors[actor_id] = None
            self.total += 1
            if len(self.actors) < config.max_actors:
                self.actors.append((actor_id, name))
        if config.window_seconds == 0:
            closed = [*closed, self._close()]
        return closed

    def should_close(self, now_ms: int) -> bool:
        """True when a window is open and `now_ms` (the job clock) has reached its end."""
        return self.window_end is not None and now_ms >= self.window_end

    def close(self) -> DigestWindow | None:
        """Emit the open window (None if none) and start waiting for the next one."""
        if self.window_end is None:
            return None
        return self._close()

    def idle(self, now_ms: int, ttl_ms: int) -> bool:
        """True when no window is open and the last one closed `ttl_ms` ago: drop the state."""
        return self.window_end is None and (
            self.closed_until is None or now_ms - self.closed_until >= ttl_ms
        )

    def freeze(self) -> tuple[Any, ...]:
        """The state as plain values for a snapshot (`thaw` is the inverse). The lists and
        dicts are the live ones: pickle the result before the next `fold`."""
        return (
            self.tenant_id, self.object_type, self.window_start, self.window_end,
            self.closed_until, self.actors, self.total, self.events, self.first_at,
            self.last_at, self.seen_events, self.seen_actors,
        )  # fmt: skip

    @classmethod
    def thaw(cls, key: DigestKey, config: DigestConfig, values: tuple[Any, ...]) -> DigestState:
        """A state from `freeze()` values, under the catalog's current `config`."""
        state = cls(key, config)
        (
            state.tenant_id, state.object_type, state.window_start, state.window_end,
            state.closed_until, actors, state.total, state.events, state.first_at,
            state.last_at, seen_events, seen_actors,
        ) = values  # fmt: skip
        state.actors = [tuple(a) for a in actors]  # type: ignore[misc]
        state.seen_events = dict(seen_events)
        state.seen_actors = dict(seen_actors)
        return state

    def _open(self, at: int, tenant_id: str, object_type: str | None) -> None:
        start = at
        if self.closed_until is not None and start < self.closed_until:
            start = self.closed_until
        self.window_start, self.window_end = start, start + self.config.window_ms
        self.tenant_id, self.object_type = tenant_id, object_type
        self.first_at = self.last_at = at

    def _close(self) -> DigestWindow:
        start, end = self.window_start, self.window_end
        assert start is not None and end is not None
        key = self.key
        window = DigestWindow(
            key=key,
            tenant_id=self.tenant_id,
            window_id=digest_window_id(
                key.recipient_id, key.notification_type, key.object_id, from_ms(start)
            ),
            window_start=from_ms(start),
            window_end=from_ms(end),
            actors=tuple(name for _, name in self.actors),
            actor_ids=tuple(actor for actor, _ in self.actors),
            total=self.total,
            events=self.events,
            first_event_at=from_ms(self.first_at),
            last_event_at=from_ms(self.last_at),
            object_type=self.object_type,
        )
        self.closed_until, self.window_start, self.window_end = end, None, None
        self.actors, self.seen_actors, self.total, self.events = [], {}, 0, 0
        return window

    def _trim_seen(self) -> None:
        """Keep the newest `max_seen_ids` ids once `seen_slack` more have come (in bulk:
        deleting the oldest key of a dict one at a time scans past every earlier deletion)."""
        keep = self.config.max_seen_ids
        if len(self.seen_events) <= keep + self.config.seen_slack:
            return
        ids = list(self.seen_events)
        self.seen_events = dict.fromkeys(ids[len(ids) - keep :])


def step(
    state: DigestState | None, event: SocialEvent, catalog: Catalog
) -> tuple[DigestState, list[DigestWindow]]:
    """Fold one event into its key's state; returns the state and the windows it closed (0-2).

    Raises `UnknownNotificationType` for an event type no catalog digest handles (dead-letter it).
    """
    if state is None:
        key = DigestKey.of(event, catalog)
        config = catalog.get(key.notification_type).digest
        assert config is not None
        state = DigestState(key, config)
    return state, list(state.fold(*event.fold_args()))


def summarize(window: DigestWindow | DigestState, locale: str | None, catalog: Catalog) -> str:
    """The digest line in `locale` (with catalog locale fallback)."""
    if isinstance(window, DigestState):
        actors = tuple(name for _, name in window.actors)
        return digest_line(catalog, window.key.notification_type, locale, actors, window.total)
    return digest_line(catalog, window.key.notification_type, locale, window.actors, window.total)


def notification_request(
    window: DigestWindow, catalog: Catalog, accepted_at: datetime
) -> dict[str, Any]:
    """The `NotificationRequest` record for a closed window (request_id = window id)."""
    nt = catalog.get(window.key.notification_type)
    return {
        "notification_id": notification_id(window.tenant_id, window.window_id),
        "request_id": window.window_id,
        "tenant_id": window.tenant_id,
        "notification_type": nt.name,
        "traffic_class": nt.traffic_class,
        "recipients": {"user_ids": [window.key.recipient_id], "segment_id": None},
        "template_version": None,
        "params": window.params(),
        "channels": None,
        "locale": None,
        "send_at": None,
        "send_local_time": None,
        "expire_at": None,
        "accepted_at": accepted_at,
        "source": DIGEST_SOURCE,
        "traceparent": None,  # many events, no one request's trace
    }
