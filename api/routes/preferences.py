"""PUT/GET /v1/users/{user_id}/preferences → compacted `herald.preferences` (key user_id).

PUT replaces the user's preferences, under `prefs:{user}:lock` (the receipts job changes them
too: an unsubscribe, sinks/consent.py): the version is the next of the hybrid logical clock
(herald.versions: the clock in microseconds, above the last version handed out for this user,
kept in `prefs:{user}:version` so that concurrent writers never share one; if Redis lost that
key the clock alone is still above every earlier version), the `user_preferences` record is
produced and acked, then the Redis copy is written unless a newer version is already there.
GET reads that copy (404 before any PUT).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from api.models import PreferencesIn, PreferencesOut, preferences_from_record, to_preferences_record
from api.problems import ProblemError, dumps, problem_responses
from api.routes import PathId
from api.state import AppState, from_ms, guarded, now_utc, redis_unavailable, to_ms, user_lock
from herald import keys
from herald.topics import PREFERENCES

log = logging.getLogger(__name__)
router = APIRouter(tags=["preferences"])

UserId = PathId


def _view(record: dict) -> PreferencesOut:  # type: ignore[type-arg]
    data = dict(record)
    if isinstance(data.get("updated_at"), int):
        data["updated_at"] = from_ms(data["updated_at"])
    return preferences_from_record(data)


@router.put(
    "/v1/users/{user_id}/preferences",
    response_model=PreferencesOut,
    responses=problem_responses(400, 401, 403, 413, 422, 429, 503),
    summary="Replace a user's notification preferences",
)
async def put_preferences(user_id: UserId, body: PreferencesIn, request: Request) -> Response:
    """Produce the new record (acked) and update the Redis copy; returns the stored view."""
    st, _ = await guarded(request, "preferences:write")
    # under the user's lock: an opt-out from a receipt (sinks/consent.py) is never lost to a PUT
    async with user_lock(st, keys.prefs_lock(user_id), "preferences_busy"):
        stored = await _replace(st, user_id, body)
    return Response(dumps(_view(stored).model_dump()), media_type="application/json")


async def _replace(st: AppState, user_id: str, body: PreferencesIn) -> dict[str, Any]:
    now = now_utc()
    now_us = time.time_ns() // 1000
    version = int(await st.script(keys.NEXT_VERSION, [keys.prefs_version(user_id)], [now_us]))
    record = to_preferences_record(user_id, body, now, version)
    await st.publish(PREFERENCES, user_id, record)
    stored = {**record, "updated_at": to_ms(now)}
    try:
        await st.script(keys.COPY_IF_NEWER, [keys.prefs(user_id)], [orjson.dumps(stored), version])
    except RedisError as exc:
        log.warning("api.preferences_copy_failed version=%d error=%s", version, type(exc).__name__)
    log.info("api.preferences_updated version=%d", version)
    return stored


@router.get(
    "/v1/users/{user_id}/preferences",
    response_model=PreferencesOut,
    responses=problem_responses(401, 403, 404, 429, 503),
    summary="Read a user's notification preferences",
)
async def get_preferences(user_id: UserId, request: Request) -> Response:
    """The latest stored preferences (404 when the user never set any)."""
    st, _ = await guarded(request, "preferences:read")
    try:
        raw = await st.redis.get(keys.prefs(user_id))
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if raw is None:
        raise ProblemError(404, "preferences_not_found", "no preferences stored for this user")
    return Response(dumps(_view(orjson.loads(raw)).model_dump()), media_type="application/json")
