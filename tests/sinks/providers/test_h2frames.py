"""H2Transport against a scripted HTTP/2 server (the `h2` library, cleartext prior knowledge):
GOAWAY, RST_STREAM and CONTINUATION, the frames a provider sends rarely and the simulators never.

Each test gives the server a script: called once per complete request, it answers, resets the
stream, says GOAWAY or writes raw frames. What the server saw (connections, streams, the frame
types on the wire) is checked beside what the client got.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import DataReceived, RequestReceived, StreamEnded
from hpack import Encoder
from hyperframe.frame import ContinuationFrame, HeadersFrame, PingFrame

from sinks.providers.h2transport import H2Transport
from tests.sinks.providers.helpers import run

HEADERS, RST_STREAM, GOAWAY, CONTINUATION = 1, 3, 7, 9
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame_types(wire: bytes) -> list[int]:
    """The type of every complete frame in `wire` (a client's bytes start with the preface)."""
    pos = len(_PREFACE) if wire.startswith(_PREFACE) else 0
    kinds = []
    while len(wire) - pos >= 9:
        hi, lo, kind = struct.unpack_from(">BHB", wire, pos)
        kinds.append(kind)
        pos += 9 + (hi << 16 | lo)
    return kinds


class ServerConn(asyncio.Protocol):
    """One server-side connection driven by `h2`; the script decides what each request gets."""

    def __init__(self, index: int, script: Script) -> None:
        self.index = index
        self.script = script
        self.h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self.transport: asyncio.Transport | None = None
        self.requests: list[tuple[int, dict[bytes, bytes]]] = []  # (stream id, headers)
        self.received, self.sent = bytearray(), bytearray()
        self.pending: list[int] = []  # for scripts that answer later
        self.lost = asyncio.Event()
        self._heads: dict[int, dict[bytes, bytes]] = {}
        self._bodies: dict[int, bytearray] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.initiate_connection()
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.received += data
        for ev in self.h2.receive_data(data):
            if isinstance(ev, RequestReceived):
                self._heads[ev.stream_id] = dict(ev.headers)
                self._bodies[ev.stream_id] = bytearray()
            elif isinstance(ev, DataReceived):
                self._bodies[ev.stream_id] += ev.data
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, StreamEnded):
                head = self._heads[ev.stream_id]
                self.requests.append((ev.stream_id, head))
                self.script(self, ev.stream_id, head, bytes(self._bodies[ev.stream_id]))
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.sent += data
            self.transport.write(data)

    # -- what a script does -----------------------------------------------------------------

    def respond(self, sid: int, body: bytes = b"ok", headers: tuple[Any, ...] = ()) -> None:
        self.h2.send_headers(sid, [(b":status", b"200"), *headers])
        self.h2.send_data(sid, body, end_stream=True)

    def reset(self, sid: int, code: ErrorCodes) -> None:
        self.h2.reset_stream(sid, code)

    def goaway(self, last_stream_id: int) -> None:
        self.h2.close_connection(ErrorCodes.NO_ERROR, last_stream_id=last_stream_id)
        self.flush()
        assert self.transport is not None
        self.transport.close()

    def raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.flush()
        self.sent += data
        self.transport.write(data)


Script = Callable[[ServerConn, int, dict[bytes, bytes], bytes], None]


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[tuple[httpx.AsyncClient, list[ServerConn]]]:
    """A scripted server on a free port and an httpx client on H2Transport pointed at it."""
    conns: list[ServerConn] = []

    def accept() -> ServerConn:
        conns.append(ServerConn(len(conns), script))
        return conns[-1]

    server = await asyncio.get_running_loop().create_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(
            transport=H2Transport(), base_url=f"http://127.0.0.1:{port}", timeout=5
        ) as client:
            yield client, conns
    finally:
        server.close()


def test_streams_above_a_goaway_go_out_again_on_a_new_connection() -> None:
    """GOAWAY(last_stream_id=1) with streams 3 and 5 open: 1 is answered, 3 and 5 were not
    processed and are sent once more, on a new connection."""

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        if conn.index:
            conn.respond(sid, body=b"second connection")
            return
        conn.pending.append(sid)
        if len(conn.pending) == 3:
            conn.respond(conn.pending[0], body=b"first connection")
            conn.goaway(last_stream_id=conn.pending[0])

    async def go() -> tuple[list[httpx.Response], list[ServerConn]]:
        async with scripted(script) as (client, conns):
            responses = await asyncio.gather(*(client.get(f"/{i}") for i in range(3)))
            return list(responses), conns

    responses, conns = run(go())
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert sorted(r.content for r in responses) == [
        b"first connection", b"second connection", b"second connection",
    ]  # fmt: skip
    assert [len(c.requests) for c in conns] == [3, 2]
    assert GOAWAY in frame_types(bytes(conns[0].sent))


def test_a_request_refused_by_goaway_twice_is_a_connect_error() -> None:
    """Nothing was processed, on either connection: ConnectError, which the provider clients
    treat as "not sent" (safe to fail over)."""

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        conn.goaway(last_stream_id=0)

    async def go() -> list[ServerConn]:
        async with scripted(script) as (client, conns):
            with pytest.raises(httpx.ConnectError, match="refused"):
                await client.post("/3/device/x", content=b"{}")
            return conns

    conns = run(go())
    assert [len(c.requests) for c in conns] == [1, 1]


def test_a_refused_stream_is_sent_once_more() -> None:
    """RST_STREAM(REFUSED_STREAM): the server did not process it; the retry is answered."""

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        if sid == 1:
            conn.reset(sid, ErrorCodes.REFUSED_STREAM)
        else:
            conn.respond(sid, body=body)

    async def go() -> tuple[httpx.Response, list[ServerConn]]:
        async with scripted(script) as (client, conns):
            return await client.post("/x", content=b"payload"), conns

    response, conns = run(go())
    assert response.status_code == 200 and response.content == b"payload"
    assert [sid for sid, _ in conns[0].requests] == [1, 3] and len(conns) == 1
    assert RST_STREAM in frame_types(bytes(conns[0].sent))


def test_a_stream_refused_twice_is_a_connect_error() -> None:
    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        conn.reset(sid, ErrorCodes.REFUSED_STREAM)

    async def go() -> list[ServerConn]:
        async with scripted(script) as (client, conns):
            with pytest.raises(httpx.ConnectError, match="refused"):
                await client.get("/x")
            return conns

    conns = run(go())
    assert sum(len(c.requests) for c in conns) == 2


def test_a_stream_reset_with_an_error_fails_that_request_and_the_connection_lives() -> None:
    """RST_STREAM(INTERNAL_ERROR) after the request arrived: it may have been processed, so it
    is RemoteProtocolError (never resent); the next request uses the same connection."""

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        if head[b":path"] == b"/reset":
            conn.reset(sid, ErrorCodes.INTERNAL_ERROR)
        else:
            conn.respond(sid)

    async def go() -> tuple[httpx.Response, list[ServerConn]]:
        async with scripted(script) as (client, conns):
            with pytest.raises(httpx.RemoteProtocolError, match="stream reset: 2"):
                await client.get("/reset")
            return await client.get("/after"), conns

    response, conns = run(go())
    assert response.status_code == 200
    assert len(conns) == 1 and [h[b":path"] for _, h in conns[0].requests] == [b"/reset", b"/after"]


def test_a_response_head_across_continuation_frames() -> None:
    """A response header block larger than one frame (16 KiB) arrives as HEADERS + CONTINUATION."""
    big = secrets.token_hex(30_000)  # ~40 KB after HPACK's Huffman coding

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        conn.respond(sid, headers=((b"x-big", big.encode()),))

    async def go() -> tuple[httpx.Response, list[ServerConn]]:
        async with scripted(script) as (client, conns):
            return await client.get("/x"), conns

    response, conns = run(go())
    assert response.status_code == 200 and response.headers["x-big"] == big
    assert frame_types(bytes(conns[0].sent)).count(CONTINUATION) >= 2


def test_a_request_head_across_continuation_frames() -> None:
    """A request header block larger than the server's frame size goes out as HEADERS +
    CONTINUATION, and the server reads it whole."""
    big = secrets.token_hex(25_000)

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        conn.respond(sid, body=hashlib.sha256(head[b"x-big"]).hexdigest().encode())

    async def go() -> tuple[httpx.Response, list[ServerConn]]:
        async with scripted(script) as (client, conns):
            return await client.get("/x", headers={"x-big": big}), conns

    response, conns = run(go())
    assert response.content == hashlib.sha256(big.encode()).hexdigest().encode()
    kinds = frame_types(bytes(conns[0].received))
    assert kinds.count(CONTINUATION) >= 2 and kinds.index(HEADERS) < kinds.index(CONTINUATION)


def test_a_header_block_interrupted_by_another_frame_is_a_connection_error() -> None:
    """HEADERS without END_HEADERS, then a PING: RFC 9113 §6.10 makes that a connection error.
    The request fails with RemoteProtocolError and the client says GOAWAY(PROTOCOL_ERROR)."""
    block = Encoder().encode([(b":status", b"200")])

    def script(conn: ServerConn, sid: int, head: dict[bytes, bytes], body: bytes) -> None:
        conn.raw(
            HeadersFrame(sid, data=b"").serialize()
            + PingFrame(0, opaque_data=b"\0" * 8).serialize()
            + ContinuationFrame(sid, data=block, flags=["END_HEADERS"]).serialize()
        )

    async def go() -> list[ServerConn]:
        async with scripted(script) as (client, conns):
            with pytest.raises(httpx.RemoteProtocolError, match="header block interrupted"):
                await client.get("/x")
            await asyncio.wait_for(conns[0].lost.wait(), 10)  # the client closed it
            return conns

    conns = run(go())
    wire = bytes(conns[0].received)
    assert GOAWAY in frame_types(wire)
    goaway_at = _frame_offset(wire, GOAWAY)
    assert struct.unpack_from(">LL", wire, goaway_at + 9)[1] == ErrorCodes.PROTOCOL_ERROR


def _frame_offset(wire: bytes, kind: int) -> int:
    """Where the first frame of `kind` starts in a client's bytes."""
    pos = len(_PREFACE)
    while True:
        hi, lo, found = struct.unpack_from(">BHB", wire, pos)
        if found == kind:
            return pos
        pos += 9 + (hi << 16 | lo)
