"""Modules that moved keep their old import names (dataflows/__init__.py `MOVED`): a recovery
snapshot pickled before a move loads after it, in a fresh interpreter."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from dataflows import MOVED
from dataflows.plan.request_source import Expansion

REPO = Path(__file__).resolve().parents[2]


def test_a_snapshot_pickled_under_the_old_module_name_loads() -> None:
    new = pickle.dumps(Expansion(request=None, batch_no=3, cursor="user-9", users=()), 2)  # type: ignore[arg-type]
    # protocol 2 names a class as text ("c<module>\n<name>\n"), as the old store did
    old = new.replace(b"dataflows.plan.request_source", b"dataflows._requests")
    assert old != new and MOVED["dataflows._requests"] == "dataflows.plan.request_source"
    code = (
        "import pickle, sys; e = pickle.loads(sys.stdin.buffer.read()); "
        "print(type(e).__module__, e.batch_no, e.cursor)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], input=old, cwd=REPO, capture_output=True, timeout=60
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert run.stdout.decode().split() == ["dataflows.plan.request_source", "3", "user-9"]
