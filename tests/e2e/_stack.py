"""The full stack of the end-to-end tests: how it is started (`herald up` with `E2E_ENV`),
what a test gets (`E2EStack`), and how nothing is left running (see conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from herald.catalog import DEFAULT_PATH
from infra.process import pid_alive
from infra.stack import read_state
from infra.stackclient import StackClient

REPO = Path(__file__).resolve().parents[2]

FCM_RATE = 800.0
E2E_ENV = {
    # The warehouse at normal priority: this stack shares the machine with two other test lanes,
    # and niced (19) it loaded no event for a minute behind them (the tests read ClickHouse).
    "HERALD_RUN_NICE": "false",
    "HERALD_PLANNING_SCHEDULE_JITTER_SECONDS": "2",
    "HERALD_DISPATCH_CALL_TIMEOUT_S": "3",
    "HERALD_DISPATCH_BACKOFF": json.dumps(
        {
            "transactional": {"base_s": 0.5, "cap_s": 4.0, "max_attempts": 4, "max_total_s": 600},
            "normal": {"base_s": 1.0, "cap_s": 10.0, "max_attempts": 8, "max_total_s": 3600},
            "bulk": {"base_s": 5.0, "cap_s": 60.0, "max_attempts": 8, "max_total_s": 3600},
        }
    ),
    "HERALD_DISPATCH_RATES": json.dumps(
        {
            "apns": {"rate": 50_000, "reserved": 10_000},
            "fcm": {"rate": FCM_RATE, "reserved": 200},
            "sms_a": {"rate": 10_000, "reserved": 3_000},
            "sms_b": {"rate": 2_000, "reserved": 600},
            "email": {"rate": 1_000, "reserved": 200},
        }
    ),
    "HERALD_DISPATCH_BREAKER": json.dumps({"min_volume": 100_000}),
    "HERALD_DISPATCH_RECONCILE_AFTER_S": "3",
}
# Where the API, the plan and digest jobs, and dispatch read the catalog: the stack's own
# (write_catalog: the default types and the routes to the third SMS provider).
CATALOG_SETTINGS = (
    "HERALD_API_CATALOG_FILE",
    "HERALD_PLANNING_CATALOG_PATH",
    "HERALD_DISPATCH_CATALOG_PATH",
)


def herald_cli(
    *args: str, run_dir: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`herald ARGS --run-dir RUN_DIR` as a subprocess (what a user types)."""
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@dataclass
class E2EStack:
    """A running full stack: where it lives and a client on it."""

    run_dir: Path
    client: StackClient

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a `herald` command against this stack."""
        return herald_cli(*args, run_dir=self.run_dir, timeout=timeout)


def stack_pids(run_dir: Path) -> tuple[list[int], list[int]]:
    """(pids of the supervisor and every component, the stack's ports) from state.json."""
    state = read_state(run_dir) or {}
    pids = [int(c["pid"]) for c in state.get("components", {}).values() if c.get("pid")]
    if state.get("supervisor_pid"):
        pids.append(int(state["supervisor_pid"]))
    return pids, [int(p) for p in state.get("ports", {}).values()]


def _ours(pid: int, run_dir: Path, ports: list[int]) -> bool:
    """Whether `pid` is still a process of this stack (a pid number may have been reused by
    an unrelated process since): its command line or environment names the run directory,
    or (redis-server rewrites both into its title) its title names one of the stack's ports."""
    markers = [str(run_dir).encode(), *(f"127.0.0.1:{port}".encode() for port in ports)]
    for name in ("cmdline", "environ"):
        try:
            raw = Path(f"/proc/{pid}/{name}").read_bytes()
        except OSError:
            return False
        if any(marker in raw for marker in markers):
            return True
    return False


def leftovers(pids: list[int], ports: list[int], run_dir: Path) -> list[int]:
    """This stack's pids still alive (a pid that now belongs to another process is not)."""
    return [pid for pid in pids if pid_alive(pid) and _ours(pid, run_dir, ports)]


def kill_leftovers(pids: list[int], ports: list[int], run_dir: Path) -> None:
    """SIGKILL the process groups of this stack's pids still alive (each component leads its
    own group); a pid that now belongs to another process is left alone."""
    for pid in leftovers(pids, ports, run_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def write_catalog(run_dir: Path) -> Path:
    """The stack's catalog: herald/catalog.toml and the types of catalog_extra.toml."""
    path = run_dir / "catalog.toml"
    extra = Path(__file__).with_name("catalog_extra.toml")
    path.write_text(f"{DEFAULT_PATH.read_text()}\n{extra.read_text()}", encoding="utf-8")
    return path


def start_stack(run_dir: Path) -> None:
    """`herald up --detach`, once more on failure (a free port taken by another process
    between allocation and bind is the known way a start fails on a shared machine)."""
    catalog = str(write_catalog(run_dir))
    env = {**E2E_ENV, **dict.fromkeys(CATALOG_SETTINGS, catalog)}
    for attempt in (1, 2):
        up = herald_cli("up", "--detach", run_dir=run_dir, env=env)
        if up.returncode == 0:
            return
        log = run_dir / "logs" / "supervisor.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        herald_cli("down", run_dir=run_dir, timeout=120)
        kill_leftovers(*stack_pids(run_dir), run_dir)
        if attempt == 2:
            pytest.fail(f"herald up failed twice: {up.stdout}\n{up.stderr}\n{tail}")
