"""Warm spares (infra/spare.py): a spare runs its command only when told, and the supervisor
hands a dead component's place to its spare and starts the next one."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from infra.process import port_open
from infra.services import Component
from infra.stack import Stack

REPO = Path(__file__).resolve().parents[2]


def _spare(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "infra.spare", "-m", "json.tool", *args],
        stdin=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip


def test_spare_runs_its_command_only_when_told(tmp_path: Path) -> None:
    source, told, never = tmp_path / "in.json", tmp_path / "told.json", tmp_path / "never.json"
    source.write_text('{"a": [1, 2]}')
    go = _spare(str(source), str(told))
    go.communicate(b"go\n", timeout=30)
    assert go.returncode == 0 and '"a": [' in told.read_text()  # json.tool ran, as `-m json.tool`
    idle = _spare(str(source), str(never))
    idle.communicate(b"", timeout=30)  # the supervisor went away: nothing runs
    assert idle.returncode == 0 and not never.exists()


def test_supervisor_hands_a_dead_component_to_its_spare(tmp_path: Path) -> None:
    """A component with a spare, SIGKILLed: its next process is the spare (the same pid),
    serving again, and a new spare waits."""
    web = Component(
        name="web", kind="job",
        argv=lambda ctx: [sys.executable, "-m", "http.server", str(ctx.port("web")),
                          "--bind", ctx.host],
        healthy=lambda ctx: port_open(ctx.host, ctx.port("web")),
        address=lambda ctx: f"http://{ctx.host}:{ctx.port('web')}",
        ports=("web",), spare=True,
    )  # fmt: skip
    stack = Stack(tmp_path, services=[], jobs=[web])
    ctx = stack.start()
    try:
        spare = stack.spares["web"]
        spare_pid = spare.pid
        stack.running["web"].process.proc.kill()  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while stack.running["web"].process.pid != spare_pid:
            stack.supervise_once()
            assert time.monotonic() < deadline, "the spare did not take over"
        deadline = time.monotonic() + 30
        while not port_open(ctx.host, ctx.port("web")):
            assert time.monotonic() < deadline, "the spare does not serve"
            time.sleep(0.05)
        assert stack.spares["web"].pid not in (None, spare_pid)
        assert stack.spares["web"].alive()
    finally:
        stack.stop()
