"""Delivery and event ids for the plan job's hot path: `herald.ids`, with the hashing of the
parts shared by a whole notification done once.

`PlanIds.delivery(nid, user, channel, device)` == `ids.delivery_id(...)` and
`PlanIds.event(delivery_id, state)` == `ids.event_id(delivery_id, state, 0)` (attempt 0, no
discriminator: the plan job's events), bit for bit; tests/herald/test_planning_ids.py holds
them to it. A delivery id hashes the namespace and the length-prefixed notification id first,
so the SHA-1 state after that prefix is kept per notification (the most recent
`max_entries`) and only the user, channel and device are hashed per delivery.
"""

from __future__ import annotations

from hashlib import sha1
from typing import Any

from herald import ids

__all__ = ["PlanIds"]

_NS_DELIVERY: bytes = ids._NS_DELIVERY  # noqa: SLF001 - the same namespaces, by construction
_NS_EVENT: bytes = ids._NS_EVENT  # noqa: SLF001
_format = ids._format  # noqa: SLF001 - the same UUID text


class PlanIds:
    """Memoizing id maker for one plan worker (see the module docstring)."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._prefixes: dict[str, Any] = {}

    def delivery(
        self, notification_id: str, user_id: str, channel: str, device_id: str | None = None
    ) -> str:
        """`ids.delivery_id(notification_id, user_id, channel, device_id)`."""
        prefix = self._prefixes.get(notification_id)
        if prefix is None:
            if len(self._prefixes) >= self.max_entries:
                self._prefixes.clear()
            name = f"{len(notification_id)}:{notification_id}"
            prefix = self._prefixes[notification_id] = sha1(_NS_DELIVERY + name.encode())
        h = prefix.copy()
        if device_id is None:
            h.update(f"{len(user_id)}:{user_id}{len(channel)}:{channel}".encode())
        else:
            h.update(
                f"{len(user_id)}:{user_id}{len(channel)}:{channel}"
                f"{len(device_id)}:{device_id}".encode()
            )
        return _format(h.digest())

    @staticmethod
    def event(delivery_id: str, state: str) -> str:
        """`ids.event_id(delivery_id, state, 0)`."""
        name = f"{len(delivery_id)}:{delivery_id}{len(state)}:{state}1:00:"
        return _format(sha1(_NS_EVENT + name.encode()).digest())
