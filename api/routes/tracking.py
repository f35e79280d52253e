"""Email tracking: GET /t/o/{token}.gif (open pixel) and GET /t/c/{token} (click redirect).

Both verify the HMAC token (herald/links.py; tampered → 400), then emit an OPENED / CLICKED
`delivery_event` to herald.delivery-events without waiting for the ack (tracking is analytics,
never on the user's critical path; a refused record is counted and logged). Event ids are
deterministic (`ids.event_id`), so repeated opens collapse into one event and repeated clicks
on the same link into one per link. No API key: the signature is the authorization.

An open or click belongs to the delivery's latest generation (a DLQ replay, herald.dlq): the
token was signed at plan time and cannot say which send the mail came from, so the route reads
the generation from the delivery's hot status (one HGET). A failed send is never opened, so
after a replay the email being read is the replay's. Without Redis, or without a status entry,
the event is generation 0 (logged): tracking never fails on it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Annotated
from urllib.parse import urlsplit

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from api import keys
from api.problems import ProblemError, problem_responses
from api.state import AppState, now_utc, state_of
from herald import ids
from herald import links as tracking

log = logging.getLogger(__name__)
router = APIRouter(tags=["tracking"])

PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
_NO_STORE = {"Cache-Control": "no-store, max-age=0", "Referrer-Policy": "no-referrer"}
Token = Annotated[str, Path(min_length=3, max_length=tracking.MAX_TOKEN)]


async def _generation(st: AppState, claims: dict[str, str]) -> int:
    """The generation of the delivery's hot status (herald.status_keys); 0 when unknown."""
    try:
        entry = await st.redis.hget(keys.status(claims["n"]), claims["d"])
    except RedisError as exc:
        log.warning("api.tracking_generation_unknown reason=%s", type(exc).__name__)
        return 0
    if entry is None:
        return 0
    try:
        return int(orjson.loads(entry).get("generation") or 0)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        log.warning("api.tracking_generation_unknown reason=bad_status_entry")
        return 0


async def _emit(
    st: AppState, kind: str, state: str, claims: dict[str, str], discriminator: str
) -> None:
    now = now_utc()
    delivery_id = claims["d"]
    generation = await _generation(st, claims)
    attributes = {"source": "tracking"}
    if "l" in claims:
        attributes["link_host"] = urlsplit(claims["l"]).hostname or ""
    record = {
        "event_id": ids.event_id(delivery_id, state, 0, discriminator, generation),
        "delivery_id": delivery_id, "notification_id": claims["n"], "user_id": claims["u"],
        "tenant_id": claims.get("t", ""), "notification_type": claims.get("y", ""),
        "channel": "email", "traffic_class": claims.get("c", ""), "state": state,
        "reason": None, "provider": None, "provider_msg_id": None, "attempt": 0,
        "latency_ms": None, "occurred_at": now, "recorded_at": now, "attributes": attributes,
        "generation": generation,
    }  # fmt: skip
    physical, serialize = st.serializers["herald.delivery-events"]
    if st.producer.produce_nowait(physical, delivery_id, serialize(record)):
        st.metrics.tracking.labels(kind).inc()
    else:
        st.metrics.unavailable.labels("kafka").inc()
        log.warning("api.tracking_event_dropped kind=%s", kind)


def _verify(st: AppState, kind: tracking.Kind, token: str) -> dict[str, str]:
    try:
        return tracking.verify(st.settings.links.secret_bytes(), kind, token)
    except tracking.BadToken as exc:
        st.metrics.tracking_rejected.labels("open" if kind == "o" else "click").inc()
        raise ProblemError(400, "invalid_tracking_token", str(exc)) from None


@router.get(
    "/t/o/{token}.gif", responses={200: {"content": {"image/gif": {}}},
                                   **problem_responses(400)},
    summary="Email open pixel",
)  # fmt: skip
async def open_pixel(token: Token, request: Request) -> Response:
    """A 1x1 GIF; records OPENED for the delivery in the token."""
    st = state_of(request)
    claims = _verify(st, "o", token)
    await _emit(st, "open", "OPENED", claims, "")
    return Response(PIXEL, media_type="image/gif", headers=_NO_STORE)


@router.get(
    "/t/c/{token}", status_code=302, responses={302: {"description": "Redirect to the link"},
                                                **problem_responses(400)},
    summary="Signed click redirect",
)  # fmt: skip
async def click(token: Token, request: Request) -> Response:
    """302 to the URL inside the signed token; records CLICKED (one event per link)."""
    st = state_of(request)
    claims = _verify(st, "c", token)
    link = claims["l"]
    await _emit(st, "click", "CLICKED", claims, hashlib.sha256(link.encode()).hexdigest()[:16])
    return Response(status_code=302, headers={"Location": link, **_NO_STORE})
