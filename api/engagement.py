"""Engagement events the API records on herald.delivery-events: an email opened or a link
clicked (api/routes/tracking.py), an in-app item delivered (fetched or pushed over a WebSocket)
or read (api/routes/inbox.py).

    await emit(st, [Engagement(...), ...], state, kind, discriminator)

Event ids are deterministic (`ids.event_id`), so a repeated open, fetch or read collapses into
one event. The receipts job folds them like provider receipts (herald/states.py: READ, OPENED,
CLICKED follow DELIVERED), and the warehouse writes them to ClickHouse. They are produced
without waiting for the ack: engagement is analytics, never on the user's critical path (a
refused record is counted and logged).

An engagement belongs to the delivery's latest generation (a DLQ replay, infra.dlq): a failed
send is never opened or read, so after a replay what is being read is the replay's. The
generations are read from the deliveries' hot status (one pipelined round trip per call);
without Redis, or without a status entry, an event is generation 0 (logged): engagement never
fails on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import RedisError

from api.state import AppState, now_utc
from herald import ids, keys
from herald.topics import DELIVERY_EVENTS

__all__ = ["Engagement", "emit"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Engagement:
    """The delivery an engagement belongs to."""

    delivery_id: str
    notification_id: str
    user_id: str
    channel: str
    tenant_id: str = ""
    notification_type: str = ""
    traffic_class: str = ""
    attributes: dict[str, str] = field(default_factory=dict)


def _generation_of(entry: Any) -> int:
    """The generation in one hot status entry (herald.status_keys); 0 when unknown."""
    if entry is None:
        return 0
    try:
        return int(orjson.loads(entry).get("generation") or 0)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        log.warning("api.engagement_generation_unknown reason=bad_status_entry")
        return 0


async def _generations(st: AppState, ofs: list[Engagement]) -> list[int]:
    """The deliveries' generations from their hot status: one pipelined round trip."""
    pipe = st.redis.pipeline(transaction=False)
    for of in ofs:
        pipe.hget(keys.status(of.notification_id), of.delivery_id)
    try:
        entries = await pipe.execute()
    except RedisError as exc:
        log.warning("api.engagement_generation_unknown reason=%s", type(exc).__name__)
        return [0] * len(ofs)
    return [_generation_of(entry) for entry in entries]


async def emit(
    st: AppState, ofs: list[Engagement], state: str, kind: str, discriminator: str = ""
) -> None:
    """Produce the `state` event of each of `ofs` (counted under `kind`: open, click,
    delivered, read)."""
    if not ofs:
        return
    now = now_utc()
    physical, serialize = st.serializers[DELIVERY_EVENTS]
    for of, generation in zip(ofs, await _generations(st, ofs), strict=True):
        record = {
            "event_id": ids.event_id(of.delivery_id, state, 0, discriminator, generation),
            "delivery_id": of.delivery_id, "notification_id": of.notification_id,
            "user_id": of.user_id, "tenant_id": of.tenant_id,
            "notification_type": of.notification_type, "channel": of.channel,
            "traffic_class": of.traffic_class, "state": state, "reason": None,
            "provider": None, "provider_msg_id": None, "attempt": 0, "latency_ms": None,
            "occurred_at": now, "recorded_at": now, "attributes": of.attributes,
            "generation": generation,
        }  # fmt: skip
        if st.producer.produce_nowait(physical, of.delivery_id, serialize(record)):
            st.metrics.tracking.labels(kind).inc()
        else:
            st.metrics.unavailable.labels("kafka").inc()
            log.warning("api.engagement_event_dropped kind=%s", kind)
