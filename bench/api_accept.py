"""Benchmark: POST /v1/notifications at a fixed offered load, next to a raw Kafka baseline.

    python -m bench.api_accept --rate 2000 --duration 20

Starts the embedded services (Kafka, Redis, ClickHouse) in a temporary run directory, creates the
topics under a fresh prefix, starts the API as its own process (`python -m api`), then:

1. API: an open-loop client sends requests on a fixed schedule (request i at t0 + i/rate) over a
   pool of keep-alive HTTP/1.1 connections. Latency is measured from the scheduled instant to
   the complete response, so a slow server cannot hide queueing (no coordinated omission).
   Reported: accepted/s (202s), p50/p90/p99/max, error rate (anything but 202).
2. Raw baseline, same run: the same Avro records produced with a plain idempotent acks=all
   producer on the same schedule; latency from the scheduled instant to the delivery report.

`--url` benchmarks an already running API instead (its key in --api-key); the baseline then
needs `--bootstrap`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_KEY = "hk_bench_" + "b" * 32


@dataclass
class Run:
    """Latencies (seconds) and outcomes of one load phase."""

    name: str
    offered: float
    duration: float
    latencies: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0
    completions: list[float] = field(default_factory=list)  # perf_counter of each response

    def done(self, now: float) -> None:
        """Record one completion at `now` (perf_counter)."""
        self.finished = max(self.finished, now)
        self.completions.append(now)

    def samples(self) -> dict[str, list[float]]:
        """Every latency (ms) and completion time (s from the phase start), for plots."""
        return {
            "latency_ms": [round(x * 1000, 3) for x in self.latencies],
            "done_s": [round(t - self.started, 4) for t in self.completions],
        }

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        ok = self.statuses.get("202", 0) + self.statuses.get("ok", 0)
        total = sum(self.statuses.values())

        def pct(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else 0.0

        return {
            "name": self.name,
            "offered_per_s": self.offered,
            # over the real span (first scheduled send to last completion), so an overloaded
            # server shows its actual rate, not the offered one
            "accepted_per_s": round(ok / max(self.finished - self.started, self.duration), 1),
            "requests": total,
            "error_rate": round((total - ok) / total, 5) if total else 0.0,
            "p50_ms": pct(0.50),
            "p90_ms": pct(0.90),
            "p99_ms": pct(0.99),
            "max_ms": round(lat[-1] * 1000, 2) if lat else 0.0,
            "statuses": self.statuses,
        }


def request_body(i: int, run_id: str) -> bytes:
    return json.dumps({
        "request_id": f"bench-{run_id}-{i}",
        "notification_type": "order_shipped",
        "recipients": {"user_ids": [f"user-{i % 100_000}"]},
        "params": {"order_id": str(i)},
    }).encode()  # fmt: skip


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


async def _http_post(conn: _Conn, host: str, path: str, key: str, body: bytes) -> int:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    conn.writer.write(head + body)
    status_line = await conn.reader.readuntil(b"\r\n")
    headers = await conn.reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in headers.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await conn.reader.readexactly(length)
    return int(status_line.split(b" ", 2)[1])


async def load_api(url: str, key: str, rate: float, duration: float, conns: int) -> Run:
    """Open-loop POSTs at `rate`/s for `duration` s."""
    host_port = url.split("://", 1)[1].rstrip("/")
    host, port = host_port.rsplit(":", 1)
    pool: asyncio.Queue[_Conn] = asyncio.Queue()
    for _ in range(conns):
        pool.put_nowait(_Conn(*await asyncio.open_connection(host, int(port))))
    run = Run("api", rate, duration)
    run_id = uuid.uuid4().hex[:8]
    tasks: list[asyncio.Task[None]] = []
    start = run.started = time.perf_counter() + 0.1
    n = int(rate * duration)

    async def one(i: int, due: float) -> None:
        conn = await pool.get()
        try:
            status = str(await _http_post(conn, host_port, "/v1/notifications", key,
                                          request_body(i, run_id)))  # fmt: skip
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            status = type(exc).__name__
            conn = _Conn(*await asyncio.open_connection(host, int(port)))
        now = time.perf_counter()
        run.latencies.append(now - due)
        run.done(now)
        run.statuses[status] = run.statuses.get(status, 0) + 1
        pool.put_nowait(conn)

    gc.disable()  # a collection in the client would show up as server latency
    try:
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
        await asyncio.gather(*tasks)
    finally:
        gc.enable()
    while not pool.empty():
        pool.get_nowait().writer.close()
    return run


def load_raw(settings: Any, rate: float, duration: float) -> Run:
    """The same records through a plain idempotent acks=all producer, same schedule."""
    from confluent_kafka import Producer

    from api.kafka import API_PRODUCER_CONFIG
    from api.models import NotificationCreate, to_request_record
    from herald import ids
    from herald.topics import load_topics, physical_subject
    from schemas.registry import make_registry
    from schemas.serde import AvroSerializer

    spec = load_topics()["herald.requests.normal"]
    topic = settings.kafka.topic(spec.name)
    ser = AvroSerializer(make_registry(settings.registry), physical_subject(spec, settings.kafka),
                         spec.schema)  # fmt: skip
    producer = Producer({**settings.kafka.client_config(), **API_PRODUCER_CONFIG})
    run = Run("raw_kafka", rate, duration)
    run_id = uuid.uuid4().hex[:8]
    n = int(rate * duration)
    values = []
    for i in range(n):
        model = NotificationCreate.model_validate_json(request_body(i, run_id))
        nid = ids.notification_id("bench", model.request_id)
        values.append((nid, ser(to_request_record(model, nid, "bench", "normal", _now()))))
    stop = threading.Event()
    poller = threading.Thread(target=lambda: [producer.poll(0.05) for _ in iter(stop.is_set, True)])
    poller.start()
    start = run.started = time.perf_counter() + 0.1

    def report(due: float) -> Any:
        def cb(err: Any, _msg: Any) -> None:
            now = time.perf_counter()
            run.latencies.append(now - due)
            run.done(now)
            key = "ok" if err is None else err.name()
            run.statuses[key] = run.statuses.get(key, 0) + 1

        return cb

    for i, (nid, value) in enumerate(values):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        producer.produce(topic, value, nid, on_delivery=report(due))
    producer.flush(30)
    stop.set()
    poller.join()
    return run


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _start_api(env: dict[str, str], port: int, log: Path, workers: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "api", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--workers", str(workers)],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    import httpx

    deadline = time.monotonic() + 180  # a loaded machine starts uvicorn slowly
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"API did not start; see {log}")


def main(argv: list[str] | None = None) -> int:
    """Run both phases and print (and optionally write) the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.api_accept", description=__doc__)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1, help="API worker processes")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--samples", action="store_true", help="--json also holds every latency")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from api.auth import hash_key
    from herald.config import HeraldSettings, KafkaSettings, RegistrySettings
    from infra.process import free_port
    from infra.stack import Stack
    from infra.topics import create_topics

    run_dir = Path(tempfile.mkdtemp(prefix="herald-bench-api-"))
    stack = Stack(run_dir, jobs=[])
    ctx = stack.start()
    api_proc = None
    finished = False
    try:
        env = {**os.environ, **ctx.child_env(), "HERALD_KAFKA_TOPIC_PREFIX": "bench."}
        kafka = KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"],
                              topic_prefix="bench.")  # fmt: skip
        create_topics(kafka)
        tenants = run_dir / "tenants.toml"
        tenants.write_text(
            f"[tenants.bench]\nrate_limit_per_second = 1000000\n[[tenants.bench.keys]]\n"
            f'id = "bench"\nsha256 = "{hash_key(BENCH_KEY)}"\nscopes = ["notifications:write"]\n'
        )
        env["HERALD_API_TENANTS_FILE"] = str(tenants)
        port = free_port("127.0.0.1")
        api_proc = _start_api(env, port, run_dir / "api.log", args.workers)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(load_api(url, BENCH_KEY, args.rate, args.warmup, args.connections))
        api = asyncio.run(load_api(url, BENCH_KEY, args.rate, args.duration, args.connections))
        settings = HeraldSettings(kafka=kafka, registry=RegistrySettings(path=run_dir / "registry"))
        raw = load_raw(settings, args.rate, args.duration)
        finished = True
    finally:
        if api_proc is not None:
            os.killpg(api_proc.pid, 15)
            api_proc.wait(15)
        stack.stop()
        if finished:  # the stack's data and logs (~40 MB); kept when the run failed
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"api_accept: stack logs kept in {run_dir}", file=sys.stderr)
    report = {"cores": os.cpu_count(), "api_workers": args.workers, "api": api.summary(),
              "raw_kafka": raw.summary()}  # fmt: skip
    print(json.dumps(report, indent=2))
    if args.samples:
        report["samples"] = {"api": api.samples(), "raw_kafka": raw.samples()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
