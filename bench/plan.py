"""Planning throughput: deliveries/s through the plan job (decode, policy, caps, render, encode).

    python -m bench.plan [--users N]   (own embedded stack in a temp dir)
    python -m bench.plan --processes 1 2  (the job as 1, then 2 bytewax.run processes)

Scenario: a bulk marketing campaign (marketing_campaign: push + email, capped 3/day) to N users
with preferences and contact points in the compacted topics, copied into Redis by the users job
(dataflows/users.py) as on the stack, sent as N/1,000 requests of 1,000 inline users. Each user's
state is read from its copies (one MGET per chunk of users, each copy parsed: the job has not
seen these users before), then each user gets a policy decision per channel, a frequency-cap
charge in Redis (one pipelined round trip per batch), a render from the per-locale bound
template, then a Delivery and a delivery_event, both Avro-encoded and produced (acks=all).
10 % of the users opted out of marketing (SUPPRESSED events only), the others get 2 deliveries.

The job runs in this process (one Bytewax worker, bounded) with recovery snapshots on. Figures:
- users job: the time it took to copy the users into Redis (not part of the planning rate);
- deliveries/s: Delivery records / (time of the run with the campaign - time of the same run
  without it): the planning rate, without startup (measured first);
- output records/s: Deliveries + delivery events over the same time;
- baseline: the same output records consumed and produced to a scratch topic, raw;
- no-op planner: the same job and campaign with the planning step replaced by one that emits
  a copy of a real Delivery and event per user and channel without deciding anything (no
  policy, caps, rendering, ids or encoding; the users' state is read as by the planner): what
  the rest of the job (request reading, the users' copies, Bytewax, produce) allows per
  process, whatever the planner costs.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import patch

from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench._harness import (
    drop_topics,
    embedded_stack,
    produce_all,
    raw_baseline,
    report,
    run_job,
    scenario_settings,
    topic_timestamps,
)
from dataflows import plan as plan_job
from dataflows import users as users_job
from dataflows._redis import redis_client
from dataflows._runtime import tune_runtime
from dataflows._settings import PlanningSettings
from dataflows._user_copies import UserState
from herald.config import HeraldSettings
from herald.planning import AudienceBatch, Planned
from schemas.registry import make_registry
from sinks.kafka import KafkaRecord, topic_serializer

OUTPUTS = ["herald.deliveries.push.bulk", "herald.deliveries.email.bulk", "herald.scheduled"]
EVENTS = "herald.delivery-events"
ZONES = ["Europe/Zurich", "Asia/Kolkata", "America/New_York", None]
LOCALES = ["en", "de", "zh", None]
PARAMS = {"headline": "Spring sale", "offer": "20% off everything", "cta_url": "https://x.test/s"}


def _encoder(settings: HeraldSettings, topic: str) -> Any:
    return topic_serializer(settings.kafka, make_registry(settings.registry), topic)


def users_table(
    settings: HeraldSettings, users: int, topic: str, diverse: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """Preferences or contact points of every user (10 % opted out of marketing). `diverse`:
    each user also has a one-minute quiet-hours window of their own (1,440 distinct), so users
    of a 1,000-user request hardly ever share a class (dataflows/plan/planned_alike.py) and are
    planned in full."""
    encode = _encoder(settings, topic)
    rng = random.Random(7)
    now = datetime.now(UTC)
    for i in range(users):
        user = f"u{i:07d}"
        if topic == "herald.preferences":
            record: dict[str, Any] = {
                "user_id": user, "category_opt_out": ["marketing"] if i % 10 == 0 else [],
                "timezone": rng.choice(ZONES), "locale": rng.choice(LOCALES),
                "updated_at": now, "version": 1,
            }  # fmt: skip
            if diverse:
                start = i * 7 % 1440
                record["quiet_hours"] = {"start": _hhmm(start), "end": _hhmm(start + 1)}
        else:
            device = {"device_id": f"d{i}", "platform": "fcm", "token": f"t{i:032d}",
                      "registered_at": now, "valid": True}  # fmt: skip
            email = {"address": f"{user}@example.test", "verified": True}
            record = {"user_id": user, "devices": [device], "email": email, "updated_at": now,
                      "version": 1}  # fmt: skip
        yield user.encode(), encode(record)


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


def campaign(settings: HeraldSettings, users: int) -> Iterator[tuple[bytes, bytes]]:
    """One request per 1,000 users; notification ids unique to the scenario's topics (the plan
    job's request dedup in Redis drops an id seen before from another topic)."""
    encode = _encoder(settings, "herald.requests.bulk")
    now = datetime.now(UTC)
    for n in range(0, users, 1000):
        nid = f"{settings.kafka.topic_prefix}{n}"
        record = {
            "notification_id": nid, "request_id": nid, "tenant_id": "bench",
            "notification_type": "marketing_campaign", "traffic_class": "bulk",
            "recipients": {"user_ids": [f"u{i:07d}" for i in range(n, min(n + 1000, users))]},
            "params": PARAMS, "accepted_at": now, "source": "api",
        }  # fmt: skip
        yield nid.encode(), encode(record)


class _NoopPlanner:
    """Stands in for `dataflows.plan.planner.Planner`: per user, the records the campaign gives it
    (2 SUPPRESSED events when opted out of marketing, else 2 Deliveries and 2 PLANNED events),
    as copies of real records read back from the campaign run (`samples`, by physical topic)."""

    def __init__(self, samples: dict[str, bytes], settings: HeraldSettings) -> None:
        self.samples = samples
        kafka = settings.kafka
        self.deliveries = [kafka.topic(t) for t in OUTPUTS[:2]]
        self.events = kafka.topic(EVENTS)
        self.state = UserState(redis_client(settings.redis), kafka.topic_prefix, 50_000)

    def fetch(self, batch: list[AudienceBatch]) -> Future[list[Planned]]:
        """As `Planner.fetch` (in the calling thread)."""
        fetched: Future[list[Planned]] = Future()
        fetched.set_result(self.state.views(batch)[0])
        return fetched

    def start(self, fetched: Future[list[Planned]]) -> Callable[[], list[KafkaRecord]]:
        """As `Planner.start`: the records, given by the returned call."""
        records = self(fetched.result())
        return lambda: records

    def __call__(self, batch: list[Planned]) -> list[KafkaRecord]:
        out: list[KafkaRecord] = []
        sample, events = self.samples, self.events
        for planned in batch:
            for view in planned.users:
                user = view.user_id
                if "marketing" in view.prefs.category_opt_out:
                    out += [KafkaRecord(events, user, sample[events])] * 2
                    continue
                for topic in self.deliveries:
                    out.append(KafkaRecord(topic, user, sample[topic]))
                    out.append(KafkaRecord(events, user, sample[events]))
        return out


def _samples(settings: HeraldSettings) -> dict[str, bytes]:
    """One record of each output topic of the campaign run (physical topic -> value)."""
    kafka = settings.kafka
    conf = {**kafka.client_config(), "group.id": "bench-sample"}
    consumer = Consumer(conf)
    found: dict[str, bytes] = {}
    try:
        for logical in [*OUTPUTS[:2], EVENTS]:
            physical = kafka.topic(logical)
            consumer.assign([TopicPartition(physical, 0, OFFSET_BEGINNING)])
            while physical not in found:
                msg = consumer.poll(10.0)
                if msg is None:
                    raise RuntimeError(f"no record in {physical} partition 0")
                value = msg.value()
                if msg.error() is None and value is not None:
                    found[physical] = value
    finally:
        consumer.close()
    return found


def _run_noop(base: HeraldSettings, settings: HeraldSettings) -> tuple[float, float]:
    """`_run_job` with the planning step replaced by `_NoopPlanner`."""
    samples = _samples(settings)

    def planner(_catalog: Any, job_settings: HeraldSettings, *_args: Any) -> _NoopPlanner:
        return _NoopPlanner(samples, job_settings)

    with patch.object(plan_job, "Planner", planner):
        return _run_job(base, settings, "noop")


def _run_job(base: HeraldSettings, settings: HeraldSettings, name: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one bounded run of the bulk plan job, with
    a fresh recovery store. CPU time includes librdkafka's threads; it is the figure that holds
    on a machine shared with other work."""
    recovery = base.run.run_dir / "bench-recovery" / f"{settings.kafka.topic_prefix}{name}"
    recovery.mkdir(parents=True)
    init_db_dir(recovery, 1)
    flow = plan_job.build_flow(
        settings, traffic_class="bulk", planning=PlanningSettings(), bounded=True
    )
    tune_runtime()  # as the job process does (dataflows/_runtime.py)
    started, cpu = time.perf_counter(), time.process_time()
    run_main(flow, epoch_interval=timedelta(seconds=10), recovery_config=RecoveryConfig(recovery))
    return time.perf_counter() - started, time.process_time() - cpu


def _load_users(settings: HeraldSettings, users: int, diverse: bool) -> float:
    """The users on the changelogs, then copied into Redis by the users job (bounded, in this
    process); the users job's seconds."""
    for topic in ("herald.preferences", "herald.devices"):
        produce_all(settings, topic, users_table(settings, users, topic, diverse))
    started = time.perf_counter()
    run_main(users_job.build_flow(settings, bounded=True), epoch_interval=timedelta(seconds=1))
    return time.perf_counter() - started


def run(base: HeraldSettings, users: int = 100_000, diverse: bool = False) -> dict[str, Any]:
    """Produce the users and the campaign, run the job, measure the baseline; return figures."""
    settings = scenario_settings(base, "plan")
    try:
        copy_s = _load_users(settings, users, diverse)
        load_s, load_cpu = _run_job(base, settings, "table")
        produce_all(settings, "herald.requests.bulk", campaign(settings, users))
        job_s, job_cpu = _run_job(base, settings, "campaign")
        span, cpu = job_s - load_s, job_cpu - load_cpu
        deliveries = sum(topic_timestamps(settings, t)[0] for t in OUTPUTS)
        events = topic_timestamps(settings, EVENTS)[0]
        baseline = raw_baseline(settings, [*OUTPUTS, EVENTS], deliveries + events)
        noop_s, _noop_cpu = _run_noop(base, settings)
    finally:
        drop_topics(settings)
    return report(
        "plan: marketing campaign through dataflows.plan (1 worker, recovery on)"
        + (", every user in a class of their own" if diverse else ""),
        {
            "users": users,
            "deliveries": deliveries,
            "delivery events": events,
            "users job seconds: the users' copies into Redis": copy_s,
            "job seconds: startup": load_s,
            "job seconds: same + campaign": job_s,
            "plan deliveries/s": deliveries / span,
            "plan output records/s": (deliveries + events) / span,
            "plan CPU µs/delivery": cpu / deliveries * 1e6,
            "plan deliveries per CPU second": deliveries / cpu,
            "baseline consume->produce rec/s": baseline["records_per_s"],
            "plan records / baseline": (deliveries + events) / span / baseline["records_per_s"],
            "job seconds: no-op planner": noop_s,
            "no-op planner deliveries/s": deliveries / (noop_s - load_s),
        },
    )


JOB = "dataflows.plan:build_flow(traffic_class='bulk', bounded=True)"  # stops at the topics' end


def run_processes(base: HeraldSettings, users: int, processes: list[int]) -> dict[str, Any]:
    """The job as `python -m bytewax.run` processes (`-i/-a` for more than one, no recovery),
    twice per count: without requests, and with the campaign; the difference is the planning
    time, without start-up."""
    table = scenario_settings(base, "plan-table")
    full = scenario_settings(base, "plan-full")
    logs = base.run.run_dir / "bench-plan-logs"
    logs.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"users": users}
    try:
        _load_users(table, 0, False)  # no users: only the marker that the copies hold them all
        figures["users job seconds"] = _load_users(full, users, False)
        produce_all(full, "herald.requests.bulk", campaign(full, users))
        planned = 0
        for i, n in enumerate(processes, 1):
            load_s = run_job(table, JOB, n, logs)
            job_s = run_job(full, JOB, n, logs)
            total = sum(topic_timestamps(full, t)[0] for t in OUTPUTS)
            deliveries, planned = total - planned, total  # each run plans the campaign again
            name = f"run {i}, {n} process{'es' if n > 1 else ''}"
            figures[f"{name}: s, startup / + campaign"] = f"{load_s:.1f} / {job_s:.1f}"
            figures[f"{name}: deliveries/s"] = deliveries / (job_s - load_s)
    finally:
        drop_topics(table)
        drop_topics(full)
    return report("plan: the job as separate processes (bytewax.run, no recovery)", figures)


def main() -> None:
    """Run on a fresh embedded stack."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument(
        "--processes", type=int, nargs="+", metavar="N",
        help="instead: run the job as N bytewax.run processes (e.g. --processes 1 2)",
    )  # fmt: skip
    parser.add_argument(
        "--diverse", action="store_true",
        help="every user in a class of their own (no templates: the full planning path)",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as tmp, embedded_stack(Path(tmp)) as s:
        if args.processes:
            run_processes(s, args.users, args.processes)
        else:
            run(s, args.users, args.diverse)


if __name__ == "__main__":
    main()
