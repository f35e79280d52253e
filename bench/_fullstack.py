"""The full stack for end-to-end benchmarks: `herald up --detach`, load, read what happened.

    with full_stack(run_dir, env={"HERALD_DISPATCH_RATES": ...}) as stack:
        stack.produce_contact_points(users)          # straight into herald.devices (changelog)
        stack.put_phone("otp-0", "+14155550100")     # through the API, as a product would
        nid, sent_at = stack.post({...})             # POST /v1/notifications, time of the send
        events = stack.delivery_events()             # every herald.delivery-events record

The stack is started exactly as an operator starts it (24 components, every job its own
process), with `env` added to the environment every component inherits, and stopped with
`herald down` whatever happens. Contact points of thousands of campaign users are produced
directly to the compacted herald.devices topic (the changelog the plan job learns from):
putting 40k users through the API would measure the API, not the campaign.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from herald.config import HeraldSettings, KafkaSettings, RedisSettings, RegistrySettings

__all__ = ["ComponentCpu", "CpuSampler", "FullStack", "full_stack"]

REPO = Path(__file__).resolve().parents[1]
DEV_KEY = "hk_dev_local_do_not_use_in_production"  # the embedded stack's public dev key


def _herald(*args: str, run_dir: Path, env: dict[str, str], timeout: float) -> str:
    """Run `herald ARGS --run-dir run_dir`; its output, or RuntimeError with it."""
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", *args, "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **env},
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"herald {' '.join(args)} failed: {proc.stdout}{proc.stderr}"[-3000:])
    return proc.stdout


def _up(run_dir: Path, env: dict[str, str], patience: float = 360) -> None:
    """`herald up --detach`; on a machine so loaded that the CLI gives up waiting (180 s) while
    its supervisor is still starting components, keep waiting for the stack to be ready."""
    from infra.stack import read_state

    try:
        _herald("up", "--detach", run_dir=run_dir, env=env, timeout=300)
        return
    except RuntimeError as exc:
        if "did not become ready in time" not in str(exc):
            # e.g. a port taken between its allocation and the bind by another stack on a
            # shared machine: the failed start left nothing behind; one more try
            _herald("up", "--detach", run_dir=run_dir, env=env, timeout=300)
            return
        failure = exc
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        if state and state.get("ready"):
            return
        time.sleep(1)
    raise failure


@contextmanager
def full_stack(run_dir: Path, env: dict[str, str] | None = None) -> Iterator[FullStack]:
    """`herald up --detach` in `run_dir` with `env`; `herald down` on exit."""
    extra = {"HERALD_LOG_LEVEL": "WARNING", **(env or {})}
    try:
        _up(run_dir, extra)
        stack = FullStack(run_dir)
        try:
            yield stack
        finally:
            stack.close()
    finally:
        _herald("down", run_dir=run_dir, env=extra, timeout=120)


class FullStack:
    """Clients for a running stack: its API (dev key), Kafka topics, registry."""

    def __init__(self, run_dir: Path) -> None:
        from infra.stack import read_state

        self.run_dir = run_dir
        state = read_state(run_dir)
        if not state or not state.get("ready"):
            raise RuntimeError(f"no ready stack in {run_dir}")
        self.state = state
        env = state["env"]
        self.settings = HeraldSettings(
            kafka=KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"]),
            registry=RegistrySettings(
                url=env.get("HERALD_REGISTRY_URL") or None,
                path=Path(env["HERALD_REGISTRY_PATH"]),
            ),
            redis=RedisSettings(url=env["HERALD_REDIS_URL"]),  # the users job's positions
        )
        self.api = httpx.Client(
            base_url=state["urls"]["api"], headers={"X-API-Key": DEV_KEY}, timeout=30
        )
        self.sims = {
            name.removeprefix("sim-"): c["address"]
            for name, c in state["components"].items()
            if name.startswith("sim-")
        }

    def close(self) -> None:
        self.api.close()

    def put_phone(self, user_id: str, phone: str) -> None:
        """A verified phone for `user_id` through the API (Redis copy + changelog)."""
        resp = self.api.put(
            f"/v1/users/{user_id}/contact-points", json={"phone": {"e164": phone, "verified": True}}
        )
        resp.raise_for_status()

    def put_contacts(self, user_id: str, *, phone: str, email: str) -> None:
        """A verified phone and email for `user_id` through the API."""
        body = {"phone": {"e164": phone, "verified": True},
                "email": {"address": email, "verified": True}}  # fmt: skip
        self.api.put(f"/v1/users/{user_id}/contact-points", json=body).raise_for_status()

    def load_segment(self, run_id: str, segment_id: str, users: int, channel: str) -> None:
        """`users` campaign users on `channel` and their segment, as `herald demo` loads them
        (contact points on the herald.devices changelog, the snapshot in ClickHouse), then
        until the users job has copied them."""
        from dataflows.users import wait_copied
        from herald.clickhouse import herald_client
        from herald.config import ClickHouseSettings
        from infra.demo.loader import load_audience

        ch = herald_client(ClickHouseSettings(dsn=self.state["env"]["HERALD_CLICKHOUSE_DSN"]))
        try:
            load_audience(self.settings, ch, run_id, segment_id, users, channel)
        finally:
            ch.close()
        wait_copied(self.settings, timeout=1800)  # the plan jobs read the users' copies

    @staticmethod
    def bulk_budget(provider: str) -> float:
        """What bulk may use of `provider`'s default budget (rate − reserved)."""
        from sinks.dispatch.settings import DispatchSettings

        rate = DispatchSettings().rates[provider]
        return rate.rate - rate.reserved

    def kafka_baseline(self, n: int) -> dict[str, float]:
        """Kafka consume→produce of up to `n` herald.delivery-events records, on this broker."""
        from bench._harness import raw_baseline, topic_timestamps

        available, _first, _last = topic_timestamps(self.settings, "herald.delivery-events")
        return raw_baseline(self.settings, ["herald.delivery-events"], min(n, available))

    def bare_client(self, channel: str, n: int) -> dict[str, Any]:
        """The bare provider client of `channel` against this stack's simulator (its sends
        count in the simulator's stats)."""
        import json

        from bench.dispatch import CHANNEL_SIM, raw_client_with
        from sinks.dispatch.simenv import client_env

        name = CHANNEL_SIM[channel]
        if name is None:
            raise ValueError(f"channel {channel!r} has no provider simulator")
        creds = json.loads((self.run_dir / "simulators" / name / "credentials.json").read_text())
        return raw_client_with(
            channel, client_env(name, creds), self.state["env"]["HERALD_REDIS_URL"], n
        )

    def quiesce(
        self,
        topics: tuple[str, ...],
        recorders: tuple[str, ...] = ("receipts", "warehouse"),
        still_s: float = 5.0,
        limit_s: float = 180.0,
    ) -> float:
        """Wait until no record was added to `topics` for `still_s` and the `recorders` jobs
        have committed every record of their inputs (the stack has finished the work in
        flight: receipts, loads, the events a niced job left for later); the seconds waited."""
        from confluent_kafka import Consumer, TopicPartition

        kafka = self.settings.kafka
        consumer = Consumer({**kafka.client_config(), "group.id": "bench"})
        started = time.monotonic()

        def ends() -> int:
            total = 0
            for name in topics:
                topic = kafka.topic(name)
                for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
                    total += consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            return total

        try:
            last, since = ends(), time.monotonic()
            while time.monotonic() - since < still_s and time.monotonic() - started < limit_s:
                time.sleep(1)
                now = ends()
                if now != last:
                    last, since = now, time.monotonic()
        finally:
            consumer.close()
        while self.behind(recorders) and time.monotonic() - started < limit_s:
            time.sleep(1)
        return time.monotonic() - started

    def behind(self, jobs: tuple[str, ...], topic: str = "herald.delivery-events") -> int:
        """Records of `topic` that `jobs` have not committed yet (their recovery stores against
        the topic's ends; a job commits once per snapshot interval, and a partition it never
        committed counts from offset 0)."""
        from confluent_kafka.admin import AdminClient

        from dashboards.lag import committed_offsets, consumer_lag

        admin = AdminClient(self.settings.kafka.client_config())
        name = self.settings.kafka.topic(topic)
        partitions = admin.list_topics(name, timeout=10).topics[name].partitions
        offsets = committed_offsets(self.run_dir / "recovery")
        mine = {
            job: {(name, p): offsets.get(job, {}).get((name, p), 0) for p in partitions}
            for job in jobs
        }
        return sum(lag.lag for lag in consumer_lag(self.settings.kafka, mine))

    def post(self, body: dict[str, Any]) -> tuple[str, float]:
        """POST /v1/notifications; (notification_id, epoch seconds when the request was sent)."""
        sent = time.time()
        resp = self.api.post("/v1/notifications", json=body)
        if resp.status_code != 202:
            raise RuntimeError(f"POST /v1/notifications: {resp.status_code} {resp.text[:500]}")
        return str(resp.json()["notification_id"]), sent

    def notification_status(self, nid: str) -> dict[str, Any]:
        """GET /v1/notifications/{nid} (one delivery per page: the summary counts them all)."""
        resp = self.api.get(f"/v1/notifications/{nid}", params={"limit": 1})
        resp.raise_for_status()
        return dict(resp.json())

    def produce_contact_points(self, users: Iterable[str], wait: bool = True) -> int:
        """An FCM device and a verified email for each user, into herald.devices; with `wait`,
        until the users job has copied them to Redis (what the plan jobs read)."""
        from bench._harness import produce_all
        from schemas.registry import make_registry
        from sinks.kafka import topic_serializer

        topic = "herald.devices"
        encode = topic_serializer(self.settings.kafka, make_registry(self.settings.registry), topic)
        now = datetime.now(UTC)

        def records() -> Iterator[tuple[bytes, bytes]]:
            for user in users:
                device = {"device_id": f"d-{user}", "platform": "fcm", "token": f"tok-{user}",
                          "registered_at": now, "valid": True}  # fmt: skip
                record = {"user_id": user, "devices": [device], "phone": None,
                          "email": {"address": f"{user}@example.test", "verified": True},
                          "updated_at": now, "version": 1}  # fmt: skip
                yield user.encode(), encode(record)

        produced = produce_all(self.settings, topic, records())
        if wait:
            from dataflows.users import wait_copied

            wait_copied(self.settings, timeout=1800)
        return produced

    def sim_stats(self, name: str, log: bool = False) -> dict[str, Any]:
        """A provider simulator's counters (no ids); with `log`, every request's
        [unix time, address, outcome] as the provider saw it."""
        params = {"ids": "0", "log": "1" if log else "0"}
        resp = httpx.get(f"{self.sims[name]}/_admin/stats", params=params, verify=False)
        resp.raise_for_status()
        stats: dict[str, Any] = resp.json()
        return stats

    def configure_sim(self, name: str, patch: dict[str, Any]) -> None:
        """Patch a simulator's fault config (e.g. its own rate limit)."""
        resp = httpx.post(f"{self.sims[name]}/_admin/config", json=patch, verify=False)
        resp.raise_for_status()

    def delivery_events(self, fields: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Every herald.delivery-events record so far (decoded; only `fields` if given)."""
        return self.records("herald.delivery-events", fields)

    def records(self, logical: str, fields: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Every record of a topic so far (decoded; only `fields` if given)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        from schemas.registry import make_registry
        from schemas.serde import AvroDeserializer

        decode = AvroDeserializer(make_registry(self.settings.registry))
        kafka = self.settings.kafka
        topic = kafka.topic(logical)
        consumer = Consumer({**kafka.client_config(), "group.id": "bench",
                             "enable.partition.eof": True})  # fmt: skip
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[dict[str, Any]] = []
        ended: set[int] = set()
        try:
            while len(ended) < len(parts):
                for msg in consumer.consume(5000, 1.0):
                    err = msg.error()
                    if err is None:
                        ev = decode(msg.value())
                        out.append({k: ev[k] for k in fields} if fields else ev)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        ended.add(msg.partition() or 0)
        finally:
            consumer.close()
        return out


class CpuSampler:
    """Machine-wide CPU busy fraction per `interval` s (from /proc/stat), in a daemon thread.

    Shows whether a phase really saturated the machine (a "busy" phase at 40 % CPU would be
    no test of isolation).
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float]] = []  # (epoch s, busy fraction)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _run(self) -> None:
        busy0, total0 = self._read()
        while not self._stop.wait(self.interval):
            busy1, total1 = self._read()
            if total1 > total0:
                self.samples.append((time.time(), (busy1 - busy0) / (total1 - total0)))
            busy0, total0 = busy1, total1

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def mean(self, start: float, end: float) -> float | None:
        """Mean busy fraction of the samples taken within [start, end]."""
        vals = [b for t, b in self.samples if start <= t <= end]
        return sum(vals) / len(vals) if vals else None


class ComponentCpu:
    """CPU of every component of a stack (its process and their children), in % of one core.

    cpu.measure(60) -> {"total": 14.2, "by_component": {"kafka": 6.1, ...}}
    cpu.start(); ...; cpu.stop() -> the same over the time between
    """

    def __init__(self, run_dir: Path) -> None:
        from infra.stack import read_state

        state = read_state(run_dir) or {}
        self.pids = {n: int(c["pid"]) for n, c in state.get("components", {}).items()
                     if c.get("pid")}  # fmt: skip
        self._start: tuple[float, dict[str, int]] | None = None

    @staticmethod
    def _tree(pid: int) -> list[int]:
        out = [pid]
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                for child in (task / "children").read_text().split():
                    out += ComponentCpu._tree(int(child))
        except OSError:
            pass
        return out

    @staticmethod
    def _ticks(pid: int) -> int:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0
        return int(fields[11]) + int(fields[12])

    def _read(self) -> dict[str, int]:
        return {n: sum(map(self._ticks, self._tree(p))) for n, p in self.pids.items()}

    def start(self) -> None:
        self._start = (time.monotonic(), self._read())

    def stop(self) -> dict[str, Any]:
        assert self._start is not None, "start() first"
        t0, before = self._start
        after, seconds = self._read(), time.monotonic() - t0
        hz = os.sysconf("SC_CLK_TCK")
        by = {n: round((after[n] - before.get(n, 0)) / hz / seconds * 100, 2) for n in after}
        return {"seconds": round(seconds, 1), "total": round(sum(by.values()), 1),
                "by_component": by}  # fmt: skip

    def measure(self, seconds: float) -> dict[str, Any]:
        self.start()
        time.sleep(seconds)
        return self.stop()
