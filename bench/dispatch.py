"""Dispatch throughput per channel and provider-rate shaping, against the provider simulators.

    python -m bench.dispatch [--push N] [--other N] [--rate R] [--processes P] [--json PATH]

Own embedded stack (Kafka, Redis) and simulators (APNs HTTP/2+TLS, Twilio-, SendGrid-shaped
HTTP/1.1; the in-app inbox is Redis), in a temp dir. Scenarios, each next to a raw baseline
measured in the same run:

- **sends/s per channel**: N Deliveries (class bulk, 3 tenants) produced to
  herald.deliveries.{channel}.bulk, then the real dispatch job (`python -m bytewax.run`, P
  processes, bounded) sends them through Herald's whole path: Kafka decode, send guard, opt-out
  re-check (one Redis round trip per batch), breaker, token bucket, provider call, retry
  decision, two Avro delivery events per send produced with acks=all. sends/s = accepted / span
  between the first and last acceptance seen by the simulator (startup excluded). Budgets are
  set far above what the machine does so that the figure is throughput, not shaping.
  Baselines: the bare provider client against the same simulator (`asyncio.gather`, 1,000 in
  flight, one process — no Kafka, no Redis, no events), and plain Kafka consume→produce of the
  same records (bench._harness.raw_baseline).
- **shaping**: 3 tenants' push campaign of 8 x R deliveries through APNs with a configured rate
  of R/s (bucket depth R x 0.1; R below the raw client's throughput, so the budget is what
  binds); the simulator answers 429 beyond R/s (0.5 s of burst allowed) and counts them.
  Reported: the achieved rate per 0.5 s window over time, its mean over the saturated windows
  vs R (target: within 5 %), the highest window (must not exceed R + depth) and the 429 count.

CPU per send (job process and simulator, from /proc) is reported so figures compare across
busy machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from bench._harness import (
    drop_topics,
    embedded_stack,
    produce_all,
    raw_baseline,
    report,
    scenario_settings,
)
from herald.config import HeraldSettings
from infra.simulators.launcher import RunningSimulator, start_simulator
from schemas.registry import make_registry
from sinks.dispatch.simenv import client_env
from sinks.kafka import topic_serializer

REPO = Path(__file__).resolve().parents[1]
CHANNEL_SIM = {"push": "apns", "sms": "sms_a", "email": "email", "inapp": None}
TENANTS = ("acme", "globex", "initech")
PROVIDER = {"push": "apns", "sms": "sms_a", "email": "email", "inapp": "inbox"}
HIGH = {"rate": 1_000_000.0, "burst_s": 0.1}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def deliveries(channel: str, n: int, run: str) -> Iterator[dict[str, Any]]:
    """Bulk deliveries of one channel with valid simulator addresses (3 tenants)."""
    now = datetime.now(UTC)
    for i in range(n):
        did = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run}/{channel}/{i}"))
        address = {"push": f"{i:064x}", "sms": f"+1500555{i % 10_000:04d}",
                   "email": f"user{i}@example.test", "inapp": f"u{i}"}[channel]  # fmt: skip
        yield {
            "delivery_id": did, "notification_id": f"{run}-n{i // 1000}", "request_id": run,
            "tenant_id": TENANTS[i % 3], "user_id": f"u{i}",
            "notification_type": "marketing_campaign", "category": "marketing",
            "traffic_class": "bulk", "channel": channel,
            "provider": PROVIDER[channel],
            "address": address, "platform": "apns" if channel == "push" else None,
            "rendered": {"title": "Spring sale", "body": "20% off everything this week",
                         "subject": "Spring sale", "data": {}},
            "locale": "en", "template_version": 1, "collapse_key": None, "attempt": 0,
            "not_before": None, "next_attempt_at": None, "expire_at": now + timedelta(hours=2),
            "first_attempt_at": None, "fallback": [], "created_at": now,
        }  # fmt: skip


def produce_deliveries(settings: HeraldSettings, channel: str, n: int) -> str:
    topic = f"herald.deliveries.{channel}.bulk"
    encode = topic_serializer(settings.kafka, make_registry(settings.registry), topic)
    run = uuid.uuid4().hex[:8]
    produce_all(settings, topic, ((d["delivery_id"].encode(), encode(d))
                                  for d in deliveries(channel, n, run)))  # fmt: skip
    return topic


def job_env(settings: HeraldSettings, sims: dict[str, RunningSimulator], rates: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HERALD_LOG_LEVEL": "WARNING",
           "HERALD_EMBEDDED": "1",  # simulators and development defaults
           "HERALD_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
           "HERALD_KAFKA_TOPIC_PREFIX": settings.kafka.topic_prefix,
           "HERALD_REDIS_URL": settings.redis.url,
           "HERALD_REGISTRY_PATH": str(settings.registry.path),
           "HERALD_DISPATCH_STATE_PREFIX": f"bench{uuid.uuid4().hex[:6]}:",
           "HERALD_DISPATCH_RATES": orjson.dumps(rates).decode(),
           "HERALD_APNS_MAX_CONCURRENCY": "1000"}  # fmt: skip
    for name, sim in sims.items():
        env.update(client_env(name, sim.credentials()))
    return env


def start_jobs(env: dict, channel: str, processes: int, tmp: Path) -> list[subprocess.Popen]:
    flow = f"dataflows.dispatch:build_flow(channel='{channel}', traffic_class='bulk', bounded=True)"
    argv = [sys.executable, "-m", "bytewax.run", flow]
    if processes > 1:
        from infra.process import free_port

        ports = [free_port("127.0.0.1") for _ in range(processes)]
        argv += ["-a", ";".join(f"127.0.0.1:{port}" for port in ports)]
    procs = []
    for i in range(processes):
        extra = ["-i", str(i)] if processes > 1 else []
        log = (tmp / f"job-{channel}-{i}.log").open("wb")
        cmd = [*argv, *extra]
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
    return procs


def wait_jobs(procs: list[subprocess.Popen], limit_s: float) -> float:
    """Wait for the bounded jobs to finish (they stop at the end of their input)."""
    started = time.monotonic()
    for p in procs:
        try:
            p.wait(max(1.0, limit_s - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(30)
    return time.monotonic() - started


def read_events(settings: HeraldSettings) -> list[tuple[str, float]]:
    """(state, occurred_at epoch s) of every delivery event of the scenario."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from schemas.serde import AvroDeserializer

    decode = AvroDeserializer(make_registry(settings.registry))
    topic = settings.kafka.topic("herald.delivery-events")
    consumer = Consumer({**settings.kafka.client_config(), "group.id": "bench",
                         "enable.partition.eof": True})  # fmt: skip
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out: list[tuple[str, float]] = []
    ended: set[int] = set()
    try:
        while len(ended) < len(parts):
            for msg in consumer.consume(5000, 1.0):
                if msg.error() is None:
                    ev = decode(msg.value())
                    out.append((ev["state"], ev["occurred_at"].timestamp()))
                elif msg.error().code() == KafkaError._PARTITION_EOF:  # type: ignore[union-attr]
                    ended.add(msg.partition() or 0)
    finally:
        consumer.close()
    return out


def windows(times: list[float], width: float) -> list[float]:
    """Events per second in consecutive windows of `width` seconds from the first event."""
    if not times:
        return []
    t0 = min(times)
    counts = [0] * (int((max(times) - t0) / width) + 1)
    for t in times:
        counts[int((t - t0) / width)] += 1
    return [c / width for c in counts]


def herald_channel(base: HeraldSettings, sims: dict, channel: str, n: int, procs_n: int,
                   tmp: Path, rates: dict | None = None) -> dict[str, Any]:  # fmt: skip
    """Produce n deliveries, run the dispatch job(s) over them, measure from their events."""
    settings = scenario_settings(base, f"dispatch-{channel}")
    topic = produce_deliveries(settings, channel, n)
    name = CHANNEL_SIM[channel]
    sim = sims.get(name) if name else None
    if sim is not None:
        sim.reset()
    env = job_env(settings, sims, rates or {p: HIGH for p in ("apns", "sms_a", "email")})
    sim_cpu = _cpu(sim.process.pid) if sim is not None and sim.process.pid else 0.0
    children = _children_cpu()
    procs = start_jobs(env, channel, procs_n, tmp)
    wall = wait_jobs(procs, 600)
    job_cpu = _children_cpu() - children
    events = read_events(settings)
    sending = [t for s, t in events if s == "SENDING"]
    accepted = [t for s, t in events if s == "PROVIDER_ACCEPTED"]
    span = (max(accepted) - min(sending)) if accepted else 0.0
    out: dict[str, Any] = {
        "deliveries": n, "accepted": len(accepted), "span_s": round(span, 2),
        "sends_per_s": round(len(accepted) / span) if span else 0, "job_wall_s": round(wall, 1),
    }  # fmt: skip
    out["job_cpu_us_per_send"] = round(job_cpu / max(len(accepted), 1) * 1e6)
    if sim is not None and sim.process.pid:
        used = _cpu(sim.process.pid) - sim_cpu
        out["simulator_cpu_us_per_request"] = round(used / max(len(accepted), 1) * 1e6)
        out["provider_429"] = sim.stats(ids=False)["rate_limited"]
    out["raw_kafka_records_per_s"] = round(raw_baseline(settings, [topic], n)["records_per_s"])
    out["_sending"] = sending
    drop_topics(settings)
    return out


async def _raw_client(
    make: Any, channel: str, n: int, concurrency: int
) -> tuple[float, int, float]:
    """(seconds, accepted, CPU seconds) of n sends after a warm-up (TLS, tokens, CA loading)."""
    recs = list(deliveries(channel, n + 200, uuid.uuid4().hex[:8]))
    sem = asyncio.Semaphore(concurrency)
    client = make()
    try:
        await asyncio.gather(*(client.send(r) for r in recs[:200]))  # warm up: TLS, tokens

        async def one(rec: dict[str, Any]) -> str:
            async with sem:
                return str((await client.send(rec)).kind)

        started, cpu = time.perf_counter(), _self_cpu()
        kinds = await asyncio.gather(*(one(r) for r in recs[200:]))
        return time.perf_counter() - started, kinds.count("accepted"), _self_cpu() - cpu
    finally:
        await client.aclose()


def raw_client(channel: str, sims: dict[str, RunningSimulator], redis_url: str, n: int) -> dict:
    """The bare provider client of `channel` against its simulator: sends/s, CPU per send."""
    name = CHANNEL_SIM[channel]
    env = client_env(name, sims[name].credentials()) if name is not None else {}
    return raw_client_with(channel, env, redis_url, n)


def raw_client_with(channel: str, env: dict[str, str], redis_url: str, n: int) -> dict:
    """`raw_client` with the client's settings given as its environment variables."""
    from sinks.dispatch.clients import default_factories

    name = CHANNEL_SIM[channel]
    if name is not None:
        os.environ.update(env)  # this process only
        os.environ["HERALD_APNS_MAX_CONCURRENCY"] = "1000"
    make = default_factories(redis_url)[name or "inbox"]
    seconds, ok, used = asyncio.run(_raw_client(make, channel, n, 1000))
    return {"sends": ok, "sends_per_s": round(ok / seconds),
            "cpu_us_per_send": round(used / max(ok, 1) * 1e6)}  # fmt: skip


def shaping(base: HeraldSettings, sims: dict, rate: float, procs_n: int, tmp: Path) -> dict:
    """A push campaign of 8 x rate deliveries through APNs budgeted at `rate`/s."""
    sim = sims["apns"]
    sim.reset(config=True)
    sim.configure(rate_limit=rate, rate_burst=rate / 2, record_ids=False)
    rates = {"apns": {"rate": rate, "burst_s": 0.1}, "sms_a": HIGH, "email": HIGH}
    run = herald_channel(base, sims, "push", int(rate * 8), procs_n, tmp, rates)
    series = windows(run.pop("_sending"), 0.5)
    saturated = series[1:-1] or series
    mean = sum(saturated) / max(len(saturated), 1)
    sim.reset(config=True)
    sim.configure(record_ids=False)
    return {
        "configured_per_s": rate, "achieved_mean_per_s": round(mean, 1),
        "achieved_vs_configured": f"{mean / rate:.1%}",
        "max_window_per_s": round(max(series), 1), "bound_per_s": rate + rate * 0.1 / 0.5,
        "min_saturated_window_per_s": round(min(saturated), 1),
        "provider_429": run.get("provider_429"), "accepted": run["accepted"],
        "series_per_0.5s": [round(x) for x in series],
    }  # fmt: skip


def _budget(results: dict[str, Any]) -> float:
    """A budget the machine can saturate now: 60 % of the measured push rate, in hundreds."""
    measured = float(results.get("push", {}).get("sends_per_s") or 1000)
    return max(200.0, round(0.6 * measured, -2))


def main(argv: list[str] | None = None) -> int:
    """Run every scenario; print the report (and write it as JSON with --json)."""
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__)
    parser.add_argument("--push", type=int, default=20_000, help="push deliveries")
    parser.add_argument("--other", type=int, default=5_000, help="sms, email, inapp deliveries")
    parser.add_argument(
        "--rate", type=float, default=None,
        help="APNs budget of the shaping scenario (default: 60 %% of the push sends/s measured)",
    )  # fmt: skip
    parser.add_argument("--processes", type=int, default=1, help="dispatch job processes")
    parser.add_argument("--channels", default="push,sms,email,inapp")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"cores": os.cpu_count(), "processes": args.processes}
    with tempfile.TemporaryDirectory(prefix="herald-bench-dispatch-") as tmp_s:
        tmp = Path(tmp_s)
        with embedded_stack(tmp / "run") as base:
            channels = args.channels.split(",")
            needed = {CHANNEL_SIM[c] for c in channels} | {"apns"}  # apns: shaping scenario
            sims = {name: start_simulator(name, tmp / name, config={"record_ids": False})
                    for name in ("apns", "sms_a", "email") if name in needed}  # fmt: skip
            try:
                for channel in channels:
                    n = args.push if channel == "push" else args.other
                    herald = herald_channel(base, sims, channel, n, args.processes, tmp)
                    sending = herald.pop("_sending")
                    raw = raw_client(channel, sims, base.redis.url, n)
                    results[channel] = report(f"dispatch {channel} (bulk, {n:,} deliveries)",
                                              {**herald, "raw_client": raw})  # fmt: skip
                    # the throughput-over-time plot of `python -m bench` (bench/_adapters.py)
                    per_s = [round(x) for x in windows(sending, 1.0)]
                    results[channel]["sends_per_s_series"] = per_s
                rate = _budget(results) if args.rate is None else args.rate
                if rate > 0:
                    results["shaping"] = report(
                        "shaping: APNs budget", shaping(base, sims, rate, args.processes, tmp)
                    )
            finally:
                for sim in sims.values():
                    sim.stop()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
