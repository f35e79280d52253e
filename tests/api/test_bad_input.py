"""Bad input over HTTP: a clear problem+json (code + field path), nothing lost, nothing crashes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest

from tests.api.conftest import READ_KEY, RunningApi


def body(**changes: Any) -> dict[str, Any]:
    base = {
        "request_id": f"r-{uuid.uuid4().hex}",
        "notification_type": "order_shipped",
        "recipients": {"user_ids": ["u-1"]},
        "params": {"order_id": "42"},
    }
    return {**base, **changes}


def problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    data: dict[str, Any] = resp.json()
    assert data["code"] == code and data["status"] == status and data["type"].endswith(code)
    return data


def test_malformed_json(api: RunningApi) -> None:
    with api.client() as http:
        resp = http.post(
            "/v1/notifications", content=b'{"request_id": "x",',
            headers={"content-type": "application/json"},
        )  # fmt: skip
    problem(resp, 400, "malformed_json")


def test_wrong_types_name_the_field(api: RunningApi) -> None:
    with api.client() as http:
        resp = http.post("/v1/notifications", json=body(template_version="two", params={"n": 1}))
    data = problem(resp, 422, "validation_error")
    locs = {tuple(e["loc"]) for e in data["errors"]}
    assert ("body", "template_version") in locs and ("body", "params", "n") in locs
    assert all(set(e) == {"loc", "code", "msg"} for e in data["errors"])


def test_oversized_body_is_413_before_parsing(api: RunningApi) -> None:
    huge = body(params={f"k{i}": "x" * 1900 for i in range(50)})
    with api.client() as http:
        resp = http.post("/v1/notifications", json=huge)
        problem(resp, 413, "payload_too_large")

        def chunks() -> Any:  # no Content-Length: counted while streaming
            for _ in range(100):
                yield b" " * 1024

        resp = http.post(
            "/v1/notifications", content=chunks(), headers={"content-type": "application/json"}
        )
        problem(resp, 413, "payload_too_large")


@pytest.mark.parametrize(
    ("changes", "code", "loc"),
    [
        ({"notification_type": "no_such_type"}, "unknown_notification_type", ["notification_type"]),
        ({"template_version": 9}, "unknown_template_version", ["template_version"]),
        ({"locale": "fr-CA"}, "unknown_locale", ["locale"]),
        ({"channels": ["sms"]}, "channel_not_allowed", ["channels", 0]),
        ({"params": {}}, "missing_param", ["params", "order_id"]),
    ],
)
def test_catalog_mismatch_is_422(
    api: RunningApi, changes: dict[str, Any], code: str, loc: list[Any]
) -> None:
    with api.client() as http:
        resp = http.post("/v1/notifications", json=body(**changes))
    data = problem(resp, 422, code)
    assert data["errors"][0]["loc"] == ["body", *loc]


def test_locale_falls_back_to_parent(api: RunningApi) -> None:
    with api.client() as http:
        assert http.post("/v1/notifications", json=body(locale="de-CH")).status_code == 202


def test_too_many_user_ids(api: RunningApi) -> None:
    users = [f"u{i}" for i in range(1001)]
    with api.client() as http:
        resp = http.post("/v1/notifications", json=body(recipients={"user_ids": users}))
    data = problem(resp, 422, "too_many_recipients")
    assert data["errors"][0]["loc"] == ["body", "recipients", "user_ids"]


def test_send_at_in_the_far_past_and_expired(api: RunningApi) -> None:
    past = (datetime.now(UTC) - timedelta(days=400)).isoformat()
    with api.client() as http:
        problem(http.post("/v1/notifications", json=body(send_at=past)), 422, "send_at_in_past")
        resp = http.post("/v1/notifications", json=body(expire_at=past))
        problem(resp, 422, "expire_at_in_past")
        naive = http.post("/v1/notifications", json=body(send_at="2030-01-01T00:00:00"))
        problem(naive, 422, "validation_error")


def test_send_at_beyond_the_schedule_horizon_is_refused(api: RunningApi) -> None:
    # one horizon (HERALD_SCHEDULE_HORIZON_DAYS, 30 days): the schedule job holds whatever the
    # API accepts, so a send_at it would drop is refused here, with a clear code
    now = datetime.now(UTC)
    with api.client() as http:
        far = (now + timedelta(days=31)).isoformat()
        data = problem(http.post("/v1/notifications", json=body(send_at=far)), 422,
                       "send_at_too_far")  # fmt: skip
        assert data["errors"][0]["loc"] == ["body", "send_at"] and "30 days" in data["detail"]
        near = (now + timedelta(days=29)).isoformat()
        assert http.post("/v1/notifications", json=body(send_at=near)).status_code == 202


def test_invalid_timezone(api: RunningApi) -> None:
    with api.client() as http:
        resp = http.put("/v1/users/u-1/preferences", json={"timezone": "Mars/Olympus_Mons"})
    data = problem(resp, 422, "invalid_timezone")
    assert data["errors"][0]["loc"] == ["body", "timezone"]


def test_non_e164_phone(api: RunningApi) -> None:
    with api.client() as http:
        resp = http.put("/v1/users/u-1/contact-points", json={"phone": {"e164": "0791234567"}})
    data = problem(resp, 422, "invalid_phone")
    assert data["errors"][0]["loc"] == ["body", "phone", "e164"]
    assert "0791234567" not in resp.text  # the number is not echoed


def test_every_spelling_of_a_phone_number_is_stored_as_one_number(api: RunningApi) -> None:
    """Spaces, dashes and other scripts' digits are one number (one OTP budget, one country
    rule): the contact point holds its canonical E.164 whatever the spelling."""
    user = f"u-{uuid.uuid4().hex}"
    with api.client() as http:
        for spelling in ("+1 415 555 0123", "+1٤١٥5550123", "+1-415-555-0123"):
            resp = http.put(f"/v1/users/{user}/contact-points", json={"phone": {"e164": spelling}})
            assert resp.status_code == 200, resp.text
        impossible = http.put(f"/v1/users/{user}/contact-points",
                              json={"phone": {"e164": "+41123"}})  # fmt: skip
    problem(impossible, 422, "invalid_phone")
    records = [r for _k, r in api.read_topic("herald.devices", 3) if r["user_id"] == user]
    assert [r["phone"]["e164"] for r in records] == ["+14155550123"] * 3


@pytest.mark.parametrize("user", ["u{1}", "u}", "u\x01", "\u00fcser", "u 1"])
def test_ids_with_braces_control_or_non_ascii_characters_are_refused(
    api: RunningApi, user: str
) -> None:
    """Braces would pick another Redis Cluster slot for the keys built from the id."""
    with api.client() as http:
        sent = http.post("/v1/notifications", json=body(recipients={"user_ids": [user]}))
        prefs = http.get(f"/v1/users/{quote(user, safe='')}/preferences")
    assert sent.status_code == 422, sent.text
    assert prefs.status_code == 422, prefs.text


def test_sms_prefix_outside_allow_list(api: RunningApi) -> None:
    with api.client() as http:
        resp = http.put("/v1/users/u-1/contact-points", json={"phone": {"e164": "+88212345678"}})
    problem(resp, 422, "sms_prefix_not_allowed")


def test_missing_unknown_and_underscoped_keys(api: RunningApi) -> None:
    with api.client(key=None) as http:
        problem(http.post("/v1/notifications", json=body()), 401, "missing_api_key")
    with api.client(key="hk_nope") as http:
        problem(http.post("/v1/notifications", json=body()), 401, "unknown_api_key")
    with api.client(key=None, headers={"Authorization": "Bearer hk_nope"}) as http:
        problem(http.get("/v1/users/u-1/preferences"), 401, "unknown_api_key")
    with api.client(READ_KEY) as http:
        data = problem(http.post("/v1/notifications", json=body()), 403, "insufficient_scope")
        assert data["scope"] == "notifications:write"


def test_replayed_key_with_other_body_is_409(api: RunningApi) -> None:
    req = body()
    with api.client() as http:
        assert http.post("/v1/notifications", json=req).status_code == 202
        resp = http.post("/v1/notifications", json={**req, "recipients": {"user_ids": ["u-9"]}})
    problem(resp, 409, "idempotency_conflict")


def test_nothing_lost_after_bad_requests(api: RunningApi) -> None:
    """Bad requests around good ones: every good one is in Kafka, the app still answers."""
    good = [body() for _ in range(5)]
    with api.client() as http:
        for req in good:
            http.post("/v1/notifications", content=b"{not json")
            http.post("/v1/notifications", json={**req, "notification_type": "nope"})
            assert http.post("/v1/notifications", json=req).status_code == 202
        assert http.get("/healthz").status_code == 200
    records = api.read_topic("herald.requests.normal", 5, settle=1.0)
    assert sorted(r["request_id"] for _, r in records) == sorted(g["request_id"] for g in good)


def test_unknown_route_and_method_are_problems(api: RunningApi) -> None:
    with api.client() as http:
        problem(http.get("/v1/nope"), 404, "not_found")
        problem(http.delete("/v1/notifications"), 405, "method_not_allowed")
