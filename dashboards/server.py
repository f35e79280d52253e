"""The dashboards process: one page, its panel data as JSON, /healthz and /metrics.

    GET /                      the dashboard (static HTML; dashboards/static/app.js draws SVG)
    GET /static/<file>         app.js, style.css (no CDN, nothing fetched from outside)
    GET /api/panels?minutes=60&tenant=   every panel of dashboards/sql plus breakers and lag
    GET /healthz               200 when ClickHouse answers, else 503
    GET /metrics               herald_breaker_state{provider}, herald_consumer_lag{job,...}

ClickHouse is queried over HTTP (herald.clickhouse.herald_client; this process never opens
chDB); breaker state comes from Redis (herald/breaker.py keys), consumer lag from the jobs'
recovery stores and Kafka (dashboards/lag.py). Each panel fails alone: an error is reported in
its JSON entry and the page shows it in that panel.
"""

from __future__ import annotations

import logging
import mimetypes
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dashboards.lag import committed_offsets, consumer_lag
from dashboards.queries import PANELS, run_panel, window
from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from herald.metrics import BreakerCollector, read_breakers
from herald.providers import EXTERNAL

__all__ = ["DEFAULT_PROVIDERS", "Dashboards", "make_server"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
DEFAULT_PROVIDERS = EXTERNAL
_WINDOWS = (5, 15, 60, 360, 1440, 10080)  # minutes a caller may ask for


class Dashboards:
    """Clients and queries behind the HTTP handlers (thread-safe)."""

    def __init__(
        self, settings: HeraldSettings, providers: Sequence[str] = DEFAULT_PROVIDERS,
        recovery_root: Path | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.providers = tuple(providers)
        self.recovery_root = recovery_root or settings.run.run_dir / "recovery"
        self.clickhouse = herald_client(settings.clickhouse)
        self.redis = redis.Redis.from_url(settings.redis.url, socket_timeout=2)
        self.registry = CollectorRegistry()
        self.registry.register(BreakerCollector(self.redis, self.providers))
        self.registry.register(_LagCollector(self))

    def panels(self, minutes: int, tenant: str) -> dict[str, Any]:
        """Every panel's rows (or error), plus breakers and lag."""
        params = window(minutes, tenant)
        out: dict[str, Any] = {"minutes": minutes, "tenant": tenant, "generated_at": time.time()}
        for name in PANELS:
            started = time.monotonic()
            try:
                rows = run_panel(self.clickhouse, name, params)
                out[name] = {"rows": rows, "ms": round((time.monotonic() - started) * 1000)}
            except Exception as exc:
                log.warning("dashboards.panel_failed panel=%s error=%s", name, type(exc).__name__)
                out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        out["breakers"] = self._guard(self.breakers)
        out["lag"] = self._guard(self.lag)
        return out

    @staticmethod
    def _guard(fn: Any) -> dict[str, Any]:
        try:
            return {"rows": fn()}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    def breakers(self) -> list[dict[str, Any]]:
        return [
            {"provider": b.provider, "state": b.state, "reason": b.reason, "trips": b.trips}
            for b in read_breakers(self.redis, self.providers)
        ]

    def lag(self) -> list[dict[str, Any]]:
        lags = consumer_lag(self.settings.kafka, committed_offsets(self.recovery_root))
        return [
            {"job": x.job, "topic": x.topic, "partition": x.partition, "offset": x.offset,
             "end": x.end, "lag": x.lag}
            for x in lags
        ]  # fmt: skip

    def healthy(self) -> bool:
        try:
            return bool(self.clickhouse.ping())
        except Exception:
            return False

    def close(self) -> None:
        self.clickhouse.close()
        self.redis.close()


class _LagCollector(Collector):
    """herald_consumer_lag{job,topic,partition}, computed on scrape."""

    def __init__(self, app: Dashboards) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "herald_consumer_lag", "Records between a job's committed position and the end of"
            " the partition.", labels=["job", "topic", "partition"],
        )  # fmt: skip
        try:
            for row in self.app.lag():
                family.add_metric([row["job"], row["topic"], str(row["partition"])], row["lag"])
        except Exception as exc:  # a scrape must not fail because Kafka is away
            log.warning("dashboards.lag_failed error=%s", type(exc).__name__)
        yield family


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        url = urlsplit(self.path)
        app = self.server.app
        try:
            if url.path in ("/", "/index.html"):
                self._file(STATIC / "index.html")
            elif url.path.startswith("/static/"):
                self._file(STATIC / url.path.removeprefix("/static/"))
            elif url.path == "/healthz":
                ok = app.healthy()
                self._json(200 if ok else 503, {"status": "ok" if ok else "clickhouse_down"})
            elif url.path == "/api/panels":
                query = parse_qs(url.query)
                minutes = int(query.get("minutes", ["60"])[0])
                if minutes not in _WINDOWS:
                    self._json(400, {"error": f"minutes must be one of {_WINDOWS}"})
                    return
                tenant = query.get("tenant", [""])[0][:128]
                self._json(200, app.panels(minutes, tenant))
            elif url.path == "/metrics":
                self._send(200, generate_latest(app.registry), "text/plain; version=0.0.4")
            else:
                self._json(404, {"error": "not found"})
        except ValueError:
            self._json(400, {"error": "bad parameter"})

    def _file(self, path: Path) -> None:
        path = path.resolve()
        if STATIC.resolve() not in path.parents or not path.is_file():
            self._json(404, {"error": "not found"})
            return
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        self._send(200, path.read_bytes(), f"{ctype}; charset=utf-8")

    def _json(self, status: int, body: Any) -> None:
        self._send(status, orjson.dumps(body), "application/json")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'self'")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.debug("dashboards.http " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: Dashboards) -> None:
        self.app = app
        super().__init__(address, _Handler)


def make_server(app: Dashboards, host: str, port: int) -> tuple[_Server, threading.Thread]:
    """Bind and serve in a daemon thread; returns the server (its `server_address` has the port)."""
    server = _Server((host, port), app)
    thread = threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True)
    thread.start()
    log.info("dashboards.listening host=%s port=%d", host, server.server_address[1])
    return server, thread
