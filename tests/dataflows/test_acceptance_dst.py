"""Seed 001 acceptance, DST switch: a local-time schedule across a DST gap or overlap is
released at the documented instant, at most once per local day.

The documented rule (herald/scheduling.py, herald.quiet_hours.next_local_time): a local time
that does not exist that day (spring forward) moves to the end of the gap; one that exists twice
(fall back) is used at its first occurrence only. The plan job computes a user's release with
`local_send_at`; here the same function computes it for two DST days, and the held deliveries
go through real schedule jobs whose clocks (HERALD_PLANNING_CLOCK_OFFSET_SECONDS, the test-only
offset) stand 20 s before the computed instants, on the test session's Kafka under their own
topic prefixes. The release is read back from the deliveries topic with its broker timestamp.
It needs Kafka and the schedule job only, so it runs in the parallel lane, not on a whole stack.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from herald.config import HeraldSettings, RegistrySettings
from herald.scheduling import local_send_at
from infra.topics import create_topics
from tests.conftest import child_env
from tests.dataflows.jobs import Job, read_timed, send
from tests.schemas.examples import example

NEW_YORK = "America/New_York"
EMAIL_BULK = "herald.deliveries.email.bulk"
JITTER_S = 2.0
LEAD_S = 20.0
START_S = 240.0  # a Bytewax job's start on a loaded 2-core machine


# (name, planned at, local wall time, the documented release)
def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


CASES = [
    # 2027-03-14 02:00 EST -> 03:00 EDT: 02:30 does not exist, released at 03:00 EDT (07:00Z)
    ("gap", _utc(2027, 3, 14, 5, 0), "02:30", _utc(2027, 3, 14, 7, 0)),
    # 2027-11-07 02:00 EDT -> 01:00 EST: 01:30 happens twice, released at the first (05:30Z)
    ("overlap", _utc(2027, 11, 7, 4, 0), "01:30", _utc(2027, 11, 7, 5, 30)),
]


def _settings(base: HeraldSettings, tmp: Path, name: str) -> HeraldSettings:
    kafka = base.kafka.model_copy(update={"topic_prefix": f"dst{name}{uuid.uuid4().hex[:6]}."})
    create_topics(kafka)
    return base.model_copy(
        update={"kafka": kafka, "registry": RegistrySettings(path=tmp / f"registry-{name}")}
    )


def _held(delivery_id: str, not_before: datetime) -> dict[str, Any]:
    base = {**example("delivery"), "delivery_id": delivery_id, "attempt": 0}
    base.update(channel="email", traffic_class="bulk", next_attempt_at=None)
    return {**base, "not_before": not_before, "expire_at": not_before + timedelta(days=1)}


@pytest.mark.timeout(600)
def test_local_time_release_across_dst_gap_and_overlap(
    settings: HeraldSettings, tmp_path: Path
) -> None:
    # the rule, as the plan job applies it
    for _, planned_at, wall, documented in CASES:
        assert local_send_at(planned_at, None, wall, NEW_YORK) == documented
    # at most once per local day: after the first 01:30 the next is tomorrow's, not the second
    after_first = datetime(2027, 11, 7, 5, 31, tzinfo=UTC)
    assert local_send_at(after_first, None, "01:30", NEW_YORK) == _utc(2027, 11, 8, 6, 30)

    runs = []
    try:
        for name, _, _, documented in CASES:
            case = _settings(settings, tmp_path, name)
            did = str(uuid.uuid4())
            send(case, "herald.scheduled", [_held(did, documented)], key="delivery_id")
            offset = (documented - timedelta(seconds=LEAD_S) - datetime.now(UTC)).total_seconds()
            env = {
                **os.environ,
                **child_env(case),
                "HERALD_PLANNING_CLOCK_OFFSET_SECONDS": str(offset),
                "HERALD_PLANNING_SCHEDULE_JITTER_SECONDS": str(JITTER_S),
            }
            job = Job(env, tmp_path / f"schedule-{name}.log", "dataflows.schedule:build_flow()")
            runs.append((name, case, did, documented, offset, job))

        deadline = time.monotonic() + LEAD_S + START_S
        released: dict[str, list[datetime]] = {}
        while time.monotonic() < deadline and len(released) < len(runs):
            for name, case, did, _, offset, job in runs:
                assert job.running(), job.output()[-3000:]
                stamps = [s for s, d in read_timed(case, EMAIL_BULK) if d["delivery_id"] == did]
                if stamps:
                    released[name] = [s + timedelta(seconds=offset) for s in stamps]
            time.sleep(1)
        # The rule allows one release in [documented, documented + jitter): wait until every
        # job's clock has passed that window and a read of the topic after it (one poll).
        for _, _, _, documented, offset, _ in runs:
            window_end = documented + timedelta(seconds=JITTER_S + 1)
            while datetime.now(UTC) + timedelta(seconds=offset) < window_end:
                time.sleep(0.2)
        for name, case, did, documented, offset, _ in runs:
            assert name in released, f"{name}: never released; {runs[0][-1].output()[-2000:]}"
            stamps = [s for s, d in read_timed(case, EMAIL_BULK) if d["delivery_id"] == did]
            assert len(stamps) == 1, f"{name}: released {len(stamps)} times"
            job_time = stamps[0] + timedelta(seconds=offset)
            late = (job_time - documented).total_seconds()
            print(f"\nDST {name}: documented {documented:%Y-%m-%d %H:%M}Z, released {late:+.1f}s")
            # never early; late by at most the jitter and a broker/poll round (the job clock
            # started LEAD_S before the instant, so a slow start does not count here)
            assert -0.5 <= late <= JITTER_S + 5.0, f"{name}: released {late:+.1f}s from rule"
    finally:
        for *_, job in runs:
            job.stop()
