"""What `herald up` gives each job (infra/services.py), without starting anything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from herald.config import RunSettings
from infra.process import ManagedProcess
from infra.services import (
    BACKGROUND_FETCH_WAIT_MS,
    FETCH_WAIT_MS,
    NICE,
    SERVICES,
    Ctx,
    jobs,
    nice_of,
)


def test_every_bytewax_job_gets_its_fetch_wait_and_the_transactional_path_the_shortest() -> None:
    ctx = Ctx(Path("/nonexistent"), "127.0.0.1", {})
    waits: dict[str, int] = {}
    for component in jobs(1):
        if component.job is None:
            continue
        ports = {p: 1 for p in component.ports}
        env = component.env(Ctx(ctx.run_dir, ctx.host, ports)) if component.env else {}
        waits[component.job] = int(env["HERALD_KAFKA_FETCH_WAIT_MS"])
    assert {job: waits[job] for job in FETCH_WAIT_MS} == FETCH_WAIT_MS
    assert waits["dispatch_bulk_email"] == waits["receipts"] == BACKGROUND_FETCH_WAIT_MS
    fastest = min(waits.values())
    assert {j for j, w in waits.items() if w == fastest} == {
        "plan_transactional",
        "dispatch_transactional",
    }


def test_only_the_recording_processes_yield_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    niced = {c.job or c.name for c in [*SERVICES, *jobs(1)] if nice_of(c)}
    assert niced == set(NICE) == {"warehouse", "receipts"}
    assert RunSettings().nice  # by default
    monkeypatch.setenv("HERALD_RUN_NICE", "false")  # the end-to-end tests' stack
    assert not RunSettings().nice
    assert not any(nice_of(c, RunSettings().nice) for c in [*SERVICES, *jobs(1)])


def _probe(tmp_path: Path, nice: int) -> tuple[int, str, int, int]:
    """(nice value, scheduling policy, session id, process group id) of a managed process."""
    probe = (
        "import os; print(os.nice(0), os.sched_getscheduler(0) == os.SCHED_IDLE,"
        " os.getsid(0), os.getpgid(0))"
    )
    log = tmp_path / f"probe{nice}.log"
    proc = ManagedProcess("probe", [sys.executable, "-c", probe], log, nice=nice)
    proc.start()
    assert proc.proc is not None
    assert proc.proc.wait(timeout=30) == 0
    value, idle, sid, pgid = log.read_text().split()
    assert pgid == str(proc.proc.pid)  # a process group of its own: stopped with its children
    return int(value), "idle" if idle == "True" else "normal", int(sid), int(pgid)


def test_niced_processes_yield_to_the_others_of_the_stacks_scheduling_group(
    tmp_path: Path,
) -> None:
    """The components stay in the starter's session, so Linux's autogroup scheduler puts them
    in one group, where nice values and SCHED_IDLE rank them against each other."""
    value, policy, sid, _ = _probe(tmp_path, nice=7)
    assert value >= 7
    assert policy == "normal"
    assert sid == os.getsid(0)  # the same session, the same autogroup
    value, policy, sid, _ = _probe(tmp_path, nice=NICE["warehouse"])
    assert value == 19
    assert policy == "idle"  # runs only on CPU time nothing else wants
    assert sid == os.getsid(0)
