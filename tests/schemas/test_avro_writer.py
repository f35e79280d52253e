"""schemas.avro_writer: byte-identical to fastavro on every Herald schema, and as strict."""

from __future__ import annotations

import io
import json
import random
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastavro import schemaless_writer

from schemas import load_schema, schema_names, schema_text
from schemas.avro_writer import compile_writer
from tests.schemas.examples import example


def fastavro_bytes(name: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, load_schema(name), record)
    return buf.getvalue()


def variants(name: str, rng: random.Random) -> list[dict[str, Any]]:
    """The example record with every nullable field nulled or set, odd strings, big numbers."""
    base = example(name)
    raw = json.loads(schema_text(name))
    out = [base]
    for _ in range(30):
        rec = dict(base)
        for field in raw["fields"]:
            ftype, value = field["type"], rec.get(field["name"])
            if isinstance(ftype, list) and rng.random() < 0.5:
                rec[field["name"]] = None
            elif ftype == "string":
                rec[field["name"]] = rng.choice(["", "ü→漢字", "x" * 300, f"id-{rng.random()}"])
            elif ftype in ("int", "long") and isinstance(value, int):
                rec[field["name"]] = rng.choice([0, -1, 63, 64, -65, 2**31 - 1])
            elif isinstance(value, datetime):
                rec[field["name"]] = value + timedelta(microseconds=rng.randrange(10**9))
        out.append(rec)
    return out


@pytest.mark.parametrize("name", schema_names())
def test_compiled_writer_matches_fastavro(name: str) -> None:
    writer = compile_writer(json.loads(schema_text(name)))  # every Herald schema compiles
    for rec in variants(name, random.Random(name)):
        assert writer(rec) == fastavro_bytes(name, rec)


def test_timestamps_accept_epoch_millis_aware_and_naive_datetimes() -> None:
    writer = compile_writer({"type": "long", "logicalType": "timestamp-millis"})
    at = datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert writer(at) == writer(-1) == writer(at.replace(tzinfo=None))


def test_unsupported_types_are_refused_up_front() -> None:
    with pytest.raises(TypeError):
        compile_writer(["null", "string", "long"])


def test_missing_fields_without_default_and_unknown_fields_raise() -> None:
    writer = compile_writer(json.loads(schema_text("delivery_event")))
    record = example("delivery_event")
    writer(record)
    with pytest.raises(KeyError, match="user_id"):
        writer({k: v for k, v in record.items() if k != "user_id"})
    with pytest.raises(ValueError, match="colour"):
        writer({**record, "colour": "red"})
    with pytest.raises((TypeError, AttributeError, struct.error)):
        writer({**record, "attempt": "one"})


def test_a_missing_field_with_a_default_takes_it() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "string"}, {"name": "b", "type": "long", "default": 7},
    ]}  # fmt: skip
    assert compile_writer(schema)({"a": "x"}) == compile_writer(schema)({"a": "x", "b": 7})


def test_an_instant_written_again_or_a_new_one_gives_its_own_bytes() -> None:
    """The writer remembers the last datetime it wrote (an event's two timestamps are one
    object): the same object again, another one, and the first again all match fastavro."""
    writer = compile_writer(json.loads(schema_text("delivery_event")))
    first = datetime(2026, 12, 5, 0, 30, 1, 123456, tzinfo=UTC)
    other = first + timedelta(milliseconds=7)
    for at in (first, first, other, first.replace(tzinfo=None), first):
        record = {**example("delivery_event"), "occurred_at": at, "recorded_at": first}
        assert writer(record) == fastavro_bytes("delivery_event", record)
