"""One HTTP/2 connection for `H2Transport`: h2's state machine driven by an asyncio.Protocol.

Frames are parsed as they arrive and each response is handed to its stream's future; frames
queued during one event-loop turn are written with one `write` (`flush_soon`). The pool that
owns the connection is told when capacity changes and when the connection goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
import httpx
from h2.errors import ErrorCodes

__all__ = ["Connection", "H2Response", "NotProcessed"]

log = logging.getLogger(__name__)


class Pool(Protocol):
    """What a connection needs from the pool that owns it."""

    max_streams: int

    def _capacity_changed(self) -> None: ...

    def _forget(self, conn: Connection) -> None: ...


_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)


class _H2(h2.connection.H2Connection):
    """h2's connection with an O(1) outbound-stream check.

    h2 counts open streams by scanning every stream on each `send_headers` (O(n) per request:
    the largest CPU cost at hundreds of concurrent streams). The transport enforces the
    server's MAX_CONCURRENT_STREAMS itself, so the real count (which also forgets closed
    streams) runs only on every 64th new stream.
    """

    _sends = 0

    @property
    def open_outbound_streams(self) -> int:
        self._sends += 1
        if self._sends % 64 == 0:
            return int(h2.connection.H2Connection.open_outbound_streams.fget(self))  # type: ignore[attr-defined]
        return 0


class _RawEncoder(hpack.Encoder):
    """HPACK without Huffman coding: ~50 µs less CPU per request for a few bytes more."""

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        return super().encode(headers, huffman=False)


class H2Response:
    """A complete HTTP/2 response: what the provider clients read from one."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # lower-case names
        self.content = content


class NotProcessed(Exception):
    """The server did not process this stream (refused / beyond GOAWAY): safe to resend."""


class _Stream:
    __slots__ = ("body", "future", "headers", "status")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()


class Connection(asyncio.Protocol):
    """One HTTP/2 connection: an h2 state machine fed by an asyncio transport."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.h2 = _H2(config=_CONFIG)
        self.h2.encoder = _RawEncoder()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.ready = asyncio.get_running_loop().create_future()
        self.closed = False  # no new streams (GOAWAY, lost, closing)
        self._flush_pending = False
        self._window = asyncio.Event()

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
            },
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(1 << 24)
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._fail_all(httpx.RemoteProtocolError(f"HTTP/2 protocol error: {exc}"))
            self._close_transport()
            return
        for event in events:
            self._dispatch(event)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(httpx.ConnectError(f"connection lost: {exc}"))
        self._fail_all(httpx.ReadError(f"connection lost: {exc or 'closed by peer'}"))
        self.pool._forget(self)

    # -- h2 events ------------------------------------------------------------------------

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                for name, value in event.headers or ():
                    if name == b":status":
                        stream.status = int(value)
                    elif not name.startswith(b":"):
                        stream.headers.append((bytes(name), bytes(value)))
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None and event.data:
                stream.body += event.data
            if event.flow_controlled_length:
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self._finish(event.stream_id, None)
        elif isinstance(event, h2.events.StreamReset):
            refused = event.error_code == ErrorCodes.REFUSED_STREAM
            exc: Exception = (
                NotProcessed()
                if refused
                else httpx.RemoteProtocolError(f"stream reset: {event.error_code!r}")
            )
            self._finish(event.stream_id, exc)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            if not self.ready.done():
                self.ready.set_result(None)
            self._window.set()
            self.pool._capacity_changed()
        elif isinstance(event, h2.events.WindowUpdated):
            self._window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._goaway(event.last_stream_id or 0, event.error_code)

    def _finish(self, stream_id: int, exc: Exception | None) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None and not stream.future.done():
            if exc is None:
                stream.future.set_result(None)
            else:
                stream.future.set_exception(exc)
        if self.closed and not self.streams:
            self._close_transport()  # draining after GOAWAY: the last stream is done
        self.pool._capacity_changed()

    def _goaway(self, last_stream_id: int, error_code: Any) -> None:
        self.closed = True
        log.info("h2.goaway error=%s last_stream_id=%s", error_code, last_stream_id)
        for stream_id in [s for s in self.streams if s > last_stream_id]:
            self._finish(stream_id, NotProcessed())
        if not self.streams:
            self._close_transport()
        self.pool._forget(self)

    def _fail_all(self, exc: Exception) -> None:
        for stream_id in list(self.streams):
            self._finish(stream_id, exc)

    # -- sending --------------------------------------------------------------------------

    def flush(self) -> None:
        """Write whatever h2 has queued (called at most once per loop turn via flush_soon)."""
        self._flush_pending = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self.flush)

    def has_capacity(self) -> bool:
        limit = min(self.pool.max_streams, self.h2.remote_settings.max_concurrent_streams)
        return not self.closed and len(self.streams) < limit

    def _close_transport(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        view = memoryview(body)
        while view:
            window = min(
                self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size
            )
            if window <= 0:
                self._window.clear()
                self.flush()
                await self._window.wait()
                continue
            chunk, view = view[:window], view[window:]
            self.h2.send_data(stream_id, bytes(chunk), end_stream=not view)

    async def exchange(
        self, headers: list[tuple[bytes, bytes]], body: bytes, read_timeout: float | None
    ) -> _Stream:
        """Send one request on a new stream and wait for the complete response."""
        loop = asyncio.get_running_loop()
        stream_id = self.h2.get_next_available_stream_id()
        stream = _Stream(loop.create_future())
        self.streams[stream_id] = stream
        try:
            self.h2.send_headers(stream_id, headers, end_stream=not body)
        except h2.exceptions.ProtocolError as exc:
            self.streams.pop(stream_id, None)
            raise httpx.LocalProtocolError(f"cannot open stream: {exc}") from exc
        if body:
            if (
                len(body) <= self.h2.local_flow_control_window(stream_id)
                and len(body) <= self.h2.max_outbound_frame_size
            ):
                self.h2.send_data(stream_id, body, end_stream=True)
            else:
                await self._send_body(stream_id, body)
        self.flush_soon()
        timer = (
            loop.call_later(read_timeout, self._timeout, stream_id)
            if read_timeout is not None
            else None
        )
        try:
            await stream.future
        finally:
            if timer is not None:
                timer.cancel()
        return stream

    def _timeout(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None or stream.future.done():
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(stream_id, ErrorCodes.CANCEL)
            self.flush_soon()
        stream.future.set_exception(httpx.ReadTimeout("no response in time"))
        self.pool._capacity_changed()
