"""A compiled Avro binary writer: schema (JSON form) -> a function from a value to its bytes.

    write = compile_writer(json.loads(schema_text("delivery_event")))
    body = write(record)          # the Avro binary body, no framing

The schema is walked once and turned into nested closures, so a record costs one call per field
and no type dispatch: about 1.7x faster than fastavro's `schemaless_writer` on a delivery
event, byte for byte the same (tests/schemas/test_avro_writer.py checks every Herald schema).
`schemas.serde.AvroSerializer` encodes with it; `dataflows/_avro_splice.py` builds on it.

Strict like fastavro's `strict_allow_default`: a record field missing from the value is an
error unless the schema gives it a default (KeyError), and a record value with keys the schema
does not know is an error (ValueError). Wrong types raise TypeError, AttributeError or
`struct.error`. Timestamps (timestamp-millis) are aware datetimes (naive = UTC) or epoch ms.

Supported types: null, boolean, int, long, float, double, string, bytes, records, arrays, maps,
and unions of null with one other type; anything else raises `TypeError` when compiling.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["Writer", "compile_writer"]

Writer = Callable[[Any], bytes]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MISSING: Any = object()
_SMALL = [bytes([n]) for n in range(128)]


def _long(n: int) -> bytes:
    """Zig-zag varint."""
    n = (n << 1) ^ (n >> 63)
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(s: str) -> bytes:
    b = s.encode()
    n = len(b)
    return (_SMALL[n << 1] if n < 64 else _long(n)) + b  # zig-zag of a length < 64: one byte


def _bytes(b: bytes) -> bytes:
    return _long(len(b)) + b


def _millis(value: datetime | int) -> bytes:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        delta = value - _EPOCH  # same arithmetic as fastavro (no float rounding)
        value = (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000
    return _long(value)


_PRIMITIVES: dict[str, Writer] = {
    "null": lambda _v: b"",
    "boolean": lambda v: b"\x01" if v else b"\x00",
    "int": _long,
    "long": _long,
    "float": lambda v: struct.pack("<f", v),
    "double": lambda v: struct.pack("<d", v),
    "string": _string,
    "bytes": _bytes,
}


def compile_writer(schema: Any, names: dict[str, Writer] | None = None) -> Writer:
    """A writer for `schema` (JSON form, as in the .avsc); named types resolve through `names`."""
    names = {} if names is None else names
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in names:
            return names[schema]
        raise TypeError(f"unknown or unsupported type {schema!r}")
    if isinstance(schema, list):
        return _union(schema, names)
    kind = schema["type"]
    if kind == "long" and schema.get("logicalType") == "timestamp-millis":
        return _millis
    if kind == "record":
        return _record(schema, names)
    if kind == "array":
        return _sequence(compile_writer(schema["items"], names), keyed=False)
    if kind == "map":
        return _sequence(compile_writer(schema["values"], names), keyed=True)
    return compile_writer(kind, names)


def _union(branches: list[Any], names: dict[str, Writer]) -> Writer:
    if len(branches) != 2 or "null" not in branches:
        raise TypeError(f"only unions of null and one type are supported, got {branches!r}")
    index = 1 - branches.index("null")
    other = compile_writer(branches[index], names)
    tag = _long(index)
    null = _long(1 - index)
    return lambda v: null if v is None else tag + other(v)


def _record(schema: Mapping[str, Any], names: dict[str, Writer]) -> Writer:
    fields: list[tuple[str, Writer, Any]] = []
    known: set[str] = set()

    def write(record: Mapping[str, Any]) -> bytes:
        try:
            out = b"".join(
                w(record[name] if default is _MISSING else record.get(name, default))
                for name, w, default in fields
            )
        except KeyError as exc:
            raise KeyError(f"{schema['name']}.{exc.args[0]} is missing (no default)") from None
        if len(record) > len(fields) or not known.issuperset(record):
            unknown = sorted(str(k) for k in record if k not in known)
            raise ValueError(f"{schema['name']} has no fields {unknown}")
        return out

    full = (
        schema["name"]
        if "." in schema["name"]
        else f"{schema.get('namespace', '')}.{schema['name']}"
    )
    names[full.lstrip(".")] = names[schema["name"]] = write
    for field in schema["fields"]:
        default = field.get("default", _MISSING)
        fields.append((field["name"], compile_writer(field["type"], names), default))
        known.add(field["name"])
    return write


def _sequence(item: Writer, keyed: bool) -> Writer:
    def write(values: Any) -> bytes:
        if not values:
            return b"\x00"
        if keyed:
            body = b"".join(_string(k) + item(v) for k, v in values.items())
        else:
            body = b"".join(item(v) for v in values)
        return _long(len(values)) + body + b"\x00"

    return write
