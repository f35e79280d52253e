"""H2Transport (Herald's lean HTTP/2 transport for httpx) against the APNs simulator."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx

from herald.outcomes import Accepted, Outcome, Unknown
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.providers import ApnsClient, ProviderClient
from sinks.providers.h2transport import H2Transport
from tests.sinks.providers.helpers import apns_config, delivery, run, send_with


def test_plugs_into_httpx_async_client(apns: RunningSimulator) -> None:
    async def go() -> httpx.Response:
        ctx = ssl.create_default_context(cafile=str(apns.ca_path))
        async with httpx.AsyncClient(transport=H2Transport(verify=ctx)) as client:
            return await client.get(f"{apns.base_url}/healthz")

    resp = run(go())
    assert resp.status_code == 200 and resp.http_version == "HTTP/2"
    assert resp.json()["simulator"] == "apns"


def test_tls_or_alpn_failure_is_a_connect_error(sms_a: RunningSimulator) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(transport=H2Transport(verify=False)) as client:
            await client.get(f"https://{sms_a.host}:{sms_a.port}/healthz", timeout=2)

    try:
        run(go())
    except httpx.ConnectError:
        return
    raise AssertionError("expected ConnectError against a plain-HTTP/1.1 server")


def test_honours_server_max_concurrent_streams(tmp_path: Path) -> None:
    """More requests in flight than the server allows streams: queued, all succeed."""
    with start_simulator("apns", tmp_path / "apns", config={"max_concurrent_streams": 10}) as sim:
        records = [delivery(f"{i:064x}") for i in range(100)]

        async def body(client: ProviderClient) -> list[Outcome]:
            return list(await asyncio.gather(*(client.send(r) for r in records)))

        outcomes = send_with(lambda: ApnsClient(apns_config(sim, max_concurrency=100)), body)
        assert all(isinstance(o, Accepted) for o in outcomes)
        assert sim.stats(ids=False)["connections"] == 1


def test_connection_survives_a_timed_out_stream(apns: RunningSimulator) -> None:
    apns.configure(timeout_after_accept=1.0)

    async def body(client: ProviderClient) -> list[Outcome]:
        first = await client.send(delivery("aa" * 32))
        await asyncio.to_thread(apns.configure, timeout_after_accept=0.0)
        return [first, await client.send(delivery("bb" * 32))]

    first, second = send_with(lambda: ApnsClient(apns_config(apns, timeout_s=0.4)), body)
    assert isinstance(first, Unknown) and isinstance(second, Accepted)
    assert apns.stats(ids=False)["connections"] == 1


def test_httpcore_transport_option_still_works(apns: RunningSimulator) -> None:
    records = [delivery(f"{i:064x}") for i in range(64)]

    async def body(client: ProviderClient) -> list[Outcome]:
        return list(await asyncio.gather(*(client.send(r) for r in records)))

    outcomes = send_with(lambda: ApnsClient(apns_config(apns, transport="httpcore")), body)
    assert all(isinstance(o, Accepted) for o in outcomes)


def test_bodies_larger_than_the_flow_control_windows(apns: RunningSimulator) -> None:
    """Bodies above the initial 64 KiB windows go out in DATA frames as WINDOW_UPDATEs arrive."""

    async def go() -> list[httpx.Response]:
        ctx = ssl.create_default_context(cafile=str(apns.ca_path))
        async with httpx.AsyncClient(transport=H2Transport(verify=ctx)) as client:
            url = f"{apns.base_url}/3/device/{'ab' * 32}"
            posts = (client.post(url, content=bytes([i]) * 200_000) for i in range(4))
            return list(await asyncio.gather(*posts))

    responses = run(go())
    # The simulator reads the whole body before answering (no provider token here).
    assert [r.status_code for r in responses] == [403] * 4
    assert all(r.json() == {"reason": "MissingProviderToken"} for r in responses)
