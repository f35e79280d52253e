"""A lean HTTP/2 transport for httpx: many multiplexed streams per connection, few syscalls.

httpx's default HTTP/2 path (httpcore) spends ~1 ms of CPU per request under concurrency (a
lock and a task switch per frame read), which caps one core near 1k requests/s. `H2Transport`
speaks HTTP/2 framing itself from an `asyncio.Protocol` (sinks/providers/h2connection.py, Rust
HPACK): responses are dispatched to per-stream futures as frames arrive, and frames written in
one event-loop turn go out in one `write`.

Plug it into `httpx.AsyncClient(transport=H2Transport(...))`, or call
`handle_async_request(httpx.Request(...))` directly on the hot path.

Semantics the provider clients rely on (`sinks.providers.base` maps them to outcomes):
    httpx.ConnectError / ConnectTimeout / PoolTimeout   nothing was sent
    httpx.ReadTimeout                                    sent, no answer in time (stream reset)
    httpx.ReadError / RemoteProtocolError                sent, connection or stream failed
A stream the server refused (REFUSED_STREAM, or above a GOAWAY's last stream id) was not
processed: it is retried once on another connection, then reported as ConnectError.
The server's SETTINGS_MAX_CONCURRENT_STREAMS is honoured (APNs allows 1 stream until it has
seen a valid provider token), capped by `max_streams`; up to `max_connections` are opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Mapping

import httpx

from sinks.providers.connect import client_tls, connect_errors
from sinks.providers.h2connection import Connection, H2Response, Header, NotProcessed

__all__ = ["H2Response", "H2Transport", "Header"]

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"host"}
)


class H2Transport(httpx.AsyncBaseTransport):
    """HTTP/2-only (TLS with ALPN "h2", or prior-knowledge h2c) connection pool for httpx."""

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | bool = True,
        max_connections: int = 1,
        max_streams: int = 1000,
    ) -> None:
        self._ssl = client_tls(verify, "h2")
        self.max_connections = max_connections
        self.max_streams = max_streams
        self._conns: list[Connection] = []
        self._connecting = 0
        self._capacity: asyncio.Event | None = None
        self._origin: tuple[httpx.URL, bytes, bytes] | None = None

    # -- pool -------------------------------------------------------------------------------

    def _capacity_changed(self) -> None:
        if self._capacity is not None:
            self._capacity.set()

    def _forget(self, conn: Connection) -> None:
        if conn in self._conns:
            self._conns.remove(conn)
        self._capacity_changed()

    async def _connect(self, url: httpx.URL, timeout: float | None) -> Connection:
        loop = asyncio.get_running_loop()
        tls = url.scheme == "https"
        port = url.port or (443 if tls else 80)
        conn = Connection(self)
        with connect_errors(url.host, port, conn._close_transport):
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: conn,
                    url.host,
                    port,
                    ssl=self._ssl if tls else None,
                    server_hostname=url.host if tls else None,
                )
                if tls:
                    assert conn.transport is not None
                    ssl_object = conn.transport.get_extra_info("ssl_object")
                    if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
                        conn._close_transport()
                        raise httpx.ConnectError("server did not negotiate HTTP/2 (ALPN h2)")
                await conn.ready  # the server's SETTINGS (e.g. MAX_CONCURRENT_STREAMS)
        log.debug("h2.connected host=%s port=%s", url.host, port)
        return conn

    def _available(self) -> Connection | None:
        """A connection with a free stream now (the hot path: no timer, no await)."""
        for conn in self._conns:
            if conn.has_capacity():
                return conn
        return None

    async def _acquire(self, url: httpx.URL, timeouts: Mapping[str, float | None]) -> Connection:
        """Wait (up to the pool timeout) for a free stream, opening connections as allowed."""
        if self._capacity is None:
            self._capacity = asyncio.Event()
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                while True:
                    for conn in self._conns:
                        if conn.has_capacity():
                            return conn
                    if len(self._conns) + self._connecting < self.max_connections:
                        self._connecting += 1
                        try:
                            conn = await self._connect(url, timeouts.get("connect"))
                        finally:
                            self._connecting -= 1
                        self._conns.append(conn)
                        self._capacity_changed()
                        continue
                    self._capacity.clear()
                    await self._capacity.wait()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no HTTP/2 stream available in time") from exc

    # -- httpx transport API ------------------------------------------------------------------

    async def request(
        self,
        url: httpx.URL,
        method: bytes,
        path: bytes,
        headers: list[Header],
        body: bytes,
        timeouts: Mapping[str, float | None],
        *,
        index_path: bool = True,
    ) -> H2Response:
        """Send one request (`url` gives scheme and authority; header names lower-case).

        `headers` are (name, value, sensitive) triples: sensitive values (per-request ids) are
        never added to the HPACK table, so they don't evict the ones that repeat (the token).
        `index_path=False` keeps a per-request path out of the HPACK table too.
        """
        origin = self._origin
        if origin is None or origin[0] is not url:
            if url.scheme not in ("https", "http"):
                raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}")
            # httpx.URL parses again for .netloc on every access: remember the last URL object
            # (a provider client passes the same one on every call)
            origin = self._origin = (url, url.raw_scheme, url.netloc)
        head = [
            (b":method", method, False),
            (b":scheme", origin[1], False),
            (b":authority", origin[2], False),
            (b":path", path, not index_path),
            *headers,
        ]
        for attempt in range(2):
            conn = self._available() or await self._acquire(url, timeouts)
            try:
                stream = await conn.exchange(head, body, timeouts.get("read"))
            except NotProcessed:
                if attempt:
                    raise httpx.ConnectError("stream refused by the server") from None
                continue
            return H2Response(
                stream.status,
                {k.decode("latin-1"): v.decode("latin-1") for k, v in stream.headers},
                bytes(stream.body),
            )
        raise AssertionError("unreachable")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """httpx transport API: send `request` on a multiplexed stream."""
        body = await request.aread()
        headers = [
            (k.lower(), v, False) for k, v in request.headers.raw if k.lower() not in _HOP_BY_HOP
        ]
        resp = await self.request(
            request.url,
            request.method.encode(),
            request.url.raw_path,
            headers,
            body,
            request.extensions.get("timeout", {}),
        )
        return httpx.Response(
            resp.status_code,
            headers=list(resp.headers.items()),
            content=resp.content,
            extensions={"http_version": b"HTTP/2"},
            request=request,
        )

    async def aclose(self) -> None:
        """Send GOAWAY on every connection and close them."""
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                conn.close()
            conn._close_transport()
        self._conns.clear()
