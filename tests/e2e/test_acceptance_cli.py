"""`herald status`, a second `herald up` and one traced OTP, on the end-to-end tests' shared stack
(started with `herald up --detach`, stopped with `herald down`: tests/e2e/conftest.py). That
`down` leaves no process and no port behind is checked on the stack tests/infra/test_scaleout.py
starts; `make run`'s foreground start and Ctrl-C in tests/infra/test_stack.py."""

from __future__ import annotations

import json
import time
import uuid

import httpx

from infra.stack import read_state
from tests.e2e._stack import E2EStack

DEV_KEY = {"X-API-Key": "hk_dev_local_do_not_use_in_production"}
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SERVICES = ("kafka", "redis", "clickhouse", "registry", "sim-apns", "sim-fcm", "sim-sms_a",
            "sim-sms_b", "sim-sms_c", "sim-email")  # fmt: skip
WAREHOUSED = {"ACCEPTED", "PLANNED", "PROVIDER_ACCEPTED", "DELIVERED"}
JOBS = ("api", "accepted", "digest", "plan_transactional", "plan_normal", "plan_bulk", "schedule",
        "dispatch_transactional", "dispatch_bulk_sms", "retry_transactional", "receipts",
        "warehouse", "dashboards")  # fmt: skip


def test_status_names_every_component_and_a_second_start_is_refused(e2e: E2EStack) -> None:
    """`herald up` on a running stack exits 1 saying so; `status --json` exits 0 with every
    component healthy and its address; Herald's processes registered their subjects through the
    registry service's URL, the one every other producer is given."""
    again = e2e.cli("up")
    assert again.returncode == 1 and "already running" in again.stderr
    for _ in range(10):  # on a loaded machine a health probe can be slow: allow a few rounds
        status = e2e.cli("status", "--json")
        if status.returncode == 0:
            break
        time.sleep(2)
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert doc["healthy"] is True
    for name in SERVICES:
        assert doc["services"][name]["healthy"], doc["services"][name]
        assert doc["services"][name]["address"]
    for job in JOBS:
        assert doc["services"][job]["healthy"], doc["services"][job]
    assert doc["dashboard_url"] and doc["dashboard_url"].startswith("http://127.0.0.1:")
    assert doc["api_url"] and doc["api_url"].startswith("http://127.0.0.1:")
    state = read_state(e2e.run_dir)
    assert state is not None and state["env"]["HERALD_REGISTRY_URL"] == doc["registry_url"]
    assert doc["services"]["registry"]["kind"] == "service"
    subjects = httpx.get(f"{doc['registry_url']}/subjects", timeout=10).json()
    assert any("herald.requests.transactional" in s for s in subjects), subjects


def test_an_otp_travels_the_whole_pipeline_with_its_trace(e2e: E2EStack) -> None:
    """API → plan → dispatch → SMS simulator → signed status callback → receipts → DELIVERED;
    the traceparent it was accepted with is on every event ClickHouse holds of it."""
    user = f"cli-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=e2e.client.api_url, headers=DEV_KEY, timeout=10) as api:
        contact = {"phone": {"e164": "+14155550123", "verified": True}}
        assert api.put(f"/v1/users/{user}/contact-points", json=contact).status_code == 200
        body = {
            "request_id": f"cli-otp-{uuid.uuid4().hex}",
            "notification_type": "otp_login",
            "recipients": {"user_ids": [user]},
            "params": {"code": "482913"},
        }
        accepted = api.post("/v1/notifications", json=body, headers={"traceparent": TRACE})
        assert accepted.status_code == 202, accepted.text
        nid = accepted.json()["notification_id"]
    sms = e2e.client.wait_for(nid, "sms", {"DELIVERED"}, timeout=90)
    assert sms["provider"] in ("sms_a", "sms_b")
    assert sms["layers"]["provider_accepted"] == "yes"

    ch = e2e.client.clickhouse()
    deadline = time.monotonic() + 60
    while True:
        rows = ch.query(
            "SELECT state, traceparent FROM delivery_events WHERE notification_id = {n:String}",
            parameters={"n": nid},
        ).result_rows
        if {s for s, _ in rows} >= WAREHOUSED or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {s for s, _ in rows} >= WAREHOUSED, rows
    assert {trace for _, trace in rows} == {TRACE}, rows
