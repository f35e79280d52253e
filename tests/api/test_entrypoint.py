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
import pytest

from api.auth import hash_key
from herald.config import HeraldSettings
from herald.errors import ConfigError
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


def test_outside_the_embedded_stack_development_defaults_refuse_to_start(
    subprocess_env: dict[str, str],
) -> None:
    """Fail closed: without HERALD_EMBEDDED (set by `herald up` only), the bundled tenants file
    with its public dev key, an SMS country list that allows every country, the public links
    secret and the simulators' callback credentials stop the API before it serves, each named
    with the setting to provide; with them provided it starts (the test above)."""
    env = {k: v for k, v in subprocess_env.items()
           if k not in ("HERALD_EMBEDDED", "HERALD_LINKS_SECRET", "HERALD_PII_KEY")}  # fmt: skip
    env["HERALD_PROVIDERS_SIMULATOR_DIR"] = "/tmp/simulators"
    proc = subprocess.run(
        [sys.executable, "-m", "api", "--host", "127.0.0.1", "--port", str(free_port()),
         "--log-level", "warning"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    for setting in ("HERALD_API_TENANTS_FILE", "HERALD_API_SMS_ALLOWED_PREFIXES",
                    "HERALD_LINKS_SECRET", "HERALD_PROVIDERS_SIMULATOR_DIR",
                    "HERALD_PII_KEY"):  # fmt: skip
        assert setting in proc.stderr, proc.stderr


def test_production_settings_pass_the_fail_closed_check(tmp_path: Path) -> None:
    from api.settings import ApiSettings, ProviderSecrets
    from herald.config import LinksSettings, PiiSettings, RunSettings, refuse_unsafe_defaults

    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[tenants]\n")
    api = ApiSettings(tenants_file=tenants, sms_allowed_prefixes=["+41"])
    links = LinksSettings(secret="s" * 40)
    unsafe = [
        *api.unsafe_defaults(),
        *ProviderSecrets().unsafe_defaults(),
        *links.unsafe_defaults(),
        *PiiSettings(key="p" * 40).unsafe_defaults(),
    ]
    assert unsafe == []
    refuse_unsafe_defaults("the API", RunSettings(embedded=False), unsafe)  # does not raise
    short = LinksSettings(secret="short").unsafe_defaults()
    with pytest.raises(ConfigError, match="shorter than 32"):
        refuse_unsafe_defaults("dispatch", RunSettings(embedded=False), short)
    refuse_unsafe_defaults("dispatch", RunSettings(embedded=True), short)  # herald up's own
