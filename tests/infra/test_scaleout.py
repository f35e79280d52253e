"""Scale-out path: the full stack with every Bytewax job as a 2-process cluster (-i/-a),
started in the foreground as `make run` does, the whole demo run on it, and stopped with Ctrl-C
(one stack for the three: each whole stack costs the suite half a minute to start and stop)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.process import pid_alive, port_open
from infra.services import BYTEWAX_JOBS
from infra.stack import read_state
from tests.infra.test_demo import REPO, herald

pytestmark = pytest.mark.integration  # `herald up --processes 2`

# 30 Bytewax processes on 2 shared cores start slowly: generous, bounded waits.
READY_S = 420.0
# The demo's stack releases held sends with 5 s of jitter instead of 120 s (the spread a million
# mornings need), so its quiet-hours scene ends about a minute sooner; the demo reads the same
# setting and says so.
DEMO_ENV = {"HERALD_PLANNING_SCHEDULE_JITTER_SECONDS": "5"}


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def start_foreground(run_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], dict]:
    """`herald up --processes 2` in the foreground, as `make run` starts it (with DEMO_ENV),
    its console into `log` (a pipe nobody reads would fill and stall the supervisor); the
    process and the stack's state once it is ready."""
    with log.open("wb") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "up", "--processes", "2", "--run-dir",
             str(run_dir)],
            cwd=REPO, stdout=console, stderr=subprocess.STDOUT, env={**os.environ, **DEMO_ENV},
        )  # fmt: skip
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        if state and state.get("ready"):
            return proc, state
        if proc.poll() is not None:
            raise AssertionError(log.read_text(errors="replace")[-5000:])
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"herald up --processes 2 was not ready within {READY_S:.0f} s")


def assert_every_scene_passed(text: str) -> None:
    """`herald demo`'s summary: seven scenes passed, with the figures they promise."""
    assert "7 of 7 scenes passed" in text, text
    for scene in range(1, 8):
        assert re.search(rf"│ {scene} │[^│]*│ passed", text), text
    assert "1,197 others liked your post" in text
    assert re.search(r"OTP [\d,]+ ms accept→provider \(target < 2 s: (met|MISSED)", text), text


@pytest.mark.timeout(1800)
def test_two_processes_per_job_pass_every_demo_scene_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    """`herald up --processes 2` in the foreground: every job a 2-process cluster; `herald demo`
    on it passes its seven scenes, so OTPs, a campaign, failover, a digest, quiet hours and
    receipts all run through the clusters; then SIGINT, as Ctrl-C after `make run`, stops every
    process. (The demo on a stack it starts itself is `herald up --detach` and `herald down`,
    as tests/e2e runs them; test_demo.py checks the demo's error when that start fails.)"""
    log = tmp_path.parent / f"{tmp_path.name}-up.log"
    began = time.monotonic()
    proc, state = start_foreground(tmp_path, log)
    ready = time.monotonic()
    try:
        for _ in range(15):  # a loaded machine answers some health probes slowly
            status = herald("status", "--json", run_dir=tmp_path, timeout=240)
            if status.returncode == 0:
                break
            time.sleep(2)
        assert status.returncode == 0, status.stdout + status.stderr
        services = json.loads(status.stdout)["services"]
        for job, _flow, _env in BYTEWAX_JOBS:
            for index, name in enumerate((job, f"{job}-p1")):
                assert services[name]["healthy"], services[name]
                assert f"process {index + 1}/2" in services[name]["address"]
                argv = cmdline(services[name]["pid"])
                assert argv[argv.index("-i") + 1] == str(index)
                assert len(argv[argv.index("-a") + 1].split(";")) == 2
        demo = herald("demo", "--campaign-size", "3000", run_dir=tmp_path, timeout=1500,
                      env=DEMO_ENV)  # fmt: skip
    finally:
        ran = time.monotonic()
        pids = [c["pid"] for c in state["components"].values()]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    print(
        f"\nscale-out: ready {ready - began:.1f}s, demo {ran - ready:.1f}s, "
        f"Ctrl-C to stopped {time.monotonic() - ran:.1f}s"
    )
    text = demo.stdout + demo.stderr
    assert demo.returncode == 0, text
    assert_every_scene_passed(text)
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
