"""An asyncio event loop in its own thread, for the provider clients of one sink partition.

A Bytewax worker is synchronous and holds the GIL while it runs Python; the provider clients are
asyncio (httpx, HTTP/2 multiplexing). Each sink partition owns one `LoopThread`: the worker
submits a whole batch of sends as one coroutine (`submit`) and waits for the future, which
releases the GIL, so the loop thread drives hundreds of concurrent requests meanwhile. The
standard asyncio loop is used: the lean HTTP/2 transport (sinks/providers/h2connection.py)
requires `asyncio.Transport` objects, which uvloop's transports are not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop until `close()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop; the future resolves in the calling thread's time."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result."""
        return self.submit(coro).result(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread (pending tasks are cancelled)."""
        if not self._thread.is_alive():
            return

        async def _cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(_cancel_all(), timeout)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("dispatch.loop_close_slow name=%s error=%s", self.name, type(exc).__name__)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
