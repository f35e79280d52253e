"""Replay/backfill against the real services: ClickHouse rebuild, dead-letter re-drive, copies;
and the warehouse job: every event reaches ClickHouse, and replays change no count."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from bytewax.recovery import init_db_dir
from confluent_kafka import Producer

from dashboards.lag import behind, topic_ends
from dashboards.queries import PANELS, run_panel, window
from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from herald.dead_letters import dead_letter
from herald.sealing import key_name, shred_hour
from infra.replay import parse_time, replay
from sinks.kafka import DeadLetterSealer
from tests.dataflows.helpers import consume, encoder
from tests.dataflows.test_receipts import FlowJob, wait_for
from tests.infra.test_analytics import scenario


def produce_at(
    settings: HeraldSettings, topic: str, records: list[tuple[bytes, bytes, int]]
) -> None:
    """Produce (key, value, timestamp ms) and wait for the acks."""
    producer = Producer({**settings.kafka.client_config(), "acks": "all"})
    for key, value, ts in records:
        producer.produce(settings.kafka.topic(topic), value, key, timestamp=ts)
    assert producer.flush(30) == 0


def ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def produce_events(
    settings: HeraldSettings, tenant: str, at: datetime, t0: datetime | None = None
) -> int:
    encode = encoder(settings, "herald.delivery-events")
    events = scenario(tenant, t0)
    records = [(e["delivery_id"].encode(), encode(e), ms(at)) for e in events]
    produce_at(settings, "herald.delivery-events", records)
    return len(events)


def counts(settings: HeraldSettings, tenant: str, now: datetime | None = None) -> dict[str, Any]:
    """Every panel over a 60-minute window ending at `now` (fixed by callers that compare)."""
    client = herald_client(settings.clickhouse)
    try:
        params = window(60, tenant, now)
        panels = {name: run_panel(client, name, params) for name in PANELS}
        rows = client.query(
            "SELECT count() FROM delivery_events FINAL WHERE tenant_id = {t:String}",
            parameters={"t": tenant},
        ).result_rows[0][0]
        return {"rows": rows, **panels}
    finally:
        client.close()


def loaded_times(settings: HeraldSettings, tenant: str) -> dict[str, tuple[datetime, datetime]]:
    """event_id -> (occurred_at, recorded_at) of the tenant's rows in ClickHouse."""
    client = herald_client(settings.clickhouse)
    try:
        rows = client.query(
            "SELECT event_id, occurred_at, recorded_at FROM delivery_events FINAL"
            " WHERE tenant_id = {t:String}",
            parameters={"t": tenant},
        ).result_rows
    finally:
        client.close()
    utc = [(e, *(t if t.tzinfo else t.replace(tzinfo=UTC) for t in ts)) for e, *ts in rows]
    return {e: (o, r) for e, o, r in utc}


def test_parse_time() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert parse_time("-2h", now) == now - timedelta(hours=2)
    assert parse_time("now", now) == now
    assert parse_time("2026-03-01T10:00:00", now) == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert parse_time("2026-03-01T10:00:00+01:00", now).hour == 10
    with pytest.raises(ValueError):
        parse_time("yesterday", now)


@pytest.mark.integration
def test_rebuild_clickhouse_twice_changes_no_count(settings: HeraldSettings) -> None:
    now = datetime.now(UTC)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    n = produce_events(settings, tenant, now)
    other = f"t-{uuid.uuid4().hex[:8]}"
    produce_events(settings, other, now - timedelta(hours=3))  # outside the range
    seen: list[tuple[int, int]] = []
    frm, to = now - timedelta(minutes=5), now + timedelta(minutes=1)

    result = replay(
        settings, "herald.delivery-events", frm, to, progress=lambda d, t: seen.append((d, t))
    )

    assert (result.mode, result.in_range, result.written) == ("clickhouse", n, n)
    assert result.scanned >= n and seen[-1] == (result.scanned, result.scanned)
    at = now + timedelta(minutes=2)  # one fixed window for every read
    first = counts(settings, tenant, at)
    assert first["rows"] == n and counts(settings, other, at)["rows"] == 0
    assert replay(settings, "herald.delivery-events", frm, to).written == n
    assert counts(settings, tenant, at) == first


@pytest.mark.integration
def test_dead_letters_are_redriven_once_keeping_their_bytes(settings: HeraldSettings) -> None:
    now = datetime.now(UTC)
    source = settings.kafka.topic("herald.deliveries.sms.bulk")
    later = now + timedelta(hours=1)
    letters = [
        dead_letter(source_topic=source, partition=0, offset=7, key=b"d-1", value=b"\x00v1",
                    reason="retries_exhausted", detail="", job="dispatch", delivery_id="d-1",
                    expire_at=later),
        dead_letter(source_topic=source, partition=0, offset=8, key=b"d-2", value=b"\x00v2",
                    reason="retries_exhausted", detail="", job="dispatch", delivery_id="d-2",
                    expire_at=now - timedelta(minutes=1)),
        dead_letter(source_topic=source, reason="encode_failed", detail="", job="plan",
                    value=b"{}"),
        dead_letter(source_topic=source, partition=0, offset=9, key=b"d-3", value=b"\x00v3",
                    reason="retries_exhausted", detail="", job="dispatch", delivery_id="d-3",
                    expire_at=now + timedelta(hours=3)),
    ]  # fmt: skip
    seal = DeadLetterSealer(settings)  # as every job seals them (herald/sealing.py)
    encode = encoder(settings, "herald.dead-letters")
    produce_at(settings, "herald.dead-letters",
               [(b"k", encode(seal(d)), ms(now)) for d in letters])  # fmt: skip
    # d-3's hour is over (its key dropped, as Redis does when the hour ends): unreadable
    shredded = shred_hour(now + timedelta(hours=3)).strftime("%Y%m%d%H")
    settings.redis.client().delete(key_name(shredded))
    frm, to = now - timedelta(minutes=1), now + timedelta(minutes=1)

    first = replay(settings, "herald.dead-letters", frm, to)
    assert (first.mode, first.written) == ("redrive", 1)
    assert first.skipped == {"expired": 1, "not_replayable": 1, "shredded": 1}
    assert consume(settings, "herald.deliveries.sms.bulk") == [(b"d-1", b"\x00v1")]
    again = replay(settings, "herald.dead-letters", frm, to)
    assert again.written == 0 and again.skipped["already_replayed"] == 1
    forced = replay(settings, "herald.dead-letters", frm, to, force=True)
    assert forced.written == 1
    excluded = replay(
        settings, "herald.dead-letters", frm, to, force=True, exclude_jobs={"dispatch"}
    )
    assert excluded.written == 0 and excluded.skipped["excluded_job"] == 3
    into = replay(settings, "herald.dead-letters", frm, to, into="herald.retry.bulk", force=True)
    assert into.written == 1 and consume(settings, "herald.retry.bulk") == [(b"d-1", b"\x00v1")]


@pytest.mark.integration
def test_copy_into_another_topic(settings: HeraldSettings) -> None:
    now = datetime.now(UTC)
    records = [(f"k{i}".encode(), f"v{i}".encode(), ms(now)) for i in range(30)]
    produce_at(settings, "herald.receipts.raw", records)
    result = replay(settings, "herald.receipts.raw", now - timedelta(minutes=1),
                    now + timedelta(minutes=1), into="herald.social-events")  # fmt: skip
    assert (result.mode, result.written) == ("copy", 30)
    copied = consume(settings, "herald.social-events")
    assert sorted(copied) == sorted((k, v) for k, v, _ in records)


def warehouse_events(port: int) -> float:
    """herald_events_total of the warehouse job, from its /metrics endpoint."""
    import httpx

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return -1.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('herald_events_total{job="warehouse"')
    )


@pytest.mark.integration
def inserted_all(settings: HeraldSettings, recovery: Path) -> bool:
    """Whether the warehouse committed a position past every delivery event now on the topic:
    its insert of a batch returns before the epoch holding the batch commits."""
    ends = topic_ends(settings.kafka, [settings.kafka.topic("herald.delivery-events")])
    return not behind(recovery.parent, recovery.name, ends)


def test_warehouse_job_loads_every_event_and_replays_change_nothing(
    settings: HeraldSettings, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    from infra.process import free_port

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    t0 = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    n = produce_events(settings, tenant, now, t0)
    port = free_port("127.0.0.1")
    env = {**subprocess_env, "HERALD_METRICS_PORT": str(port)}
    recovery = tmp_path / "warehouse"
    recovery.mkdir()
    init_db_dir(recovery, 1)
    job = FlowJob(
        "dataflows.warehouse:build_flow()", env, "-r", str(recovery), "-s", "1", "-b", "0"
    )
    try:
        wait_for(lambda: counts(settings, tenant)["rows"] == n)
        # the job loads the timestamps as the epoch milliseconds it read: the same instants
        want = {e["event_id"]: (e["occurred_at"], e["recorded_at"]) for e in scenario(tenant, t0)}
        assert loaded_times(settings, tenant) == want
        # one fixed window for both reads: a minute boundary between them must not shift buckets
        at = datetime.now(UTC) + timedelta(minutes=2)
        first = counts(settings, tenant, at)
        assert warehouse_events(port) == n
        # re-drive the range through Kafka (the job loads it again) and into ClickHouse directly
        frm, to = now - timedelta(minutes=1), now + timedelta(minutes=1)
        redriven = replay(
            settings, "herald.delivery-events", frm, to, into="herald.delivery-events"
        )
        assert redriven.written == n
        assert replay(settings, "herald.delivery-events", frm, to).written == 2 * n  # + copies
        wait_for(lambda: warehouse_events(port) == 2 * n)
        wait_for(lambda: inserted_all(settings, recovery))  # it counts before it inserts
        assert counts(settings, tenant, at) == first
        assert job.proc.poll() is None
    finally:
        job.stop()


@pytest.mark.integration
def test_cli_entry_point(settings: HeraldSettings, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.replay import replay_cli

    n = produce_events(settings, f"t-{uuid.uuid4().hex[:8]}", datetime.now(UTC))
    assert replay_cli(settings, "herald.delivery-events", "-5m", "now") == 0
    assert f"{n} written" in capsys.readouterr().out
    assert replay_cli(settings, "herald.delivery-events", "now", "-5m") == 2
    assert replay_cli(settings, "herald.delivery-events", "yesterday", "now") == 2
