"""Encoding of the planning jobs' outputs: `Output(topic, key, value)` -> `KafkaRecord`.

One Avro serializer per logical topic (its schema and subject from infra/topics.toml), built on
first use. Records are built by trusted code, so the serializers skip the per-record schema check
(`validate=False`, ~2x faster); a record fastavro still refuses becomes an `encode_failed` dead
letter. Used as a `flat_map_batch` mapper: dead-letter dicts in the batch pass through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from herald.config import HeraldSettings
from herald.errors import SerdeError
from herald.plan_records import Output
from infra.topics import load_topics, physical_subject
from schemas.registry import SchemaRegistry
from schemas.serde import AvroSerializer
from sinks.kafka import KafkaRecord, dead_letter

__all__ = ["Encoder"]

log = logging.getLogger(__name__)

DeadLetter = dict[str, Any]


class Encoder:
    """`Output` -> `KafkaRecord` (see the module docstring)."""

    def __init__(self, settings: HeraldSettings, registry: SchemaRegistry, job: str) -> None:
        self.kafka = settings.kafka
        self.registry = registry
        self.job = job
        self.specs = load_topics()
        self._serializers: dict[str, tuple[str, Callable[[Any], bytes]]] = {}

    def _serializer(self, logical: str) -> tuple[str, Callable[[Any], bytes]]:
        found = self._serializers.get(logical)
        if found is None:
            spec = self.specs[logical]
            serializer = AvroSerializer(
                self.registry, physical_subject(spec, self.kafka), spec.schema, validate=False
            )
            found = self._serializers[logical] = (self.kafka.topic(logical), serializer)
        return found

    def __call__(self, batch: list[Output | DeadLetter]) -> list[KafkaRecord | DeadLetter]:
        """Encode every Output; pass dead letters through."""
        out: list[KafkaRecord | DeadLetter] = []
        for item in batch:
            if not isinstance(item, Output):
                out.append(item)
                continue
            topic, serialize = self._serializer(item.topic)
            try:
                out.append(KafkaRecord(topic, item.key, serialize(item.value)))
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
