"""Layered delivery status from Redis hot state (`status:{nid}`, see herald/keys.py).

The plan, dispatch and receipts jobs write one JSON entry per delivery with
`put_delivery_status` (sync client, what Bytewax sinks use). The API reads them and derives
layers per delivery; until the first delivery exists a request shows state ACCEPTED.

Layers answer, per delivery: did the platform accept it, did the provider accept it, was it
delivered, and (where the channel can tell) was it read / opened / clicked. Each is
`yes | no | pending | unknown`; `unknown` where the channel gives no such signal (APNs/FCM send
no delivery receipt), never counted as success or failure. The derivation and the channel
capability table are herald.states (`layers`, `CAPABILITIES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, cast

import orjson
from pydantic import BaseModel, ConfigDict

from herald import keys, states
from herald.controls import progress
from herald.status_keys import counts_key
from herald.status_keys import status_entry as status_entry  # one JSON layout, shared

if TYPE_CHECKING:
    import redis

    from api.state import AppState

Layer = Literal["yes", "no", "pending", "unknown"]


class Layers(BaseModel):
    """Per layer `yes | no | pending | unknown` (herald.states.layers; engagement layers the
    channel never reports are left out)."""

    model_config = ConfigDict(extra="allow")

    accepted: Layer
    provider_accepted: Layer
    delivered: Layer


class DeliveryStatus(BaseModel):
    """One delivery (user x channel [x device])."""

    delivery_id: str
    user_id: str
    channel: str
    provider: str | None = None
    state: str
    status_reason: str | None = None
    updated_at: datetime | None = None
    # How many times `herald replay` re-sent this delivery from the dead-letter topic (0: never);
    # the state is the latest generation's (herald.status_keys).
    generation: int = 0
    layers: Layers


class Progress(BaseModel):
    """How far a notification got (herald.controls.progress): its control, users planned of
    the audience (segments; `users_total` once known), and its deliveries: sent, ended without
    a send (suppressed, expired, failed), still on their way."""

    control: Literal["running", "paused", "cancelled"]
    users_total: int | None = None
    users_planned: int | None = None
    deliveries: int
    sent: int
    not_sent: int
    remaining: int


class NotificationStatus(BaseModel):
    """Body of GET /v1/notifications/{id}. `summary` counts every delivery of the
    notification by current state (not only the page's)."""

    notification_id: str
    notification_type: str
    traffic_class: str
    accepted_at: datetime
    state: str
    recipients: str
    deliveries: list[DeliveryStatus]
    summary: dict[str, int]
    progress: Progress
    next_cursor: str | None = None


def layers_for(state: str, channel: str) -> Layers:
    """The layered view of a delivery's current state on its channel."""
    try:
        derived = states.layers(channel, states.State(state))
    except (KeyError, ValueError):  # a channel or state this API version does not know
        derived = {"provider_accepted": "unknown", "delivered": "unknown"}
    return Layers(accepted="yes", **cast(dict[str, Any], derived))


def put_delivery_status(
    client: redis.Redis, notification_id: str, delivery_id: str, entry: bytes,
    ttl_seconds: int = 30 * 24 * 3600,
) -> None:  # fmt: skip
    """Write one delivery's current status (callers fold transitions; this only stores)."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.status(notification_id), delivery_id, entry)
    pipe.expire(keys.status(notification_id), ttl_seconds)
    pipe.execute()


def _delivery(delivery_id: str, raw: bytes | str) -> DeliveryStatus:
    data: Mapping[str, Any] = orjson.loads(raw)
    state = str(data.get("state", "ACCEPTED"))
    channel = str(data.get("channel", ""))
    return DeliveryStatus(
        delivery_id=delivery_id, user_id=str(data.get("user_id", "")), channel=channel,
        provider=data.get("provider"), state=state, status_reason=data.get("reason"),
        updated_at=data.get("updated_at"), generation=int(data.get("generation") or 0),
        layers=layers_for(state, channel),
    )  # fmt: skip


async def read_status(
    st: AppState, nid: str, tenant_id: str, cursor: int, limit: int
) -> NotificationStatus | None:
    """The status view, or None when unknown to this tenant (other tenants see 404 too)."""
    from api.state import from_ms

    meta: dict[str, str] = await st.redis.hgetall(keys.notif(nid))  # type: ignore[assignment]
    if not meta or meta.get("tenant_id") != tenant_id:
        return None
    scanned: Any = await st.redis.hscan(keys.status(nid), cursor=cursor, count=limit)
    next_cursor, fields = int(scanned[0]), cast(dict[str, str], scanned[1])
    deliveries = sorted(
        (_delivery(d, raw) for d, raw in fields.items()), key=lambda d: (d.user_id, d.channel)
    )
    counted: dict[str, str] = await st.redis.hgetall(counts_key(nid))  # type: ignore[assignment]
    summary = {s: int(n) for s, n in counted.items() if int(n) > 0}
    if not counted:  # written before the counts existed: the page's
        for d in deliveries:
            summary[d.state] = summary.get(d.state, 0) + 1
    if not summary:
        state = "ACCEPTED"
    elif len(summary) == 1:
        state = next(iter(summary))
    else:
        state = "IN_PROGRESS"
    return NotificationStatus(
        notification_id=nid, notification_type=meta["notification_type"],
        traffic_class=meta["traffic_class"], accepted_at=from_ms(int(meta["accepted_at"])),
        state=state, recipients=meta.get("recipients", ""), deliveries=deliveries,
        summary=summary, progress=Progress(**progress(meta, summary)),  # type: ignore[arg-type]
        next_cursor=str(next_cursor) if int(next_cursor) else None,
    )  # fmt: skip
