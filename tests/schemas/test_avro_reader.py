"""schemas.avro_reader: the same records as fastavro on every Herald schema, and it refuses
(raises) every record it cannot read, so that fastavro decides those."""

from __future__ import annotations

import io
import json
import random
import struct
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas import load_schema, schema_names, schema_text
from schemas.avro_reader import REFUSED, compile_reader
from schemas.serde import _parse_millis
from tests.schemas.test_avro_writer import fastavro_bytes, variants


def fastavro_record(name: str, body: bytes, millis: bool = False) -> Any:
    schema = _parse_millis(json.loads(schema_text(name))) if millis else load_schema(name)
    return schemaless_reader(io.BytesIO(body), schema, None)


@pytest.mark.parametrize("millis", [False, True])
@pytest.mark.parametrize("name", schema_names())
def test_compiled_reader_matches_fastavro(name: str, millis: bool) -> None:
    reader = compile_reader(json.loads(schema_text(name)), millis=millis)
    assert reader is not None  # every Herald schema compiles
    for rec in variants(name, random.Random(name)):
        body = fastavro_bytes(name, rec)
        got = reader(body)
        assert got == fastavro_record(name, body, millis)
        assert list(got) == [f["name"] for f in json.loads(schema_text(name))["fields"]]


@pytest.mark.parametrize("name", schema_names())
def test_every_damaged_record_is_refused_or_read_as_fastavro_reads_it(name: str) -> None:
    """Truncated, extended and bit-flipped bodies: where fastavro reads a record the compiled
    reader reads the same or refuses; where fastavro fails, it refuses too."""
    reader = compile_reader(json.loads(schema_text(name)))
    assert reader is not None
    rng = random.Random(f"damage-{name}")
    for rec in variants(name, rng)[:8]:
        body = fastavro_bytes(name, rec)
        damaged = [body[:cut] for cut in range(len(body))] + [body + b"\x00", body + b"\x81"]
        for _ in range(200):
            flipped = bytearray(body)
            flipped[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
            damaged.append(bytes(flipped))
        for bad in damaged:
            buf = io.BytesIO(bad)
            try:
                expected = schemaless_reader(buf, load_schema(name), None)
                whole = buf.tell() == len(bad)  # fastavro leaves trailing bytes unread
            except Exception:  # noqa: BLE001 - fastavro raises assorted errors on garbage
                expected, whole = None, False
            try:
                got = reader(bad)
            except REFUSED:
                continue  # fastavro decides (schemas.serde.AvroDeserializer)
            assert whole and got == expected, (name, bad)


def test_timestamps_before_1970_and_far_ahead_are_exact() -> None:
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ]}  # fmt: skip
    reader = compile_reader(schema)
    assert reader is not None
    for ms in (-1, -86_400_001, 0, 1, 1_764_960_000_123, 3_999_999_999_999, 4_000_000_000_001,
               253_402_300_799_999):  # fmt: skip
        buf = io.BytesIO()
        schemaless_writer(buf, parse_schema(schema), {"at": ms})
        body = buf.getvalue()
        assert reader(body) == schemaless_reader(io.BytesIO(body), parse_schema(schema))


def test_blocks_with_byte_sizes_and_floats_are_read() -> None:
    schema = {"type": "record", "name": "B", "fields": [
        {"name": "xs", "type": {"type": "array", "items": "double"}},
        {"name": "m", "type": {"type": "map", "values": "float"}},
        {"name": "ok", "type": "boolean"},
    ]}  # fmt: skip
    reader = compile_reader(schema)
    assert reader is not None
    # an array block written with a negative count and its size in bytes (Avro spec 1.11 §
    # "Complex Types: Arrays"), as Java writers may do: 2 doubles, 16 bytes
    body = (b"\x03" + b"\x20" + struct.pack("<dd", 1.5, -2.0) + b"\x00"
            + b"\x02" + b"\x02k" + struct.pack("<f", 0.25) + b"\x00" + b"\x01")  # fmt: skip
    assert reader(body) == {"xs": [1.5, -2.0], "m": {"k": 0.25}, "ok": True}


def test_unsupported_schemas_are_left_to_fastavro() -> None:
    assert compile_reader({"type": "record", "name": "U", "fields": [
        {"name": "u", "type": ["null", "string", "long"]}]}) is None  # fmt: skip
    enum = {"type": "enum", "name": "C", "symbols": ["A"]}
    assert compile_reader({"type": "record", "name": "E", "fields": [
        {"name": "e", "type": enum}]}) is None  # fmt: skip
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]}  # fmt: skip
    assert compile_reader(recursive) is None
    assert compile_reader({"type": "string"}) is None  # Herald frames records only
