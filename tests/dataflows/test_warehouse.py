"""The warehouse job against real Kafka, ClickHouse and a registry served over HTTP: Kafka's
Avro bytes loaded by ClickHouse itself, and what it cannot load decoded here or dead-lettered."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from bytewax.testing import run_main

from dataflows.warehouse import build_flow, registry_url
from herald import ids
from herald.clickhouse import herald_client
from herald.config import HeraldSettings, RegistrySettings
from schemas.registry import FileRegistry
from schemas.registry_server import create_app
from tests.api.conftest import serve
from tests.dataflows.helpers import consume, decoder, encoder, produce

pytestmark = pytest.mark.integration

EVENTS = "herald.delivery-events"


@pytest.fixture
def served(settings: HeraldSettings) -> Iterator[HeraldSettings]:
    """`settings` with its registry reached over HTTP (as `herald up` and production run)."""
    for url in serve(create_app(FileRegistry(settings.registry.path))):
        registry = RegistrySettings(url=url, path=settings.registry.path)
        yield settings.model_copy(update={"registry": registry})


def _events(settings: HeraldSettings, n: int) -> list[dict]:
    p, now = settings.kafka.topic_prefix, datetime.now(UTC).replace(microsecond=0)
    out = []
    for i in range(n):
        delivery = f"{p}d-{i}"
        out.append({
            "event_id": ids.event_id(delivery, "PROVIDER_ACCEPTED", 1), "delivery_id": delivery,
            "notification_id": f"{p}n", "user_id": f"u-{i}", "tenant_id": f"{p}tenant",
            "notification_type": "marketing_campaign", "channel": "push",
            "traffic_class": "bulk", "state": "PROVIDER_ACCEPTED", "reason": None,
            "provider": "apns", "provider_msg_id": f"m-{i}", "attempt": 1, "latency_ms": i,
            "occurred_at": now, "recorded_at": now, "attributes": {"http_status": "200"},
            "generation": 0, "traceparent": None,
        })  # fmt: skip
    return out


def _loaded(settings: HeraldSettings) -> list[tuple]:
    client = herald_client(settings.clickhouse)
    try:
        return [tuple(r) for r in client.query(
            "SELECT delivery_id, state, provider, provider_msg_id, latency_ms, attributes,"
            " occurred_at FROM delivery_events FINAL WHERE tenant_id = {t:String}"
            " ORDER BY latency_ms",
            parameters={"t": f"{settings.kafka.topic_prefix}tenant"},
        ).result_rows]  # fmt: skip
    finally:
        client.close()


def _run(settings: HeraldSettings) -> None:
    run_main(build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))


def test_clickhouse_loads_the_records_as_kafka_holds_them(
    served: HeraldSettings, caplog: pytest.LogCaptureFixture
) -> None:
    events = _events(served, 50)
    enc = encoder(served, EVENTS)
    produce(served, EVENTS, [(e["delivery_id"].encode(), enc(e)) for e in events])
    with caplog.at_level(logging.WARNING, logger="dataflows.warehouse"):
        _run(served)
    assert "warehouse.avro_refused" not in caplog.text  # ClickHouse decoded every record
    rows = _loaded(served)
    assert [r[0] for r in rows] == [e["delivery_id"] for e in events]
    first = rows[0]
    assert first[1:6] == ("PROVIDER_ACCEPTED", "apns", "m-0", 0, {"http_status": "200"})
    assert first[6].replace(tzinfo=UTC) == events[0]["occurred_at"]


def test_what_clickhouse_refuses_is_decoded_here_and_the_rest_dead_lettered(
    served: HeraldSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """One record that is not Avro at all (dead-lettered unread), one framed record whose body
    ends early (ClickHouse refuses the batch: decoded here, dead-lettered), the rest loaded."""
    events = _events(served, 10)
    enc = encoder(served, EVENTS)
    good = [(e["delivery_id"].encode(), enc(e)) for e in events]
    truncated = (b"cut", enc(events[0])[:12])
    produce(served, EVENTS, [*good[:5], (b"junk", b"not avro"), *good[5:], truncated])
    with caplog.at_level(logging.WARNING, logger="dataflows.warehouse"):
        _run(served)
    assert "warehouse.avro_refused" in caplog.text
    assert [r[0] for r in _loaded(served)] == [e["delivery_id"] for e in events]
    decode = decoder(served)
    letters = [decode(v) for _k, v in consume(served, "herald.dead-letters")]
    assert sorted((x["key"], x["reason"]) for x in letters) == [
        (b"cut", "truncated"), (b"junk", "bad_magic_byte")
    ]  # fmt: skip


def test_without_a_registry_url_the_records_are_decoded_here(settings: HeraldSettings) -> None:
    events = _events(settings, 5)
    enc = encoder(settings, EVENTS)
    produce(settings, EVENTS, [(e["delivery_id"].encode(), enc(e)) for e in events])
    _run(settings)
    assert [r[0] for r in _loaded(settings)] == [e["delivery_id"] for e in events]
    assert registry_url(settings.registry) is None


def test_the_registry_url_carries_its_credentials() -> None:
    settings = RegistrySettings(url="https://reg.example:8081/x", basic_auth_user_info="k:p@ss")
    assert registry_url(settings) == "https://k:p%40ss@reg.example:8081/x"
