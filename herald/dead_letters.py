"""Dead letters: the record every job writes for input it cannot process (schemas/dead_letter.avsc).

    dead_letter(source_topic=..., reason=..., detail=..., job=..., ...) -> dead_letter dict

Built here, below every job and source, so a Kafka source (sources/kafka.py), the sinks and the
dataflows make them the same way; sinks/kafka.py seals and publishes them to
herald.dead-letters.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

__all__ = ["DETAIL_MAX", "dead_letter"]

DETAIL_MAX = 500  # characters of `detail` kept


def dead_letter(
    *,
    source_topic: str,
    reason: str,
    detail: str,
    job: str,
    partition: int = -1,
    offset: int = -1,
    key: bytes | str | None = None,
    value: bytes | None = None,
    attempts: int = 1,
    delivery_id: str | None = None,
    expire_at: datetime | None = None,
    failed_at: datetime | None = None,
) -> dict[str, Any]:
    """A `dead_letter` record (schemas/dead_letter.avsc).

    `dead_letter_id` is deterministic when the Kafka coordinates are known (so a re-processed
    record yields the same dead letter), random otherwise. `detail` is truncated; callers must
    keep message bodies, OTP codes and phone numbers out of it.
    """
    if partition >= 0:
        dead_letter_id = f"{job}:{source_topic}:{partition}:{offset}"
    else:
        dead_letter_id = f"{job}:{uuid.uuid4().hex}"
    return {
        "dead_letter_id": dead_letter_id,
        "source_topic": source_topic,
        "partition": partition,
        "offset": offset,
        "key": key.encode() if isinstance(key, str) else key,
        "value": value,
        "reason": reason,
        "detail": detail[:DETAIL_MAX],
        "job": job,
        "failed_at": failed_at or datetime.now(UTC),
        "attempts": attempts,
        "delivery_id": delivery_id,
        "expire_at": expire_at,
    }
