"""Cancel, pause and resume a notification (layout and rules: herald.controls).

    change_control(st, tenant_id, nid, control) -> ControlResult

1. one script sets `control` on the notification's header (404 unknown to the tenant; 409
   `notification_cancelled` for a pause or resume after a cancel: a cancel is final);
2. resume and cancel put the deliveries dispatch parked while paused back on their topics
   (a page at a time: produced, acknowledged, then removed from the list, so a failure loses
   nothing and a retried call goes on where it stopped), where dispatch decides them again;
3. pause and cancel wait until no dispatch worker holds a send lease on the notification (or
   `control_settle_seconds` passed): from the answer on no send of it starts. `settled: false`
   says the wait ran out (a worker still sending, or one that died holding a lease).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from pydantic import BaseModel

from api.auth import Tenant
from api.problems import ProblemError
from api.state import AppState, check_authority
from herald.controls import CANCELLED, LEASE_PREFIX, PAUSED, RUNNING, parked_key, split_parked
from herald.errors import DeliveryError
from herald.status_keys import header_key

__all__ = ["ControlResult", "change_control"]

Control = Literal["running", "paused", "cancelled"]

# KEYS[1] notif:{nid}; ARGV: tenant, control, epoch ms. {outcome, previous control}.
_SET = """
if redis.call('HGET', KEYS[1], 'tenant_id') ~= ARGV[1] then return {'missing', ''} end
local current = redis.call('HGET', KEYS[1], 'control') or 'running'
if current == 'cancelled' and ARGV[2] ~= 'cancelled' then return {'refused', current} end
if current ~= ARGV[2] then
  redis.call('HSET', KEYS[1], 'control', ARGV[2], 'control_at', ARGV[3])
end
return {'ok', current}
"""

PAGE = 500
POLL_S = 0.02


class ControlResult(BaseModel):
    """The answer to a cancel, pause or resume."""

    notification_id: str
    control: Control
    previous: Control
    settled: bool  # no dispatch worker was still sending it when this was answered
    released: int  # parked deliveries put back on their topics (resume, cancel)


async def change_control(st: AppState, tenant: Tenant, nid: str, control: Control) -> ControlResult:
    """See the module docstring. The key must be allowed to send the notification's type and
    to target its segment (403, api.state.check_authority)."""
    key = header_key(nid)
    found: list[str | None] = await st.redis.hmget(  # type: ignore[assignment,misc]
        key, ["tenant_id", "notification_type", "recipients"]
    )
    owner, type_name, recipients = found
    if owner != tenant.tenant_id or type_name is None:
        raise ProblemError(404, "notification_not_found", "no such notification for this tenant")
    recipients = recipients or ""
    segment = recipients.removeprefix("segment:") if recipients.startswith("segment:") else None
    check_authority(st, tenant, type_name, segment)
    outcome, previous = await st.script(
        _SET, [key], [tenant.tenant_id, control, int(time.time() * 1000)]
    )
    if outcome == "missing":
        raise ProblemError(404, "notification_not_found", "no such notification for this tenant")
    if outcome == "refused":
        raise ProblemError(
            409, "notification_cancelled", "a cancelled notification cannot be paused or resumed",
            notification_id=nid,
        )  # fmt: skip
    released = await _release_parked(st, nid) if control in (RUNNING, CANCELLED) else 0
    settled = await _settled(st, nid) if control in (PAUSED, CANCELLED) else True
    return ControlResult(
        notification_id=nid, control=control, previous=previous, settled=settled,
        released=released,
    )  # fmt: skip


async def _release_parked(st: AppState, nid: str) -> int:
    """Put every parked delivery back on its deliveries topic; how many."""
    key = parked_key(nid)
    released = 0
    kafka = st.settings.kafka
    while True:
        entries = await st.redis.lrange(key, 0, PAGE - 1)  # type: ignore[misc]
        if not entries:
            return released
        sends = []
        for entry in entries:
            topic, record_key, value = split_parked(entry)
            produce = st.producer.produce(
                kafka.topic(topic), record_key, value, st.api.ack_timeout_seconds
            )
            sends.append(produce)
        try:
            await asyncio.gather(*sends)
        except DeliveryError as exc:
            st.metrics.unavailable.labels("kafka").inc()
            raise ProblemError(
                503, "kafka_unavailable", f"parked deliveries not released, retry ({exc})",
                headers={"Retry-After": "1"},
            ) from exc  # fmt: skip
        await st.redis.ltrim(key, len(entries), -1)  # type: ignore[misc]
        released += len(entries)


async def _settled(st: AppState, nid: str) -> bool:
    """True once no live send lease is left on the notification (within the settle time)."""
    deadline = time.monotonic() + st.api.control_settle_seconds
    while True:
        header: dict[str, str] = await st.redis.hgetall(header_key(nid))  # type: ignore[assignment,misc]
        now_ms = time.time() * 1000
        live = [v for k, v in header.items() if k.startswith(LEASE_PREFIX) and int(v) > now_ms]
        if not live:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
