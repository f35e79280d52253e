"""Confluent-framed Avro serde: round trips, schema resolution, and every SerdeError reason."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.validation import validate

import schemas
from herald.errors import RegistryError, SerdeError
from schemas.registry import FileRegistry
from schemas.serde import (
    AvroDeserializer,
    AvroSerializer,
    compile_validator,
    frame,
    parse_header,
)
from tests.schemas.examples import NOW, example


@pytest.fixture
def registry(tmp_path: Path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def _reason(fn: Any, arg: Any) -> str:
    with pytest.raises(SerdeError) as info:
        fn(arg)
    return info.value.reason


@pytest.mark.parametrize("name", schemas.schema_names())
def test_round_trip_every_schema(registry: FileRegistry, name: str) -> None:
    ser = AvroSerializer(registry, f"{name}-value", name)
    data = ser(example(name))
    assert data[0] == 0
    assert parse_header(data) == ser.schema_id == 1
    assert AvroDeserializer(registry)(data) == example(name)
    assert AvroDeserializer(registry, name)(data) == example(name)


def test_timestamps_decode_as_utc_datetimes_and_accept_epoch_millis(
    registry: FileRegistry,
) -> None:
    record = example("social_event")
    record["occurred_at"] = int(NOW.timestamp() * 1000)
    out = AvroDeserializer(registry)(AvroSerializer(registry, "s", "social_event")(record))
    assert out["occurred_at"] == NOW
    assert out["occurred_at"].tzinfo is not None


def test_timestamps_as_millis_round_trip_through_the_serializer(registry: FileRegistry) -> None:
    """The dispatch job's decoding: epoch ms on every timestamp, the rest unchanged, and the
    record encodes back to the same bytes (retries and dead letters are written from it)."""
    ser = AvroSerializer(registry, "d", "delivery")
    record = example("delivery")
    data = ser(record)
    fast = AvroDeserializer(registry, "delivery", timestamps="millis")(data)
    slow = AvroDeserializer(registry, "delivery")(data)
    stamps = [k for k, v in slow.items() if isinstance(v, datetime)]
    assert stamps and all(fast[k] == int(slow[k].timestamp() * 1000) for k in stamps)
    assert {k: v for k, v in fast.items() if k not in stamps} == {
        k: v for k, v in slow.items() if k not in stamps
    }
    assert ser(fast) == data


def test_defaults_fill_omitted_optional_fields(registry: FileRegistry) -> None:
    record = example("delivery")
    for optional in ("provider", "platform", "collapse_key", "attempt", "fallback", "expire_at"):
        del record[optional]
    out = AvroDeserializer(registry)(AvroSerializer(registry, "d", "delivery")(record))
    assert out["attempt"] == 0 and out["fallback"] == [] and out["expire_at"] is None


def test_registration_is_lazy_and_once(registry: FileRegistry) -> None:
    ser = AvroSerializer(registry, "d-value", "delivery")
    assert not (registry.path / FileRegistry.STATE_FILE).exists()
    ser(example("delivery"))
    ser(example("delivery"))
    assert registry.subject_versions("d-value") == [1]


def test_reader_schema_resolution_from_an_older_writer(registry: FileRegistry) -> None:
    """A record written with an older version (fewer fields) is read with today's defaults."""
    current = json.loads(schemas.schema_text("social_event"))
    old = dict(current, fields=[f for f in current["fields"] if f["name"] != "actor_name"])
    old_id = registry.register("social-value", json.dumps(old))
    record = example("social_event")
    del record["actor_name"]
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(old, named_schemas={}), record)
    data = frame(old_id, buf.getvalue())
    assert "actor_name" not in AvroDeserializer(registry)(data)
    resolved = AvroDeserializer(registry, "social_event")(data)
    assert resolved["actor_name"] is None
    assert resolved["event_id"] == "e-1"


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda r: r.pop("user_id"), "user_id: missing required field"),
        (lambda r: r.update(template_version="3"), "template_version: expected int, got str"),
        (lambda r: r.update(template_version=1.5), "template_version: expected int"),
        (lambda r: r.update(attempt=True), "attempt: expected int, got bool"),
        (lambda r: r.update(user_id=None), "user_id: expected string"),
        (lambda r: r.update(expire_at="tomorrow"), "expire_at: expected null | timestamp"),
        (lambda r: r.update(fallback=[1]), "fallback: expected array<string>"),
        (lambda r: r["rendered"].pop("body"), "rendered.body: missing required field"),
        (lambda r: r["rendered"]["data"].update(n=1), "rendered.data: expected map<string>"),
        (lambda r: r.update(surprise="x"), "unknown field(s) surprise"),
    ],
)
def test_encoding_a_violating_record_raises_schema_violation(
    registry: FileRegistry, mutate: Any, where: str
) -> None:
    record = example("delivery")
    mutate(record)
    with pytest.raises(SerdeError) as info:
        AvroSerializer(registry, "d", "delivery")(record)
    assert info.value.reason == "schema_violation"
    assert where in info.value.detail


def test_violation_detail_never_contains_values(registry: FileRegistry) -> None:
    record = example("delivery")
    record["rendered"]["body"] = 123456  # e.g. an OTP code put in the wrong place
    record["address"] = 41791234567
    with pytest.raises(SerdeError) as info:
        AvroSerializer(registry, "d", "delivery")(record)
    assert "123456" not in str(info.value) and "41791234567" not in str(info.value)


@pytest.mark.parametrize("bad", [None, "not a record", ["list"]])
def test_encoding_a_non_record_raises_schema_violation(registry: FileRegistry, bad: Any) -> None:
    assert _reason(AvroSerializer(registry, "d", "delivery"), bad) == "schema_violation"


def test_unvalidated_serializer_still_rejects_missing_fields(registry: FileRegistry) -> None:
    ser = AvroSerializer(registry, "d", "delivery", validate=False)
    record = example("delivery")
    del record["user_id"]
    assert _reason(ser, record) == "schema_violation"
    assert _reason(ser, dict(example("delivery"), user_id=5)) == "schema_violation"


def test_every_decode_reason(registry: FileRegistry) -> None:
    good = AvroSerializer(registry, "d", "delivery")(example("delivery"))
    de = AvroDeserializer(registry, "delivery")
    assert _reason(de, None) == "empty_record"
    assert _reason(de, b"") == "empty_record"
    assert _reason(de, b"\x01" + good[1:]) == "bad_magic_byte"
    assert _reason(de, b"{") == "bad_magic_byte"  # JSON where Avro was expected
    assert _reason(de, good[:3]) == "truncated"
    assert _reason(de, good[:-4]) == "truncated"
    assert _reason(de, frame(999, good[5:])) == "unknown_schema_id"
    assert _reason(de, good + b"\x00\x00") == "schema_violation"  # trailing garbage
    # a valid header, then a string whose bytes are not UTF-8
    invalid_utf8 = frame(1, b"\x04\xff\xfe" + good[5 + 1 + len("d-1") :])
    assert _reason(de, invalid_utf8) == "schema_violation"
    with pytest.raises(SerdeError) as info:
        de(invalid_utf8)
    assert "\\xff" not in info.value.detail and "UTF-8" in info.value.detail
    assert de(good) == example("delivery")  # and the good record still decodes


def test_record_written_with_another_schema_does_not_decode_as_this_one(
    registry: FileRegistry,
) -> None:
    """A record from the wrong topic cannot be resolved to the reader schema."""
    social = AvroSerializer(registry, "s", "social_event")(example("social_event"))
    with pytest.raises(SerdeError) as info:
        AvroDeserializer(registry, "delivery")(social)
    assert info.value.reason == "schema_violation"
    assert info.value.detail == (
        "schema id 1: writer herald.SocialEvent cannot be read as herald.Delivery"
    )


def test_registry_outage_is_not_a_bad_record(tmp_path: Path) -> None:
    class Down:
        def register(self, subject: str, schema_text: str) -> int:
            raise RegistryError("down")

        def get_schema(self, schema_id: int) -> str:
            raise RegistryError("down")

    with pytest.raises(RegistryError):
        AvroSerializer(Down(), "d", "delivery")(example("delivery"))
    with pytest.raises(RegistryError) as info:
        AvroDeserializer(Down())(frame(1, b"\x00"))
    assert not isinstance(info.value, SerdeError)


def test_writer_schemas_are_fetched_once_per_id(registry: FileRegistry) -> None:
    calls: list[int] = []

    class Counting:
        def register(self, subject: str, schema_text: str) -> int:
            return registry.register(subject, schema_text)

        def get_schema(self, schema_id: int) -> str:
            calls.append(schema_id)
            return registry.get_schema(schema_id)

    data = AvroSerializer(Counting(), "d", "delivery")(example("delivery"))
    de = AvroDeserializer(Counting(), "delivery")
    for _ in range(100):
        de(data)
    assert calls == [1]


_PROBES: list[Any] = [
    None, 0, -1, 2**31, 2**40, 2**70, 1.5, True, False, "s", b"b", bytearray(b"b"), [], {},
    ["s"], [1], [None], {"k": "v"}, {"k": 1}, {1: "v"}, ("s",), NOW, NOW.date(),
]  # fmt: skip


_MISSING = object()


def _paths(record: dict[str, Any], prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    for key, value in record.items():
        yield (*prefix, key)
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            yield from _paths(value, (*prefix, key))
        if isinstance(value, list) and value and isinstance(value[0], dict):
            yield from _paths(value[0], (*prefix, key, 0))


def _fastavro_accepts(record: Any, schema: Any) -> bool:
    try:
        return bool(validate(record, schema, raise_errors=False))
    except Exception:
        return False


@pytest.mark.parametrize("name", schemas.schema_names())
def test_compiled_validator_is_at_least_as_strict_as_fastavro(name: str) -> None:
    """Differential test: every probe fastavro's validator rejects, the compiled one rejects;
    it only rejects more where a record has unknown fields (fastavro's validator ignores them)
    or an array is not a list."""
    schema = schemas.load_schema(name)
    check = compile_validator(schema)
    assert check(example(name))
    for path in _paths(example(name)):
        for probe in [*_PROBES, _MISSING]:
            record = copy.deepcopy(example(name))
            parent = record
            for step in path[:-1]:
                parent = parent[step]
            if probe is _MISSING:
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(probe)
            ours, theirs = check(record), _fastavro_accepts(record, schema)
            if theirs and not ours:
                assert isinstance(probe, (dict, tuple)), (path, probe)
            else:
                assert ours == theirs, (path, probe)
