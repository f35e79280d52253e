"""Devices and contact points → compacted `herald.devices` (Avro contact_points, key user_id).

Every change is a read-modify-write of the user's full contact_points record under the Redis
lock `cp:{user}:lock`: read the copy `cp:{user}`, apply the change (the next version,
herald.versions), produce and await the ack, write the copy, release. The lock (not WATCH) is
what keeps two concurrent writers from both producing a version with different contents.

A user without a copy starts from an empty record only while the copies are known to hold every
user (`users:{prefix}:restored`, kept by the users job, dataflows/users.py). After Redis lost its
data that marker is gone until the job has written every user again from the compacted
changelog; a change meanwhile waits for it (up to `restore_wait_seconds`), then answers 503
`user_state_restoring` with Retry-After: it never replaces a user's devices with the new one.

    POST   /v1/devices                          register/refresh a push token → 201; `verified`
                                                only with scope contact_points:verify
    DELETE /v1/devices/{device_id}?user_id=…    remove it → 204 (404 when unknown)
    PUT    /v1/users/{user_id}/contact-points   set/clear phone (E.164) and email; `verified`
                                                only with scope contact_points:verify
    GET    /v1/users/{user_id}/contact-points   the current record (tokens as hints; phone and
                                                email masked without scope pii:read)
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel
from redis.exceptions import RedisError

from api.auth import Tenant
from api.models import (
    ContactPointsUpdate,
    DeviceRegistration,
    empty_contact_points,
    with_contact_update,
    with_device,
)
from api.otp import sms_prefix_problem
from api.problems import ProblemError, dumps, problem_responses
from api.routes import PathId
from api.state import (
    AppState,
    from_ms,
    guarded,
    now_utc,
    redis_unavailable,
    to_ms,
    user_lock,
    wait_restored,
)
from herald import keys
from herald.pii import mask_email, mask_phone
from herald.topics import DEVICES
from herald.user_records import without_device

log = logging.getLogger(__name__)
router = APIRouter(tags=["devices"])

UserId = PathId
VERIFY_SCOPE, PII_SCOPE = "contact_points:verify", "pii:read"  # api/auth.py SCOPES
_NS_DEVICE = uuid.UUID("0b7e3c1a-6f0d-5e55-9a51-5d0e8f0c2a11")


def device_id_for(user_id: str, platform: str, token: str) -> str:
    """Stable id of a user x token registration (re-registering yields the same id)."""
    return str(uuid.uuid5(_NS_DEVICE, f"{len(user_id)}:{user_id}{platform}:{token}"))


class DeviceView(BaseModel):
    device_id: str
    platform: str
    token_hint: str
    app_id: str | None = None
    registered_at: datetime
    valid: bool
    verified: bool = False


class ContactPointsView(BaseModel):
    """The current contact points of a user (device tokens shown as hints only)."""

    user_id: str
    devices: list[DeviceView]
    phone: dict[str, Any] | None = None
    email: dict[str, Any] | None = None
    updated_at: datetime
    version: int


class DeviceRegistered(BaseModel):
    device_id: str
    user_id: str
    version: int


def _masked(point: dict[str, Any] | None, field: str, mask: Callable[[str], str]) -> Any:
    return None if point is None else {**point, field: mask(point[field])}


def _view(record: dict[str, Any], pii: bool) -> ContactPointsView:
    """The API's view of a contact-points record; phone and email masked unless `pii` (the
    caller's key holds `pii:read`)."""
    devices = [
        DeviceView(
            device_id=d["device_id"],
            platform=d["platform"],
            token_hint=d["token"][:6] + "…",
            app_id=d.get("app_id"),
            registered_at=from_ms(d["registered_at"]),
            valid=d["valid"],
            verified=d.get("verified", False),
        )  # fmt: skip
        for d in record["devices"]
    ]
    phone, email = record.get("phone"), record.get("email")
    if not pii:
        phone, email = _masked(phone, "e164", mask_phone), _masked(email, "address", mask_email)
    return ContactPointsView(
        user_id=record["user_id"], devices=devices, phone=phone, email=email,
        updated_at=from_ms(record["updated_at"]), version=record["version"],
    )  # fmt: skip


def _as_ms(record: dict[str, Any]) -> dict[str, Any]:
    """Timestamps as epoch ms (the Redis copy's convention, also valid for the serializer)."""

    def ms(v: Any) -> Any:
        return to_ms(v) if isinstance(v, datetime) else v

    devices = [{**d, "registered_at": ms(d["registered_at"])} for d in record["devices"]]
    return {**record, "devices": devices, "updated_at": ms(record["updated_at"])}


async def _modify(
    st: AppState, user_id: str, change: Callable[[dict[str, Any], datetime], dict[str, Any]]
) -> dict[str, Any]:
    """Lock, read, apply `change`, produce (acked), write the copy; returns the new record."""
    async with user_lock(st, keys.contact_points_lock(user_id), "contact_points_busy"):
        now = now_utc()
        raw = await st.redis.get(keys.contact_points(user_id))
        if raw is None:
            await wait_restored(st)
            raw = await st.redis.get(keys.contact_points(user_id))
        current = orjson.loads(raw) if raw else _as_ms(empty_contact_points(user_id, now))
        changed = change(current, now)
        if changed is current:
            return current
        new = _as_ms(changed)
        await st.publish(DEVICES, user_id, new)
        await st.redis.set(keys.contact_points(user_id), orjson.dumps(new))
        return new


def _check_verify_scope(st: AppState, tenant: Tenant, claims_verified: bool) -> None:
    """403 `insufficient_scope` when the body sets `verified` and the key lacks the scope."""
    if claims_verified and VERIFY_SCOPE not in tenant.scopes:
        st.metrics.rejected.labels("insufficient_scope").inc()
        raise ProblemError(
            403, "insufficient_scope", f"setting `verified` needs scope {VERIFY_SCOPE}",
            scope=VERIFY_SCOPE,
        )  # fmt: skip


@router.post(
    "/v1/devices",
    status_code=201,
    response_model=DeviceRegistered,
    responses=problem_responses(400, 401, 403, 413, 422, 429, 503),
    summary="Register (or refresh) a push token",
)
async def register_device(body: DeviceRegistration, request: Request) -> Response:
    """Add the token to the user's contact points; the same token again refreshes it (and
    sets its `verified` anew). Only a key with `contact_points:verify` may register a device
    as verified: types marked `secret` in the catalog (OTP codes) are pushed to those only, so
    a key that may register devices cannot point a user's codes at its own token."""
    st, tenant = await guarded(request, "devices:write")
    _check_verify_scope(st, tenant, body.verified)
    device_id = device_id_for(body.user_id, body.platform, body.token)
    record = await _modify(
        st, body.user_id, lambda cur, now: with_device(cur, body, device_id, now)
    )
    log.info("api.device_registered platform=%s version=%d", body.platform, record["version"])
    out = DeviceRegistered(device_id=device_id, user_id=body.user_id, version=record["version"])
    return Response(dumps(out.model_dump()), status_code=201, media_type="application/json")


@router.delete(
    "/v1/devices/{device_id}",
    status_code=204,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
    summary="Remove a push token",
)
async def delete_device(
    device_id: Annotated[str, Path(max_length=64)],
    user_id: Annotated[str, Query(min_length=1, max_length=128, pattern=r"^[^\s]+$")],
    request: Request,
) -> Response:
    """Remove the device from the user's contact points (404 when the user has no such device)."""
    st, _ = await guarded(request, "devices:write")
    found = False

    def change(cur: dict[str, Any], now: datetime) -> dict[str, Any]:
        nonlocal found
        new = without_device(cur, device_id, now)
        found = new is not cur
        return new

    await _modify(st, user_id, change)
    if not found:
        raise ProblemError(404, "device_not_found", "this user has no such device")
    return Response(status_code=204)


@router.put(
    "/v1/users/{user_id}/contact-points",
    response_model=ContactPointsView,
    responses=problem_responses(400, 401, 403, 413, 422, 429, 503),
    summary="Set or clear a user's phone and email",
)
async def put_contact_points(
    user_id: UserId, body: ContactPointsUpdate, request: Request
) -> Response:
    """Apply the fields present in the body (null clears); the SMS prefix allow-list applies.
    Only a key with `contact_points:verify` may set a phone or email as verified."""
    st, tenant = await guarded(request, "devices:write")
    claims_verified = (body.phone is not None and body.phone.verified) or (
        body.email is not None and body.email.verified
    )
    _check_verify_scope(st, tenant, claims_verified)
    if body.phone is not None and not st.api.sms_allowed(body.phone.e164):
        st.metrics.rejected.labels("sms_prefix_not_allowed").inc()
        raise sms_prefix_problem(["body", "phone", "e164"])
    record = await _modify(st, user_id, lambda cur, now: with_contact_update(cur, body, now))
    log.info(
        "api.contact_points_updated phone=%s email=%s version=%d",
        mask_phone(body.phone.e164 if body.phone else None),
        mask_email(body.email.address if body.email else None), record["version"],
    )  # fmt: skip
    return Response(dumps(_view(record, PII_SCOPE in tenant.scopes).model_dump()),
                    media_type="application/json")  # fmt: skip


@router.get(
    "/v1/users/{user_id}/contact-points",
    response_model=ContactPointsView,
    responses=problem_responses(401, 403, 404, 429, 503),
    summary="Read a user's contact points",
)
async def get_contact_points(user_id: UserId, request: Request) -> Response:
    """The current record (404 before the first change)."""
    st, tenant = await guarded(request, "devices:read")
    try:
        raw = await st.redis.get(keys.contact_points(user_id))
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if raw is None:
        raise ProblemError(404, "contact_points_not_found", "nothing registered for this user")
    view = _view(orjson.loads(raw), PII_SCOPE in tenant.scopes)
    return Response(dumps(view.model_dump()), media_type="application/json")
