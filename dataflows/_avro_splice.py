"""Avro encoding for many records that share most field values (the deliveries of a campaign).

    splice = SpliceEncoder(schema, varying)
    segments = splice.segments(prototype)  every field not in `varying`, encoded once
    body = splice.encode(segments, values) the varying fields encoded between the segments

Avro's binary form of a record is the concatenation of its fields' encodings in schema order, so
the fields a campaign's deliveries share (notification, tenant, type, rendered content, expiry,
fallback...) are encoded once per request × channel × locale and only the per-user fields (ids,
address, timestamps) per record. On a delivery that is ~5x cheaper than fastavro's
schemaless_writer, which dominated planning time. tests/dataflows/test_avro_splice.py checks the
bytes against fastavro. The fields are written by `schemas.avro_writer.compile_writer` (the types it
supports are the ones a spliced schema may use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.avro_writer import Writer, compile_writer

__all__ = ["SpliceEncoder"]


class SpliceEncoder:
    """Encode records of one record schema whose fields outside `varying` repeat (module doc)."""

    def __init__(self, schema: Mapping[str, Any], varying: Sequence[str]) -> None:
        names: dict[str, Writer] = {}
        self.fields = [
            (f["name"], compile_writer(f["type"], names), f.get("default"))
            for f in schema["fields"]
        ]
        known = {name for name, _w, _d in self.fields}
        unknown = sorted(set(varying) - known)
        if unknown:
            raise ValueError(f"not fields of {schema['name']}: {unknown}")
        self.varying = tuple(name for name, _w, _d in self.fields if name in varying)
        self._plan = tuple((name, w) for name, w, _d in self.fields if name in varying)
        self.writers = tuple(w for _name, w in self._plan)  # of the varying fields, in order

    def segments(self, prototype: Mapping[str, Any]) -> tuple[bytes, ...]:
        """The encoded constant fields: one segment before, between and after the varying ones."""
        out: list[bytes] = []
        current: list[bytes] = []
        for name, writer, default in self.fields:
            if name in self.varying:
                out.append(b"".join(current))
                current = []
            else:
                current.append(writer(prototype.get(name, default)))
        out.append(b"".join(current))
        return tuple(out)

    def encode(self, segments: tuple[bytes, ...], record: Mapping[str, Any]) -> bytes:
        """The record's Avro body: `segments` interleaved with its varying fields."""
        plan = self._plan
        if len(plan) == 3:  # the plan job's records (herald.plan_records): unrolled
            (a, wa), (b, wb), (c, wc) = plan
            s0, s1, s2, s3 = segments
            return b"".join((s0, wa(record[a]), s1, wb(record[b]), s2, wc(record[c]), s3))
        parts = [segments[0]]
        append = parts.append
        for i, (name, writer) in enumerate(plan, 1):
            append(writer(record[name]))
            append(segments[i])
        return b"".join(parts)
