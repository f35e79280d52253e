"""A compiled Avro binary reader: schema (JSON form) -> a function from framed bytes to a record.

    read = compile_reader(json.loads(schema_text("delivery_event")))   # None: not supported
    record = read(body)        # the Avro binary body; `offset=5` skips a framing header

The pair of schemas/avro_writer.py. The schema is walked once into one generated function of
straight-line code (records and unions inline, a loop per array or map), so there is no type
dispatch per value. `schemas.serde.AvroDeserializer` reads with it when a record was written
with exactly the schema it reads (the normal case), and with fastavro otherwise; fastavro is
also the judge of any record this code cannot read: the reader raises one of `REFUSED`
(`IndexError`, `ValueError`, `UnicodeDecodeError`, `struct.error`, `OverflowError`) on a
truncated body, a bad union index, a negative length, an over-long varint, bad UTF-8 or
trailing bytes, and the deserializer then asks fastavro, whose error (or answer) stands. The
same records as fastavro's `schemaless_reader` (tests/schemas/test_avro_reader.py: every Herald
schema, varied and damaged records), and faster: `python -m bench.serde` measures both in one
run (a delivery ~14 µs with fastavro, ~9 with this; a delivery event ~9.5 and ~7).

Timestamps (timestamp-millis) come back as aware UTC datetimes, or with `millis=True` as the
epoch milliseconds on the wire; `as_tuple=True` returns the field values in order instead of a
dict (the digest job's social events, dataflows/digest_decode.py). Supported types: null,
boolean, int, long, float, double, string, bytes, records (named ones referenced again by name
too), arrays, maps, and unions of null with one other type; for any other schema
`compile_reader` returns None.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["REFUSED", "Reader", "compile_reader", "read_long"]

Reader = Callable[[bytes], Any]  # a record dict (a tuple of its values with `as_tuple`)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# What a reader raises on a record it cannot read (UnicodeDecodeError is a ValueError; a
# timestamp out of datetime's range is an OverflowError).
REFUSED = (IndexError, ValueError, struct.error, OverflowError)
# Below this (year 2096) a float division is exact to the millisecond and twice as fast.
_FLOAT_EXACT_MS = 4_000_000_000_000


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint at `pos`: (value, next position). IndexError when the data ends,
    ValueError past 10 bytes."""
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _timestamp(ms: int) -> datetime:
    if 0 <= ms < _FLOAT_EXACT_MS:
        return datetime.fromtimestamp(ms / 1000, UTC)
    return _EPOCH + timedelta(milliseconds=ms)


def _length(target: str) -> list[str]:
    """A non-negative length (string, bytes) into `target`: one byte inline, else a varint."""
    return [
        "b = data[pos]",
        "if b < 0x80:",
        f"    {target} = b >> 1; pos += 1",
        "    if b & 1: raise ValueError('negative length')",
        "else:",
        f"    {target}, pos = read_long(data, pos)",
        f"    if {target} < 0: raise ValueError('negative length')",
    ]


_PRIMITIVE = {"null", "boolean", "int", "long", "float", "double", "string", "bytes"}


class _Compiler:
    def __init__(self, millis: bool) -> None:
        self.millis = millis
        self.named: dict[str, Any] = {}
        self.visiting: set[str] = set()
        self.count = 0

    def var(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def read(self, schema: Any, target: str, namespace: str = "") -> list[str] | None:
        """Lines reading one value of `schema` into `target` (None: not supported)."""
        if isinstance(schema, str):
            if schema in _PRIMITIVE:
                return self._primitive(schema, target)
            name = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            found = self.named.get(name, self.named.get(schema))
            return None if found is None else self._record(found, target, namespace)
        if isinstance(schema, list):
            return self._union(schema, target, namespace)
        if not isinstance(schema, dict):
            return None
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if kind == "long" and logical == "timestamp-millis":
            lines = [f"{target}, pos = read_long(data, pos)"]
            return lines if self.millis else [*lines, f"{target} = _timestamp({target})"]
        if kind in _PRIMITIVE and logical is None:
            return self._primitive(kind, target)
        if kind == "record":
            return self._record(schema, target, namespace)
        if kind in ("array", "map"):
            return self._block(schema, target, namespace)
        return None

    @staticmethod
    def _primitive(kind: str, target: str) -> list[str]:
        if kind == "null":
            return [f"{target} = None"]
        if kind == "boolean":
            return ["b = data[pos]; pos += 1", "if b > 1: raise ValueError('not a boolean')",
                    f"{target} = b == 1"]  # fmt: skip
        if kind in ("int", "long"):
            return ["b = data[pos]", "if b < 0x80:",
                    f"    {target} = (b >> 1) ^ -(b & 1); pos += 1",
                    "else:", f"    {target}, pos = read_long(data, pos)"]  # fmt: skip
        if kind in ("float", "double"):
            size, code = (4, "<f") if kind == "float" else (8, "<d")
            return [f"({target},) = unpack_from({code!r}, data, pos); pos += {size}"]
        decode = ".decode()" if kind == "string" else ""
        return [*_length("n"), "end = pos + n", "if end > size: raise IndexError('body ends')",
                f"{target} = data[pos:end]{decode}; pos = end"]  # fmt: skip

    def _union(self, branches: list[Any], target: str, namespace: str) -> list[str] | None:
        if len(branches) != 2 or branches[0] != "null" or branches[1] == "null":
            return None
        inner = self.read(branches[1], target, namespace)
        if inner is None:
            return None
        return ["b = data[pos]; pos += 1", "if b == 0:", f"    {target} = None", "elif b == 2:",
                *("    " + line for line in inner), "else:",
                "    raise ValueError('bad union index')"]  # fmt: skip

    def _record(
        self, schema: dict[str, Any], target: str, namespace: str, as_tuple: bool = False
    ) -> list[str] | None:
        name = schema.get("name", "")
        space = schema.get("namespace", namespace)
        full = name if "." in name or not space else f"{space}.{name}"
        if full in self.visiting:
            return None  # a recursive type: fastavro reads it
        self.named[full] = schema
        self.visiting.add(full)
        lines: list[str] = []
        values: list[tuple[str, str]] = []  # (field name, variable)
        for field in schema.get("fields", ()):
            value = self.var()
            code = self.read(field["type"], value, space)
            if code is None:
                return None
            lines += code
            values.append((field["name"], value))
        self.visiting.discard(full)
        if as_tuple:
            return [*lines, f"{target} = ({''.join(f'{v}, ' for _, v in values)})"]
        return [*lines, f"{target} = {{{', '.join(f'{n!r}: {v}' for n, v in values)}}}"]

    def _block(self, schema: dict[str, Any], target: str, namespace: str) -> list[str] | None:
        is_map = schema["type"] == "map"
        count, key, item = self.var(), self.var(), self.var()
        inner = self.read(schema["values"] if is_map else schema["items"], item, namespace)
        if inner is None:
            return None
        body = [*self._primitive("string", key), *inner] if is_map else inner
        store = f"{target}[{key}] = {item}" if is_map else f"{target}.append({item})"
        return [
            f"{target} = {{}}" if is_map else f"{target} = []",
            "while True:",
            f"    {count}, pos = read_long(data, pos)",
            f"    if {count} == 0: break",
            f"    if {count} < 0:",  # a block with its size in bytes after the count
            f"        {count} = -{count}; _, pos = read_long(data, pos)",
            f"    for _ in range({count}):",
            *("        " + line for line in [*body, store]),
        ]


def compile_reader(
    schema: dict[str, Any], *, millis: bool = False, offset: int = 0, as_tuple: bool = False
) -> Reader | None:
    """A reader of records of `schema` starting `offset` bytes into the data (see the module
    docstring), or None when the schema uses a type this module does not read. `as_tuple`:
    the record's field values in field order instead of a dict (nested records stay dicts)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    body = _Compiler(millis)._record(schema, "record", "", as_tuple=as_tuple)
    if body is None:
        return None
    lines = [
        "def read(data):",
        "    size = len(data)",
        f"    pos = {int(offset)}",
        *("    " + line for line in body),
        "    if pos != size: raise ValueError('bytes after the record')",
        "    return record",
    ]
    namespace: dict[str, Any] = {
        "read_long": read_long, "_timestamp": _timestamp, "unpack_from": struct.unpack_from,
    }  # fmt: skip
    exec("\n".join(lines), namespace)  # noqa: S102 - code generated from a schema, not from data
    reader: Reader = namespace["read"]
    return reader
