"""One client HTTP/2 connection for `H2Transport`: RFC 9113 framing driven by an asyncio.Protocol.

Why not the `h2` state machine: at thousands of requests per second h2 (with pure-Python hpack
and hyperframe) cost ~200 µs of CPU per request — frame objects, per-stream state machines,
header validation and debug logging — three quarters of a push send. This module does only
what a client that sends complete requests and reads complete responses needs: it writes
HEADERS (+CONTINUATION) and DATA frames as bytes, parses inbound frames with `struct`, and
codes header blocks with the HPACK coder jh2's own connection uses (`jh2.connection`: its Rust
implementation: an APNs request head encodes in ~5 µs and a response decodes in ~2.5 µs,
against 62 and 33 µs with the pure-Python `hpack`; pinned, checked at import). Together
~5x less CPU.

What is implemented (client side only): SETTINGS (and ACK; MAX_CONCURRENT_STREAMS,
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE and HEADER_TABLE_SIZE honoured), PING ACK, GOAWAY (streams
above last-stream-id are `NotProcessed`), RST_STREAM (REFUSED_STREAM → `NotProcessed`),
WINDOW_UPDATE and both directions of flow control, padding, CONTINUATION, 1xx and trailers.
Server push is disabled (SETTINGS_ENABLE_PUSH=0), so PUSH_PROMISE is a protocol error.
Frames queued during one event-loop turn are written with one `write` (`flush_soon`); the pool
that owns the connection is told when capacity changes and when the connection goes away.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Protocol

import httpx
from jh2 import connection as jh2_connection
from jh2.connection import Decoder, Encoder, HPACKError

if not jh2_connection.ALTERNATIVE_HPACK:  # the pure-Python fallback takes (name, value) pairs
    raise ImportError("jh2 without its compiled HPACK coder: reinstall jh2 (requirements.lock)")

__all__ = ["Connection", "H2Response", "Header", "NotProcessed"]

log = logging.getLogger(__name__)

Header = tuple[bytes, bytes, bool]
"""(name, value, sensitive): lower-case name; sensitive values never enter the HPACK table."""

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME = struct.Struct(">BHBBL")  # length (24 bits as 8 + 16), type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION = 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
REFUSED_STREAM, CANCEL = 0x7, 0x8
_MAX_STREAM_ID = 2**31 - 1
_TICK = 0.05  # read timeouts are checked this often (one timer per connection, not per stream)
_RECV_WINDOW = 1 << 20  # our INITIAL_WINDOW_SIZE per stream
_CONN_RECV_WINDOW = 1 << 24  # added to the connection window at start
_LOCAL_SETTINGS = b"".join(
    _SETTING.pack(k, v) for k, v in ((0x2, 0), (0x3, 100), (0x4, _RECV_WINDOW))
)  # ENABLE_PUSH=0, MAX_CONCURRENT_STREAMS=100, INITIAL_WINDOW_SIZE


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One serialized frame."""
    n = len(payload)
    return _FRAME.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


class Pool(Protocol):
    """What a connection needs from the pool that owns it."""

    max_streams: int

    def _capacity_changed(self) -> None: ...

    def _forget(self, conn: Connection) -> None: ...


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
    __slots__ = ("body", "deadline", "future", "headers", "received", "send_window", "status")

    def __init__(self, future: asyncio.Future[None], send_window: int, deadline: float) -> None:
        self.future = future
        self.deadline = deadline  # loop time after which the stream is reset (ReadTimeout)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.send_window = send_window
        self.received = 0  # flow-controlled bytes not yet returned by WINDOW_UPDATE


class Connection(asyncio.Protocol):
    """One HTTP/2 connection: frames in and out of an asyncio transport."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False  # no new streams (GOAWAY, lost, closing, ids used up)
        self.remote_max_streams = 100  # until the server's SETTINGS say otherwise
        self._encoder = Encoder()
        self._decoder = Decoder()
        self._next_id = 1
        self._max_frame = 16_384
        self._initial_window = 65_535  # the server's INITIAL_WINDOW_SIZE
        self._conn_window = 65_535  # what we may still send on the connection
        self._conn_received = 0
        self._window = asyncio.Event()
        self._inbox = bytearray()
        self._block: bytearray | None = None  # header block awaiting CONTINUATION
        self._block_id = 0
        self._block_end = False
        self._out: list[bytes] = []
        self._flush_pending = False
        self._sweeper: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._out += [
            _PREFACE,
            frame(SETTINGS, 0, 0, _LOCAL_SETTINGS),
            frame(WINDOW_UPDATE, 0, 0, _U32.pack(_CONN_RECV_WINDOW)),
        ]
        self.flush()

    def data_received(self, data: bytes) -> None:
        buf = self._inbox
        buf += data
        pos, end = 0, len(buf)
        try:
            while end - pos >= 9:
                hi, lo, kind, flags, sid = _FRAME.unpack_from(buf, pos)
                size = hi << 16 | lo
                if end - pos - 9 < size:
                    break
                payload = bytes(buf[pos + 9 : pos + 9 + size])
                pos += 9 + size
                self._frame(kind, flags, sid & _MAX_STREAM_ID, payload)
        except (HPACKError, ValueError, IndexError, struct.error) as exc:
            self._protocol_error(f"HTTP/2 protocol error: {type(exc).__name__}: {exc}")
            return
        del buf[:pos]
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(httpx.ConnectError(f"connection lost: {exc}"))
        self._fail_all(httpx.ReadError(f"connection lost: {exc or 'closed by peer'}"))
        self.pool._forget(self)

    # -- inbound frames -------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            raise ValueError("header block interrupted")
        if kind in (HEADERS, DATA):
            size = len(payload)  # flow control counts padding too
            if flags & PADDED:
                payload = payload[1 : size - payload[0]]
            if kind == DATA:
                self._data(flags, sid, payload, size)
                return
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block, self._block_id = bytearray(), sid
            self._block_end = bool(flags & END_STREAM)
            kind, flags = CONTINUATION, flags & END_HEADERS
        if kind == CONTINUATION:
            if self._block is None or sid != self._block_id:
                raise ValueError("unexpected CONTINUATION")
            self._block += payload
            if flags & END_HEADERS:
                block, self._block = bytes(self._block), None
                self._headers(sid, self._decoder.decode(block, raw=True), self._block_end)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(sid, _U32.unpack(payload[:4])[0] & _MAX_STREAM_ID)
        elif kind == RST_STREAM:
            code = _U32.unpack(payload[:4])[0]
            refused = code == REFUSED_STREAM
            exc = NotProcessed() if refused else httpx.RemoteProtocolError(f"stream reset: {code}")
            self._finish(sid, exc)
        elif kind == PING:
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            last, code = struct.unpack(">LL", payload[:8])
            self._goaway(last & _MAX_STREAM_ID, code)
        elif kind == PUSH_PROMISE:
            raise ValueError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5)

    def _data(self, flags: int, sid: int, payload: bytes, size: int) -> None:
        self._conn_received += size
        if self._conn_received >= _CONN_RECV_WINDOW // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._conn_received)))
            self._conn_received = 0
        stream = self.streams.get(sid)
        if stream is None:
            return  # cancelled or unknown: counted for the connection window only
        stream.body += payload
        if flags & END_STREAM:
            self._finish(sid, None)
            return
        stream.received += size
        if stream.received >= _RECV_WINDOW // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, sid, _U32.pack(stream.received)))
            stream.received = 0

    def _headers(self, sid: int, headers: list[Header], end_stream: bool) -> None:
        stream = self.streams.get(sid)
        if stream is not None and stream.status < 200:  # response head (1xx heads replaced)
            stream.status, stream.headers = 0, []
            for name, value, _ in headers:
                if name == b":status":
                    stream.status = int(value)
                elif name[:1] != b":":
                    stream.headers.append((name, value))
        if end_stream:
            self._finish(sid, None)

    def _settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - 5, 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == 0x1:
                self._encoder.header_table_size = value
            elif key == 0x3:
                self.remote_max_streams = value
            elif key == 0x4:
                delta, self._initial_window = value - self._initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                self._window.set()
            elif key == 0x5:
                self._max_frame = value
        self._out.append(frame(SETTINGS, ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)
        self.pool._capacity_changed()

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            self._conn_window += increment
        elif (stream := self.streams.get(sid)) is not None:
            stream.send_window += increment
        self._window.set()

    def _finish(self, sid: int, exc: Exception | None) -> None:
        stream = self.streams.pop(sid, None)
        if stream is not None and not stream.future.done():
            if exc is None:
                stream.future.set_result(None)
            else:
                stream.future.set_exception(exc)
                self._window.set()  # a body send waiting for window sees its stream is gone
        if self.closed and not self.streams:
            self._close_transport()  # draining after GOAWAY: the last stream is done
        self.pool._capacity_changed()

    def _goaway(self, last_stream_id: int, error_code: int) -> None:
        self.closed = True
        log.info("h2.goaway error=%s last_stream_id=%s", error_code, last_stream_id)
        for sid in [s for s in self.streams if s > last_stream_id]:
            self._finish(sid, NotProcessed())
        if not self.streams:
            self._close_transport()
        self.pool._forget(self)

    def _fail_all(self, exc: Exception) -> None:
        for sid in list(self.streams):
            self._finish(sid, exc)

    def _protocol_error(self, message: str) -> None:
        log.warning("h2.protocol_error %s", message)
        self._out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", 0, 0x1)))
        self.flush()
        self._fail_all(httpx.RemoteProtocolError(message))
        self._close_transport()

    # -- sending --------------------------------------------------------------------------

    def flush(self) -> None:
        """Write the queued frames (called at most once per loop turn via flush_soon)."""
        self._flush_pending = False
        if self._out:
            data, self._out = b"".join(self._out), []
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(data)

    def flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self.flush)

    def has_capacity(self) -> bool:
        limit = min(self.pool.max_streams, self.remote_max_streams)
        return not self.closed and len(self.streams) < limit

    def close(self) -> None:
        """Say GOAWAY (no error) and close the connection."""
        self._out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", 0, 0)))
        self.flush()
        self._close_transport()

    def _close_transport(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self.transport is not None:
            self.transport.close()

    def _send_headers(self, sid: int, headers: list[Header], end_stream: bool) -> None:
        # Literals go out without Huffman coding (RFC 7541 §5.2 lets the sender choose): it
        # cost ~30 µs of pure Python per APNs request (47 -> 18 µs to encode a head, for ~50
        # more bytes), ~15 % of a core at 5,000 sends/s on the worker that holds the GIL.
        block = self._encoder.encode(headers, huffman=False)
        size = self._max_frame
        chunks = [block[i : i + size] for i in range(0, len(block), size)] or [b""]
        last = len(chunks) - 1
        for i, chunk in enumerate(chunks):
            flags = (END_HEADERS if i == last else 0) | (END_STREAM if end_stream and not i else 0)
            self._out.append(frame(HEADERS if not i else CONTINUATION, flags, sid, chunk))

    async def _send_body(self, sid: int, stream: _Stream, body: bytes) -> None:
        view = memoryview(body)
        while view:
            window = min(stream.send_window, self._conn_window, self._max_frame)
            if window <= 0:
                self._window.clear()
                self.flush()
                await self._window.wait()
                if sid not in self.streams:
                    return  # reset or failed meanwhile: its future says why
                continue
            chunk, view = bytes(view[:window]), view[window:]
            stream.send_window -= len(chunk)
            self._conn_window -= len(chunk)
            self._out.append(frame(DATA, 0 if view else END_STREAM, sid, chunk))

    async def exchange(
        self, headers: list[Header], body: bytes, read_timeout: float | None
    ) -> _Stream:
        """Send one request on a new stream and wait for the complete response.

        `headers` start with the pseudo-headers (:method, :scheme, :authority, :path).
        """
        loop = asyncio.get_running_loop()
        sid = self._next_id
        self._next_id += 2
        if self._next_id > _MAX_STREAM_ID:
            self.closed = True  # ids used up: the pool opens a new connection
        deadline = loop.time() + read_timeout if read_timeout is not None else float("inf")
        stream = _Stream(loop.create_future(), self._initial_window, deadline)
        self.streams[sid] = stream
        try:
            self._send_headers(sid, headers, end_stream=not body)
        except (HPACKError, ValueError, TypeError) as exc:
            self.streams.pop(sid, None)
            raise httpx.LocalProtocolError(f"cannot encode request headers: {exc}") from exc
        if body:
            n = len(body)
            if n <= stream.send_window and n <= self._conn_window and n <= self._max_frame:
                stream.send_window -= n
                self._conn_window -= n
                self._out.append(frame(DATA, END_STREAM, sid, body))
            else:
                await self._send_body(sid, stream, body)
        self.flush_soon()
        if self._sweeper is None and read_timeout is not None:
            self._sweeper = loop.call_later(_TICK, self._sweep)
        await stream.future
        return stream

    def _sweep(self) -> None:
        """Reset the streams past their read deadline; re-arm while any stream is open."""
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        for sid, stream in list(self.streams.items()):
            if stream.deadline <= now:
                self._timeout(sid)
        if self.streams and not (self.transport is None or self.transport.is_closing()):
            self._sweeper = asyncio.get_running_loop().call_later(_TICK, self._sweep)

    def _timeout(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is None or stream.future.done():
            return
        self._out.append(frame(RST_STREAM, 0, sid, _U32.pack(CANCEL)))
        self.flush_soon()
        stream.future.set_exception(httpx.ReadTimeout("no response in time"))
        self._window.set()
        self.pool._capacity_changed()
