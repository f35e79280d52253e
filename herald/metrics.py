"""Prometheus helpers shared by Herald's process kinds (jobs, dashboards; the API has its own).

    JobMetrics(job)                 counters/gauges of one process kind, `job` label bound
    MetricsSettings                 HERALD_METRICS_PORT / HERALD_METRICS_HOST (entry points only)
    serve_metrics(settings)         start prometheus_client's HTTP server once per process
    BreakerCollector(redis, names)  herald_breaker_state{provider} read from Redis on scrape

Series (every one carries `job`, the process kind: accepted, receipts, warehouse, plan, ...):

    herald_events_total{job,state}                 delivery events emitted, by state
    herald_suppressed_total{job,reason}            deliveries suppressed, by reason
    herald_sent_total{job,provider,channel}        provider calls that were accepted
    herald_errors_total{job,error_class}           errors by class (permanent, retryable, ...)
    herald_dead_letters_total{job,reason}          records dead-lettered
    herald_receipts_total{job,provider,outcome}    receipt events by fold outcome
    herald_consumer_lag{job,topic,partition}       records behind the end of a partition
    herald_breaker_state{provider}                 0 closed, 1 half-open, 2 open

Cost: a counter increment is a lock and an add; the HTTP server is a daemon thread that only
runs on scrape (a busy Bytewax worker holds the GIL, so a scrape may wait for it; nothing in the
worker waits for a scrape). Jobs count per batch where they can, not per record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    import redis

__all__ = [
    "BREAKER_VALUES",
    "BreakerCollector",
    "JobMetrics",
    "MetricsSettings",
    "read_breakers",
    "serve_metrics",
]

log = logging.getLogger(__name__)

BREAKER_VALUES = {"closed": 0, "half_open": 1, "open": 2}
_started: dict[str, int] = {}
_lock = threading.Lock()


class MetricsSettings(BaseSettings):
    """Where a process serves /metrics; no port = no server (tests, one-off commands)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_METRICS_")

    port: int | None = None
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class _Families:
    events: Counter
    suppressed: Counter
    sent: Counter
    errors: Counter
    dead_letters: Counter
    receipts: Counter
    lag: Gauge


@cache
def _families(registry: CollectorRegistry = REGISTRY) -> _Families:
    """The metric families, created once per registry (prometheus_client refuses twins)."""
    return _Families(
        events=Counter("herald_events", "Delivery events emitted, by state.", ["job", "state"],
                       registry=registry),
        suppressed=Counter("herald_suppressed", "Deliveries suppressed, by reason.",
                           ["job", "reason"], registry=registry),
        sent=Counter("herald_sent", "Provider calls accepted by the provider.",
                     ["job", "provider", "channel"], registry=registry),
        errors=Counter("herald_errors", "Errors by class (permanent, retryable, rate_limited,"
                       " platform, unknown, infra).", ["job", "error_class"], registry=registry),
        dead_letters=Counter("herald_dead_letters", "Records dead-lettered, by reason.",
                             ["job", "reason"], registry=registry),
        receipts=Counter("herald_receipts", "Receipt events by outcome (applied, duplicate,"
                         " stale, premature, unmappable, unmatched).",
                         ["job", "provider", "outcome"], registry=registry),
        lag=Gauge("herald_consumer_lag", "Records between a job's committed position and the"
                  " end of the partition.", ["job", "topic", "partition"], registry=registry),
    )  # fmt: skip


class JobMetrics:
    """The series of one process kind; methods take counts so callers can count per batch."""

    def __init__(self, job: str, registry: CollectorRegistry = REGISTRY) -> None:
        self.job = job
        self._f = _families(registry)

    def event(self, state: str, n: int = 1) -> None:
        """`n` delivery events of `state` emitted."""
        self._f.events.labels(self.job, state).inc(n)

    def suppressed(self, reason: str, n: int = 1) -> None:
        self._f.suppressed.labels(self.job, reason).inc(n)

    def sent(self, provider: str, channel: str, n: int = 1) -> None:
        self._f.sent.labels(self.job, provider, channel).inc(n)

    def error(self, error_class: str, n: int = 1) -> None:
        self._f.errors.labels(self.job, error_class).inc(n)

    def dead_letter(self, reason: str, n: int = 1) -> None:
        self._f.dead_letters.labels(self.job, reason).inc(n)

    def receipt(self, provider: str, outcome: str, n: int = 1) -> None:
        self._f.receipts.labels(self.job, provider, outcome).inc(n)

    def lag(self, topic: str, partition: int, records: int) -> None:
        self._f.lag.labels(self.job, topic, str(partition)).set(records)


def serve_metrics(settings: MetricsSettings, registry: CollectorRegistry = REGISTRY) -> int | None:
    """Start the /metrics HTTP server (daemon thread) once per process; returns its port.

    Port 0 picks a free port. A second call returns the first server's port.
    """
    if settings.port is None:
        return None
    with _lock:
        if "port" in _started:
            return _started["port"]
        server, _thread = start_http_server(settings.port, settings.host, registry=registry)
        port = int(server.server_address[1])
        _started["port"] = port
    log.info("metrics.serving host=%s port=%d", settings.host, port)
    return port


@dataclass(frozen=True, slots=True)
class BreakerReading:
    """One provider's breaker as stored in Redis by herald.breaker."""

    provider: str
    state: str
    reason: str
    trips: int


def read_breakers(
    client: redis.Redis, providers: Iterable[str], prefix: str = "herald:"
) -> list[BreakerReading]:
    """Read `<prefix>breaker:{<provider>}` hashes (herald/breaker.py) without changing them.

    A missing hash is a closed breaker (it expires a day after its last transition). The
    read does not apply the open → half-open cool-down; a breaker past its cool-down shows
    `open` until the next call through it.
    """
    names = list(providers)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(f"{prefix}breaker:{{{name}}}", "state", "reason", "trips")
    out: list[BreakerReading] = []
    for name, (state, reason, trips) in zip(names, pipe.execute(), strict=True):
        out.append(BreakerReading(
            name, _text(state) or "closed", _text(reason), int(_text(trips) or 0)
        ))  # fmt: skip
    return out


def _text(value: object) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


class BreakerCollector(Collector):
    """herald_breaker_state{provider} and herald_breaker_trips{provider}, read on scrape."""

    def __init__(self, client: redis.Redis, providers: Iterable[str], prefix: str = "herald:"):
        self._client = client
        self._providers = list(providers)
        self._prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = GaugeMetricFamily(
            "herald_breaker_state", "Circuit breaker per provider: 0 closed, 1 half-open, 2 open.",
            labels=["provider"],
        )  # fmt: skip
        trips = GaugeMetricFamily(
            "herald_breaker_trips", "Times the breaker opened (kept 24 h).", labels=["provider"]
        )
        try:
            readings = read_breakers(self._client, self._providers, self._prefix)
        except Exception as exc:  # a scrape must not fail because Redis is down
            log.warning("metrics.breaker_read_failed error=%s", type(exc).__name__)
            readings = []
        for reading in readings:
            state.add_metric([reading.provider], BREAKER_VALUES.get(reading.state, 0))
            trips.add_metric([reading.provider], reading.trips)
        yield state
        yield trips
