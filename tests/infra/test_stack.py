"""The launcher behind `herald up/status/down`, driven as a user would, on real processes.

`herald status`, a refused second `herald up` and a traced OTP through a detached stack are
checked on the end-to-end tests' shared stack (tests/e2e/test_acceptance_cli.py); that
`herald down` leaves nothing behind, on that stack too (tests/e2e/conftest.py); that Ctrl-C on
a foreground `herald up` stops everything, on tests/infra/test_scaleout.py's stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
