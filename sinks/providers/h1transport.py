"""A lean HTTP/1.1 keep-alive transport for httpx: one asyncio.Protocol per connection, h11.

httpx's default pool (httpcore) walks every pooled connection on every request and asks each
whether its socket turned readable (a syscall and several anyio attribute lookups each): with
16 connections that is most of the ~1.5 ms of CPU an SMS or email send cost, and it capped a
process near 350 sends/s. Here an idle connection learns that the server closed it from the
event loop itself (`eof_received` / `connection_lost`), so taking one from the pool is a pop
and a flag check; h11 frames the messages.

Plug it into `httpx.AsyncClient(transport=H1Transport(...))`. Semantics the provider clients
rely on (`sinks.providers.base` maps them to outcomes), as with httpx's own transport:
    httpx.ConnectError / ConnectTimeout / PoolTimeout   nothing was sent
    httpx.ReadTimeout                                    sent, no answer in time (closed)
    httpx.ReadError / RemoteProtocolError                sent, connection failed or bad answer
A connection idle for longer than `keepalive_expiry` is closed instead of reused (a server may
close it at the same moment we write), as httpx does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from typing import Any

import h11
import httpx

from sinks.providers.connect import client_tls, connect_errors

__all__ = ["H1Transport"]

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"upgrade"})
Origin = tuple[str, str, int]


class _Stale(Exception):
    """The pooled connection closed before the request was written: nothing was sent."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request/response at a time."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._waiter: asyncio.Future[None] | None = None
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes while idle: nothing we can pair them with
            self.close()
            return
        self.h11.receive_data(data)
        self._read_events()

    def eof_received(self) -> bool:
        if self._waiter is not None:
            self.h11.receive_data(b"")
            self._read_events()
        self.closed = True
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(httpx.ReadError(f"connection lost: {exc or 'closed by the server'}"))

    # -- exchange -----------------------------------------------------------------------------

    def _read_events(self) -> None:
        while self._waiter is not None:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._fail(httpx.RemoteProtocolError(str(exc)))
                self.close()
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                self._status = event.status_code
                self._headers = list(event.headers)
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                waiter, self._waiter = self._waiter, None
                if not waiter.done():
                    waiter.set_result(None)
            elif isinstance(event, h11.ConnectionClosed):
                self._fail(httpx.ReadError("connection closed before the response ended"))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def exchange(
        self, head: h11.Request, body: bytes, read_timeout: float | None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Write one request, wait for the whole response (ReadTimeout closes the connection)."""
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise _Stale
        self._status, self._headers, self._body = 0, [], bytearray()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            out = self.h11.send(head)
            if body:
                out += self.h11.send(h11.Data(data=body))
            out += self.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            self._waiter = None
            raise httpx.LocalProtocolError(str(exc)) from exc
        self.transport.write(out)
        try:
            async with asyncio.timeout(read_timeout):
                await self._waiter
        except TimeoutError as exc:
            self._waiter = None
            self.close()
            raise httpx.ReadTimeout("no response in time") from exc
        return self._status, self._headers, bytes(self._body)

    def reusable(self) -> bool:
        """Both sides finished the exchange and agreed to keep the connection: next cycle."""
        if self.closed or self.h11.our_state is not h11.DONE:
            return False
        if self.h11.their_state is not h11.DONE:
            return False
        self.h11.start_next_cycle()
        self.idle_since = time.monotonic()
        return True

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class H1Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive connection pool for httpx (see the module docstring)."""

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | bool = True,
        max_connections: int = 16,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self._ssl = client_tls(verify, "http/1.1")
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._open = 0  # connections checked out or connecting
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def _connect(self, origin: Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        tls = scheme == "https"
        conn = _Connection()
        with connect_errors(host, port, conn.close):
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().create_connection(
                    lambda: conn,
                    host,
                    port,
                    ssl=self._ssl if tls else None,
                    server_hostname=host if tls else None,
                )
        return conn

    async def _checkout(self, origin: Origin, timeouts: dict[str, Any]) -> _Connection:
        """An idle live connection to `origin`, or a new one within `max_connections`."""
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have expired
            if not conn.closed and now - conn.idle_since < self.keepalive_expiry:
                self._open += 1
                return conn
            conn.close()
        if self._open + self._idle_count() >= self.max_connections:
            self._drop_one_idle()
        if self._open + self._idle_count() >= self.max_connections:
            await self._wait_for_slot(timeouts.get("pool"))
            return await self._checkout(origin, timeouts)
        self._open += 1
        try:
            return await self._connect(origin, timeouts.get("connect"))
        except BaseException:
            self._release()
            raise

    def _idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def _drop_one_idle(self) -> None:
        """Close an idle connection to another origin to make room (rare: one origin a client)."""
        for queue in self._idle.values():
            if queue:
                queue.popleft().close()
                return

    async def _wait_for_slot(self, timeout: float | None) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no HTTP/1.1 connection available in time") from exc
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _release(self) -> None:
        """A checked-out connection went back to the pool or was closed: wake one waiter."""
        self._open -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """httpx transport API: send `request` on a pooled keep-alive connection."""
        url = request.url
        if url.scheme not in ("https", "http"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}")
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        body = await request.aread()
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP_BY_HOP]
        try:
            head = h11.Request(method=request.method, target=url.raw_path, headers=headers)
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        for attempt in range(2):
            conn = await self._checkout(origin, timeouts)
            try:
                status, raw_headers, content = await conn.exchange(head, body, timeouts.get("read"))
                break
            except _Stale:
                conn.close()
                self._release()
                if attempt:
                    raise httpx.ConnectError("connections closed before the request") from None
            except BaseException:
                conn.close()
                self._release()
                raise
        if conn.reusable():
            self._idle.setdefault(origin, deque()).append(conn)
        else:
            conn.close()
        self._release()
        return httpx.Response(
            status,
            headers=raw_headers,
            content=content,
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    async def aclose(self) -> None:
        """Close every idle connection (checked-out ones close when their exchange ends)."""
        for queue in self._idle.values():
            while queue:
                with contextlib.suppress(Exception):
                    queue.pop().close()
        self._idle.clear()
