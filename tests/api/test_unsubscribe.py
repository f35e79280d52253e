"""One-click unsubscribe (RFC 8058): the signed URL of a marketing email records the opt-out."""

from __future__ import annotations

import orjson
import redis

from herald import keys
from herald.links import open_pixel_url, unsubscribe_url
from tests.api.conftest import RunningApi


def _url(api: RunningApi, user: str, entry: str = "marketing:email") -> str:
    secret = api.app.state.herald.settings.links.secret_bytes()
    return unsubscribe_url(api.url, secret, user, entry).removeprefix(api.url)


def test_one_click_post_records_the_opt_out_once(api: RunningApi) -> None:
    client = redis.Redis.from_url(api.settings.redis.url)
    client.set(keys.users_restored(api.settings.kafka.topic_prefix), 1)  # copies hold every user
    with api.client() as http:
        kept = {"quiet_hours": {"start": "22:00", "end": "07:00"}, "timezone": "Europe/Berlin"}
        assert http.put("/v1/users/ann/preferences", json=kept).status_code == 200
    path = _url(api, "ann")
    with api.client(key=None) as http:  # the mail client has no API key: the token is enough
        page = http.get(path)  # a link scanner fetching the URL records nothing
        assert page.status_code == 200 and '<form method="post">' in page.text
        assert orjson.loads(client.get(keys.prefs("ann")))["category_channel_opt_out"] == []
        one_click = {"content-type": "application/x-www-form-urlencoded"}
        first = http.post(path, content=b"List-Unsubscribe=One-Click", headers=one_click)
        again = http.post(path, content=b"List-Unsubscribe=One-Click", headers=one_click)
        fresh = http.post(_url(api, "bob"), content=b"List-Unsubscribe=One-Click",
                          headers=one_click)  # fmt: skip
    assert first.status_code == again.status_code == fresh.status_code == 200
    assert "Unsubscribed" in first.text
    with api.client() as http:
        ann = http.get("/v1/users/ann/preferences").json()
        bob = http.get("/v1/users/bob/preferences").json()
    assert ann["category_channel_opt_out"] == ["marketing:email"]
    assert ann["quiet_hours"] == {"start": "22:00", "end": "07:00"}  # the rest is kept
    assert ann["timezone"] == "Europe/Berlin"
    assert bob["category_channel_opt_out"] == ["marketing:email"] and not bob["global_opt_out"]
    # the PUT, the opt-out (not its repeat) and bob's opt-out, each acked on the changelog
    records = api.read_topic("herald.preferences", 3, settle=1.0)
    by_version = sorted((r["version"], k, r["category_channel_opt_out"]) for k, r in records)
    assert [(k, entries) for _v, k, entries in by_version if k == "ann"] == [
        ("ann", []), ("ann", ["marketing:email"])
    ]  # fmt: skip
    assert [(k, entries) for _v, k, entries in by_version if k == "bob"] == [
        ("bob", ["marketing:email"])
    ]
    assert max(v for v, k, _e in by_version if k == "ann") == ann["version"]
    client.close()


def test_a_bad_token_is_refused_and_records_nothing(api: RunningApi) -> None:
    path = _url(api, "cat")
    body, mac = path.removeprefix("/v1/unsubscribe/").split(".")
    secret = api.app.state.herald.settings.links.secret_bytes()
    pixel = open_pixel_url(
        "", secret, {"delivery_id": "d", "notification_id": "n", "user_id": "cat"}
    )
    pixel_token = pixel.removeprefix("/t/o/").removesuffix(".gif")
    with api.client(key=None) as http:
        for token in (f"{body}x.{mac}", f"{body}.{mac[:-3]}AAA", "garbage", pixel_token):
            resp = http.post(f"/v1/unsubscribe/{token}")
            assert resp.status_code == 400, resp.text
            assert resp.json()["code"] == "invalid_unsubscribe_token"
    with api.client() as http:
        assert http.get("/v1/users/cat/preferences").status_code == 404
