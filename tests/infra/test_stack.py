"""The launcher behind `herald up/status/down`, driven as a user would, on real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from herald.errors import AlreadyRunningError
from infra.process import pid_alive, port_open
from infra.services import CORE_SERVICES
from infra.stack import Stack, read_state, stack_status

REPO = Path(__file__).resolve().parents[2]


def herald(*args: str, run_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


DEV_KEY = {"X-API-Key": "hk_dev_local_do_not_use_in_production"}


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def otp_travels_the_whole_pipeline(api: str, clickhouse: str) -> None:
    """API → plan → dispatch → SMS simulator → signed status callback → receipts → DELIVERED;
    the traceparent it was accepted with is on every event ClickHouse holds of it."""
    import httpx

    with httpx.Client(base_url=api, headers=DEV_KEY, timeout=10) as client:
        contact = {"phone": {"e164": "+14155550123", "verified": True}}
        assert client.put("/v1/users/e2e-user/contact-points", json=contact).status_code == 200
        body = {
            "request_id": "e2e-otp-1",
            "notification_type": "otp_login",
            "recipients": {"user_ids": ["e2e-user"]},
            "params": {"code": "482913"},
        }
        accepted = client.post("/v1/notifications", json=body, headers={"traceparent": TRACE})
        assert accepted.status_code == 202, accepted.text
        nid = accepted.json()["notification_id"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            status = client.get(f"/v1/notifications/{nid}").json()
            states = {d["channel"]: d for d in status.get("deliveries", [])}
            if states.get("sms", {}).get("state") == "DELIVERED":
                break
            time.sleep(0.5)
        sms = states["sms"]
        assert sms["state"] == "DELIVERED", f"{sms} in {status}"
        assert sms["provider"] in ("sms_a", "sms_b")
        assert sms["layers"]["provider_accepted"] == "yes"
    traced_in_clickhouse(clickhouse, nid)


def traced_in_clickhouse(dsn: str, nid: str) -> None:
    """Every job's events of `nid` reach ClickHouse with the notification's traceparent."""
    from herald.clickhouse import herald_client
    from herald.config import ClickHouseSettings

    client = herald_client(ClickHouseSettings(dsn=dsn))
    try:
        deadline = time.monotonic() + 60
        while True:
            rows = client.query(
                "SELECT state, traceparent FROM delivery_events WHERE notification_id = {n:String}",
                parameters={"n": nid},
            ).result_rows
            states = {state for state, _ in rows}
            if "DELIVERED" in states or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        client.close()
    assert {"ACCEPTED", "PLANNED", "PROVIDER_ACCEPTED", "DELIVERED"} <= states, rows
    assert {trace for _, trace in rows} == {TRACE}, rows


def test_second_start_is_refused_and_stop_leaves_nothing(tmp_path: Path) -> None:
    stack = Stack(tmp_path, services=CORE_SERVICES[:2], jobs=[])  # kafka, redis
    ctx = stack.start()
    try:
        with pytest.raises(AlreadyRunningError, match="already running"):
            Stack(tmp_path, services=CORE_SERVICES[:2], jobs=[]).start()
        state, components = stack_status(tmp_path)
        assert state is not None and state["ready"]
        assert {c.name for c in components} == {"kafka", "redis"}
        assert all(c.healthy for c in components)
        pids = [c.pid for c in components]
    finally:
        stack.stop()
    assert not any(pid_alive(pid) for pid in pids if pid)
    assert not any(port_open(ctx.host, port) for port in ctx.ports.values())
    assert read_state(tmp_path) is None


@pytest.mark.integration  # a whole `herald up` stack
def test_cli_up_status_down(tmp_path: Path) -> None:
    """`herald up --detach` → `status --json` exits 0 with addresses → `down` leaves nothing."""
    up = herald("up", "--detach", run_dir=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        again = herald("up", run_dir=tmp_path)
        assert again.returncode == 1 and "already running" in again.stderr

        # on a loaded machine a health probe can be slow: allow a few rounds
        for _ in range(10):
            status = herald("status", "--json", run_dir=tmp_path)
            if status.returncode == 0:
                break
            time.sleep(2)
        assert status.returncode == 0, status.stdout + status.stderr
        doc = json.loads(status.stdout)
        assert doc["healthy"] is True
        for name in (
            "kafka",
            "redis",
            "clickhouse",
            "registry",
            "sim-apns",
            "sim-fcm",
            "sim-sms_a",
            "sim-sms_b",
            "sim-sms_c",
            "sim-email",
        ):
            assert doc["services"][name]["healthy"], doc["services"][name]
            assert doc["services"][name]["address"]
        jobs = ("api", "accepted", "digest", "plan_transactional", "plan_normal", "plan_bulk")
        jobs += ("schedule", "dispatch_transactional", "dispatch_bulk_sms", "retry_transactional")
        jobs += ("receipts", "warehouse", "dashboards")
        for job in jobs:
            assert doc["services"][job]["healthy"], doc["services"][job]
        assert doc["dashboard_url"] and doc["dashboard_url"].startswith("http://127.0.0.1:")
        assert doc["api_url"] and doc["api_url"].startswith("http://127.0.0.1:")
        otp_travels_the_whole_pipeline(doc["api_url"], doc["services"]["clickhouse"]["address"])
        # the registry service: Herald's processes registered their subjects through its URL,
        # the one every other producer is given (no process but the service opens its file)
        state = read_state(tmp_path)
        assert state is not None and state["env"]["HERALD_REGISTRY_URL"] == doc["registry_url"]
        assert doc["services"]["registry"]["kind"] == "service"
        subjects = httpx.get(f"{doc['registry_url']}/subjects", timeout=10).json()
        assert any("herald.requests.transactional" in s for s in subjects), subjects
        pids = [s["pid"] for s in doc["services"].values()]
        ports = read_state(tmp_path)["ports"].values()  # type: ignore[index]
    finally:
        down = herald("down", run_dir=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(port_open("127.0.0.1", port) for port in ports)
    after = herald("status", run_dir=tmp_path)
    assert after.returncode == 1 and "no Herald stack" in after.stdout


@pytest.mark.integration  # a whole `herald up` stack
def test_foreground_up_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    """What `make run` does: `herald up` in the foreground, then SIGINT."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "up", "--run-dir", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        state = read_state(tmp_path)
        if state and state.get("ready"):
            break
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    state = read_state(tmp_path)
    assert state and state["ready"]
    pids = [c["pid"] for c in state["components"].values()]
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "stopped" in out
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(port_open("127.0.0.1", p) for p in state["ports"].values())
    assert not os.path.exists(tmp_path / "state.json")
