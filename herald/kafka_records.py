"""Kafka records as the stages hand them to each other: read by a source (sources/kafka.py),
decoded, and used downstream by dataflows and sinks (a dispatch sink dead-letters the raw
record it was given).

    KafkaMessage    one record as read: coordinates, key, value, timestamp, headers
    Decoded         a KafkaMessage with its decoded Avro value

Headers Herald sets (a record's meaning is its value; a header only lets a consumer skip work):
    herald-superseded   on a delivery event whose delivery's next event, produced after it in
                        the same batch, takes the hot status from wherever this one would
                        (herald.status_keys.supersedes); value b"<channel>/<state>" of this
                        event. Set by dispatch on SENDING events produced with their outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from herald.dead_letters import dead_letter

__all__ = ["SUPERSEDED", "Decoded", "Headers", "KafkaMessage", "superseded_header"]

SUPERSEDED = "herald-superseded"

Headers = list[tuple[str, str | bytes | None]]  # as confluent-kafka produces them


@dataclass(frozen=True, slots=True)
class KafkaMessage:
    """One record as read from Kafka. `timestamp_ms` is the record's create/log-append time."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes | None], ...] | None = None  # None: the record has none

    @property
    def timestamp(self) -> datetime | None:
        """The record timestamp as a tz-aware UTC datetime (Bytewax clocks need tz-aware)."""
        if self.timestamp_ms is None:
            return None
        return datetime.fromtimestamp(self.timestamp_ms / 1000, UTC)

    def header(self, name: str) -> bytes | None:
        """The value of header `name` (the first, if repeated); None when absent."""
        for key, value in self.headers or ():
            if key == name:
                return value
        return None

    def dead_letter(self, reason: str, detail: str, job: str, **extra: Any) -> dict[str, Any]:
        """A dead letter carrying this record's coordinates and raw bytes, unchanged."""
        return dead_letter(
            source_topic=self.topic, partition=self.partition, offset=self.offset,
            key=self.key, value=self.value, reason=reason, detail=detail, job=job, **extra,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded record: the raw message (for dead-lettering later) and its Avro value."""

    message: KafkaMessage
    value: dict[str, Any]


@cache
def superseded_header(channel: str, state: str) -> Headers:
    """The headers of a superseded delivery event (one list per pair, shared: never mutate)."""
    return [(SUPERSEDED, f"{channel}/{state}".encode())]
