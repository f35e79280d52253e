"""Scale-out path: the full stack with every Bytewax job as a 2-process cluster (-i/-a)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from infra.process import pid_alive, port_open
from infra.services import BYTEWAX_JOBS
from infra.stack import read_state
from tests.infra.test_stack import DEV_KEY, herald, otp_travels_the_whole_pipeline

USERS = [f"scale-user-{i}" for i in range(20)]


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
        done = {"PROVIDER_ACCEPTED", "DELIVERED", "OPENED", "CLICKED"}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = client.get(f"/v1/notifications/{nid}").json()
            reached = {d["user_id"] for d in status.get("deliveries", []) if d["state"] in done}
            if reached >= set(USERS):
                return
            time.sleep(1.0)
        raise AssertionError(f"campaign not delivered to every user: {status}")


def put_emails(api: str) -> None:
    with httpx.Client(base_url=api, headers=DEV_KEY, timeout=10) as client:
        for user in USERS:
            contact = {"email": {"address": f"{user}@example.com", "verified": True}}
            reply = client.put(f"/v1/users/{user}/contact-points", json=contact)
            assert reply.status_code == 200, reply.text


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_every_job_runs_as_two_processes_end_to_end(tmp_path: Path) -> None:
    up = herald("up", "--detach", "--processes", "2", run_dir=tmp_path, timeout=400)
    assert up.returncode == 0, up.stdout + up.stderr
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
        otp_travels_the_whole_pipeline(api)
        campaign_reaches_every_user(api)
        pids = [s["pid"] for s in services.values()]
        ports = read_state(tmp_path)["ports"].values()  # type: ignore[index]
    finally:
        down = herald("down", run_dir=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(port_open("127.0.0.1", port) for port in ports)


def test_deploy_manifests_are_current_and_partitions_cover_every_worker() -> None:
    from infra.deploy.render import load_jobs, main, topic_plan

    assert main(["--check"]) == 0  # infra/deploy/* matches sizing.toml and infra/topics.toml
    jobs = load_jobs()
    names = {j.name for j in jobs}
    assert {"dispatch_push_bulk", "dispatch_sms_transactional", "plan_bulk"} <= names
    plan = topic_plan(jobs, 8)
    for job in jobs:
        for topic in job.reads:
            partitions, readers = plan[topic]
            assert partitions >= job.total_workers and job.name in readers
    assert all(partitions % 8 == 0 for partitions, _ in plan.values())
