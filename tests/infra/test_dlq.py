"""Dead-letter replay: dead letters written by the real dispatch sink (retries exhausted), then
re-driven with the same delivery_id and expire_at as the next generation, policy and expiry
re-checked, idempotent; the replay's status supersedes FAILED_PERMANENT in Redis and ClickHouse
while ClickHouse keeps the original attempts' events."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import orjson
import pytest
import redis
from bytewax.testing import run_main

from dataflows import receipts, warehouse
from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from herald.kafka_records import Decoded, KafkaMessage
from herald.sealing import is_sealed
from herald.status_keys import status_key
from infra.dlq import replay_dead_letters
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.sink import DispatchSink
from tests.dataflows.jobs import DEAD_LETTERS, EVENTS, read
from tests.sinks.dispatch_helpers import delivery, dispatch_settings, factories, now, put_prefs

pytestmark = pytest.mark.integration

PUSH_TX = "herald.deliveries.push.transactional"
PUSH_BULK = "herald.deliveries.push.bulk"


@pytest.fixture(scope="module")
def apns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    with start_simulator("apns", tmp_path_factory.mktemp("sims") / "apns") as sim:
        yield sim


def dispatch(settings: HeraldSettings, cfg: DispatchSettings, sim: RunningSimulator,
             deliveries: list[dict[str, Any]]) -> None:  # fmt: skip
    """Run one batch through the real sink partition (producing to Kafka)."""
    sink = DispatchSink(settings, cfg, factories=factories({"apns": sim}, settings.redis.url))
    part = sink.build("dispatch", 0, 1)
    try:
        batch = []
        for i, d in enumerate(deliveries):
            topic = settings.kafka.topic(f"herald.deliveries.push.{d['traffic_class']}")
            batch.append(Decoded(KafkaMessage(topic, 0, i, d["delivery_id"].encode(), b""), d))
        part.write_batch(batch)
    finally:
        part.close()


def test_replay_keeps_identity_rechecks_policy_and_is_idempotent(
    settings: HeraldSettings, apns: RunningSimulator
) -> None:
    apns.reset(config=True)
    apns.configure(errors={"InternalServerError": 1.0})
    one_shot = {"max_attempts": 1}
    cfg = dispatch_settings(backoff={"transactional": one_shot, "bulk": one_shot})
    failing = delivery()
    later_opt_out = delivery(notification_type="marketing_campaign", category="marketing",
                             traffic_class="bulk")  # fmt: skip
    # Still valid while dispatch fails it, however slow the machine; expired for the replay,
    # which is run as of a moment after its expire_at (its `now`), not after a sleep.
    expiring = delivery(expire_at=now() + timedelta(minutes=5))
    dispatch(settings, cfg, apns, [failing, later_opt_out, expiring])

    letters = read(settings, DEAD_LETTERS)
    assert sorted(x["delivery_id"] for x in letters) == sorted(
        d["delivery_id"] for d in (failing, later_opt_out, expiring)
    )
    assert {x["reason"] for x in letters} == {"retries_exhausted"}
    assert all(x["job"] == "dispatch" and x["attempts"] == 1 for x in letters)
    assert all(is_sealed(x["value"]) for x in letters)  # readable by the replay until expiry

    put_prefs(redis.Redis.from_url(settings.redis.url), later_opt_out["user_id"],
              category_opt_out=["marketing"])  # fmt: skip
    later = expiring["expire_at"] + timedelta(seconds=1)
    result = replay_dead_letters(settings, dispatch=cfg, now=later)
    assert (result.scanned, result.replayed) == (3, 1)
    assert result.skipped == {"opted_out": 1, "expired": 1}

    [again] = [d for d in read(settings, PUSH_TX) if d["delivery_id"] == failing["delivery_id"]]
    expire = failing["expire_at"]
    assert again["expire_at"] == expire.replace(microsecond=expire.microsecond // 1000 * 1000)
    assert (again["attempt"], again["first_attempt_at"], again["next_attempt_at"]) == (
        0,
        None,
        None,
    )
    assert again["generation"] == 1
    assert read(settings, PUSH_BULK) == []
    checked = {(e["delivery_id"], e["state"], e["reason"]) for e in read(settings, EVENTS)
               if e["attributes"].get("by") == "dlq_replay"}  # fmt: skip
    assert checked == {
        (later_opt_out["delivery_id"], "SUPPRESSED", "category_opt_out"),
        (expiring["delivery_id"], "EXPIRED", "expired"),
    }

    assert replay_dead_letters(settings, dispatch=cfg, now=later).skipped == {"already_replayed": 3}
    dry = replay_dead_letters(settings, dispatch=cfg, force=True, dry_run=True, now=later)
    assert dry.replayed == 1 and len(read(settings, PUSH_TX)) == 1

    apns.configure(errors={})  # the provider is back: the replayed delivery goes through
    dispatch(settings, cfg, apns, [again])
    did = failing["delivery_id"]
    events = read(settings, EVENTS)
    accepted = [e for e in events if e["state"] == "PROVIDER_ACCEPTED" and e["delivery_id"] == did]
    assert len(accepted) == 1 and (accepted[0]["attempt"], accepted[0]["generation"]) == (1, 1)
    assert_replay_supersedes_the_failure(settings, failing)


def assert_replay_supersedes_the_failure(settings: HeraldSettings, sent: dict[str, Any]) -> None:
    """The receipts job (hot status) and the warehouse job (ClickHouse) over the events: the
    replay's PROVIDER_ACCEPTED is the current state, next to the original attempts' events."""
    for flow in (
        receipts.build_flow(settings, bounded=True),
        warehouse.build_flow(settings, bounded=True),
    ):
        run_main(flow, epoch_interval=timedelta(milliseconds=200))
    did = sent["delivery_id"]
    client = redis.Redis.from_url(settings.redis.url)
    try:
        raw = client.hget(status_key(sent["notification_id"]), did)
    finally:
        client.close()
    status = orjson.loads(raw)  # type: ignore[arg-type]
    assert (status["state"], status["generation"]) == ("PROVIDER_ACCEPTED", 1)
    ch = herald_client(settings.clickhouse)
    try:
        history = ch.query(
            "SELECT generation, state, attempt FROM delivery_events FINAL"
            " WHERE delivery_id = {d:String}",
            parameters={"d": did},
        ).result_rows
        current = ch.query(
            "SELECT state FROM delivery_current WHERE delivery_id = {d:String}",
            parameters={"d": did},
        ).result_rows
    finally:
        ch.close()
    assert {(0, "SENDING", 1), (0, "FAILED_PERMANENT", 1), (1, "SENDING", 1),
            (1, "PROVIDER_ACCEPTED", 1)} <= {tuple(r) for r in history}  # fmt: skip
    assert current == [("PROVIDER_ACCEPTED",)]
