"""Inbox: items in Redis (bounded, idempotent), paging, read marks, WebSocket pushes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
import redis
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from api.app import create_app
from herald.config import HeraldSettings
from herald.inbox import add_inbox_item, inbox_item
from tests.api.conftest import (
    FULL_KEY,
    READ_KEY,
    RunningApi,
    make_api_settings,
    make_tenants,
    serve,
)
from tests.conftest import mark_users_restored


def client(api: RunningApi) -> redis.Redis:
    return redis.Redis.from_url(api.settings.redis.url)


def fill(api: RunningApi, user: str, n: int, max_items: int = 500) -> list[str]:
    r = client(api)
    ids = []
    for i in range(n):
        item_id = f"d-{i:03d}"
        # two items per millisecond: paging must handle equal scores
        add_inbox_item(r, user, inbox_item(item_id, f"t{i}", f"b{i}", 1_000 + i // 2), max_items)
        ids.append(item_id)
    return ids


def test_redis_runs_with_aof(api: RunningApi) -> None:
    """In-app messages must survive a Redis restart: the embedded Redis uses AOF."""
    config = client(api).config_get("append*")
    assert config["appendonly"] == "yes" and config["appendfsync"] == "everysec"


def test_add_is_idempotent_and_bounded(api: RunningApi) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    r = client(api)
    assert add_inbox_item(r, user, inbox_item("a", "t", "b", 1), max_items=3) == 1
    assert add_inbox_item(r, user, inbox_item("a", "t", "b", 1), max_items=3) == -1
    for i in range(5):
        add_inbox_item(r, user, inbox_item(f"x{i}", "t", "b", 10 + i), max_items=3)
    with api.client() as http:
        page = http.get(f"/v1/users/{user}/inbox").json()
    assert [i["item_id"] for i in page["items"]] == ["x4", "x3", "x2"] and page["unread"] == 3


def test_paging_newest_first(api: RunningApi) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    ids = fill(api, user, 25)
    seen: list[str] = []
    cursor = None
    with api.client() as http:
        while True:
            params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
            page = http.get(f"/v1/users/{user}/inbox", params=params).json()
            seen += [i["item_id"] for i in page["items"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
        bad = http.get(f"/v1/users/{user}/inbox", params={"cursor": "garbage"})
    assert seen == sorted(ids, reverse=True)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cursor"


def test_mark_read_and_unread_count(api: RunningApi) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    fill(api, user, 4)
    with api.client() as http:
        assert http.get(f"/v1/users/{user}/inbox/unread-count").json() == {"unread": 4}
        assert http.post(f"/v1/users/{user}/inbox/d-001/read").json() == {"unread": 3}
        assert http.post(f"/v1/users/{user}/inbox/d-001/read").json() == {"unread": 3}
        assert http.post(f"/v1/users/{user}/inbox/nope/read").status_code == 404
        items = http.get(f"/v1/users/{user}/inbox").json()["items"]
        assert {i["item_id"]: i["read"] for i in items}["d-001"] is True
        assert http.post(f"/v1/users/{user}/inbox/read-all").json() == {"unread": 0}
        assert http.get(f"/v1/users/{user}/inbox/unread-count").json() == {"unread": 0}


def test_websocket_pushes_items_and_counts(api: RunningApi) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    ws_url = api.url.replace("http://", "ws://") + f"/v1/users/{user}/inbox/ws"
    with connect(ws_url, additional_headers={"X-API-Key": FULL_KEY}, open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5)) == {"type": "unread", "unread": 0}  # subscribed
        add_inbox_item(client(api), user, inbox_item("d-1", "Hi", "there", 5))
        pushed = json.loads(ws.recv(timeout=5))
        assert pushed["type"] == "item" and pushed["unread"] == 1
        assert pushed["item"]["item_id"] == "d-1" and pushed["item"]["title"] == "Hi"
        with api.client() as http:
            http.post(f"/v1/users/{user}/inbox/d-1/read")
        assert json.loads(ws.recv(timeout=5)) == {"type": "unread", "unread": 0}


def test_websocket_needs_a_key_with_inbox_scope(api: RunningApi) -> None:
    ws_url = api.url.replace("http://", "ws://") + "/v1/users/u-1/inbox/ws"
    for headers in ({}, {"X-API-Key": READ_KEY}):
        try:
            with connect(ws_url, additional_headers=headers, open_timeout=5) as ws:
                ws.recv(timeout=2)
            raise AssertionError("connection was accepted")
        except Exception as exc:  # rejected handshake or immediate close
            assert "accepted" not in str(exc)


def test_fetched_pushed_and_read_items_become_delivered_and_read_events(api: RunningApi) -> None:
    """A listed page delivers its items once; an item pushed over the WebSocket is delivered;
    marking read gives READ (after DELIVERED for an item no app had received)."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    r = client(api)
    for i in range(3):
        item = inbox_item(f"d-{i}", "t", "b", 10 + i, notification_id="n-1",
                          notification_type="inbox_announcement", tenant_id="acme",
                          traffic_class="bulk")  # fmt: skip
        add_inbox_item(r, user, item)
    with api.client() as http:
        http.get(f"/v1/users/{user}/inbox", params={"limit": 2})  # d-2, d-1 delivered
        http.get(f"/v1/users/{user}/inbox", params={"limit": 2})  # nothing new
        http.post(f"/v1/users/{user}/inbox/d-0/read")  # not fetched: DELIVERED, then READ
        http.post(f"/v1/users/{user}/inbox/d-0/read")  # already read: nothing
        http.post(f"/v1/users/{user}/inbox/read-all")  # d-2, d-1: READ
    ws_url = api.url.replace("http://", "ws://") + f"/v1/users/{user}/inbox/ws"
    with connect(ws_url, additional_headers={"X-API-Key": FULL_KEY}, open_timeout=5) as ws:
        json.loads(ws.recv(timeout=5))
        time.sleep(0.2)
        add_inbox_item(r, user, inbox_item("d-3", "t", "b", 20, notification_id="n-1"))
        assert json.loads(ws.recv(timeout=5))["item"]["item_id"] == "d-3"
        time.sleep(0.5)
    events = [e for _, e in api.read_topic("herald.delivery-events", 7, settle=1.0)]
    got = sorted((e["delivery_id"], e["state"], e["attributes"]["via"]) for e in events)
    assert got == [
        ("d-0", "DELIVERED", "read"),
        ("d-0", "READ", "read"),
        ("d-1", "DELIVERED", "fetch"),
        ("d-1", "READ", "read"),
        ("d-2", "DELIVERED", "fetch"),
        ("d-2", "READ", "read"),
        ("d-3", "DELIVERED", "websocket"),
    ]
    first = next(e for e in events if e["delivery_id"] == "d-1")
    assert (first["channel"], first["tenant_id"], first["traffic_class"], first["user_id"]) == (
        "inapp",
        "acme",
        "bulk",
        user,
    )


def _refused(ws_url: str, **headers: str) -> bool:
    try:
        with connect(ws_url, additional_headers=headers, open_timeout=5) as ws:
            ws.recv(timeout=2)
    except Exception as exc:  # rejected handshake or immediate close
        return "accepted" not in str(exc)
    return False


def test_an_end_users_inbox_token_opens_that_inbox_only(api: RunningApi) -> None:
    """The backend mints a short-lived token for one user (scope inbox:token); the user's app
    reads and marks its inbox with it, and opens the WebSocket with `?token=`; the token opens
    no other inbox, mints nothing, and a tenant key is never taken from a URL."""
    user, other = f"u-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"
    fill(api, user, 2)
    with api.client() as http:
        minted = http.post(f"/v1/users/{user}/inbox/tokens")
        not_allowed = http.post(f"/v1/users/{user}/inbox/tokens", headers={"X-API-Key": READ_KEY})
    assert minted.status_code == 201, minted.text
    assert not_allowed.status_code == 403
    token = minted.json()["token"]
    assert minted.json()["user_id"] == user and token.startswith("hu_")
    bearer = {"Authorization": f"Bearer {token}"}
    with api.client(key=None) as http:
        page = http.get(f"/v1/users/{user}/inbox", headers=bearer)
        read = http.post(f"/v1/users/{user}/inbox/d-000/read", headers=bearer)
        foreign = http.get(f"/v1/users/{other}/inbox", headers=bearer)
        mint = http.post(f"/v1/users/{user}/inbox/tokens", headers=bearer)
        forged = http.get(f"/v1/users/{user}/inbox", headers={"Authorization": f"Bearer {token}x"})
        in_url = http.get(f"/v1/users/{user}/inbox", params={"api_key": FULL_KEY})
    assert page.status_code == 200 and len(page.json()["items"]) == 2
    assert read.json() == {"unread": 1}
    assert foreign.status_code == 403 and foreign.json()["code"] == "other_users_inbox"
    assert mint.status_code == 401  # an end user's token is no tenant key
    assert forged.status_code == 401 and forged.json()["code"] == "invalid_user_token"
    assert in_url.status_code == 401
    ws = api.url.replace("http://", "ws://") + "/v1/users/{}/inbox/ws"
    with connect(ws.format(user) + f"?token={token}", open_timeout=5) as sock:
        assert json.loads(sock.recv(timeout=5)) == {"type": "unread", "unread": 1}
    assert _refused(ws.format(other) + f"?token={token}")
    assert _refused(ws.format(user) + f"?api_key={FULL_KEY}")
    assert _refused(ws.format(user) + f"?token={FULL_KEY}")


def test_an_expired_inbox_token_is_refused(api: RunningApi) -> None:
    from api.auth import mint_user_token

    user = f"u-{uuid.uuid4().hex[:8]}"
    secret = api.settings.links.secret_bytes()
    expired = mint_user_token(secret, "acme", user, int(time.time()) - 1)
    live = mint_user_token(secret, "acme", user, int(time.time()) + 60)
    gone_tenant = mint_user_token(secret, "no-such-tenant", user, int(time.time()) + 60)
    with api.client(key=None) as http:
        codes = [http.get(f"/v1/users/{user}/inbox/unread-count",
                          headers={"Authorization": f"Bearer {t}"}).status_code
                 for t in (expired, live, gone_tenant)]  # fmt: skip
    assert codes == [401, 200, 401]


def test_more_sockets_than_redis_connections_and_a_cap_per_user(api: RunningApi) -> None:
    """600 live sockets on one API process (each once held one of the 256 pooled Redis
    connections: the 260th was an HTTP 500) share one subscription; an item reaches its user's
    sockets only; a user's 9th socket is refused (inbox_ws_per_user = 8)."""
    base = api.url.replace("http://", "ws://") + "/v1/users/{}/inbox/ws"
    users = [f"u-{uuid.uuid4().hex[:8]}" for _ in range(75)]
    headers = {"X-API-Key": FULL_KEY}

    async def scenario() -> tuple[list[str], BaseException | None]:
        async def open_one(user: str) -> Any:
            sock = await ws_connect(base.format(user), additional_headers=headers)
            assert json.loads(await sock.recv()) == {"type": "unread", "unread": 0}
            return sock

        socks = []
        for user in users:  # 8 each: the cap
            socks += await asyncio.gather(*(open_one(user) for _ in range(8)))
        refused: BaseException | None = None
        try:
            extra = await open_one(users[0])
            await extra.recv()
        except Exception as exc:  # closed at the handshake or right after it
            refused = exc
        r = client(api)
        add_inbox_item(r, users[3], inbox_item("d-1", "Hi", "there", 5))
        for user in users:  # after d-1 on the one subscription: each user's own item
            if user != users[3]:
                add_inbox_item(r, user, inbox_item(f"own-{user}", "Hi", "there", 6))
        first = await asyncio.gather(*(s.recv() for s in socks))
        for sock in socks:
            await sock.close()
        return [json.loads(f)["item"]["item_id"] for f in first], refused

    first, refused = asyncio.run(scenario())
    expected = [("d-1" if u == users[3] else f"own-{u}") for u in users for _ in range(8)]
    assert first == expected  # d-1 reached its user's 8 sockets, and no other socket
    assert refused is not None and "403" in str(refused), refused  # closed at the handshake


def test_an_idle_socket_is_closed_and_client_frames_keep_it_open(settings: HeraldSettings) -> None:
    """inbox_ws_idle_seconds (1 s here): a socket whose client sends a frame (text or binary)
    more often stays open; once the frames stop it is closed with "idle"."""
    mark_users_restored(settings.redis.url, settings.kafka.topic_prefix)
    app = create_app(settings, api=make_api_settings(inbox_ws_idle_seconds=1.0),
                     tenants=make_tenants())  # fmt: skip
    for url in serve(app):
        ws_url = url.replace("http://", "ws://") + f"/v1/users/u-{uuid.uuid4().hex[:8]}/inbox/ws"
        with connect(ws_url, additional_headers={"X-API-Key": FULL_KEY}, open_timeout=5) as ws:
            assert json.loads(ws.recv(timeout=5))["type"] == "unread"
            started = time.monotonic()
            while time.monotonic() - started < 2.5:  # 2.5 idle periods: a send to a closed
                # socket would raise here
                ws.send(b"ping" if int(time.monotonic() * 4) % 2 else "ping")
                time.sleep(0.25)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.reason == "idle"
