"""Scale-out path: the full stack with every Bytewax job as a 2-process cluster (-i/-a),
started in the foreground as `make run` does and stopped with Ctrl-C (one stack for both: each
whole stack costs the suite half a minute to start and stop)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from infra.process import pid_alive, port_open
from infra.services import BYTEWAX_JOBS
from infra.stack import read_state
from tests.infra.test_stack import DEV_KEY, REPO, herald

pytestmark = pytest.mark.integration  # `herald up --processes 2`

USERS = [f"scale-user-{i}" for i in range(20)]
DONE = {"PROVIDER_ACCEPTED", "DELIVERED", "OPENED", "CLICKED"}
# 30 Bytewax processes on 2 shared cores start and drain slowly: generous, bounded waits.
WAIT_S = 240.0


def states_of(client: httpx.Client, nid: str) -> list[dict]:
    return list(client.get(f"/v1/notifications/{nid}").json().get("deliveries", []))


def otp_reaches_the_provider(api: str) -> None:
    """API → plan (2 processes) → dispatch (2 processes) → SMS simulator → receipts."""
    with httpx.Client(base_url=api, headers=DEV_KEY, timeout=10) as client:
        contact = {"phone": {"e164": "+14155550177", "verified": True}}
        assert client.put("/v1/users/scale-otp/contact-points", json=contact).status_code == 200
        body = {
            "request_id": "scale-otp-1",
            "notification_type": "otp_login",
            "recipients": {"user_ids": ["scale-otp"]},
            "params": {"code": "551177"},
        }
        accepted = client.post("/v1/notifications", json=body)
        assert accepted.status_code == 202, accepted.text
        nid = accepted.json()["notification_id"]
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            sms = [d for d in states_of(client, nid) if d["channel"] == "sms"]
            if sms and sms[0]["state"] in DONE:
                assert sms[0]["provider"] in ("sms_a", "sms_b")
                return
            time.sleep(1.0)
        raise AssertionError(f"OTP not accepted by an SMS provider: {states_of(client, nid)}")


def campaign_reaches_every_user(api: str) -> None:
    """A small bulk campaign (promo_weekly, email) is accepted by the provider for each user."""
    with httpx.Client(base_url=api, headers=DEV_KEY, timeout=10) as client:
        body = {
            "request_id": "scale-campaign-1",
            "notification_type": "promo_weekly",
            "recipients": {"user_ids": USERS},
            "params": {"week": "2026-W10", "highlights_url": "https://example.com/w10"},
        }
        accepted = client.post("/v1/notifications", json=body)
        assert accepted.status_code == 202, accepted.text
        nid = accepted.json()["notification_id"]
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            reached = {d["user_id"] for d in states_of(client, nid) if d["state"] in DONE}
            if reached >= set(USERS):
                return
            time.sleep(1.0)
        raise AssertionError(f"campaign not delivered to every user: {states_of(client, nid)}")


def put_emails(api: str) -> None:
    with httpx.Client(base_url=api, headers=DEV_KEY, timeout=10) as client:
        for user in USERS:
            contact = {"email": {"address": f"{user}@example.com", "verified": True}}
            reply = client.put(f"/v1/users/{user}/contact-points", json=contact)
            assert reply.status_code == 200, reply.text


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def start_foreground(run_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], dict]:
    """`herald up --processes 2` in the foreground, as `make run` starts it, its console into
    `log` (a pipe nobody reads would fill and stall the supervisor); the process and the
    stack's state once it is ready."""
    with log.open("wb") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "up", "--processes", "2", "--run-dir",
             str(run_dir)],
            cwd=REPO, stdout=console, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        if state and state.get("ready"):
            return proc, state
        if proc.poll() is not None:
            raise AssertionError(log.read_text(errors="replace")[-5000:])
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("herald up --processes 2 was not ready within 420 s")


@pytest.mark.timeout(1200)
def test_every_job_runs_as_two_processes_end_to_end_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    """`herald up --processes 2` in the foreground: every job a 2-process cluster, an OTP and
    a campaign through them; then SIGINT, as Ctrl-C after `make run`, stops every process."""
    log = tmp_path.parent / f"{tmp_path.name}-up.log"
    began = time.monotonic()
    proc, state = start_foreground(tmp_path, log)
    ready = time.monotonic()
    try:
        for _ in range(15):  # a loaded machine answers some health probes slowly
            status = herald("status", "--json", run_dir=tmp_path)
            if status.returncode == 0:
                break
            time.sleep(2)
        assert status.returncode == 0, status.stdout + status.stderr
        doc = json.loads(status.stdout)
        services = doc["services"]
        for job, _flow, _env in BYTEWAX_JOBS:
            for index, name in enumerate((job, f"{job}-p1")):
                assert services[name]["healthy"], services[name]
                assert f"process {index + 1}/2" in services[name]["address"]
                argv = cmdline(services[name]["pid"])
                assert argv[argv.index("-i") + 1] == str(index)
                assert len(argv[argv.index("-a") + 1].split(";")) == 2
        api = doc["api_url"]
        put_emails(api)
        otp_reaches_the_provider(api)
        otp = time.monotonic()
        campaign_reaches_every_user(api)
    finally:
        sent = time.monotonic()
        pids = [c["pid"] for c in state["components"].values()]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    print(
        f"\nscale-out: ready {ready - began:.1f}s, OTP {otp - ready:.1f}s, campaign "
        f"{sent - otp:.1f}s, Ctrl-C to stopped {time.monotonic() - sent:.1f}s"
    )
    out = log.read_text(errors="replace")
    assert proc.returncode == 0, out[-5000:]
    assert "stopped" in out
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(port_open("127.0.0.1", p) for p in state["ports"].values())
    assert not (tmp_path / "state.json").exists()


def test_deploy_manifests_are_current_and_partitions_cover_every_worker() -> None:
    from infra.deploy.render import load_jobs, main, topic_plan

    assert main(["--check"]) == 0  # infra/deploy/* matches sizing.toml and herald/topics.toml
    jobs = load_jobs()
    names = {j.name for j in jobs}
    assert {"dispatch_push_bulk", "dispatch_sms_transactional", "plan_bulk"} <= names
    plan = topic_plan(jobs, 8)
    for job in jobs:
        for topic in job.reads:
            partitions, readers = plan[topic]
            assert partitions >= job.total_workers and job.name in readers
    assert all(partitions % 8 == 0 for partitions, _ in plan.values())
