"""Inbox endpoints: list (newest first, cursor paging), mark read, unread count, WebSocket.

    GET  /v1/users/{user_id}/inbox?limit=&cursor=      items + next_cursor + unread
    POST /v1/users/{user_id}/inbox/{item_id}/read      mark one read → {unread}
    POST /v1/users/{user_id}/inbox/read-all            mark all read → {unread: 0}
    GET  /v1/users/{user_id}/inbox/unread-count        {unread}
    WS   /v1/users/{user_id}/inbox/ws                  pushes {"type": "item"|"unread", ...}

    POST /v1/users/{user_id}/inbox/tokens              the user's inbox token → 201

Who calls: the user's app, with the inbox token its backend minted (scope inbox:token; valid
`inbox_token_ttl_seconds`, for that user's inbox only) as `Authorization: Bearer`; on the
WebSocket, which browsers cannot give headers, as `?token=`. A tenant key (scope inbox:read or
inbox:write) works too, in the headers only: never in a URL, which proxies and servers log.
The WebSocket sends the unread count first, then every event published on the user's channel.

Engagement (api/engagement.py): an item an app fetched (a listed page) or was pushed (over the
WebSocket) for the first time is DELIVERED; an item marked read (one, or all) is READ, after its
DELIVERED if no app had received it before. The events go to herald.delivery-events, where the
receipts job folds them into the delivery's state (no more DELIVERY_UNKNOWN for an item seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from pydantic import BaseModel
from redis.exceptions import RedisError

from api.auth import USER_TOKEN_PREFIX, mint_user_token
from api.engagement import Engagement, emit
from api.models import PATH_ID_PATTERN
from api.problems import ProblemError, dumps, problem_responses
from api.routes import PathId
from api.state import AppState, guarded, guarded_user, redis_unavailable, user_authority
from herald import inbox

log = logging.getLogger(__name__)
router = APIRouter(tags=["inbox"])

UserId = PathId
ItemId = PathId


class InboxItem(BaseModel):
    item_id: str
    notification_id: str | None = None
    notification_type: str | None = None
    title: str
    body: str
    data: dict[str, str] = {}
    created_at: int
    read: bool


class InboxPage(BaseModel):
    items: list[InboxItem]
    next_cursor: str | None
    unread: int


class Unread(BaseModel):
    unread: int


def _json(obj: Any) -> Response:
    return Response(dumps(obj), media_type="application/json")


@router.get(
    "/v1/users/{user_id}/inbox", response_model=InboxPage,
    responses=problem_responses(400, 401, 403, 429, 503), summary="List inbox items",
)  # fmt: skip
async def list_inbox(
    user_id: UserId,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Newest first; pass `next_cursor` back as `cursor` for the next page."""
    st, _ = await guarded_user(request, user_id, "inbox:read")
    position = inbox.decode_cursor(cursor) if cursor else None
    if cursor and position is None:
        raise ProblemError(400, "invalid_cursor", "cursor is not one this API returned")
    try:
        items, next_cursor, unread = await inbox.list_items(st.redis, user_id, limit, position)
        await _delivered(st, user_id, items, "fetch")
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    return _json({"items": items, "next_cursor": next_cursor, "unread": unread})


def _engagement(user_id: str, item: dict[str, Any], via: str) -> Engagement:
    return Engagement(
        str(item["item_id"]), str(item.get("notification_id") or ""), user_id, "inapp",
        str(item.get("tenant_id") or ""), str(item.get("notification_type") or ""),
        str(item.get("traffic_class") or ""), {"source": "inbox", "via": via},
    )  # fmt: skip


async def _delivered(st: AppState, user_id: str, items: list[dict[str, Any]], via: str) -> None:
    """DELIVERED for the items no app had received before."""
    new = await inbox.take_undelivered(st.redis, user_id, [str(i["item_id"]) for i in items])
    delivered = [_engagement(user_id, i, via) for i in items if i["item_id"] in new]
    await emit(st, delivered, "DELIVERED", "delivered")


async def _read(st: AppState, user_id: str, items: list[dict[str, Any]]) -> None:
    """READ for items just marked read (DELIVERED first when no app had received them)."""
    await _delivered(st, user_id, items, "read")
    await emit(st, [_engagement(user_id, item, "read") for item in items], "READ", "read")


@router.post(
    "/v1/users/{user_id}/inbox/read-all", response_model=Unread,
    responses=problem_responses(401, 403, 429, 503), summary="Mark every item read",
)  # fmt: skip
async def read_all(user_id: UserId, request: Request) -> Response:
    st, _ = await guarded_user(request, user_id, "inbox:write")
    try:
        await _read(st, user_id, await inbox.mark_all_read(st.redis, user_id))
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    return _json({"unread": 0})


@router.post(
    "/v1/users/{user_id}/inbox/{item_id}/read", response_model=Unread,
    responses=problem_responses(401, 403, 404, 429, 503), summary="Mark one item read",
)  # fmt: skip
async def read_one(user_id: UserId, item_id: ItemId, request: Request) -> Response:
    st, _ = await guarded_user(request, user_id, "inbox:write")
    try:
        marked = await inbox.mark_read(st.redis, user_id, item_id)
        if marked is not None and marked[1] is not None:
            await _read(st, user_id, [marked[1]])
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if marked is None:
        raise ProblemError(404, "inbox_item_not_found", "no such item in this inbox")
    return _json({"unread": marked[0]})


@router.get(
    "/v1/users/{user_id}/inbox/unread-count", response_model=Unread,
    responses=problem_responses(401, 403, 429, 503), summary="Unread count",
)  # fmt: skip
async def get_unread(user_id: UserId, request: Request) -> Response:
    st, _ = await guarded_user(request, user_id, "inbox:read")
    try:
        return _json({"unread": await inbox.unread_count(st.redis, user_id)})
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc


class InboxToken(BaseModel):
    token: str
    user_id: str
    expires_at: datetime


@router.post(
    "/v1/users/{user_id}/inbox/tokens", status_code=201, response_model=InboxToken,
    responses=problem_responses(401, 403, 429, 503), summary="Mint an end user's inbox token",
)  # fmt: skip
async def mint_inbox_token(user_id: UserId, request: Request) -> Response:
    """For the tenant's backend: a token the user's app sends on this user's inbox routes and
    WebSocket (see the module docstring), valid `inbox_token_ttl_seconds`."""
    st, tenant = await guarded(request, "inbox:token")
    expires = int(time.time()) + st.api.inbox_token_ttl_seconds
    token = mint_user_token(st.settings.links.secret_bytes(), tenant.tenant_id, user_id, expires)
    body = {"token": token, "user_id": user_id, "expires_at": datetime.fromtimestamp(expires, UTC)}
    return Response(dumps(body), status_code=201, media_type="application/json")


@router.websocket("/v1/users/{user_id}/inbox/ws")
async def inbox_ws(websocket: WebSocket, user_id: str) -> None:
    """Push new items and unread counts to an online user."""
    st: AppState = websocket.app.state.herald
    key = websocket.headers.get("x-api-key")
    auth = websocket.headers.get("authorization", "")
    if not key and auth[:7].lower() == "bearer ":
        key = auth[7:].strip()
    token = websocket.query_params.get("token")
    if not key and token and token.startswith(USER_TOKEN_PREFIX):
        key = token  # only an inbox token may travel in the URL
    try:
        tenant = user_authority(st, key, user_id, "inbox:read")
    except ProblemError:
        await websocket.close(code=1008)
        return
    hub = st.inbox_hub
    refused = hub.refusal(tenant.tenant_id, user_id)
    if refused is not None or not re.fullmatch(PATH_ID_PATTERN, user_id):
        st.metrics.rejected.labels("inbox_ws_refused").inc()
        await websocket.close(code=1008 if refused is None else 1013, reason=refused or "")
        return
    try:
        queue = await hub.join(tenant.tenant_id, user_id)
    except RedisError as exc:
        log.warning("api.inbox_ws_unavailable error=%s", type(exc).__name__)
        await websocket.close(code=1011)
        return
    try:
        await websocket.accept()
        unread = await inbox.unread_count(st.redis, user_id)
        await websocket.send_text(dumps({"type": "unread", "unread": unread}).decode())
        await _serve(st, websocket, user_id, queue)
    except (WebSocketDisconnect, RedisError, RuntimeError) as exc:
        log.debug("api.inbox_ws_closed reason=%s", type(exc).__name__)
    finally:
        await hub.leave(tenant.tenant_id, user_id, queue)


async def _serve(
    st: AppState, websocket: WebSocket, user_id: str, queue: asyncio.Queue[str | None]
) -> None:
    """Send the user's events until the client leaves, the hub ends the socket, or it has been
    idle (no event, no client frame) for `inbox_ws_idle_seconds`."""
    reader = asyncio.create_task(_drain(websocket, queue))
    try:
        while True:
            try:
                async with asyncio.timeout(st.api.inbox_ws_idle_seconds):  # no task, as wait_for
                    data = await queue.get()
            except TimeoutError:
                await websocket.close(code=1000, reason="idle")
                return
            if data is None or reader.done():
                with contextlib.suppress(RuntimeError):
                    await websocket.close(code=1001 if data is None else 1000)
                return
            if data == _ALIVE:
                continue
            await websocket.send_text(data)
            await _pushed(st, user_id, data)
    finally:
        reader.cancel()


async def _pushed(st: AppState, user_id: str, data: Any) -> None:
    """An item pushed over the WebSocket is delivered."""
    with contextlib.suppress(orjson.JSONDecodeError, TypeError, KeyError):
        event = orjson.loads(data)
        if event.get("type") == "item" and isinstance(event.get("item"), dict):
            await _delivered(st, user_id, [event["item"]], "websocket")


_ALIVE = ""  # put in a socket's queue for a client frame: not idle (never an event)


async def _drain(websocket: WebSocket, queue: asyncio.Queue[str | None]) -> None:
    """Read client frames (each one keeps the socket from idling) until it disconnects, then
    end the socket."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while (await websocket.receive())["type"] != "websocket.disconnect":  # text or bytes
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(_ALIVE)
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(None)
