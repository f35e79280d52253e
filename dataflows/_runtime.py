"""What a job process sets up when its `build_flow` is the entry point: logging, GC, /metrics.

    configure_process()               logging (HERALD_LOG_LEVEL, default INFO), tune_runtime(),
                                      and /metrics on HERALD_METRICS_PORT when set
                                      (herald.metrics)
    tune_runtime()                    the GC thresholds and the GIL switch interval below
                                      (in-process benchmarks call it too, so that they measure
                                      what a job process runs)
    defer_interrupts()                SIGINT stops the job through Bytewax's own signal check

Garbage collector: CPython's default thresholds (700, 10, 10) collect the youngest generation
every 700 container allocations and everything every 100 of those. A job allocates a few dicts
per record while its long-lived objects (modules, parsed schemas, clients, Bytewax state) sit in
the oldest generation, so full collections scan them again and again: on the dispatch job
(100k pushes) 21% of the process's CPU went to the collector, 50 full collections of ~53 ms.
Herald's records are acyclic (reference counting frees them), so the jobs collect less often:
the youngest generation every 50,000 allocations, the middle one every 20 of those, the oldest
every 100 of those. Cycles are still collected, only later; the collector's share fell to ~2.4%
of the CPU on the same run.

GIL switch interval: a job's worker thread runs Python almost without pause, and its helper
threads (the plan job's Redis calls, dataflows/plan/planner.py) need the GIL to pack a request or
parse an answer. With CPython's default 5 ms interval a helper waited up to 5 ms for each of
those steps, and the worker then waited for the helper: 0.54 s of a 100k-user campaign's ~3.8 s.
At 1 ms that wait fell to 0.09 s; the worker pays a few more switches.

Interrupts: an idle job waits in its Kafka source's poll (sources/consumer.py), inside Python,
so a SIGINT would raise KeyboardInterrupt there: Bytewax reports it as an error of the source
instead of stopping in order ("signal received"). `defer_interrupts` installs a SIGINT handler
that raises only where Bytewax checks for signals between steps (no Python frame of the job
running: the current frame is bytewax.run's call of its runtime); taken anywhere else, the
signal is delivered again every 2 ms until one lands in Bytewax's check. Once Bytewax has it,
further SIGINTs are ignored while the job stops (SIGTERM and SIGKILL still end it).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from types import FrameType

from herald.metrics import MetricsSettings, serve_metrics

__all__ = [
    "GC_THRESHOLDS",
    "SWITCH_INTERVAL_S",
    "configure_process",
    "defer_interrupts",
    "tune_runtime",
]

GC_THRESHOLDS = (50_000, 20, 100)
SWITCH_INTERVAL_S = 0.001


def configure_process() -> int | None:
    """Configure logging, the garbage collector and /metrics of a job process (entry point
    only); returns the metrics port, None when HERALD_METRICS_PORT is not set."""
    logging.basicConfig(
        level=os.environ.get("HERALD_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    tune_runtime()
    defer_interrupts()
    return serve_metrics(MetricsSettings())


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _taken.is_set():
        return  # Bytewax has it: the job is stopping
    if frame is None or frame.f_code.co_filename.endswith(_BYTEWAX_RUN):
        _taken.set()
        raise KeyboardInterrupt
    _resend(signum)


_BYTEWAX_RUN = os.path.join("bytewax", "run.py")
_resending: set[int] = set()
_taken = threading.Event()


def _resend(signum: int) -> None:
    """Deliver `signum` again every 2 ms (from a daemon thread) until Bytewax's check takes it:
    between its steps the worker spends milliseconds outside Python."""
    if signum in _resending:
        return
    _resending.add(signum)

    def again() -> None:
        while not _taken.wait(0.002):
            os.kill(os.getpid(), signum)

    threading.Thread(target=again, name="interrupt-resend", daemon=True).start()


def defer_interrupts() -> None:
    """SIGINT raises KeyboardInterrupt only in Bytewax's signal check (module docstring)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


def tune_runtime() -> None:
    """Collect less often, switch threads sooner (see the module docstring)."""
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
