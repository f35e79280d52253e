"""Digest throughput: like events/s through the digest job with >= 10k active recipients.

    python -m bench.digest [--events N] [--recipients R]   (own embedded stack in a temp dir)

Two runs over the same records: the job in this process (one Bytewax worker, recovery snapshots
on, epoch 10 s: the per-process figure), then as two `python -m bytewax.run` processes (`-i/-a`,
startup included: what 2 cores do; the same job over an empty topic gives the fixed start-up
cost, reported beside it and subtracted for the steady rate). Both are bounded: they stop at the
end of the topic. Every event is decoded, keyed by (recipient, type, object), deduplicated and
folded into its open window; windows stay open (likes: 600 s), so the figure is the ingest rate
of the aggregation.
The baseline consumes the same records and produces them to a scratch topic, in the same run.
CPU figures (`time.process_time` of this process: every thread, librdkafka's included) are
given beside wall figures because a shared machine's load moves wall-clock rates a lot.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main

from bench._harness import (
    drop_topics,
    embedded_stack,
    produce_all,
    raw_baseline,
    report,
    run_job,
    scenario_settings,
)
from dataflows._runtime import tune_runtime
from dataflows._settings import PlanningSettings
from dataflows.digest import build_flow
from herald.config import HeraldSettings
from schemas.registry import make_registry
from sinks.kafka import topic_serializer

TOPIC = "herald.social-events"
BOUNDED_JOB = "dataflows.digest:build_flow(bounded=True)"  # stops at the end of the topic


def like_events(settings: HeraldSettings, n: int, recipients: int) -> Iterator[tuple[bytes, bytes]]:
    """`n` distinct likes from 100k actors on one post of each of `recipients` users."""
    encode = topic_serializer(settings.kafka, make_registry(settings.registry), TOPIC)
    rng = random.Random(3)
    at = datetime.now(UTC)
    for i in range(n):
        recipient = f"r{rng.randrange(recipients)}"
        actor = f"a{rng.randrange(100_000)}"
        record = {
            "event_id": f"e{i}", "event_type": "like", "actor_id": actor, "actor_name": actor,
            "recipient_id": recipient, "object_id": f"post-{recipient}", "object_type": "post",
            "occurred_at": at, "tenant_id": "bench",
        }  # fmt: skip
        yield recipient.encode(), encode(record)


def run(base: HeraldSettings, events: int = 1_000_000, recipients: int = 20_000) -> dict[str, Any]:
    """Produce the likes, run the job over them, measure the baseline; return the figures."""
    settings = scenario_settings(base, "digest")
    try:
        started = time.perf_counter()
        produce_all(settings, TOPIC, like_events(settings, events, recipients))
        produced_s = time.perf_counter() - started
        recovery = base.run.run_dir / "bench-recovery" / settings.kafka.topic_prefix
        recovery.mkdir(parents=True)
        init_db_dir(recovery, 1)
        flow = build_flow(settings, planning=PlanningSettings(), bounded=True)
        tune_runtime()  # as the job process does (dataflows/_runtime.py)
        started, cpu = time.perf_counter(), time.process_time()
        run_main(
            flow, epoch_interval=timedelta(seconds=10), recovery_config=RecoveryConfig(recovery)
        )
        job_s, job_cpu = time.perf_counter() - started, time.process_time() - cpu
        logs = base.run.run_dir / "bench-logs" / settings.kafka.topic_prefix
        logs.mkdir(parents=True)
        two_s = run_job(settings, BOUNDED_JOB, 2, logs)
        idle_s = _startup_s(base, logs)
        cpu = time.process_time()
        baseline = raw_baseline(settings, [TOPIC], events)
        baseline_cpu = time.process_time() - cpu
    finally:
        drop_topics(settings)
    return report(
        "digest: like events through dataflows.digest (1 worker, recovery on)",
        {
            "events": events,
            "active recipients (keys)": recipients,
            "produce (encode + send) events/s": events / produced_s,
            "digest events/s, 1 process": events / job_s,
            "digest seconds, 1 process": job_s,
            "digest CPU us/event, 1 process": job_cpu / events * 1e6,
            "digest events/CPU-s, 1 process": events / job_cpu,
            "digest events/s, 2 processes": events / two_s,
            "digest seconds, 2 processes": two_s,
            "2 processes on an empty topic (s)": idle_s,
            "digest events/s, 2 processes, start-up excluded": events / max(two_s - idle_s, 1e-9),
            "baseline consume->produce rec/s": baseline["records_per_s"],
            "baseline CPU us/record": baseline_cpu / events * 1e6,
            "baseline records/CPU-s": events / baseline_cpu,
            "digest 1 process / baseline": events / job_s / baseline["records_per_s"],
            "digest / baseline, CPU per item": job_cpu / baseline_cpu,
        },
    )


def _startup_s(base: HeraldSettings, logs: Path) -> float:
    """Seconds the same 2-process job takes over an empty topic: process start, imports,
    cluster handshake, recovery store and end-of-topic detection (the fixed cost)."""
    empty = scenario_settings(base, "digest-empty")
    try:
        return run_job(empty, BOUNDED_JOB, 2, logs)
    finally:
        drop_topics(empty)


def main() -> None:
    """Run on a fresh embedded stack."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--recipients", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as tmp, embedded_stack(Path(tmp)) as s:
        run(s, args.events, args.recipients)


if __name__ == "__main__":
    main()
