"""A 2-worker Bytewax flow for tests/sources/test_thread_state.py: each worker's source
counts the calls that found its thread's Python state empty (KEEP=1 keeps it first)."""

from __future__ import annotations

import os
import threading

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from sources.consumer import keep_thread_state

CALLS = 200
_seen = threading.local()


class _Counting(StatelessSourcePartition[str]):
    def __init__(self, worker: int) -> None:
        if os.environ.get("KEEP") == "1":
            keep_thread_state()
        self._worker = worker
        self._calls = 0
        self._fresh = 0

    def next_batch(self) -> list[str]:
        if self._calls == CALLS:
            raise StopIteration
        self._calls += 1
        if not getattr(_seen, "marked", False):
            self._fresh += 1
            _seen.marked = True
        return [f"worker={self._worker} fresh={self._fresh}"] if self._calls == CALLS else []


class _Source(DynamicSource[str]):
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Counting:
        return _Counting(worker_index)


_print_lock = threading.Lock()


class _Lines(StatelessSinkPartition[str]):
    """One whole line per item: Bytewax's StdOutSink prints from both workers at once, and
    `print` writes the text and its newline apart, so two workers' lines could run together."""

    def write_batch(self, items: list[str]) -> None:
        with _print_lock:
            for item in items:
                print(item, flush=True)


class _Sink(DynamicSink[str]):
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Lines:
        return _Lines()


flow = Dataflow("thread_state")
op.output("out", op.input("in", flow, _Source()), _Sink())
