"""Encoding of the planning jobs' outputs: `Output(topic, key, value)` -> `KafkaRecord`.

One Avro serializer per logical topic (its schema and subject from herald/topics.toml), built on
first use. Records are built by trusted code, so the serializers skip the per-record schema check
(`validate=False`, ~2x faster); a record the writer still refuses becomes an `encode_failed` dead
letter. Used as a `flat_map_batch` mapper: other items in the batch (dead-letter dicts, ready
KafkaRecords) pass through.

Shaped outputs (`Output.shape`, set by the plan job for records that differ only in their ids)
of the delivery and delivery_event schemas are spliced (dataflows/_avro_splice.py): the shared
fields are encoded once per shape and checked once against the whole record's bytes from the
serializer (a mismatch logs `encode.splice_mismatch` and that shape falls back to the
serializer); per record only the ids are encoded.

Deliveries of the `secret_types` (catalog `secret`: OTP codes, reset links) are sealed
(herald/sealing.py: address and content readable by dispatch until the delivery expires) and
never spliced.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from dataflows._avro_splice import SpliceEncoder
from herald.config import HeraldSettings
from herald.dead_letters import dead_letter
from herald.errors import SerdeError
from herald.plan_records import Output, Shape
from herald.sealing import Sealer, seal_delivery
from herald.topics import load_topics, physical_subject
from schemas import schema_text
from schemas.avro_writer import Writer
from schemas.registry import SchemaRegistry
from schemas.serde import AvroSerializer, frame
from sinks.kafka import KafkaRecord

__all__ = ["Encoder", "Splice"]

log = logging.getLogger(__name__)

DeadLetter = dict[str, Any]
# Fields that differ between records of one shape, per schema (see herald.plan_records.Output).
SPLICED = {
    "delivery": ("delivery_id", "user_id", "address"),
    "delivery_event": ("event_id", "delivery_id", "user_id"),
}
_MAX_SHAPES = 4096


class Splice(NamedTuple):
    """What encodes the records of one shape (`Encoder.splice_parts`): the body is
    `segments[0] + writers[0](record[varying[0]]) + segments[1] + ... + segments[-1]`, framed
    (the first segment starts with the wire header)."""

    topic: str  # physical
    segments: tuple[bytes, ...]
    varying: tuple[str, ...]
    writers: tuple[Writer, ...]


class _Splicer:
    """Shape -> encoded shared fields, for one schema; None marks a shape that fell back. The
    first segment starts with the wire header, so a record is one join."""

    def __init__(self, schema: str, header: bytes) -> None:
        self.encoder = SpliceEncoder(json.loads(schema_text(schema)), SPLICED[schema])
        self.header = header
        self.shapes: dict[Shape, tuple[bytes, ...] | None] = {}

    def encode(self, item: Output, fallback: Callable[[Any], bytes]) -> bytes:
        """Framed bytes of `item` (the serializer's for a new shape, which also checks it)."""
        assert item.shape is not None
        segments = self.shapes.get(item.shape, _NEW)
        if segments is _NEW:
            return self._first(item, fallback)
        if segments is None:
            return fallback(item.value)
        return self.encoder.encode(segments, item.value)

    def parts(self, item: Output, fallback: Callable[[Any], bytes]) -> tuple[bytes, ...] | None:
        """The segments of `item`'s shape (made from `item` when new); None if it fell back."""
        assert item.shape is not None
        if self.shapes.get(item.shape, _NEW) is _NEW:
            self._first(item, fallback)
        return self.shapes.get(item.shape)

    def _first(self, item: Output, fallback: Callable[[Any], bytes]) -> bytes:
        assert item.shape is not None
        data = fallback(item.value)
        body = self.encoder.segments(item.value)
        segments = (self.header + body[0], *body[1:])
        matches = self.encoder.encode(segments, item.value) == data
        if not matches:
            log.error("encode.splice_mismatch schema=%s", self.encoder.varying)
        if len(self.shapes) >= _MAX_SHAPES:
            self.shapes.clear()
        self.shapes[item.shape] = segments if matches else None
        return data


_NEW: Any = object()


class Encoder:
    """`Output` -> `KafkaRecord` (see the module docstring)."""

    def __init__(
        self,
        settings: HeraldSettings,
        registry: SchemaRegistry,
        job: str,
        secret_types: frozenset[str] = frozenset(),
    ) -> None:
        self.kafka = settings.kafka
        self.redis = settings.redis
        self.registry = registry
        self.job = job
        self.specs = load_topics()
        self._serializers: dict[str, tuple[str, Callable[[Any], bytes], _Splicer | None]] = {}
        # deliveries of these types are sealed (herald/sealing.py), never spliced
        self.secret_types = secret_types
        self._sealer: Sealer | None = None

    def _secret(self, item: Output) -> bool:
        return bool(self.secret_types) and (
            item.value.get("notification_type") in self.secret_types and "rendered" in item.value
        )

    def _sealed(self, value: dict[str, Any]) -> dict[str, Any]:
        if self._sealer is None:
            self._sealer = Sealer(self.redis.client(socket_timeout=5))
        return seal_delivery(self._sealer, value)

    def _serializer(self, logical: str) -> tuple[str, Callable[[Any], bytes], _Splicer | None]:
        found = self._serializers.get(logical)
        if found is None:
            spec = self.specs[logical]
            serializer = AvroSerializer(
                self.registry, physical_subject(spec, self.kafka), spec.schema, validate=False
            )
            splicer = None
            if spec.schema in SPLICED:
                splicer = _Splicer(spec.schema, frame(serializer.schema_id, b""))
            found = (self.kafka.topic(logical), serializer, splicer)
            self._serializers[logical] = found
        return found

    def splice_parts(self, item: Output) -> Splice | None:
        """How records of `item`'s shape are encoded: `Splice` (physical topic, the shape's
        encoded constant fields, the varying fields and their writers); None for an item
        without a shape, of a schema that does not splice, or whose shape fell back to the
        serializer (or failed to encode). Used to build records without `Output`s
        (dataflows/plan/planned_alike.py)."""
        if item.shape is None or self._secret(item):
            return None
        found = self._serializers.get(item.topic) or self._serializer(item.topic)
        topic, serialize, splicer = found
        if splicer is None:
            return None
        try:
            segments = splicer.parts(item, serialize)
        except SerdeError:
            return None
        if segments is None:
            return None
        return Splice(topic, segments, splicer.encoder.varying, splicer.encoder.writers)

    def __call__(self, batch: list[Any]) -> list[KafkaRecord | DeadLetter]:
        """Encode every Output; pass dead letters through."""
        out: list[KafkaRecord | DeadLetter] = []
        found = self._serializers
        for item in batch:
            if type(item) is not Output:
                out.append(item)
                continue
            topic, serialize, splicer = found.get(item.topic) or self._serializer(item.topic)
            try:
                if self.secret_types and self._secret(item):
                    data = serialize(self._sealed(item.value))
                elif item.shape is not None and splicer is not None:
                    data = splicer.encode(item, serialize)
                else:
                    data = serialize(item.value)
                out.append(KafkaRecord(topic, item.key, data))
            except SerdeError as exc:
                log.error("encode.failed job=%s topic=%s reason=%s", self.job, topic, exc.reason)
                out.append(
                    dead_letter(
                        source_topic=topic,
                        reason="encode_failed",
                        job=self.job,
                        key=item.key,
                        detail=f"{exc.reason}: {exc.detail}",
                        delivery_id=item.key,
                    )  # fmt: skip
                )
        return out
