"""POST /v1/notifications (accept) and GET /v1/notifications/{id} (layered status).

Accept: validate → catalog checks → (OTP limits) → one Redis script (tenant rate + idempotency
claim) → Avro → Kafka `herald.requests.{class}` → await the delivery report → record
accepted state → 202. Kafka or Redis failing → 503; nothing answers 202 before the ack.

Idempotency (key `idem:{nid}`, nid = ids.notification_id(tenant, request_id)):
  no entry                    claim "pending", produce, mark "accepted" → 202
  accepted, same body hash    202 with the stored notification_id and accepted_at (no produce)
  any state, other body hash  409 naming the existing notification_id
  pending, same body hash     produce again (a concurrent retry, or a crashed attempt): the
                              duplicate record carries the same notification_id, downstream
                              dedups by it
A failed produce deletes its own pending claim, so a retry with another body is not a conflict.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from api.auth import Tenant
from api.controls import Control, ControlResult, change_control
from api.intake import body_hash, check_against_catalog, check_times
from api.models import NotificationAccepted, NotificationCreate, to_request_record
from api.otp import charge_otp_limits, check_otp_recipients, count_otp
from api.problems import ProblemError, dumps, problem_responses
from api.routes import PathId
from api.segments import check_segment
from api.state import (
    AppState,
    authenticate,
    check_authority,
    from_ms,
    guarded,
    now_utc,
    rate_limited,
    redis_unavailable,
    state_of,
    to_ms,
)
from api.status import NotificationStatus, read_status
from herald import ids, keys, tracing
from herald.status_keys import request_header

log = logging.getLogger(__name__)
router = APIRouter(tags=["notifications"])

# KEYS[1] tenant rate key, KEYS[2] idem key; ARGV: limit, pending value, ttl seconds
_ACCEPT_SCRIPT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], 2) end
if n > tonumber(ARGV[1]) then return {'limited', ''} end
local cur = redis.call('GET', KEYS[2])
if not cur then
  redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[3]))
  return {'new', ''}
end
return {'exists', cur}
"""
# KEYS[1] idem key, KEYS[2] notif key; ARGV: idem value, idem ttl, notif ttl, field, value, ...
_ACCEPTED_SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1
"""
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _accepted(nid: str, accepted_ms: int) -> Response:
    body = {"notification_id": nid, "accepted_at": from_ms(accepted_ms)}
    return Response(dumps(body), status_code=202, media_type="application/json")


async def _claim(st: AppState, rate_key: str, limit: int, nid: str, pending: str) -> list[str]:
    ttl = st.api.idempotency_ttl_seconds
    if st.settings.redis.cluster:  # two slots: two calls
        n = await st.redis.incr(rate_key)
        if n == 1:
            await st.redis.expire(rate_key, 2)
        if n > limit:
            return ["limited", ""]
        if await st.redis.set(keys.idem(nid), pending, ex=ttl, nx=True):
            return ["new", ""]
        return ["exists", str(await st.redis.get(keys.idem(nid)) or "")]
    return await st.script(  # type: ignore[no-any-return]
        _ACCEPT_SCRIPT, [rate_key, keys.idem(nid)], [limit, pending, ttl]
    )


@router.post(
    "/v1/notifications",
    status_code=202,
    response_model=NotificationAccepted,
    responses=problem_responses(400, 401, 403, 404, 409, 413, 422, 429, 503),
    summary="Accept a notification request (202 once durable in Kafka)",
)
async def create_notification(body: NotificationCreate, request: Request) -> Response:
    """Accept one notification; see the module docstring for idempotency and durability.

    (Served by `api.fastpath` in the running app; this route documents it and is the fallback.)
    """
    st = state_of(request)
    tenant = authenticate(request, "notifications:write")
    headers = request.headers
    return await accept(
        st,
        tenant,
        body,
        headers.get("x-end-user-ip"),
        headers.get("x-end-user-device"),
        headers.get("traceparent"),
    )


async def accept(
    st: AppState, tenant: Tenant, body: NotificationCreate, end_user_ip: str | None,
    end_user_device: str | None, trace: str | None = None,
) -> Response:  # fmt: skip
    """The accept pipeline for an authenticated tenant and a parsed body; `trace` is the
    request's `traceparent` header (kept when valid, herald/tracing.py)."""
    now = now_utc()
    nt = check_against_catalog(body, st.catalog)
    check_authority(st, tenant, nt.name, body.recipients.segment_id)
    if body.recipients.segment_id is not None:  # another tenant's or a deleted segment: 404
        await check_segment(st, tenant.tenant_id, body.recipients.segment_id)
    check_times(body, now, st.api.send_at_max_past_seconds, st.settings.schedule.horizon_days)
    otp = nt.otp
    phones: set[str] = set()
    if otp:
        channels = body.channels or nt.allowed_channels
        user_ids = list(body.recipients.user_ids or [])
        phones = await check_otp_recipients(st, user_ids, "sms" in channels)
    nid = ids.notification_id(tenant.tenant_id, body.request_id)
    digest = body_hash(body)
    accepted_ms = to_ms(now)
    pending = f"{digest}|pending|{accepted_ms}"
    rate_key = keys.rate(tenant.tenant_id, int(time.time()))
    try:
        outcome, current = await _claim(st, rate_key, tenant.rate_limit_per_second, nid, pending)
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if outcome == "limited":
        raise rate_limited(st, tenant)
    if outcome == "exists":
        held_hash, state, held_ms = current.split("|")
        if held_hash != digest:
            st.metrics.rejected.labels("idempotency_conflict").inc()
            raise ProblemError(
                409, "idempotency_conflict",
                "this request_id was used with a different body",
                notification_id=nid,
            )  # fmt: skip
        if state == "accepted":
            st.metrics.replayed.inc()
            return _accepted(nid, int(held_ms))
    record = to_request_record(
        body, nid, tenant.tenant_id, nt.traffic_class, now,  # type: ignore[arg-type]
        template_version=nt.template_version, traceparent=tracing.traceparent(trace),
    )  # fmt: skip
    try:
        if otp and outcome != "exists":  # a retry of a request in flight was charged already
            await charge_otp_limits(st, phones, end_user_ip, end_user_device)
        await st.publish(f"herald.requests.{nt.traffic_class}", nid, record)
    except ProblemError:
        with contextlib.suppress(RedisError):
            await st.script(_RELEASE_SCRIPT, [keys.idem(nid)], [pending])
        raise
    await _record_accepted(st, nid, digest, accepted_ms, body, tenant.tenant_id, nt, otp)
    st.metrics.accepted.labels(nt.traffic_class).inc()
    if otp:
        st.metrics.otp_sent.labels(nt.name).inc()
        await count_otp(st, nt.name, "sent", now)
    log.debug("api.notification_accepted nid=%s type=%s", nid, nt.name)
    return _accepted(nid, accepted_ms)


async def _record_accepted(
    st: AppState, nid: str, digest: str, accepted_ms: int, body: NotificationCreate,
    tenant_id: str, nt: Any, otp: bool,
) -> None:  # fmt: skip
    """Mark the idempotency key accepted and store the status header (after the Kafka ack).

    A Redis failure here is logged, not answered 503: the request is already durable, and a
    retry with the same body re-produces it (same notification_id) and records this again.
    """
    recipients = body.recipients
    meta = request_header(
        tenant_id, body.request_id, nt.name, nt.traffic_class, accepted_ms,
        len(recipients.user_ids or []), recipients.segment_id, otp,
    )  # fmt: skip
    try:
        pairs = [item for kv in meta.items() for item in kv]
        await st.script(
            _ACCEPTED_SCRIPT, [keys.idem(nid), keys.notif(nid)],
            [f"{digest}|accepted|{accepted_ms}", st.api.idempotency_ttl_seconds,
             st.api.status_ttl_seconds, *pairs],
        )  # fmt: skip
    except RedisError as exc:
        log.warning("api.accepted_state_not_recorded nid=%s error=%s", nid, type(exc).__name__)


async def _control(request: Request, notification_id: str, control: Control) -> Response:
    st, tenant = await guarded(request, "notifications:write")
    try:
        result = await change_control(st, tenant, notification_id, control)
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    log.info("api.notification_control nid=%s control=%s settled=%s released=%d",
             notification_id, control, result.settled, result.released)  # fmt: skip
    return Response(dumps(result.model_dump()), media_type="application/json")


_CONTROL_RESPONSES = problem_responses(401, 403, 404, 409, 429, 503)


@router.post(
    "/v1/notifications/{notification_id}/cancel",
    response_model=ControlResult, responses=_CONTROL_RESPONSES,
    summary="Cancel: nothing not yet sent is sent; the rest ends SUPPRESSED `cancelled`",
)  # fmt: skip
async def cancel_notification(notification_id: PathId, request: Request) -> Response:
    """Final. Answered once no dispatch worker is still sending it (`settled`); deliveries
    parked by a pause are released to end as cancelled."""
    return await _control(request, notification_id, "cancelled")


@router.post(
    "/v1/notifications/{notification_id}/pause",
    response_model=ControlResult, responses=_CONTROL_RESPONSES,
    summary="Pause: planning stops and deliveries reaching dispatch are parked",
)  # fmt: skip
async def pause_notification(notification_id: PathId, request: Request) -> Response:
    """Answered once no dispatch worker is still sending it (`settled`). 409 after a cancel."""
    return await _control(request, notification_id, "paused")


@router.post(
    "/v1/notifications/{notification_id}/resume",
    response_model=ControlResult, responses=_CONTROL_RESPONSES,
    summary="Resume a paused notification: parked deliveries go back to dispatch",
)  # fmt: skip
async def resume_notification(notification_id: PathId, request: Request) -> Response:
    """Planning goes on where it stopped; `released` parked deliveries are sent. 409 after a
    cancel."""
    return await _control(request, notification_id, "running")


@router.get(
    "/v1/notifications/{notification_id}",
    response_model=NotificationStatus,
    responses=problem_responses(401, 403, 404, 429, 503),
    summary="Layered status per delivery (user x channel)",
)
async def get_notification(
    notification_id: str,
    request: Request,
    cursor: Annotated[str, Query(max_length=32, pattern=r"^\d+$")] = "0",
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    """The request-level state and one entry per known delivery, paged by `cursor`."""
    st, tenant = await guarded(request, "notifications:read")
    try:
        status = await read_status(st, notification_id, tenant.tenant_id, int(cursor), limit)
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if status is None:
        raise ProblemError(404, "notification_not_found", "no such notification for this tenant")
    return Response(dumps(status.model_dump()), media_type="application/json")
