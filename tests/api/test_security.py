"""Rate limits, OTP abuse limits and metrics, and 503 (never 202) when Kafka is down."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.app import create_app
from herald.config import HeraldSettings
from tests.api.conftest import (
    DEVICES_KEY,
    ORDERS_KEY,
    SLOW_KEY,
    RunningApi,
    make_api_settings,
    make_tenants,
    serve,
)


def otp(user: str, **changes: Any) -> dict[str, Any]:
    base = {
        "request_id": f"otp-{uuid.uuid4().hex}",
        "notification_type": "otp_login",
        "recipients": {"user_ids": [user]},
        "params": {"code": "123456"},
    }
    return {**base, **changes}


def with_phone(api: RunningApi, user: str, phone: str) -> None:
    with api.client() as http:
        resp = http.put(f"/v1/users/{user}/contact-points", json={"phone": {"e164": phone}})
        assert resp.status_code == 200, resp.text


def test_tenant_rate_limit_is_429_with_retry_after(api: RunningApi) -> None:
    with api.client(SLOW_KEY) as http:
        codes = [http.get("/v1/users/u-1/inbox/unread-count") for _ in range(8)]
    limited = [r for r in codes if r.status_code == 429]
    assert limited, [r.status_code for r in codes]
    assert limited[0].json()["code"] == "rate_limited"
    assert int(limited[0].headers["retry-after"]) >= 1


def test_otp_limited_per_phone(api: RunningApi) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    with_phone(api, user, f"+4179{uuid.uuid4().int % 10**7:07d}")
    with api.client() as http:
        codes = [http.post("/v1/notifications", json=otp(user)).status_code for _ in range(4)]
        assert codes == [202, 202, 202, 429]  # 3 per phone per window (test settings)
        resp = http.post("/v1/notifications", json=otp(user))
    assert resp.json()["code"] == "otp_rate_limited" and resp.json()["dimension"] == "phone"
    assert int(resp.headers["retry-after"]) > 0
    # the code itself never appears in an error or in the problem
    assert "123456" not in resp.text


def test_a_retried_otp_request_does_not_use_up_the_phone_budget(api: RunningApi) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    with_phone(api, user, f"+4179{uuid.uuid4().int % 10**7:07d}")
    first = otp(user)
    with api.client() as http:
        # the same request_id again and again (client retries): one OTP, one charge
        replies = [http.post("/v1/notifications", json=first) for _ in range(5)]
        assert [r.status_code for r in replies] == [202] * 5
        assert len({r.json()["notification_id"] for r in replies}) == 1
        codes = [http.post("/v1/notifications", json=otp(user)).status_code for _ in range(3)]
    assert codes == [202, 202, 429]  # 3 per phone per window: the retries cost nothing


@pytest.mark.parametrize(("header", "limit"), [("X-End-User-IP", 5), ("X-End-User-Device", 4)])
def test_otp_limited_per_ip_and_device(api: RunningApi, header: str, limit: int) -> None:
    value = f"v-{uuid.uuid4().hex}"
    with api.client(headers={header: value}) as http:
        codes = [
            http.post("/v1/notifications", json=otp(f"u-{uuid.uuid4().hex[:8]}")).status_code
            for _ in range(limit + 1)
        ]
    assert codes == [202] * limit + [429]


def test_otp_to_a_disallowed_prefix_is_refused(api: RunningApi) -> None:
    from herald import keys

    user = f"u-{uuid.uuid4().hex[:8]}"
    # stored before the allow-list existed (written directly to the copy)
    import orjson
    import redis

    client = redis.Redis.from_url(api.settings.redis.url)
    record = {"user_id": user, "devices": [], "phone": {"e164": "+88212345678", "verified": True},
              "email": None, "updated_at": 0, "version": 1}  # fmt: skip
    client.set(keys.contact_points(user), orjson.dumps(record))
    with api.client() as http:
        resp = http.post("/v1/notifications", json=otp(user))
    assert resp.status_code == 422 and resp.json()["code"] == "sms_prefix_not_allowed"


def test_otp_sent_and_verified_metrics(api: RunningApi) -> None:
    with api.client() as http:
        sent = [http.post("/v1/notifications", json=otp(f"u-{uuid.uuid4().hex[:8]}")) for _ in "ab"]
        nid = sent[0].json()["notification_id"]
        assert http.post(f"/v1/otp/{nid}/verified").status_code == 204
        assert http.post(f"/v1/otp/{nid}/verified").status_code == 204  # counted once
        assert http.post(f"/v1/otp/{uuid.uuid4()}/verified").status_code == 404
        metrics = http.get("/metrics").text
    assert 'herald_otp_sent_total{notification_type="otp_login"} 2.0' in metrics
    assert 'herald_otp_verified_total{notification_type="otp_login"} 1.0' in metrics
    assert 'herald_otp_unverified_ratio{notification_type="otp_login"}' in metrics


@pytest.fixture
def api_without_kafka(settings: HeraldSettings) -> Iterator[RunningApi]:
    dead = settings.kafka.model_copy(update={"bootstrap_servers": "127.0.0.1:9"})
    broken = settings.model_copy(update={"kafka": dead})
    app = create_app(broken, api=make_api_settings(ack_timeout_seconds=1.0), tenants=make_tenants())
    for url in serve(app):
        yield RunningApi(url, broken, app)


def test_kafka_down_is_503_never_202(api_without_kafka: RunningApi, api: RunningApi) -> None:
    req = otp("u-x", notification_type="order_shipped", params={"order_id": "1"})
    with api_without_kafka.client() as http:
        resp = http.post("/v1/notifications", json=req)
        assert resp.status_code == 503 and resp.json()["code"] == "kafka_unavailable"
        assert resp.headers["retry-after"] == "1"
        prefs = http.put("/v1/users/u-x/preferences", json={"locale": "en"})
        assert prefs.status_code == 503
    # the failed attempt released its idempotency claim: another body is no conflict
    with api.client() as http:
        again = http.post("/v1/notifications", json={**req, "params": {"order_id": "2"}})
    assert again.status_code == 202


def test_logs_never_hold_codes_phones_or_bodies(
    api: RunningApi, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    user = f"u-{uuid.uuid4().hex[:8]}"
    phone = "+41795550123"
    with_phone(api, user, phone)
    with api.client() as http:
        http.put(f"/v1/users/{user}/contact-points", json={"email": {"address": "zed@example.ch"}})
        assert (
            http.post("/v1/notifications", json=otp(user, params={"code": "987654"})).status_code
            == 202
        )
        for _ in range(4):  # into the per-phone limit: the refusal is logged/counted too
            http.post("/v1/notifications", json=otp(user, params={"code": "987654"}))
    text = caplog.text
    assert "api.contact_points_updated" in text  # events are logged ...
    assert "+41*******23" in text  # ... with the phone masked
    for secret in ("987654", phone, "zed@example.ch"):
        assert secret not in text


def test_redis_down_is_503(settings: HeraldSettings) -> None:
    from herald.config import RedisSettings

    broken = settings.model_copy(update={"redis": RedisSettings(url="redis://127.0.0.1:9/0")})
    app = create_app(broken, api=make_api_settings(), tenants=make_tenants())
    for url in serve(app):
        api = RunningApi(url, broken, app)
        with api.client() as http:
            req = otp("u-1", notification_type="order_shipped", params={"order_id": "1"})
            resp = http.post("/v1/notifications", json=req)
            assert resp.status_code == 503 and resp.json()["code"] == "redis_unavailable"
            assert http.get("/v1/users/u-1/inbox/unread-count").status_code == 503
            assert http.get("/healthz").status_code == 503


def test_a_key_sends_only_the_types_and_segments_it_is_allowed(api: RunningApi) -> None:
    """The orders service's key (types = ["order_shipped"], segments = []) cannot send an OTP
    or a password reset with its own URL, nor target a segment."""
    user = f"u-{uuid.uuid4().hex}"
    with api.client(key=ORDERS_KEY) as http:
        ok = http.post("/v1/notifications", json=_request(user, "order_shipped", order_id="1"))
        otp = http.post("/v1/notifications", json=_request(user, "otp_login", code="123456"))
        reset = http.post("/v1/notifications", json=_request(
            user, "password_reset", reset_url="https://evil.example/r"))  # fmt: skip
        to_all = {**_request(user, "order_shipped", order_id="1"),
                  "recipients": {"segment_id": "all"}}  # fmt: skip
        segment = http.post("/v1/notifications", json=to_all)
    assert ok.status_code == 202, ok.text
    for resp in (otp, reset):
        assert resp.status_code == 403 and resp.json()["code"] == "type_not_allowed", resp.text
    assert segment.status_code == 403 and segment.json()["code"] == "segment_not_allowed"


def _request(user: str, notification_type: str, **params: str) -> dict[str, Any]:
    return {"request_id": f"r-{uuid.uuid4().hex}", "notification_type": notification_type,
            "recipients": {"user_ids": [user]}, "params": params}  # fmt: skip


def test_verified_needs_its_scope_and_whole_addresses_need_pii_read(api: RunningApi) -> None:
    """A key with devices:write alone cannot mark a phone verified (which OTPs trust), and
    reads phone numbers and email addresses masked."""
    user = f"u-{uuid.uuid4().hex}"
    phone = {"phone": {"e164": "+41791234567", "verified": True}}
    with api.client(key=DEVICES_KEY) as http:
        refused = http.put(f"/v1/users/{user}/contact-points", json=phone)
        plain = {"phone": {"e164": "+41791234567"}, "email": {"address": "alice@example.com"}}
        unverified = http.put(f"/v1/users/{user}/contact-points", json=plain)
        masked = http.get(f"/v1/users/{user}/contact-points").json()
    with api.client() as http:  # every scope
        assert http.put(f"/v1/users/{user}/contact-points", json=phone).status_code == 200
        whole = http.get(f"/v1/users/{user}/contact-points").json()
    assert refused.status_code == 403 and refused.json()["scope"] == "contact_points:verify"
    assert unverified.status_code == 200, unverified.text
    assert masked["phone"] == {"e164": "+41*******67", "verified": False}
    assert masked["email"]["address"] == "a***@example.com"
    assert whole["phone"] == {"e164": "+41791234567", "verified": True}
    assert whole["email"]["address"] == "alice@example.com"


def test_only_the_verify_scope_registers_a_device_that_may_receive_codes(
    api: RunningApi,
) -> None:
    """A key with devices:write alone registers push tokens as unverified: OTP codes (a
    `secret` type) never go to them, so such a key cannot point a user's codes at its own
    token. Marking a device verified takes contact_points:verify."""
    user = f"u-{uuid.uuid4().hex}"
    token = {"user_id": user, "platform": "apns", "token": "ab" * 32}
    with api.client(key=DEVICES_KEY) as http:
        refused = http.post("/v1/devices", json={**token, "verified": True})
        planted = http.post("/v1/devices", json=token)
    with api.client() as http:  # every scope
        own = {**token, "token": "cd" * 32, "verified": True}
        assert http.post("/v1/devices", json=own).status_code == 201
        devices = http.get(f"/v1/users/{user}/contact-points").json()["devices"]
    assert refused.status_code == 403 and refused.json()["scope"] == "contact_points:verify"
    assert planted.status_code == 201, planted.text
    assert [(d["token_hint"], d["verified"]) for d in devices] == [
        ("ababab…", False),
        ("cdcdcd…", True),
    ]
