"""Delivery and event ids for the plan job's hot path: `herald.ids`, with the parts shared by
many ids prepared once.

`PlanIds.delivery(nid, user, channel, device)` == `ids.delivery_id(...)` and
`PlanIds.event(delivery_id, state)` == `ids.event_id(delivery_id, state, 0)` (attempt 0, no
discriminator: the plan job's events), bit for bit; tests/herald/test_planning_ids.py holds
them to it. Both are one SHA-1 of a namespace and length-prefixed parts (`herald.ids._name`);
the functions below take those parts already made, so a caller that makes many ids of one
notification, user or state prepares each part once (dataflows/plan/planned_alike.py):

    delivery_id_of(delivery_prefix(nid), part(user) + part(channel) [+ part(device)])
    event_id_of(delivery_id.encode(), event_tail(state))   (delivery ids are 36 characters)
"""

from __future__ import annotations

from hashlib import sha1

from herald import ids

__all__ = [
    "PlanIds",
    "delivery_id_of",
    "delivery_prefix",
    "event_id_of",
    "event_tail",
    "part",
]

_NS_DELIVERY: bytes = ids._NS_DELIVERY  # noqa: SLF001 - the same namespaces, by construction
_NS_EVENT: bytes = ids._NS_EVENT  # noqa: SLF001
_format = ids._format  # noqa: SLF001 - the same UUID text
_EVENT_PREFIX = _NS_EVENT + b"36:"  # every delivery id is a 36-character UUID text


def part(value: str) -> str:
    """One length-prefixed part of an id's name (`herald.ids._name`)."""
    return f"{len(value)}:{value}"


def delivery_prefix(notification_id: str) -> bytes:
    """What every delivery id of a notification is hashed from first."""
    return _NS_DELIVERY + part(notification_id).encode()


def delivery_id_of(prefix: bytes, rest: str) -> str:
    """The delivery id of `delivery_prefix(nid)` and the user's, channel's (and device's)
    parts."""
    return _format(sha1(prefix + rest.encode()).digest())


def event_tail(state: str) -> bytes:
    """What follows the delivery id in the name of its attempt-0 event of `state`."""
    return f"{part(state)}1:00:".encode()


def event_id_of(delivery_id: bytes, tail: bytes) -> str:
    """`ids.event_id(delivery_id, state, 0)` of an encoded delivery id and `event_tail(state)`."""
    return _format(sha1(_EVENT_PREFIX + delivery_id + tail).digest())


class PlanIds:
    """Memoizing id maker for one plan worker: the most recent `max_entries` notifications'
    prefixes and the states' tails."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._prefixes: dict[str, bytes] = {}
        self._tails: dict[str, bytes] = {}

    def prefix(self, notification_id: str) -> bytes:
        """`delivery_prefix(notification_id)`, memoized."""
        found = self._prefixes.get(notification_id)
        if found is None:
            if len(self._prefixes) >= self.max_entries:
                self._prefixes.clear()
            found = self._prefixes[notification_id] = delivery_prefix(notification_id)
        return found

    def delivery(
        self, notification_id: str, user_id: str, channel: str, device_id: str | None = None
    ) -> str:
        """`ids.delivery_id(notification_id, user_id, channel, device_id)`."""
        rest = f"{len(user_id)}:{user_id}{len(channel)}:{channel}"
        if device_id is not None:
            rest += part(device_id)
        return delivery_id_of(self.prefix(notification_id), rest)

    def event(self, delivery_id: str, state: str) -> str:
        """`ids.event_id(delivery_id, state, 0)`."""
        tail = self._tails.get(state)
        if tail is None:
            tail = self._tails[state] = event_tail(state)
        if len(delivery_id) != 36:  # not a delivery id made here: the general formula
            return ids.event_id(delivery_id, state, 0)
        return event_id_of(delivery_id.encode(), tail)
