"""What `herald up` gives each job (infra/services.py), without starting anything."""

from __future__ import annotations

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


def test_a_niced_process_yields_to_other_sessions_too(tmp_path: Path) -> None:
    """Every component runs in its own session; with autogroup scheduling the session's group
    carries the nice value that ranks it against the others."""
    probe = (
        "import os, pathlib; g = pathlib.Path('/proc/self/autogroup');"
        " print(os.nice(0), g.read_text().split()[-1] if g.exists() else 'none')"
    )
    proc = ManagedProcess("probe", [sys.executable, "-c", probe], tmp_path / "probe.log", nice=7)
    proc.start()
    assert proc.proc is not None
    assert proc.proc.wait(timeout=30) == 0
    process_nice, group_nice = (tmp_path / "probe.log").read_text().split()
    assert int(process_nice) >= 7
    if group_nice != "none":  # a kernel without autogroup has no such file
        assert int(group_nice) >= 7
