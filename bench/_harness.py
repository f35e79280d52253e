"""Shared benchmark helpers: an embedded stack, bulk produce, a raw Kafka baseline, reports.

    embedded_stack(run_dir)           Kafka, Redis, ClickHouse as `herald up` starts them, no jobs
    scenario_settings(base, name)     a unique topic prefix with every topic created, own registry
    produce_all(settings, topic, kv)  produce (key, value) pairs as fast as librdkafka goes
    raw_baseline(settings, topic, n)  consume n records of a topic and produce them elsewhere
    drop_topics(settings)             delete a scenario's topics (Tansu keeps records in RAM)
    report(title, figures)            print a figure table; figures are returned as a dict too

The baseline is measured in the same run, on the same broker, with the same records, so a
figure can be read as "x % of what plain Kafka consume->produce does on this machine now".
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from herald.config import (
    ClickHouseSettings,
    HeraldSettings,
    KafkaSettings,
    RedisSettings,
    RegistrySettings,
    RunSettings,
)
from herald.topics import load_topics
from infra.process import free_port
from infra.stack import Stack
from infra.topics import create_topics

__all__ = [
    "drop_topics",
    "embedded_stack",
    "produce_all",
    "raw_baseline",
    "report",
    "run_job",
    "scenario_settings",
]

REPO = Path(__file__).resolve().parents[1]
PRODUCER = {"linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000}


def _config(kafka: KafkaSettings) -> dict[str, Any]:
    return dict(kafka.client_config())


@contextmanager
def embedded_stack(run_dir: Path) -> Iterator[HeraldSettings]:
    """Start Kafka, Redis and ClickHouse (no jobs) in `run_dir`; yield settings reaching them."""
    stack = Stack(run_dir, jobs=[])
    ctx = stack.start()
    env = ctx.child_env()
    try:
        yield HeraldSettings(
            kafka=KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"]),
            redis=RedisSettings(url=env["HERALD_REDIS_URL"]),
            clickhouse=ClickHouseSettings(dsn=env["HERALD_CLICKHOUSE_DSN"]),
            registry=RegistrySettings(
                url=env.get("HERALD_REGISTRY_URL") or None,
                path=Path(env["HERALD_REGISTRY_PATH"]),
            ),
            run=RunSettings(run_dir=run_dir),
        )
    finally:
        stack.stop()


def scenario_settings(base: HeraldSettings, name: str) -> HeraldSettings:
    """`base` with a fresh topic prefix (all topics created) and its own registry directory."""
    prefix = f"bench-{name}-{uuid.uuid4().hex[:6]}."
    kafka = base.kafka.model_copy(update={"topic_prefix": prefix})
    create_topics(kafka)
    registry = RegistrySettings(path=base.run.run_dir / "bench-registry" / prefix)
    return base.model_copy(update={"kafka": kafka, "registry": registry})


def produce_all(
    settings: HeraldSettings, topic: str, records: Iterable[tuple[bytes | None, bytes]]
) -> int:
    """Produce to a logical topic; returns the count once the broker acknowledged all."""
    producer = Producer({**settings.kafka.client_config(), **PRODUCER, "acks": "all"})
    physical = settings.kafka.topic(topic)
    n = 0
    for key, value in records:
        while True:
            try:
                producer.produce(physical, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "records left unacknowledged"
    return n


def _assigned_consumer(kafka: KafkaSettings, physical: list[str]) -> Consumer:
    conf = {**kafka.client_config(), "group.id": "bench", "enable.partition.eof": False}
    consumer = Consumer(conf)
    parts = [
        TopicPartition(t, p, OFFSET_BEGINNING)
        for t in physical
        for p in consumer.list_topics(t, timeout=10).topics[t].partitions
    ]
    consumer.assign(parts)
    return consumer


def raw_baseline(settings: HeraldSettings, topics: list[str], n: int) -> dict[str, float]:
    """Consume `n` records of logical `topics` and produce each to a scratch topic; records/s."""
    kafka = settings.kafka
    scratch = kafka.topic("bench.baseline")
    admin = AdminClient(_config(kafka))
    admin.create_topics([NewTopic(scratch, 4, 1)])[scratch].result(30)
    consumer = _assigned_consumer(kafka, [kafka.topic(t) for t in topics])
    producer = Producer({**kafka.client_config(), **PRODUCER, "acks": "all"})
    done = 0
    started = time.perf_counter()
    try:
        while done < n:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is not None:
                    continue
                while True:
                    try:
                        producer.produce(scratch, msg.value(), msg.key())
                        break
                    except BufferError:
                        producer.poll(0.05)
                done += 1
            producer.poll(0)
        assert producer.flush(120) == 0
    finally:
        consumer.close()
    seconds = time.perf_counter() - started
    return {"records": done, "seconds": seconds, "records_per_s": done / seconds}


def topic_timestamps(settings: HeraldSettings, topic: str) -> tuple[int, float, float]:
    """(records, first, last record timestamp in s) of a logical topic, read to its end."""
    physical = settings.kafka.topic(topic)
    conf = {**settings.kafka.client_config(), "group.id": "bench", "enable.partition.eof": True}
    consumer = Consumer(conf)
    parts = consumer.list_topics(physical, timeout=10).topics[physical].partitions
    consumer.assign([TopicPartition(physical, p, OFFSET_BEGINNING) for p in parts])
    n, first, last = 0, float("inf"), 0.0
    ended: set[int] = set()
    try:
        while len(ended) < len(parts):
            for msg in consumer.consume(5000, 1.0):
                err = msg.error()
                if err is None:
                    ts = msg.timestamp()[1] / 1000
                    n, first, last = n + 1, min(first, ts), max(last, ts)
                elif err.code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition() or 0)
    finally:
        consumer.close()
    return n, first, last


def drop_topics(settings: HeraldSettings) -> None:
    """Delete every topic of the scenario's prefix (frees the embedded broker's memory)."""
    kafka = settings.kafka
    names = [kafka.topic(name) for name in load_topics()] + [kafka.topic("bench.baseline")]
    admin = AdminClient(_config(kafka))
    for future in admin.delete_topics(names, operation_timeout=30).values():
        with contextlib.suppress(Exception):  # already gone
            future.result(30)


def job_env(settings: HeraldSettings) -> dict[str, str]:
    """Environment for a job process that should use `settings` (as `herald up` passes it)."""
    return {
        **os.environ,
        "HERALD_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "HERALD_KAFKA_TOPIC_PREFIX": settings.kafka.topic_prefix,
        "HERALD_REDIS_URL": settings.redis.url,
        "HERALD_CLICKHOUSE_DSN": settings.clickhouse.dsn,
        "HERALD_REGISTRY_PATH": str(settings.registry.path),
        "HERALD_RUN_DIR": str(settings.run.run_dir),
        "PYTHONPATH": str(REPO),
    }


def run_job(settings: HeraldSettings, import_str: str, processes: int, log_dir: Path) -> float:
    """Seconds until a bounded job run as `processes` bytewax.run processes has finished."""
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(processes))
    started = time.perf_counter()
    procs = []
    for i in range(processes):
        cluster = ["-i", str(i), "-a", addresses] if processes > 1 else []
        with open(log_dir / f"job-{i}.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bytewax.run", import_str, *cluster],
                    cwd=REPO,
                    env=job_env(settings),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
    codes = [proc.wait(timeout=1800) for proc in procs]
    if any(codes):
        raise RuntimeError(f"{import_str} exited with {codes}; see {log_dir}")
    return time.perf_counter() - started


def report(title: str, figures: dict[str, Any]) -> dict[str, Any]:
    """Print `figures` under `title`; return them."""
    print(f"\n== {title}")
    for key, value in figures.items():
        shown = (
            f"{value:,.1f}"
            if isinstance(value, float)
            else f"{value:,}"
            if isinstance(value, int)
            else value
        )
        print(f"  {key:<34} {shown}")
    return figures
