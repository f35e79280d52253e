"""APNs simulator: HTTP/2 over TLS, provider-token checks, wire-format errors, concurrency."""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import uuid
from pathlib import Path

import httpx
import jwt
import pytest

from infra.simulators.keys import ec_private_pem
from infra.simulators.launcher import RunningSimulator

TOKEN = "ab" * 32
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def provider_token(sim: RunningSimulator, iat: float | None = None, key: str | None = None) -> str:
    creds = sim.credentials()
    return jwt.encode(
        {"iss": creds["team_id"], "iat": int(iat if iat is not None else time.time())},
        key or Path(creds["auth_key_path"]).read_text(),
        algorithm="ES256",
        headers={"kid": creds["key_id"]},
    )


_TOKENS: dict[int, str] = {}


def shared_token(sim: RunningSimulator) -> str:
    """One provider token per simulator process (a new token per request would be throttled)."""
    if sim.port not in _TOKENS:
        _TOKENS[sim.port] = provider_token(sim)
    return _TOKENS[sim.port]


def client(sim: RunningSimulator, http1: bool = False) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(sim.ca_path))
    return httpx.Client(base_url=sim.base_url, http2=True, http1=http1, verify=ctx, timeout=5)


def push(
    c: httpx.Client, sim: RunningSimulator, device: str = TOKEN, **headers: str
) -> httpx.Response:
    base = {"authorization": f"bearer {shared_token(sim)}", "apns-topic": "com.herald.app"}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    return c.post(f"/3/device/{device}", content=b'{"aps":{"alert":"hi"}}', headers=base)


def test_accepts_over_http2_and_echoes_apns_id(apns: RunningSimulator) -> None:
    sent = str(uuid.uuid4())
    with client(apns) as c:
        resp = push(c, apns, apns_id=sent, apns_collapse_id="c1", apns_expiration="0")
        generated = push(c, apns)
    assert resp.http_version == "HTTP/2"
    assert resp.status_code == 200 and resp.content == b""
    assert resp.headers["apns-id"] == sent
    assert UUID_RE.match(generated.headers["apns-id"])
    ids = apns.stats()["accepted_ids"][TOKEN]
    assert [sent, "c1"] in ids and len(ids) == 2


def test_healthz_on_the_same_port_for_http1_and_http2(apns: RunningSimulator) -> None:
    with client(apns) as c:
        assert c.get("/healthz").json()["simulator"] == "apns"
    assert apns.healthy()  # HTTP/1.1 over the same TLS port


@pytest.mark.parametrize(
    ("headers", "device", "status", "reason"),
    [
        ({"apns-topic": ""}, TOKEN, 400, "MissingTopic"),
        ({"apns-id": "NOT-A-UUID"}, TOKEN, 400, "BadMessageId"),
        ({"apns-collapse-id": "x" * 65}, TOKEN, 400, "BadCollapseId"),
        ({"apns-priority": "7"}, TOKEN, 400, "BadPriority"),
        ({"apns-push-type": "fax"}, TOKEN, 400, "InvalidPushType"),
        ({"apns-expiration": "soon"}, TOKEN, 400, "BadExpirationDate"),
        ({}, "zz" * 32, 400, "BadDeviceToken"),
        ({"authorization": ""}, TOKEN, 403, "MissingProviderToken"),
        ({"authorization": "bearer garbage"}, TOKEN, 403, "InvalidProviderToken"),
    ],
)
def test_request_validation(
    apns: RunningSimulator, headers: dict[str, str], device: str, status: int, reason: str
) -> None:
    base = {"authorization": f"bearer {shared_token(apns)}", "apns-topic": "com.herald.app"}
    base.update(headers)
    with client(apns) as c:
        resp = c.post(f"/3/device/{device}", content=b'{"aps":{}}', headers=base)
    assert (resp.status_code, resp.json()["reason"]) == (status, reason)


def test_payload_limits_path_and_method(apns: RunningSimulator) -> None:
    auth = {"authorization": f"bearer {shared_token(apns)}", "apns-topic": "t"}
    with client(apns) as c:
        big = c.post(f"/3/device/{TOKEN}", content=b"x" * 4097, headers=auth)
        empty = c.post(f"/3/device/{TOKEN}", content=b"", headers=auth)
        path = c.post("/2/device/x", content=b"{}", headers=auth)
        method = c.get(f"/3/device/{TOKEN}", headers=auth)
    assert (big.status_code, big.json()["reason"]) == (413, "PayloadTooLarge")
    assert empty.json()["reason"] == "PayloadEmpty"
    assert (path.status_code, method.status_code) == (404, 405)


def test_provider_token_expiry_wrong_key_and_update_rate(apns: RunningSimulator) -> None:
    with client(apns) as c:
        old = push(c, apns, authorization=f"bearer {provider_token(apns, time.time() - 3700)}")
        other_key = provider_token(apns, key=ec_private_pem().decode())
        wrong = push(c, apns, authorization=f"bearer {other_key}")
        first = push(c, apns)
        newer = provider_token(apns, time.time() - 30)  # a different token, same connection
        second = push(c, apns, authorization=f"bearer {newer}")
    assert (old.status_code, old.json()["reason"]) == (403, "ExpiredProviderToken")
    assert wrong.json()["reason"] == "InvalidProviderToken"
    assert first.status_code == 200
    assert (second.status_code, second.json()["reason"]) == (429, "TooManyProviderTokenUpdates")


def test_unregistered_has_timestamp_and_invalid_is_bad_device_token(
    apns: RunningSimulator,
) -> None:
    dead, bad = "cd" * 32, "ef" * 32
    apns.configure(unregistered=[dead], invalid=[bad])
    with client(apns) as c:
        gone = push(c, apns, device=dead)
        invalid = push(c, apns, device=bad)
    assert gone.status_code == 410 and gone.json()["reason"] == "Unregistered"
    assert abs(gone.json()["timestamp"] / 1000 - time.time()) < 60
    assert (invalid.status_code, invalid.json()["reason"]) == (400, "BadDeviceToken")
    assert apns.stats()["errors"] == {"Unregistered": 1, "BadDeviceToken": 1}


@pytest.mark.parametrize(
    ("kind", "status"),
    [("TooManyRequests", 429), ("InternalServerError", 500), ("ServiceUnavailable", 503)],
)
def test_error_mix(apns: RunningSimulator, kind: str, status: int) -> None:
    apns.configure(errors={kind: 1.0})
    with client(apns) as c:
        resp = push(c, apns)
    assert (resp.status_code, resp.json()["reason"]) == (status, kind)


def test_many_concurrent_streams_on_one_connection(apns: RunningSimulator) -> None:
    """256 concurrent streams multiplexed on one HTTP/2 connection all succeed."""

    async def run() -> list[int]:
        ctx = ssl.create_default_context(cafile=str(apns.ca_path))
        limits = httpx.Limits(max_connections=1)
        headers = {"authorization": f"bearer {shared_token(apns)}", "apns-topic": "t"}
        async with httpx.AsyncClient(
            base_url=apns.base_url, http2=True, http1=False, verify=ctx, limits=limits
        ) as c:
            resps = await asyncio.gather(
                *(
                    c.post(f"/3/device/{i:064x}", content=b'{"aps":{}}', headers=headers)
                    for i in range(256)
                )
            )
        return [r.status_code for r in resps]

    assert asyncio.run(run()) == [200] * 256
    stats = apns.stats(ids=False)
    assert stats["accepted"] == 256 and stats["connections"] == 1
