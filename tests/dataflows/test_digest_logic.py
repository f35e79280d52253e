"""The digest job's pieces without a broker: decoder, parser (sharding, dead letters), the
per-shard Bytewax logic driven directly and through Bytewax's testing runner."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from functools import partial
from io import BytesIO
from pathlib import Path
from typing import Any

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflows._settings import Clock
from dataflows.digest import SHARDS, DigestLogic, EventParser, shard_name
from dataflows.digest_decode import FIELDS, SocialEventDecoder
from herald.catalog import load_catalog
from herald.digest import to_ms
from herald.digest_shard import EventItem
from herald.errors import SerdeError
from herald.kafka_records import KafkaMessage
from schemas import load_schema, schema_text
from schemas.avro_reader import compile_reader
from schemas.registry import FileRegistry
from schemas.serde import AvroDeserializer, AvroSerializer

CATALOG = load_catalog()
T0 = datetime(2026, 3, 8, 9, 0, tzinfo=UTC)


class FakeClock(Clock):
    """A settable job clock."""

    def __init__(self, now: datetime) -> None:
        object.__setattr__(self, "at", now)

    def now(self) -> datetime:
        return self.at  # type: ignore[attr-defined,no-any-return]

    def set(self, now: datetime) -> None:
        object.__setattr__(self, "at", now)


@pytest.fixture
def registry(tmp_path: Path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def record(i: int, kind: str = "like", recipient: str = "r1", **extra: Any) -> dict[str, Any]:
    return {
        "event_id": f"e{i}", "event_type": kind, "actor_id": f"a{i}", "actor_name": f"user{i}",
        "recipient_id": recipient, "object_id": "p1", "object_type": "post",
        "occurred_at": T0, "tenant_id": "t", **extra,
    }  # fmt: skip


def message(value: bytes | None, offset: int = 0) -> KafkaMessage:
    return KafkaMessage("p.herald.social-events", 0, offset, b"r1", value)


def like(i: int, at: datetime, recipient: str = "r1") -> EventItem:
    return ((recipient, "social_like", "p1"), f"e{i}", f"a{i}", f"user{i}", to_ms(at), "t", "post")


# -- decoder --------------------------------------------------------------------------------

text = st.text(max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    strings=st.lists(text, min_size=5, max_size=5),
    optional=st.lists(st.none() | text, min_size=3, max_size=3),
    millis=st.integers(min_value=-(2**62), max_value=2**62),
)
def test_fast_path_reads_what_fastavro_writes(
    strings: list[str], optional: list[str | None], millis: int
) -> None:
    required = ("event_id", "event_type", "actor_id", "recipient_id", "tenant_id")
    rec: dict[str, Any] = dict(zip(required, strings, strict=True))
    rec.update(zip(("actor_name", "object_id", "object_type"), optional, strict=True))
    rec["occurred_at"] = millis
    buf = BytesIO()
    buf.write(b"\0\0\0\0\1")
    schemaless_writer(buf, load_schema("social_event"), rec)
    decode = compile_reader(json.loads(schema_text("social_event")), millis=True, offset=5,
                            as_tuple=True)  # fmt: skip
    assert decode is not None
    assert decode(buf.getvalue()) == tuple(rec[name] for name in FIELDS)


def test_decoder_matches_the_general_path_and_its_reasons(registry: FileRegistry) -> None:
    encode = AvroSerializer(registry, "social-events-value", "social_event")
    decode, general = SocialEventDecoder(registry), AvroDeserializer(registry, "social_event")
    data = encode(record(1, actor_name=None))
    rec = general(data)
    assert decode(data) == tuple(to_ms(rec[n]) if n == "occurred_at" else rec[n] for n in FIELDS)
    for bad, reason in [
        (None, "empty_record"),
        (b"\1" + data[1:], "bad_magic_byte"),
        (data[:-3], "truncated"),
        (data + b"\0", "schema_violation"),
        (data[:5] + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "truncated"),
        (b"\0\0\0\3\x99" + data[5:], "unknown_schema_id"),
    ]:
        with pytest.raises(SerdeError) as fast_error:
            decode(bad)
        with pytest.raises(SerdeError) as general_error:
            general(bad)
        assert fast_error.value.reason == general_error.value.reason == reason, bad


def test_another_writer_schema_is_resolved_by_the_general_path(registry: FileRegistry) -> None:
    schema = json.loads(schema_text("social_event"))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "object_type"]  # older writer
    schema_id = registry.register("social-events-value", json.dumps(schema))
    rec = record(2)
    del rec["object_type"]
    buf = BytesIO()
    buf.write(b"\0" + schema_id.to_bytes(4, "big"))
    schemaless_writer(buf, parse_schema(schema), rec)
    decoded = SocialEventDecoder(registry)(buf.getvalue())
    assert decoded[FIELDS.index("object_type")] is None and decoded[0] == "e2"
    assert decoded[FIELDS.index("occurred_at")] == to_ms(T0)


# -- parser ---------------------------------------------------------------------------------


def test_parser_groups_by_shard_and_dead_letters_bad_records(registry: FileRegistry) -> None:
    encode = AvroSerializer(registry, "social-events-value", "social_event")
    parser = EventParser(CATALOG, SocialEventDecoder(registry))
    recipients = [f"r{i}" for i in range(40)]
    batch = [message(encode(record(i, recipient=r)), i) for i, r in enumerate(recipients)]
    batch += [message(b"junk", 90), message(encode(record(91, kind="share")), 91)]
    out = parser(batch + batch[:5])  # with redeliveries
    letters = [x for x in out if isinstance(x, dict)]
    assert sorted(d["reason"] for d in letters) == ["bad_magic_byte", "unknown_event_type"]
    groups = [x for x in out if isinstance(x, tuple)]
    assert sum(len(g) for _, g in groups) == 45
    shard_of = {item[0][0]: name for name, group in groups for item in group}
    assert len({name for name, _ in groups}) == len(groups) > 1
    assert set(shard_of.values()) <= {shard_name(i) for i in range(SHARDS)}
    again = EventParser(CATALOG, SocialEventDecoder(registry))(batch[:1])  # stable across runs
    assert again[0][0] == shard_of["r0"]  # type: ignore[index]
    key, event_id, actor, name, at, tenant, otype = groups[0][1][0]
    assert key[1:] == ("social_like", "p1") and at == to_ms(T0) and otype == "post"


# -- shard logic ----------------------------------------------------------------------------


def test_digest_logic_closes_on_the_timer_and_expires_idle_state() -> None:
    clock = FakeClock(T0)
    logic = DigestLogic(CATALOG, clock, 2.0, 3600.0, None)
    out, discard = logic.on_batch([[like(i, T0) for i in range(5)], [like(1, T0)]])
    assert (out, discard) == ([], False)
    assert logic.notify_at() == T0 + timedelta(seconds=602)
    restored = DigestLogic(CATALOG, clock, 2.0, 3600.0, logic.snapshot())
    clock.set(T0 + timedelta(seconds=603))
    for state in (logic, restored):
        windows, discard = state.on_notify()
        assert [(w.total, w.events) for w in windows] == [(5, 5)] and not discard
    assert logic.notify_at() == T0 + timedelta(seconds=600 + 3600)
    clock.set(T0 + timedelta(seconds=4300))
    assert logic.on_notify() == ([], True)


def test_an_overdue_window_settles_before_it_closes() -> None:
    """A backlog (events of a window long past) read in several batches: one notification."""
    clock = FakeClock(T0 + timedelta(hours=1))
    logic = DigestLogic(CATALOG, clock, 2.0, 3600.0, None)
    for i in range(3):
        assert logic.on_batch([[like(i, T0)]]) == ([], False)
        assert logic.on_notify()[0] == []  # still settling
        clock.set(clock.now() + timedelta(seconds=1))
    clock.set(clock.now() + timedelta(seconds=2))
    assert [w.total for w in logic.on_notify()[0]] == [3]


def test_digest_logic_through_bytewax() -> None:
    clock = FakeClock(T0 + timedelta(hours=1))  # every window is already due
    items = [(shard_name(1), [like(i, T0), like(i + 10, T0, "r2")]) for i in range(3)]
    out: list[Any] = []
    flow = Dataflow("digest_logic")
    keyed = op.input("in", flow, TestingSource(items, batch_size=3))
    logic = partial(DigestLogic, CATALOG, clock, 0.0, 60.0)
    windows = op.stateful_batch("shard_windows", keyed, logic)
    op.output("out", windows, TestingSink(out))
    run_main(flow)
    totals = sorted((k, w.key.recipient_id, w.total) for k, w in out)
    assert totals == [(shard_name(1), "r1", 3), (shard_name(1), "r2", 3)]
