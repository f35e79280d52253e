"""Digest aggregation: many social events → one notification per (recipient, type, object) window.

Pure logic for the `digest` dataflow (Bytewax keeps one `DigestState` per key and calls `step`
for each event and `DigestState.should_close`/`close` on clock ticks).

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
  (`max_seen_ids`, default 4096); a redelivered event is ignored. `total` counts distinct actors
  (exact up to `max_seen_ids` actors per window; beyond that each new event counts as one).
- `DigestState` is mutable (O(1) per event at 100k events/s; `add` returns the same object) and
  picklable for recovery snapshots. Discard a key's state when `idle(now, ttl)`.

`summarize(window, locale, catalog)` gives "user1, user2, user3 and 1,197 others liked your
post" (en) or "user1、user2、user3 等 1200 人赞了你" (zh); `DigestWindow.params()` carries the
same facts to the plan job, whose templates render the line in the recipient's locale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from herald.catalog import Catalog, Fields, ParseContext
from herald.ids import digest_window_id, notification_id
from herald.render import DIGEST_ACTORS, DIGEST_TOTAL, check_variables, digest_line, encode_actors

__all__ = [
    "DigestConfig",
    "DigestKey",
    "DigestState",
    "DigestText",
    "DigestWindow",
    "SocialEvent",
    "notification_request",
    "parse_digest_config",
    "step",
    "summarize",
]

_DIRECT = timedelta(milliseconds=1)
_TEXT_VARS = frozenset({"actors", "others", "total"})


@dataclass(frozen=True, slots=True)
class DigestText:
    """Digest line templates of one locale: `few` (every actor named), `many`, `many_one`."""

    few: str
    many: str
    many_one: str | None = None


@dataclass(frozen=True, slots=True)
class DigestConfig:
    """The `digest` table of a catalog type; `window_seconds == 0` means direct."""

    event_type: str
    window_seconds: int
    max_actors: int
    max_seen_ids: int
    texts: Mapping[str, DigestText]

    @property
    def window(self) -> timedelta:
        """Window length; a direct type gets 1 ms so consecutive windows have distinct starts."""
        return timedelta(seconds=self.window_seconds) if self.window_seconds else _DIRECT


def parse_digest_config(f: Fields, ctx: ParseContext) -> DigestConfig:
    """Parse and validate `types.<name>.digest` (called by `herald.catalog`)."""
    texts: dict[str, DigestText] = {}
    for tag in f.get("text", dict):
        t = f.sub("text").sub(tag)
        text = DigestText(t.get("few", str), t.get("many", str), t.get("many_one", str, None))
        for key in ("few", "many", "many_one"):
            if getattr(text, key) is not None:
                check_variables(t, key, getattr(text, key), _TEXT_VARS)
        t.close()
        texts[f.locale(f"text.{tag}", tag)] = text
    if ctx.default_locale not in texts:
        raise f.error("text", f"needs the catalog default locale {ctx.default_locale!r}")
    config = DigestConfig(
        event_type=f.get("event_type", str),
        window_seconds=f.integer("window_seconds", 0),
        max_actors=f.integer("max_actors", 1, 3),
        max_seen_ids=f.integer("max_seen_ids", 1, 4096),
        texts=texts,
    )
    f.close()
    return config


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


@dataclass
class DigestState:
    """Mutable per-key aggregation state (see the module docstring for the window rules)."""

    key: DigestKey
    config: DigestConfig
    tenant_id: str = ""
    object_type: str | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    closed_until: datetime | None = None
    actors: list[tuple[str, str]] = field(default_factory=list)
    total: int = 0
    events: int = 0
    first_event_at: datetime | None = None
    last_event_at: datetime | None = None
    seen_events: dict[str, None] = field(default_factory=dict)
    seen_actors: dict[str, None] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        """True while a window holds at least one event."""
        return self.window_end is not None

    def seen(self, event: SocialEvent) -> bool:
        """True when this upstream event id was already counted (a redelivery)."""
        return event.event_id in self.seen_events

    def add(self, event: SocialEvent) -> DigestState:
        """Count `event` (ignored when seen), opening a window if none is open; returns self.

        The caller closes the open window first when `event.occurred_at >= window_end` (`step`).
        """
        if event.event_id in self.seen_events:
            return self
        self._remember(self.seen_events, event.event_id)
        if self.window_end is None:
            self._open(event)
        self.events += 1
        at = event.occurred_at
        self.first_event_at = min(self.first_event_at or at, at)
        self.last_event_at = max(self.last_event_at or at, at)
        if event.actor_id in self.seen_actors:
            return self
        if len(self.seen_actors) < self.config.max_seen_ids:
            self.seen_actors[event.actor_id] = None
        self.total += 1
        if len(self.actors) < self.config.max_actors:
            self.actors.append((event.actor_id, event.display_name))
        return self

    def should_close(self, now: datetime) -> bool:
        """True when a window is open and `now` (the job clock) has reached its end."""
        return self.window_end is not None and now >= self.window_end

    def close(self) -> DigestWindow | None:
        """Emit the open window (None if none) and start waiting for the next one."""
        if self.window_start is None or self.window_end is None:
            return None
        assert self.first_event_at is not None and self.last_event_at is not None
        window = DigestWindow(
            key=self.key,
            tenant_id=self.tenant_id,
            window_id=digest_window_id(
                self.key.recipient_id,
                self.key.notification_type,
                self.key.object_id,
                self.window_start,
            ),
            window_start=self.window_start,
            window_end=self.window_end,
            actors=tuple(name for _, name in self.actors),
            actor_ids=tuple(actor for actor, _ in self.actors),
            total=self.total,
            events=self.events,
            first_event_at=self.first_event_at,
            last_event_at=self.last_event_at,
            object_type=self.object_type,
        )
        self.closed_until, self.window_start, self.window_end = self.window_end, None, None
        self.actors, self.seen_actors, self.total, self.events = [], {}, 0, 0
        self.first_event_at = self.last_event_at = None
        return window

    def idle(self, now: datetime, ttl: timedelta) -> bool:
        """True when no window is open and the last one closed `ttl` ago: drop the state."""
        return self.window_end is None and (
            self.closed_until is None or now - self.closed_until >= ttl
        )

    def _open(self, event: SocialEvent) -> None:
        start = event.occurred_at
        if self.closed_until is not None and start < self.closed_until:
            start = self.closed_until
        self.window_start, self.window_end = start, start + self.config.window
        self.tenant_id, self.object_type = event.tenant_id, event.object_type

    def _remember(self, ids: dict[str, None], value: str) -> None:
        ids[value] = None
        if len(ids) > self.config.max_seen_ids:
            del ids[next(iter(ids))]


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
    if state.seen(event):
        return state, []
    closed: list[DigestWindow] = []
    if state.window_end is not None and event.occurred_at >= state.window_end:
        closed.append(_closed(state))
    state.add(event)
    if state.config.window_seconds == 0:
        closed.append(_closed(state))
    return state, closed


def _closed(state: DigestState) -> DigestWindow:
    window = state.close()
    assert window is not None
    return window


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
        "source": "digest",
    }
