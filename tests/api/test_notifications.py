"""POST /v1/notifications and GET /v1/notifications/{id} over real HTTP, Kafka and Redis."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from herald import ids
from tests.api.conftest import RunningApi


def body(**changes: Any) -> dict[str, Any]:
    """A valid request with a fresh request_id (Redis outlives each test's topics)."""
    base = {
        "request_id": f"order-{uuid.uuid4().hex[:12]}",
        "notification_type": "order_shipped",
        "recipients": {"user_ids": ["u-1", "u-2"]},
        "params": {"order_id": "42"},
    }
    return {**base, **changes}


def test_accept_writes_to_the_class_topic_before_202(api: RunningApi) -> None:
    req = body()
    with api.client() as http:
        resp = http.post("/v1/notifications", json=req)
    assert resp.status_code == 202, resp.text
    out = resp.json()
    assert out["notification_id"] == ids.notification_id("acme", req["request_id"])
    datetime.fromisoformat(out["accepted_at"])
    records = api.read_topic("herald.requests.normal", 1)
    key, record = records[0]
    assert key == out["notification_id"]
    assert record["traffic_class"] == "normal" and record["tenant_id"] == "acme"
    assert record["recipients"]["user_ids"] == ["u-1", "u-2"] and record["source"] == "api"
    # the template version is pinned at accept: the catalog's current one, as none was named
    current = api.app.state.herald.catalog.get("order_shipped").template_version
    assert record["template_version"] == current >= 1


def test_a_traceparent_header_travels_on_the_request_record(api: RunningApi) -> None:
    """A valid W3C traceparent is kept on the record; an invalid one is dropped, never refused
    (herald/tracing.py)."""
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sent: dict[str, str | None] = {}  # notification id -> the traceparent it should carry
    with api.client() as http:
        for value, kept in ((trace, trace), ("00-garbage", None)):
            resp = http.post("/v1/notifications", json=body(), headers={"traceparent": value})
            assert resp.status_code == 202, resp.text
            sent[resp.json()["notification_id"]] = kept
    records = api.read_topic("herald.requests.normal", 2)  # two partitions: in any order
    assert {key: record["traceparent"] for key, record in records} == sent


def test_class_comes_from_the_catalog(api: RunningApi) -> None:
    with api.client() as http:
        resp = http.post(
            "/v1/notifications",
            json=body(notification_type="security_alert", params={"event": "new login"},
                      request_id=f"sec-{uuid.uuid4().hex}"),
        )  # fmt: skip
    assert resp.status_code == 202, resp.text
    [(_, record)] = api.read_topic("herald.requests.transactional", 1)
    assert record["notification_type"] == "security_alert"


def test_idempotent_replay_and_conflict(api: RunningApi) -> None:
    req = body()
    with api.client() as http:
        first = http.post("/v1/notifications", json=req)
        # same body under the other key name: same notification, same accepted_at
        again = http.post(
            "/v1/notifications",
            json={**{k: v for k, v in req.items() if k != "request_id"},
                  "idempotency_key": req["request_id"]},
        )  # fmt: skip
        other = http.post("/v1/notifications", json={**req, "params": {"order_id": "43"}})
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json()
    assert other.status_code == 409
    problem = other.json()
    assert other.headers["content-type"].startswith("application/problem+json")
    assert problem["code"] == "idempotency_conflict"
    assert problem["notification_id"] == first.json()["notification_id"]
    # one record only: the replay did not produce again
    assert len(api.read_topic("herald.requests.normal", 1, settle=1.5)) == 1


def test_status_shows_accepted_then_layers(api: RunningApi) -> None:
    with api.client() as http:
        nid = http.post("/v1/notifications", json=body()).json()["notification_id"]
        status = http.get(f"/v1/notifications/{nid}").json()
        assert status["state"] == "ACCEPTED" and status["deliveries"] == []
        assert status["recipients"] == "users:2"
        from api.status import put_delivery_status, status_entry

        client = redis.Redis.from_url(api.settings.redis.url)
        now = datetime.now(UTC)
        put_delivery_status(client, nid, "d-push", status_entry(
            state="PROVIDER_ACCEPTED", channel="push", user_id="u-1", updated_at=now,
            provider="apns", generation=1))  # fmt: skip
        put_delivery_status(client, nid, "d-email", status_entry(
            state="SUPPRESSED", channel="email", user_id="u-2", updated_at=now,
            reason="opt_out_category"))  # fmt: skip
        status = http.get(f"/v1/notifications/{nid}").json()
    by_id = {d["delivery_id"]: d for d in status["deliveries"]}
    assert by_id["d-push"]["layers"] == {
        "accepted": "yes", "provider_accepted": "yes", "delivered": "unknown", "read": "pending"
    }  # fmt: skip
    assert (by_id["d-push"]["generation"], by_id["d-email"]["generation"]) == (1, 0)
    assert by_id["d-email"]["status_reason"] == "opt_out_category"
    assert by_id["d-email"]["layers"]["delivered"] == "no"
    assert status["summary"] == {"PROVIDER_ACCEPTED": 1, "SUPPRESSED": 1}


def test_status_is_per_tenant(api: RunningApi) -> None:
    from tests.api.conftest import READ_KEY

    with api.client() as http:
        nid = http.post("/v1/notifications", json=body()).json()["notification_id"]
    with api.client(READ_KEY) as other:
        resp = other.get(f"/v1/notifications/{nid}")
    assert resp.status_code == 404 and resp.json()["code"] == "notification_not_found"


def test_segment_and_scheduled_request(api: RunningApi) -> None:
    send_at = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    params = {"headline": "Sale", "offer": "-20%", "cta_url": "https://x.test/s"}
    req = body(
        request_id=f"camp-{uuid.uuid4().hex}",
        notification_type="marketing_campaign",
        recipients={"segment_id": "seg-9"},
        send_at=send_at,
        params=params,
    )
    with api.client() as http:
        resp = http.post("/v1/notifications", json=req)
    assert resp.status_code == 202, resp.text
    [(_, record)] = api.read_topic("herald.requests.bulk", 1)
    assert record["recipients"] == {"user_ids": [], "segment_id": "seg-9"}
    assert record["send_at"] is not None
