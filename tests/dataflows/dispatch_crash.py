"""A dispatch job that kills itself with SIGKILL at one batch stage (tests only).

    python -m bytewax.run "tests.dataflows.dispatch_crash:build_flow(stage='answered')"

The crash happens once: the first batch that reaches `stage` writes the marker file named by
HERALD_TEST_CRASH_MARKER and kills the process; a restarted job sees the marker and runs normally.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from bytewax.dataflow import Dataflow

from dataflows.dispatch import build_flow as dispatch_flow
from sinks.dispatch.work import Item


def build_flow(
    channel: str = "push", traffic_class: str = "transactional", stage: str = "sent"
) -> Dataflow:
    """The real dispatch job with a crash hook at `stage` (guarded | answered | sent | marked:
    sinks/dispatch/engine.py)."""
    marker = Path(os.environ["HERALD_TEST_CRASH_MARKER"])

    def hook(name: str, items: list[Item]) -> None:
        if name == stage and items and not marker.exists():
            marker.write_text(",".join(it.delivery_id for it in items))
            os.kill(os.getpid(), signal.SIGKILL)

    return dispatch_flow(channel=channel, traffic_class=traffic_class, hook=hook)
