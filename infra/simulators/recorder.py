"""A tiny HTTP server that records the callbacks simulators post (tests and demos only).

    with CallbackRecorder() as rec:
        start_simulator("sms_a", ..., callback_url=rec.url("/v1/callbacks/sms_a"))
        rec.wait_for(4)
        rec.requests[0].form()

Runs a stdlib ThreadingHTTPServer in a daemon thread on a free loopback port and answers 204.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

import orjson

__all__ = ["CallbackRecorder", "RecordedRequest"]


@dataclass(frozen=True)
class RecordedRequest:
    """One received callback."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    received_at: float

    def form(self) -> dict[str, str]:
        """The body as form params."""
        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))

    def json(self) -> Any:
        """The body as JSON."""
        return orjson.loads(self.body)


class CallbackRecorder:
    """Records every POST it receives; `status` is what it answers (default 204)."""

    def __init__(
        self, host: str = "127.0.0.1", status: int = 204, slow_first_s: float = 0.0
    ) -> None:
        """`slow_first_s`: the first request is taken (recorded and answered) only after this
        long, as by a receiver slow to accept a connection."""
        self.requests: list[RecordedRequest] = []
        self.status = status
        self._slow_first_s = slow_first_s
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - stdlib naming
                with recorder._lock:
                    slow, recorder._slow_first_s = recorder._slow_first_s, 0.0
                if slow:
                    time.sleep(slow)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                item = RecordedRequest(
                    "POST",
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    time.monotonic(),
                )
                with recorder._lock:
                    recorder.requests.append(item)
                self.send_response(recorder.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/") -> str:
        """Absolute URL of `path` on this recorder."""
        return f"http://{self.host}:{self.port}{path}"

    def wait_for(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until at least `n` requests arrived; return them (TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= n:
                    return list(self.requests)
            time.sleep(0.02)
        raise TimeoutError(f"got {len(self.requests)} callbacks, expected {n}")

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> CallbackRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
