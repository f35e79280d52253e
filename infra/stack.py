"""The embedded stack launcher behind `herald up | status | down`.

One supervisor process owns a run directory:

    <run_dir>/stack.lock      flock held by the supervisor while the stack runs
    <run_dir>/state.json      pids, ports, addresses and URLs of every component
    <run_dir>/logs/<name>.log one log per component (and supervisor.log when detached)
    <run_dir>/data/<name>/    Redis AOF, chDB data directory
    <run_dir>/registry/       the schema registry service's store
    <run_dir>/recovery/<job>/ Bytewax recovery partitions

Start order: services (Kafka, Redis, ClickHouse, the schema registry, the provider
simulators) in parallel → bootstrap (topics, ClickHouse migrations) → jobs. Stop order is the
reverse. A dead job is restarted with backoff (its
recovery snapshots make that safe); a dead service is restarted too, and Kafka is
re-bootstrapped because the embedded broker keeps everything in memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from herald.config import ClickHouseSettings, KafkaSettings, RunSettings
from herald.errors import AlreadyRunningError, InfraError
from infra.process import (
    ManagedProcess,
    free_port,
    kill_groups,
    pid_alive,
    stop_all,
    wait_until,
)
from infra.services import SERVICES, Component, Ctx, jobs, nice_of

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
LOCK_FILE = "stack.lock"


def read_state(run_dir: Path) -> dict[str, Any] | None:
    """The state file of a running (or crashed) stack, or None when there is none."""
    try:
        return dict(json.loads((run_dir / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return None


def is_locked(run_dir: Path) -> bool:
    """Whether a supervisor currently holds the run directory."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


@dataclass
class Running:
    component: Component
    process: ManagedProcess
    restarts: int = 0
    next_restart: float = 0.0


class Stack:
    """Starts, supervises and stops every component of the embedded stack."""

    def __init__(
        self,
        run_dir: Path,
        host: str = "127.0.0.1",
        services: list[Component] | None = None,
        jobs: list[Component] | None = None,
        on_event: Callable[[str], None] | None = None,
        processes: int = 1,
    ) -> None:
        """`processes`: processes per Bytewax job (ignored when `jobs` is given)."""
        self.run_dir = run_dir.resolve()
        self.host = host
        self.processes = processes
        self.services = SERVICES if services is None else services
        self.jobs = _jobs(processes) if jobs is None else jobs
        self.on_event = on_event or (lambda msg: log.info(msg))
        self.running: dict[str, Running] = {}
        # Warm spares of the jobs that have one (infra/spare.py), by component name.
        self.spares: dict[str, ManagedProcess] = {}
        self.ctx: Ctx | None = None
        self.nice = RunSettings().nice  # HERALD_RUN_NICE=false: every component at nice 0
        self._lock_fh: IO[str] | None = None
        self._stop = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Ctx:
        """Lock the run directory, start services, bootstrap, start jobs; returns the context.

        Raises AlreadyRunningError when another supervisor holds the run directory; on any
        other failure everything started so far is stopped before the error propagates.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            ports = {p: free_port(self.host) for c in self.services + self.jobs for p in c.ports}
            self.ctx = Ctx(run_dir=self.run_dir, host=self.host, ports=ports)
            self._write_state(ready=False)
            self._start_all(self.services)
            self._bootstrap()
            self._reset_recovery()
            self._start_all(self.jobs)
            for running in self.running.values():
                self._start_spare(running.component)
            self._write_state(ready=True)
            return self.ctx
        except BaseException:
            self.stop()
            raise

    def supervise(self, poll: float = 0.1) -> None:
        """Block until `request_stop()` (or SIGINT/SIGTERM via `install_signal_handlers`).

        A dead component is noticed within `poll` seconds: the time a killed plan or dispatch
        process adds to an OTP's latency before its restart begins (one `waitpid` per
        component per look, a few microseconds each)."""
        while not self._stop.wait(poll):
            self.supervise_once()

    def supervise_once(self) -> None:
        """Restart every component found dead (backoff permitting)."""
        for running in list(self.running.values()):
            if not running.process.alive():
                self._restart(running)

    def request_stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """Ctrl-C and `herald down` (SIGTERM) stop the stack cleanly."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.request_stop())

    def stop(self) -> None:
        """Stop jobs, then services, release the lock and remove the state file. Idempotent.

        The jobs stop together, then the services they used, together: a stop takes as long as
        the slowest process, not the sum (`herald down` on an idle machine: 5.3-5.6 s one after
        the other, 4.8-5.1 s together; Tansu's own shutdown is ~2.6 s of it once clients have
        connected)."""
        stop_all([self.spares.pop(name) for name in list(self.spares)], timeout=2)
        stopping = [self.running.pop(name) for name in reversed(list(self.running))]
        own = [r for r in stopping if r.component.kind != "service"]  # jobs, API, simulators
        services = [r for r in stopping if r.component.kind == "service"]
        for batch in (own, services):
            for running in batch:
                self.on_event(f"stopping {running.component.name}")
            stop_all([r.process for r in batch])
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / STATE_FILE).unlink()
        self._release_lock()

    # -- internals -----------------------------------------------------------------------

    def _acquire_lock(self) -> None:
        fh = open(self.run_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the stack's life
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            state = read_state(self.run_dir) or {}
            raise AlreadyRunningError(
                f"a Herald stack is already running in {self.run_dir} "
                f"(supervisor pid {state.get('supervisor_pid', '?')}); "
                "see `herald status`, or stop it with `herald down`"
            ) from None
        self._lock_fh = fh

    def _release_lock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def _process(self, component: Component) -> ManagedProcess:
        assert self.ctx is not None
        return ManagedProcess(
            name=component.name,
            argv=component.argv(self.ctx),
            log_path=self.run_dir / "logs" / f"{component.name}.log",
            env={**self.ctx.child_env(), **(component.env(self.ctx) if component.env else {})},
            nice=nice_of(component, self.nice),
        )

    def _start_spare(self, component: Component) -> None:
        """Start the warm spare of `component` if it has one (infra/spare.py)."""
        if not component.spare or component.name in self.spares:
            return
        spare = self._process(component)
        spare.argv = [sys.executable, "-m", "infra.spare", *spare.argv[1:]]
        spare.stdin_pipe = True
        spare.start()
        self.spares[component.name] = spare

    def _start_all(self, components: list[Component]) -> None:
        """Start components together, then wait for each to be healthy."""
        for component in components:
            self.on_event(f"starting {component.name}")
            process = self._process(component)
            process.start()
            self.running[component.name] = Running(component, process)
            self._write_state(ready=False)
        for component in components:
            self._await_healthy(self.running[component.name])

    def _await_healthy(self, running: Running) -> None:
        assert self.ctx is not None
        ctx, component, process = self.ctx, running.component, running.process

        def check() -> bool:
            if not process.alive():
                raise InfraError(
                    f"{component.name} exited with code {process.returncode()}; "
                    f"last log lines ({process.log_path}):\n{process.tail()}"
                )
            return component.healthy(ctx)

        try:
            wait_until(check, component.ready_timeout, what=f"{component.name} to be healthy")
        except TimeoutError as exc:
            raise InfraError(f"{exc}; log: {process.log_path}\n{process.tail()}") from exc
        self.on_event(f"{component.name} healthy at {component.address(ctx)}")

    def _bootstrap(self) -> None:
        """Create topics and apply ClickHouse migrations (both idempotent)."""
        assert self.ctx is not None
        env = self.ctx.child_env()
        if "HERALD_KAFKA_BOOTSTRAP_SERVERS" in env:
            from infra.topics import create_topics

            kafka = KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"])
            created = create_topics(kafka)
            self.on_event(f"kafka topics ready ({len(created)} created)")
        if "HERALD_CLICKHOUSE_DSN" in env:
            from herald.clickhouse import herald_client
            from infra.migrate import apply_migrations

            client = herald_client(ClickHouseSettings(dsn=env["HERALD_CLICKHOUSE_DSN"]))
            try:
                applied = apply_migrations(client)
            finally:
                client.close()
            self.on_event(f"clickhouse migrations applied ({len(applied)} new)")

    def _reset_recovery(self) -> None:
        """Fresh Bytewax recovery partitions for every job.

        The embedded broker is memory-only, so offsets snapshotted by a previous stack point
        into topics that no longer exist; resuming from them would skip new records.
        """
        import subprocess

        partitions: dict[str, int] = {}
        for component in self.jobs:
            job = component.job or component.name
            partitions[job] = max(partitions.get(job, 1), component.processes)
        for job, count in partitions.items():
            path = self.run_dir / "recovery" / job
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            subprocess.run(
                [sys.executable, "-m", "bytewax.recovery", str(path), str(count)],
                check=True,
                capture_output=True,
            )

    def _restart(self, running: Running) -> None:
        now = time.monotonic()
        if now < running.next_restart:
            return
        name = running.component.name
        self.on_event(
            f"{name} exited with code {running.process.returncode()}; restarting "
            f"(restart #{running.restarts + 1}, log {running.process.log_path})"
        )
        running.process.stop(timeout=2)
        spare = self.spares.pop(name, None)
        if spare is not None and spare.go():
            running.process = spare  # imported ahead: starts ~1-2 s sooner
        else:
            running.process = self._process(running.component)
            running.process.start()
        self._start_spare(running.component)
        running.restarts += 1
        running.next_restart = now + min(30.0, 2.0 ** min(running.restarts, 5))
        if name == "kafka":
            self.on_event("kafka restarted: the embedded broker is memory-only, records are lost")
            with contextlib.suppress(Exception):
                self._await_healthy(running)
                self._bootstrap()
        self._write_state(ready=True)

    def _write_state(self, ready: bool) -> None:
        assert self.ctx is not None
        ctx = self.ctx
        state = {
            "supervisor_pid": os.getpid(),
            "run_dir": str(self.run_dir),
            "host": self.host,
            "ready": ready,
            "processes": self.processes,
            "written_at": datetime.now(UTC).isoformat(),
            "ports": ctx.ports,
            "env": ctx.child_env(),
            "components": {
                name: {
                    "kind": r.component.kind,
                    "pid": r.process.pid,
                    "address": r.component.address(ctx),
                    "log": str(r.process.log_path),
                    "restarts": r.restarts,
                }
                for name, r in self.running.items()
            },
            "urls": {
                "api": None,
                "dashboard": None,
                **{
                    r.component.url_name: r.component.address(ctx)
                    for r in self.running.values()
                    if r.component.url_name
                },
            },
        }
        tmp = self.run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)


def _jobs(processes: int) -> list[Component]:
    return jobs(processes)


# -- status and down, used by other processes than the supervisor ---------------------------


@dataclass
class ComponentStatus:
    name: str
    kind: str
    pid: int | None
    address: str
    healthy: bool
    detail: str


def stack_status(run_dir: Path) -> tuple[dict[str, Any] | None, list[ComponentStatus]]:
    """Check every component recorded in the state file: process alive and health check."""
    run_dir = run_dir.resolve()
    state = read_state(run_dir)
    if state is None or not is_locked(run_dir):
        return None, []
    ctx = Ctx(run_dir=run_dir, host=state["host"], ports=dict(state["ports"]))
    by_name = {c.name: c for c in SERVICES + jobs(int(state.get("processes") or 1))}
    result = []
    for name, info in state["components"].items():
        pid = info.get("pid")
        alive = bool(pid) and pid_alive(int(pid))
        healthy, detail = alive, "running" if alive else "not running"
        component = by_name.get(name)
        if alive and component is not None:
            try:
                healthy = bool(component.healthy(ctx))
                detail = "healthy" if healthy else "unhealthy"
            except Exception as exc:
                healthy, detail = False, f"unhealthy: {exc}"
        result.append(ComponentStatus(name, info["kind"], pid, info["address"], healthy, detail))
    return state, result


def stop_stack(run_dir: Path, timeout: float = 60.0) -> bool:
    """Ask the supervisor to stop (SIGTERM) and wait; kill leftovers. False if none ran."""
    run_dir = run_dir.resolve()
    state = read_state(run_dir)
    if state is None:
        return False
    supervisor = int(state["supervisor_pid"])
    if pid_alive(supervisor):
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not pid_alive(supervisor), timeout, what="supervisor to stop")
    # A supervisor killed with SIGKILL leaves its components: stop them directly.
    pids = [int(info["pid"]) for info in state["components"].values() if info.get("pid")]
    kill_groups([pid for pid in pids if pid_alive(pid)])
    with contextlib.suppress(FileNotFoundError):
        (run_dir / STATE_FILE).unlink()
    return True
