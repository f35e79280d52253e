"""A simulator restarted on its port (what the supervisor does) keeps its identity."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import orjson
import pytest

from infra.process import ManagedProcess, free_port, wait_until
from infra.simulators.launcher import simulator_argv


def run(name: str, port: int, state_dir: Path) -> ManagedProcess:
    proc = ManagedProcess(f"sim-{name}", simulator_argv(name, port, state_dir), state_dir / "log")
    proc.start()
    return proc


def healthy(url: str, verify: ssl.SSLContext | bool) -> bool:
    return httpx.get(f"{url}/healthz", verify=verify, timeout=2).status_code == 200


@pytest.mark.parametrize("name", ["sms_a", "apns"])
def test_restart_on_the_same_port_keeps_credentials_and_ca(name: str, tmp_path: Path) -> None:
    port, scheme = free_port(), "https" if name == "apns" else "http"
    url, creds_path = f"{scheme}://127.0.0.1:{port}", tmp_path / "credentials.json"
    proc = run(name, port, tmp_path)
    try:
        wait_until(lambda: healthy(url, False), 60, what=name)
        first = orjson.loads(creds_path.read_bytes())
        ca = (tmp_path / "tls" / "ca.pem").read_bytes() if name == "apns" else b""
        proc.stop()
        proc = run(name, port, tmp_path)
        # a client built before the restart (the old CA) still trusts the restarted server
        verify: ssl.SSLContext | bool = False
        if name == "apns":
            verify = ssl.create_default_context(cafile=str(tmp_path / "tls" / "ca.pem"))
        wait_until(lambda: healthy(url, verify), 60, what=name)
        assert orjson.loads(creds_path.read_bytes()) == first
        if name == "apns":
            assert (tmp_path / "tls" / "ca.pem").read_bytes() == ca
            assert first["key_id"] and Path(first["auth_key_path"]).exists()
        else:
            sid, token = first["account_sid"], first["auth_token"]
            resp = httpx.post(
                f"{url}/2010-04-01/Accounts/{sid}/Messages.json",
                data={"To": "+447700900001", "From": "+15005550006", "Body": "hi"},
                auth=(sid, token),
            )
            assert resp.status_code == 201, resp.text
    finally:
        proc.stop()


def test_a_new_port_means_a_new_identity(tmp_path: Path) -> None:
    port = free_port()
    proc = run("sms_b", port, tmp_path)
    try:
        wait_until(lambda: healthy(f"http://127.0.0.1:{port}", False), 60, what="sms_b")
        first = orjson.loads((tmp_path / "credentials.json").read_bytes())
    finally:
        proc.stop()
    other = free_port()
    proc = run("sms_b", other, tmp_path)
    try:
        wait_until(lambda: healthy(f"http://127.0.0.1:{other}", False), 60, what="sms_b")
        second = orjson.loads((tmp_path / "credentials.json").read_bytes())
    finally:
        proc.stop()
    assert second["api_secret"] != first["api_secret"]
