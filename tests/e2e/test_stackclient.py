"""infra.stackclient against a real, fully started stack: the end-to-end tests' shared stack
(tests/e2e/conftest.py, `herald up --detach`)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from herald.errors import ApiError, StackNotRunningError
from infra.process import pid_alive
from infra.stackclient import StackClient
from tests.e2e._stack import E2EStack


@pytest.fixture
def client(e2e: E2EStack) -> StackClient:
    return e2e.client


def test_no_stack_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StackNotRunningError, match="make run"):
        StackClient.from_run_dir(tmp_path)


def test_otp_round_trip_through_api_simulator_and_clickhouse(client: StackClient) -> None:
    user = f"sc-{uuid.uuid4().hex[:8]}"
    view = client.put_contact_points(user, phone="+14155550142", email=f"{user}@example.com")
    assert view["user_id"] == user and view["phone"] and view["email"]
    prefs = client.put_preferences(user, {"timezone": "Europe/Berlin", "locale": "de"})
    assert prefs["timezone"] == "Europe/Berlin"
    device_id = client.put_device(user, "apns", "a" * 64)
    assert device_id in {d["device_id"] for d in client.contact_points(user)["devices"]}
    for name in ("sms_a", "sms_b"):
        client.sim(name).reset()
    nid = client.send(
        {
            "request_id": f"sc-{uuid.uuid4().hex}",
            "notification_type": "otp_login",
            "recipients": {"user_ids": [user]},
            "params": {"code": "123456"},
        }
    )
    sms = client.wait_for(nid, "sms", {"DELIVERED"}, timeout=90)
    assert sms["user_id"] == user and sms["provider"] in ("sms_a", "sms_b")
    assert client.status(nid)["notification_id"] == nid
    stats = client.sim(sms["provider"]).stats(ids=True)
    assert stats["accepted"] >= 1
    assert any(addr.endswith("14155550142") for addr in stats["accepted_ids"]), stats
    assert "accepted_ids" not in client.sim(sms["provider"]).stats(ids=False)

    ch = client.clickhouse()
    deadline = time.monotonic() + 60
    seen: set[str] = set()
    wanted = {"ACCEPTED", "PROVIDER_ACCEPTED"}  # written by two jobs, in either order
    while time.monotonic() < deadline and not wanted <= seen:
        rows = ch.query(
            "SELECT DISTINCT state FROM delivery_events WHERE notification_id = {n:String}",
            parameters={"n": nid},
        ).result_rows
        seen = {r[0] for r in rows}
        time.sleep(0.5)
    assert wanted <= seen, seen


def test_send_raises_with_the_response_text(client: StackClient) -> None:
    with pytest.raises(ApiError, match="422") as info:
        client.send({"request_id": "x", "notification_type": "otp_login", "recipients": {}})
    assert "user_ids" in info.value.body


def test_simulator_config_patch_and_reset(client: StackClient) -> None:
    sim = client.sim("sms_b")
    before = sim.config()
    patched = sim.configure({"errors": {"500": 0.25}})
    assert patched["errors"] == {"500": 0.25}
    assert sim.config()["errors"] == {"500": 0.25}
    sim.reset(config=True)
    assert sim.config() == before
    assert sim.stats()["requests"] == 0
    with pytest.raises(ApiError):
        sim.configure({"errors": {"500": 2.0}})
    with pytest.raises(KeyError):
        client.sim("pigeon")


def test_killed_component_is_restarted_by_the_supervisor(client: StackClient) -> None:
    old = client.pid("warehouse")
    assert client.kill("warehouse") == old
    new = client.wait_restarted("warehouse", old, timeout=60)
    assert new != old and pid_alive(new)
    assert not pid_alive(old)
