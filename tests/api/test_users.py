"""Preferences, devices and contact points: Kafka changelogs (compacted topics) + Redis copies."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.api.conftest import RunningApi


def new_user() -> str:
    return f"u-{uuid.uuid4().hex[:10]}"


def test_preferences_round_trip_through_kafka_and_back(api: RunningApi) -> None:
    user = new_user()
    prefs = {
        "global_opt_out": False,
        "category_opt_out": ["marketing"],
        "channel_opt_out": ["sms"],
        "category_channel_opt_out": ["social:push"],
        "quiet_hours": {"start": "22:00", "end": "07:00"},
        "timezone": "Asia/Shanghai",
        "locale": "zh-CN",
    }
    with api.client() as http:
        assert http.get(f"/v1/users/{user}/preferences").status_code == 404
        first = http.put(f"/v1/users/{user}/preferences", json=prefs)
        assert first.status_code == 200, first.text
        second = http.put(f"/v1/users/{user}/preferences", json={**prefs, "global_opt_out": True})
        read = http.get(f"/v1/users/{user}/preferences").json()
    assert 0 < first.json()["version"] < second.json()["version"]
    assert read["global_opt_out"] is True and read["timezone"] == "Asia/Shanghai"
    assert read["quiet_hours"] == {"start": "22:00", "end": "07:00"}
    assert read["version"] == second.json()["version"]
    records = api.read_topic("herald.preferences", 2)
    assert [k for k, _ in records] == [user, user]
    assert [r["version"] for _, r in records] == [first.json()["version"], read["version"]]
    assert records[1][1]["category_channel_opt_out"] == ["social:push"]


def test_device_register_refresh_delete(api: RunningApi) -> None:
    user = new_user()
    token = "f" * 64
    with api.client() as http:
        reg = http.post("/v1/devices", json={"user_id": user, "platform": "apns", "token": token})
        assert reg.status_code == 201, reg.text
        again = http.post("/v1/devices", json={"user_id": user, "platform": "apns", "token": token})
        assert again.json()["device_id"] == reg.json()["device_id"]  # refresh, same id
        http.post("/v1/devices", json={"user_id": user, "platform": "fcm", "token": "t" * 40})
        view = http.get(f"/v1/users/{user}/contact-points").json()
        assert len(view["devices"]) == 2 and token not in str(view)  # tokens only as hints
        gone = http.delete(f"/v1/devices/{reg.json()['device_id']}", params={"user_id": user})
        assert gone.status_code == 204
        missing = http.delete(f"/v1/devices/{reg.json()['device_id']}", params={"user_id": user})
        assert missing.status_code == 404 and missing.json()["code"] == "device_not_found"
    records = api.read_topic("herald.devices", 4)
    versions = [r["version"] for _, r in records]
    assert versions == sorted(set(versions)) and len(versions) == 4  # strictly increasing
    assert [d["platform"] for d in records[-1][1]["devices"]] == ["fcm"]
    assert records[0][1]["devices"][0]["token"] == token  # the topic carries the real token


def test_contact_points_full_record_per_user(api: RunningApi) -> None:
    user = new_user()
    with api.client() as http:
        http.post("/v1/devices", json={"user_id": user, "platform": "fcm", "token": "t" * 40})
        resp = http.put(
            f"/v1/users/{user}/contact-points",
            json={"phone": {"e164": "+41791234567", "verified": True},
                  "email": {"address": "a@example.ch"}},
        )  # fmt: skip
        assert resp.status_code == 200, resp.text
        cleared = http.put(f"/v1/users/{user}/contact-points", json={"email": None}).json()
    assert cleared["phone"] == {"e164": "+41791234567", "verified": True}
    assert cleared["email"] is None and len(cleared["devices"]) == 1
    [_, _, (key, last)] = api.read_topic("herald.devices", 3)
    assert cleared["version"] == last["version"]
    assert key == user and last["phone"]["verified"] is True and len(last["devices"]) == 1


def test_concurrent_updates_get_distinct_versions(api: RunningApi) -> None:
    user = new_user()

    def register(i: int) -> int:
        with api.client() as http:
            body = {"user_id": user, "platform": "fcm", "token": f"token-{i:04d}-" + "x" * 30}
            return http.post("/v1/devices", json=body).status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(register, range(8))) == {201}
    records = api.read_topic("herald.devices", 8)
    versions = sorted(r["version"] for _, r in records)
    assert len(set(versions)) == 8  # one version each, under the lock
    assert len(records[-1][1]["devices"]) == 8 or max(len(r["devices"]) for _, r in records) == 8
