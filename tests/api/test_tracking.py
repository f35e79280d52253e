"""Open pixel and signed click redirect: events emitted, tampering refused, no open redirect."""

from __future__ import annotations

from datetime import UTC, datetime

import redis

from herald import ids
from herald.links import click_url, open_pixel_url, push_opened_url
from herald.status_keys import status_entry, status_key
from tests.api.conftest import RunningApi

DELIVERY = {"delivery_id": "d-1", "notification_id": "n-1", "user_id": "u-1",
            "tenant_id": "acme", "notification_type": "order_shipped",
            "traffic_class": "normal"}  # fmt: skip


def secret(api: RunningApi) -> bytes:
    return api.app.state.herald.settings.links.secret_bytes()


def test_open_pixel_emits_opened(api: RunningApi) -> None:
    url = open_pixel_url(api.url, secret(api), DELIVERY)
    with api.client(key=None) as http:
        resp = http.get(url.removeprefix(api.url))
        again = http.get(url.removeprefix(api.url))
    assert resp.status_code == again.status_code == 200
    assert resp.headers["content-type"] == "image/gif" and resp.content.startswith(b"GIF89a")
    events = api.read_topic("herald.delivery-events", 2)
    assert {e["state"] for _, e in events} == {"OPENED"}
    assert events[0][1]["event_id"] == events[1][1]["event_id"]  # repeated opens collapse
    assert events[0][0] == "d-1" and events[0][1]["channel"] == "email"
    assert events[0][1]["generation"] == 0  # no hot status: generation 0, the plain event id
    assert events[0][1]["event_id"] == ids.event_id("d-1", "OPENED", 0)


def test_opens_and_clicks_belong_to_the_latest_generation(api: RunningApi) -> None:
    """After a DLQ replay (generation 1 in the hot status) the mail read is the replay's."""
    delivery = {**DELIVERY, "delivery_id": "d-gen", "notification_id": "n-tracking-gen"}
    now = datetime.now(UTC)
    entry = status_entry(state="DELIVERED", channel="email", user_id="u-1", updated_at=now,
                         provider="sendgrid", generation=1)  # fmt: skip
    client = redis.Redis.from_url(api.settings.redis.url)
    client.hset(status_key("n-tracking-gen"), "d-gen", entry)
    target = "https://shop.example/a"
    with api.client(key=None, follow_redirects=False) as http:
        assert http.get(open_pixel_url("", secret(api), delivery)).status_code == 200
        assert http.get(click_url("", secret(api), delivery, target)).status_code == 302
    events = {e["state"]: e for _, e in api.read_topic("herald.delivery-events", 2)}
    assert {s: e["generation"] for s, e in events.items()} == {"OPENED": 1, "CLICKED": 1}
    assert events["OPENED"]["event_id"] == ids.event_id("d-gen", "OPENED", 0, "", 1)
    assert events["OPENED"]["event_id"] != ids.event_id("d-gen", "OPENED", 0)


def test_click_redirects_to_the_signed_url_only(api: RunningApi) -> None:
    target = "https://shop.example/orders/42?utm=mail"
    url = click_url(api.url, secret(api), DELIVERY, target)
    path = url.removeprefix(api.url)
    body, mac = path.removeprefix("/t/c/").split(".")
    with api.client(key=None, follow_redirects=False) as http:
        resp = http.get(path)
        tampered = http.get(f"/t/c/{body[:-2]}xx.{mac}")
        swapped = http.get(f"/t/c/{body}.{mac[:-3]}AAA")
        as_pixel = http.get(f"/t/o/{body}.{mac}.gif")  # a click token is no open token
        garbage = http.get("/t/c/not-a-token")
    assert resp.status_code == 302 and resp.headers["location"] == target
    for bad in (tampered, swapped, as_pixel, garbage):
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_tracking_token"
        assert "location" not in bad.headers
    [(_, event)] = api.read_topic("herald.delivery-events", 1)
    assert event["state"] == "CLICKED" and event["attributes"]["link_host"] == "shop.example"


def test_unsafe_targets_cannot_be_signed(api: RunningApi) -> None:
    import pytest

    from herald.links import BadToken

    for target in ("javascript:alert(1)", "//evil.example", "/relative"):
        with pytest.raises(BadToken):
            click_url(api.url, secret(api), DELIVERY, target)


def test_push_opened_is_read(api: RunningApi) -> None:
    delivery = {**DELIVERY, "delivery_id": "d-push", "notification_type": "new_follower"}
    url = push_opened_url(api.url, secret(api), delivery).removeprefix(api.url)
    with api.client(key=None) as http:
        assert http.post(url).status_code == 204
        assert http.post(url).status_code == 204  # the app reports twice: one event
        as_pixel = http.post(url.replace("/t/p/", "/t/p/x"))
    assert as_pixel.status_code == 400
    events = api.read_topic("herald.delivery-events", 2)
    assert {(e["state"], e["channel"], e["attributes"]["via"]) for _, e in events} == {
        ("READ", "push", "opened")
    }
    assert events[0][1]["event_id"] == events[1][1]["event_id"]
