"""Cancel, pause and resume through the API (api/controls.py, herald.controls): the control on
the notification's header, the answer waiting for dispatch's send leases, parked deliveries
released to their topic, a cancel that is final, and the progress in the status."""

from __future__ import annotations

import time

import redis

from herald.controls import parked_entry, parked_key
from herald.status_keys import StatusUpdate, header_key, write_statuses
from schemas.registry import make_registry
from sinks.kafka import topic_serializer
from tests.api.conftest import FULL_KEY, ORDERS_KEY, READ_KEY, RunningApi
from tests.api.test_notifications import body
from tests.sinks.dispatch_helpers import delivery, now


def _accepted(api: RunningApi, key: str = FULL_KEY) -> str:
    with api.client(key) as http:
        resp = http.post("/v1/notifications", json=body())
    assert resp.status_code == 202, resp.text
    return str(resp.json()["notification_id"])


def test_pause_resume_cancel_and_a_cancel_is_final(api: RunningApi) -> None:
    nid = _accepted(api)
    with api.client() as http:
        paused = http.post(f"/v1/notifications/{nid}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json() == {"notification_id": nid, "control": "paused",
                                 "previous": "running", "settled": True, "released": 0}  # fmt: skip
        assert http.get(f"/v1/notifications/{nid}").json()["progress"]["control"] == "paused"
        resumed = http.post(f"/v1/notifications/{nid}/resume").json()
        assert (resumed["control"], resumed["previous"]) == ("running", "paused")
        cancelled = http.post(f"/v1/notifications/{nid}/cancel").json()
        assert (cancelled["control"], cancelled["settled"]) == ("cancelled", True)
        for action in ("pause", "resume"):
            refused = http.post(f"/v1/notifications/{nid}/{action}")
            assert refused.status_code == 409
            assert refused.json()["code"] == "notification_cancelled"
        again = http.post(f"/v1/notifications/{nid}/cancel")
        assert again.status_code == 200 and again.json()["previous"] == "cancelled"
        assert http.get(f"/v1/notifications/{nid}").json()["progress"]["control"] == "cancelled"


def test_only_the_owner_with_write_scope_and_authority_may_control(api: RunningApi) -> None:
    nid = _accepted(api)  # an order_shipped notification of tenant acme
    with api.client(READ_KEY) as other:  # another tenant, read-only
        assert other.post(f"/v1/notifications/{nid}/cancel").status_code in (403, 404)
    with api.client() as http:
        missing = http.post("/v1/notifications/no-such-notification/cancel")
        assert missing.status_code == 404
        assert missing.json()["code"] == "notification_not_found"
    own = _accepted(api, ORDERS_KEY)  # tenant "orders", a key that may send order_shipped
    with api.client(ORDERS_KEY) as orders:
        assert orders.post(f"/v1/notifications/{nid}/pause").status_code == 404  # acme's
        assert orders.post(f"/v1/notifications/{own}/pause").status_code == 200


def test_a_pause_is_answered_once_no_dispatch_worker_is_sending(api: RunningApi) -> None:
    nid = _accepted(api)
    client = redis.Redis.from_url(api.settings.redis.url)
    # a dispatch worker checked the control and is sending for another 0.6 s
    client.hset(header_key(nid), "lease:worker-1", int(time.time() * 1000) + 600)
    client.hset(header_key(nid), "lease:worker-dead", int(time.time() * 1000) - 1)  # lapsed
    started = time.monotonic()
    with api.client() as http:
        answer = http.post(f"/v1/notifications/{nid}/pause").json()
    assert answer["settled"] is True
    assert time.monotonic() - started >= 0.5  # it waited for the live lease only
    client.close()


def test_resume_puts_parked_deliveries_back_on_their_topic(api: RunningApi) -> None:
    nid = _accepted(api)
    settings = api.settings
    parked = delivery(notification_id=nid)
    topic = "herald.deliveries.push.transactional"
    value = topic_serializer(settings.kafka, make_registry(settings.registry), topic)(parked)
    client = redis.Redis.from_url(settings.redis.url)
    client.rpush(parked_key(nid), parked_entry(topic, parked["delivery_id"], value))
    with api.client() as http:
        http.post(f"/v1/notifications/{nid}/pause")
        answer = http.post(f"/v1/notifications/{nid}/resume").json()
    assert answer["released"] == 1
    assert client.llen(parked_key(nid)) == 0
    [(key, record)] = api.read_topic(topic, 1, settle=0.5)
    assert key == parked["delivery_id"] and record["notification_id"] == nid
    client.close()


def test_status_counts_every_delivery_and_shows_progress(api: RunningApi) -> None:
    nid = _accepted(api)
    client = redis.Redis.from_url(api.settings.redis.url)
    at = now()

    def update(did: str, state: str) -> StatusUpdate:
        return StatusUpdate(nid, did, state, "push", f"u-{did}", at)

    write_statuses(client, [update(f"d{i}", "PLANNED") for i in range(300)])
    write_statuses(client, [update(f"d{i}", "PROVIDER_ACCEPTED") for i in range(120)])
    write_statuses(client, [update(f"d{i}", "SUPPRESSED") for i in range(250, 300)])
    write_statuses(client, [update("d0", "PROVIDER_ACCEPTED")])  # a repeat changes no count
    with api.client() as http:
        status = http.get(f"/v1/notifications/{nid}", params={"limit": 10}).json()
    # the summary counts the whole notification, not the page
    assert status["summary"] == {"PLANNED": 130, "PROVIDER_ACCEPTED": 120, "SUPPRESSED": 50}
    assert status["progress"] == {
        "control": "running", "users_total": 2, "users_planned": None, "deliveries": 300,
        "sent": 120, "not_sent": 50, "remaining": 130,
    }  # fmt: skip
    client.close()
