"""PUT/GET /v1/users/{user_id}/preferences → compacted `herald.preferences` (key user_id).

PUT replaces the user's preferences: the version is the next of the hybrid logical clock
(herald.versions: the clock in microseconds, above the last version handed out for this user,
kept in `prefs:{user}:version` so that concurrent writers never share one; if Redis lost that
key the clock alone is still above every earlier version), the `user_preferences` record is
produced and acked, then the Redis copy is written unless a newer version is already there.
GET reads that copy (404 before any PUT).
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from api import keys
from api.models import PreferencesIn, PreferencesOut, preferences_from_record, to_preferences_record
from api.problems import ProblemError, dumps, problem_responses
from api.state import from_ms, guarded, now_utc, redis_unavailable, to_ms

log = logging.getLogger(__name__)
router = APIRouter(tags=["preferences"])

UserId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[^\s/]+$")]

# The next version (herald.versions.next_version, atomically). KEYS[1] counter; ARGV[1] now in us
NEXT_VERSION = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local v = math.max(tonumber(ARGV[1]), held + 1)
v = string.format('%d', v)
redis.call('SET', KEYS[1], v)
return v
"""


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
    now = now_utc()
    try:
        now_us = time.time_ns() // 1000
        version = int(await st.script(NEXT_VERSION, [keys.prefs_version(user_id)], [now_us]))
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    record = to_preferences_record(user_id, body, now, version)
    await st.publish("herald.preferences", user_id, record)
    stored = {**record, "updated_at": to_ms(now)}
    try:
        await st.script(keys.COPY_IF_NEWER, [keys.prefs(user_id)], [orjson.dumps(stored), version])
    except RedisError as exc:
        log.warning("api.preferences_copy_failed version=%d error=%s", version, type(exc).__name__)
    log.info("api.preferences_updated version=%d", version)
    return Response(dumps(_view(stored).model_dump()), media_type="application/json")


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
