"""`python -m api` as its own process (what `herald up` runs): settings from the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from api.auth import hash_key
from herald.config import HeraldSettings
from tests.api.conftest import free_port, read_topic

KEY = "hk_entry_" + "e" * 30


def test_python_m_api_serves_with_env_settings(
    subprocess_env: dict[str, str], settings: HeraldSettings, tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        f'[tenants.entry]\n[[tenants.entry.keys]]\nid = "e"\nsha256 = "{hash_key(KEY)}"\n'
        'scopes = ["notifications:write", "notifications:read"]\n'
    )
    port = free_port()
    env = {**subprocess_env, "HERALD_API_TENANTS_FILE": str(tenants)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "api", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        env=env, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "API did not start"
            time.sleep(0.2)
        body = {"request_id": f"r-{uuid.uuid4().hex}", "notification_type": "order_shipped",
                "recipients": {"user_ids": ["u-1"]}, "params": {"order_id": "1"}}  # fmt: skip
        resp = httpx.post(f"{url}/v1/notifications", json=body, headers={"X-API-Key": KEY})
        assert resp.status_code == 202, resp.text
        nid = resp.json()["notification_id"]
        status = httpx.get(f"{url}/v1/notifications/{nid}", headers={"X-API-Key": KEY})
        assert status.json()["state"] == "ACCEPTED"
        assert httpx.get(f"{url}/openapi.json").status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    [(key, _)] = read_topic(settings, "herald.requests.normal", 1)
    assert key == nid
