"""A Bytewax cluster worker keeps its Python thread state (sources/consumer.py's docstring):
without it each call into Python starts from an empty state, and a worker's thread-local
registry and idle flag are lost between calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fresh_calls(keep: bool) -> dict[str, int]:
    """Each worker's number of calls (of 200) that found its thread state empty."""
    env = {**os.environ, "KEEP": "1" if keep else "0", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "bytewax.run", "tests.sources._thread_state_flow:flow", "-w", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line.split() for line in run.stdout.splitlines() if line.startswith("worker=")]
    return {worker: int(fresh.removeprefix("fresh=")) for worker, fresh in lines}


@pytest.mark.parametrize("keep", [False, True], ids=["bytewax-default", "kept"])
def test_a_cluster_worker_keeps_its_thread_state_once_asked(keep: bool) -> None:
    fresh = fresh_calls(keep)
    assert sorted(fresh) == ["worker=0", "worker=1"]
    if keep:
        assert set(fresh.values()) == {1}  # only the first call, before it was kept
    else:
        assert min(fresh.values()) > 100  # Bytewax's behaviour this works around
