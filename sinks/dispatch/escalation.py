"""Escalation at dispatch: the held message of an escalating type goes out only when the one it
escalates was not read first (herald.catalog.Escalation; the hold is planned by herald.policy).

    EscalationCheck(client, catalog).read_first(items) -> delivery ids to drop

An item is an escalation when its type has one and it is on the escalation's `to` channel. The
message it escalates is the same user's delivery of the notification on the `from` channel
(`ids.delivery_id(nid, user, from)`, an in-app item or an email, which have no device); its
current state is in the notification's status hash (`status:{nid}`, herald.status_keys), one
pipelined HGET per item. READ, OPENED or CLICKED there: the escalation is dropped (SUPPRESSED
`read_before_escalation`); anything else, or no entry yet: it is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import redis

from herald import ids
from herald.catalog import Catalog
from herald.states import State
from herald.status_keys import status_key
from sinks.dispatch.work import Item

__all__ = ["READ_FIRST", "EscalationCheck"]

READ_FIRST = "read_before_escalation"
_READ = frozenset({State.READ.value, State.OPENED.value, State.CLICKED.value})


class EscalationCheck:
    """See the module docstring."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, catalog: Catalog) -> None:
        self.client = client
        self.catalog = catalog

    def read_first(self, items: Sequence[Item]) -> set[str]:
        """Delivery ids of the escalations among `items` whose first message was read."""
        asks: list[tuple[str, str, str]] = []  # (escalation delivery id, status key, field)
        for it in items:
            d = it.delivery
            nt = self.catalog.types.get(d["notification_type"])
            rule = nt.escalation if nt is not None else None
            if rule is None or d["channel"] != rule.to_channel:
                continue
            first = ids.delivery_id(d["notification_id"], d["user_id"], rule.from_channel)
            asks.append((it.delivery_id, status_key(d["notification_id"]), first))
        if not asks:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for _did, key, field in asks:
            pipe.hget(key, field)
        return {did for (did, _k, _f), raw in zip(asks, pipe.execute(), strict=True)
                if raw is not None and _state(raw) in _READ}  # fmt: skip


def _state(raw: bytes | str) -> str:
    try:
        return str(orjson.loads(raw).get("state", ""))
    except (orjson.JSONDecodeError, AttributeError):
        return ""
