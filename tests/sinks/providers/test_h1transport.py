"""H1Transport (Herald's lean HTTP/1.1 transport for httpx) against real loopback servers: the
SMS A simulator, and a small asyncio server whose misbehaviour each test chooses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from herald.outcomes import Accepted, Outcome
from infra.simulators.launcher import RunningSimulator
from sinks.providers import ProviderClient, TwilioClient
from sinks.providers.h1transport import H1Transport
from tests.sinks.providers.helpers import delivery, run, send_with, twilio_config

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[_Server]:
    server = _Server(handler)
    srv = await asyncio.start_server(server._serve, "127.0.0.1", 0)  # noqa: SLF001
    port = srv.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    async with srv:
        yield server


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request (headers + Content-Length body); False at EOF."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return False
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return True


def _ok(body: bytes = b"ok", close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while await _read_request(reader):
            writer.write(_ok())
            await writer.drain()
    except asyncio.IncompleteReadError:
        pass


def test_sends_over_the_sms_simulator(sms_a: RunningSimulator) -> None:
    records = [delivery(f"+1555000{i:04d}", channel="sms") for i in range(40)]

    async def body(client: ProviderClient) -> list[Outcome]:
        return list(await asyncio.gather(*(client.send(r) for r in records)))

    outcomes = send_with(lambda: TwilioClient(twilio_config(sms_a, max_connections=4)), body)
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert len({o.provider_msg_id for o in outcomes if isinstance(o, Accepted)}) == 40


def test_keeps_connections_alive_and_within_the_limit() -> None:
    async def go() -> tuple[int, list[int]]:
        async with serving(keep_alive) as server:
            transport = H1Transport(max_connections=3)
            async with httpx.AsyncClient(transport=transport, base_url=server.url) as client:
                first = await asyncio.gather(
                    *(client.post("/x", content=b"a" * 10) for _ in range(30))
                )
                again = [await client.get("/y") for _ in range(10)]
            return server.connections, [r.status_code for r in first + again]

    connections, statuses = run(go())
    assert statuses == [200] * 40
    assert connections <= 3


def test_a_connection_the_server_closed_is_not_reused() -> None:
    async def close_after_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok())
        await writer.drain()  # then the connection closes (no Connection: close header)

    async def go() -> tuple[int, list[int]]:
        async with serving(close_after_one) as server:
            async with httpx.AsyncClient(transport=H1Transport(), base_url=server.url) as client:
                statuses = []
                for _ in range(5):
                    statuses.append((await client.get("/")).status_code)
                    await asyncio.sleep(0.05)  # the loop sees the EOF of the idle connection
            return server.connections, statuses

    connections, statuses = run(go())
    assert statuses == [200] * 5 and connections == 5


def test_connection_close_answer_is_honoured() -> None:
    async def says_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok(close=True))
        await writer.drain()
        await asyncio.sleep(0.2)  # the client must not wait for this close to reuse it

    async def go() -> tuple[int, list[bytes]]:
        async with serving(says_close) as server:
            async with httpx.AsyncClient(transport=H1Transport(), base_url=server.url) as client:
                bodies = [(await client.get("/")).content for _ in range(3)]
            return server.connections, bodies

    connections, bodies = run(go())
    assert bodies == [b"ok"] * 3 and connections == 3


def test_chunked_response_body() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-Id: 7\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        await writer.drain()

    async def go() -> httpx.Response:
        async with (
            serving(chunked) as server,
            httpx.AsyncClient(transport=H1Transport(), base_url=server.url) as client,
        ):
            return await client.post("/", json={"a": 1})

    resp = run(go())
    assert resp.status_code == 201 and resp.content == b"hello world"
    assert resp.headers["x-id"] == "7" and resp.http_version == "HTTP/1.1"


def test_no_answer_in_time_is_a_read_timeout_and_the_connection_is_dropped() -> None:
    async def silent_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(1.0)

    async def go() -> int:
        async with serving(silent_once) as server:
            async with httpx.AsyncClient(
                transport=H1Transport(), base_url=server.url, timeout=httpx.Timeout(0.2)
            ) as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.get("/")
                server.handler = keep_alive
                assert (await client.get("/")).status_code == 200
            return server.connections

    assert run(go()) == 2


def test_connection_lost_mid_answer_is_a_read_error() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()

    async def go() -> None:
        async with (
            serving(half) as server,
            httpx.AsyncClient(transport=H1Transport(), base_url=server.url) as client,
        ):
            await client.get("/")

    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        run(go())


def test_refused_connection_is_a_connect_error() -> None:
    async def go() -> None:
        async with serving(keep_alive) as server:
            url = server.url
        async with httpx.AsyncClient(transport=H1Transport()) as client:
            await client.get(url)  # the server is gone

    with pytest.raises(httpx.ConnectError):
        run(go())


def test_pool_timeout_when_every_connection_is_busy() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader):
            await asyncio.sleep(0.5)
            writer.write(_ok())
            await writer.drain()

    async def go() -> list[BaseException | httpx.Response]:
        async with serving(slow) as server:
            transport = H1Transport(max_connections=1)
            timeout = httpx.Timeout(5.0, pool=0.1)
            async with httpx.AsyncClient(
                transport=transport, base_url=server.url, timeout=timeout
            ) as client:
                both = await asyncio.gather(
                    client.get("/"), client.get("/"), return_exceptions=True
                )
                return list(both)

    results = run(go())
    assert sum(isinstance(r, httpx.PoolTimeout) for r in results) == 1
    assert sum(isinstance(r, httpx.Response) and r.status_code == 200 for r in results) == 1


def test_a_pooled_connection_closing_under_the_request_is_replaced() -> None:
    """Closed after it was taken from the pool, before the write: nothing was sent, so the
    request goes out on a new connection instead of failing."""

    async def go() -> tuple[int, int]:
        async with serving(keep_alive) as server:
            transport = H1Transport()
            async with httpx.AsyncClient(transport=transport, base_url=server.url) as client:
                await client.get("/")
                (idle,) = [c for q in transport._idle.values() for c in q]  # noqa: SLF001
                assert idle.transport is not None
                idle.transport.close()  # closing now; the loop reports it only later
                status = (await client.get("/")).status_code
            return status, server.connections

    assert run(go()) == (200, 2)
