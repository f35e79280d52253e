"""infra/process.py: stopping several processes together."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from infra.process import ManagedProcess, pid_alive, stop_all

# Installs its SIGTERM handler, says so in a file, then waits: the handler cleans up for a
# moment, says so in another file and exits, or ("ignore") the signal is ignored.
CHILD = """
import pathlib, signal, sys, time
def stop(*_):
    time.sleep(0.2)
    pathlib.Path(sys.argv[1] + ".stopped").write_text("clean")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[2] == "ignore" else stop)
pathlib.Path(sys.argv[1]).write_text("ready")
while True:
    time.sleep(1)
"""


def _start(tmp_path: Path, name: str, on_term: str) -> ManagedProcess:
    ready = tmp_path / f"{name}.ready"
    proc = ManagedProcess(name, [sys.executable, "-c", CHILD, str(ready), on_term],
                          tmp_path / f"{name}.log")  # fmt: skip
    proc.start()
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.alive(), proc.tail()
        time.sleep(0.02)
    return proc


def test_stop_all_asks_every_process_then_kills_the_ones_that_ignore_it(tmp_path: Path) -> None:
    polite = [_start(tmp_path, f"job{i}", "exit") for i in range(3)]
    stubborn = _start(tmp_path, "stubborn", "ignore")
    stop_all([*polite, stubborn], timeout=1.0)
    stopped = sorted(path.name for path in tmp_path.glob("*.stopped"))
    assert stopped == ["job0.ready.stopped", "job1.ready.stopped", "job2.ready.stopped"]
    # ... and the one that ignored SIGTERM is gone too (SIGKILL once the timeout passed)
    assert not any(pid_alive(p.pid) for p in [*polite, stubborn] if p.pid)
    stop_all([*polite, stubborn])  # idempotent
