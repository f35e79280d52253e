"""The dashboards process with live data from the embedded stack, loaded in headless Chromium.

Events go to Kafka, the warehouse job (a real process, with a recovery store) loads them into
ClickHouse, a breaker is tripped in Redis; then the page is rendered by a real browser and
every panel must show data.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis
from bytewax.recovery import init_db_dir

from herald.breaker import CircuitBreaker
from herald.config import HeraldSettings
from infra.process import free_port
from tests.dataflows.test_receipts import FlowJob, wait_for
from tests.infra.test_replay import counts, produce_events

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]  # fmt: skip
PANELS_WITH_DATA = (
    "funnel", "report_rates", "rates_over_time", "latency_by_class", "providers", "lag",
    "suppression_reasons", "current_states",
)  # fmt: skip


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("headless Chromium is needed: apt-get install -y chromium")
    return found


class Dashboard:
    """`python -m dashboards` as a real process."""

    def __init__(self, env: dict[str, str], recovery: Path, providers: str) -> None:
        self.port = free_port("127.0.0.1")
        argv = [
            sys.executable, "-m", "dashboards", "--host", "127.0.0.1", "--port", str(self.port),
            "--recovery-dir", str(recovery), "--providers", providers,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        assert self.proc.poll() is None, self.proc.stdout.read().decode()  # type: ignore[union-attr]
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def live(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[Dashboard, str, str]]:
    """Warehouse job + dashboards process over this test's topics; (dashboard, tenant, provider)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    provider = f"sim{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(settings.redis.url)
    CircuitBreaker(client).trip(provider, "auth_failed", 300)
    client.close()
    recovery = tmp_path / "recovery"
    (recovery / "warehouse").mkdir(parents=True)
    init_db_dir(recovery / "warehouse", 1)
    job = FlowJob("dataflows.warehouse:build_flow()", subprocess_env,
                  "-r", str(recovery / "warehouse"), "-s", "1", "-b", "0")  # fmt: skip
    board = Dashboard(subprocess_env, recovery, f"apns,sms_a,email,{provider}")
    try:
        n = produce_events(settings, tenant, datetime.now(UTC))
        wait_for(lambda: counts(settings, tenant)["rows"] == n)
        wait_for(board.healthy)
        wait_for(lambda: lag_rows(board) > 0)  # the job committed a snapshot
        yield board, tenant, provider
    finally:
        board.stop()
        job.stop()


def lag_rows(board: Dashboard) -> int:
    data = httpx.get(f"{board.url}/api/panels", params={"minutes": 60}, timeout=10).json()
    return len(data["lag"].get("rows", []))


def test_api_and_metrics(live: tuple[Dashboard, str, str]) -> None:
    board, tenant, provider = live
    data = httpx.get(f"{board.url}/api/panels", params={"minutes": 60, "tenant": tenant}).json()
    assert not [k for k, v in data.items() if isinstance(v, dict) and "error" in v]
    assert {r["step"]: r["count"] for r in data["funnel"]["rows"]}["delivered"] == 2
    assert {b["provider"]: b["state"] for b in data["breakers"]["rows"]}[provider] == "open"
    assert {r["job"] for r in data["lag"]["rows"]} == {"warehouse"}
    metrics = httpx.get(f"{board.url}/metrics").text
    assert f'herald_breaker_state{{provider="{provider}"}} 2.0' in metrics
    assert 'herald_consumer_lag{job="warehouse"' in metrics
    assert httpx.get(f"{board.url}/api/panels", params={"minutes": 7}).status_code == 400
    assert httpx.get(f"{board.url}/static/../server.py").status_code == 404


def test_page_renders_every_panel_in_chromium(
    live: tuple[Dashboard, str, str], tmp_path: Path
) -> None:
    board, tenant, provider = live
    url = f"{board.url}/?minutes=60&tenant={tenant}"
    argv = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=8000", "--window-size=1400,2200", "--dump-dom", url]  # fmt: skip
    dom = subprocess.run(argv, capture_output=True, timeout=50, check=True).stdout.decode()

    states = dict(re.findall(r'data-panel="(\w+)"[^>]*?data-state="(\w+)"', dom))
    assert states, dom[-2000:]
    assert {p: states.get(p) for p in PANELS_WITH_DATA} == {p: "ok" for p in PANELS_WITH_DATA}
    assert "error" not in states.values()
    assert 'data-rendered="' in dom
    assert dom.count('class="bar"') >= 20, "bars were drawn"
    assert "polyline" in dom  # the time series
    assert 'class="badge unknown"' in dom  # push: delivery not provided by the channel
    assert 'class="badge open"' in dom and provider in dom  # the tripped breaker
    if os.environ.get("HERALD_SCREENSHOT"):  # for a person: look at the page
        shot = Path(os.environ["HERALD_SCREENSHOT"])
        argv = [
            chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'p2'}",
            "--virtual-time-budget=8000", "--window-size=1400,2000", f"--screenshot={shot}", url,
        ]  # fmt: skip
        subprocess.run(argv, capture_output=True, timeout=50, check=True)
