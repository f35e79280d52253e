"""POST /v1/otp/{notification_id}/verified: the upstream service reports a code was used.

Together with the sent counter this yields `herald_otp_unverified_ratio` at /metrics: a rising
share of OTPs never verified is the classic SMS-pumping signal. Idempotent: reporting twice
counts once. 404 for an unknown id, another tenant's id, or a non-OTP notification.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from api.otp import count_otp
from api.problems import ProblemError, problem_responses
from api.state import guarded, now_utc, redis_unavailable
from herald import keys

router = APIRouter(tags=["otp"])


@router.post(
    "/v1/otp/{notification_id}/verified",
    status_code=204,
    responses=problem_responses(401, 403, 404, 429, 503),
    summary="Report that an OTP was verified",
)
async def otp_verified(
    notification_id: Annotated[str, Path(max_length=64)], request: Request
) -> Response:
    """Count the verification once."""
    st, tenant = await guarded(request, "otp:verify")
    try:
        meta: dict[str, str] = await st.redis.hgetall(keys.notif(notification_id))  # type: ignore[assignment]
        if not meta or meta.get("tenant_id") != tenant.tenant_id or meta.get("otp") != "1":
            raise ProblemError(404, "otp_not_found", "no OTP notification with this id")
        first = await st.redis.set(
            keys.otp_verified(notification_id), "1", nx=True, ex=st.api.status_ttl_seconds
        )
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if first:
        st.metrics.otp_verified.labels(meta["notification_type"]).inc()
        await count_otp(st, meta["notification_type"], "verified", now_utc())
    return Response(status_code=204)
