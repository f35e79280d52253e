"""Managed subprocesses: start in their own process group, log to a file, stop for good.

Every embedded service and job is a plain OS process (no Docker). Each runs in a new session
so that stopping it also stops whatever it spawned (Bytewax workers, chDB threads); nothing
is left behind after `stop()`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def reset_sigint() -> None:  # pragma: no cover - runs in the child before exec
    """`preexec_fn` for a child stopped with SIGINT: SIGINT back to its default action.

    A shell starts background commands with SIGINT ignored, and an ignored signal stays ignored
    across exec: Python then never installs its KeyboardInterrupt handler, and a Bytewax job
    launched from there would ignore the clean stop (and be killed after the timeout).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _child_setup(nice: int = 0) -> None:  # pragma: no cover - runs in the child before exec
    reset_sigint()
    if nice:
        _lower_priority(nice)
    if sys.platform == "linux":
        _die_with_parent()


def _lower_priority(nice: int) -> None:  # pragma: no cover - runs in the child before exec
    """Add `nice` to this process's nice value, and to its session's scheduling group.

    With Linux's autogroup scheduling (on by default on desktop and server kernels) the CPU is
    shared between sessions first, and every child starts its own session (start_new_session):
    a nice value then only ranks a process against its own session, so the group's own nice
    value (/proc/self/autogroup) is the one that counts against the other components.
    """
    os.nice(nice)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
        group.write(str(nice))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to SIGTERM this child when the process that started it dies (even by SIGKILL).

    Children run in their own session (so Ctrl-C reaches only the supervisor, which then stops
    them in order); this makes sure a supervisor killed without warning leaves nothing behind.
    """
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


# Ports handed to servers come from below Linux's default ephemeral range (32768-60999), which
# outgoing connections draw from: an OS-chosen port (bind to 0) can be taken by a client socket
# between the moment it is picked and the moment the server binds it.
_SERVER_PORTS = (20000, 32000)
_rng = random.SystemRandom()


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, outside the ephemeral range when possible.

    Never the same port twice in one process: the launcher picks every port before the
    services bind them, so a port given to a service that has not bound it yet still looks free
    (two services once got the same port and the second failed to start)."""
    for _ in range(64):
        port = _rng.randrange(*_SERVER_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    check: Callable[[], bool], timeout: float, interval: float = 0.1, what: str = "condition"
) -> None:
    """Poll `check` until it returns True; raise TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # health checks may raise while a service boots
            last_exc = exc
        time.sleep(interval)
    detail = f" (last error: {last_exc})" if last_exc else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie we own)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def kill_group(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group led by `pid`, then SIGKILL whatever is left after `timeout`."""
    kill_groups([pid], timeout)


def kill_groups(pids: Sequence[int], timeout: float = 10.0) -> None:
    """`kill_group` for several groups at once: all are asked to stop together, so stopping
    them takes as long as the slowest, not the sum."""
    alive = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + timeout
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _group_alive(pid)]
            if alive:
                time.sleep(0.05)
        if not alive:
            return
    for pid in alive:
        if _group_alive(pid):
            log.warning("process.unkillable pid=%s", pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # The group may hold only zombies of ours; reap what we can and look again.
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class ManagedProcess:
    """One subprocess with its own process group and log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    # A pipe on stdin (a warm spare waits for a line on it, infra/spare.py).
    stdin_pipe: bool = False
    # Added to the process's nice value: > 0 gives the CPU to others first when it is scarce.
    nice: int = 0

    def start(self) -> None:
        """Start the process; stdout and stderr go to `log_path` (appended)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as logfile:
            self.proc = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.PIPE if self.stdin_pipe else subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=functools.partial(_child_setup, self.nice),
            )
        log.info("process.started name=%s pid=%s", self.name, self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def go(self) -> bool:
        """Tell a waiting spare to start (one line on its stdin); False when it is gone."""
        if self.proc is None or self.proc.stdin is None or not self.alive():
            return False
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except OSError:
            return False
        log.info("process.spare_started name=%s pid=%s", self.name, self.proc.pid)
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process and its whole group; idempotent."""
        stop_all([self], timeout)

    def tail(self, lines: int = 20) -> str:
        """The last lines of the log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_all(processes: Sequence[ManagedProcess], timeout: float = 10.0) -> None:
    """Stop several processes and their groups together (`kill_groups`); idempotent."""
    started = [(p.name, p.proc) for p in processes if p.proc is not None]
    kill_groups([proc.pid for _name, proc in started], timeout)
    for name, proc in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        log.info("process.stopped name=%s pid=%s rc=%s", name, proc.pid, proc.poll())
