"""The state of one delivery inside a dispatch batch, and what the batch produces.

`Item` is created per delivery read (or per redelivered record) and mutated as the batch goes
through its stages; `Outputs` collects what the sink must write: delivery events, records for
the retry topic, dead letters, device-token cleanups and dead addresses to disable, and the
deliveries of a cross-channel fallback (herald.fallback). Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from herald.breaker import Admission
from herald.dispatching import GuardOp
from herald.guard import Proceed
from herald.kafka_records import KafkaMessage
from herald.retry import RetryPolicy

__all__ = ["DeadLetterOut", "Item", "Outputs"]


@dataclass
class Item:
    """One delivery in flight through a batch.

    `attempt` is the number of the attempt about to be made (`Delivery.attempt + 1` at first,
    + 1 per failover); `first_attempt_at` is set by the first provider call of its life.
    `guard_op` is what to do with its guard once the batch's calls are over.
    """

    delivery: dict[str, Any]
    message: KafkaMessage | None
    provider: str
    policy: RetryPolicy
    bypass_opt_out: bool
    attempt: int
    first_attempt_at: datetime | None = None
    guard: Proceed | None = None
    admission: Admission | None = None
    rejected_by: set[str] = field(default_factory=set)
    guard_op: GuardOp = "keep"
    sent_marker: str = ""

    @property
    def delivery_id(self) -> str:
        """The delivery's id (guard key, Kafka key, event ids)."""
        return str(self.delivery["delivery_id"])

    @property
    def traffic_class(self) -> str:
        """transactional | normal | bulk."""
        return str(self.delivery["traffic_class"])


@dataclass(frozen=True, slots=True)
class DeadLetterOut:
    """A delivery given up on: its current record (the dead letter's value) and why."""

    message: KafkaMessage | None
    record: dict[str, Any]
    reason: str


@dataclass
class Outputs:
    """What one batch produces, in order of decision."""

    events: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[DeadLetterOut] = field(default_factory=list)
    cleanups: list[tuple[str, str]] = field(default_factory=list)  # (user_id, token)
    disables: list[tuple[str, str, str]] = field(default_factory=list)  # (user, channel, address)
    deliveries: list[dict[str, Any]] = field(default_factory=list)  # fallback deliveries
    # accepted deliveries with a cross-channel fallback step: kept for a late failure
    watched: list[dict[str, Any]] = field(default_factory=list)
    # deliveries of paused notifications, parked until resumed (herald.controls)
    parked: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Outputs) -> None:
        """Append everything `other` collected."""
        self.events.extend(other.events)
        self.retries.extend(other.retries)
        self.dead_letters.extend(other.dead_letters)
        self.cleanups.extend(other.cleanups)
        self.disables.extend(other.disables)
        self.deliveries.extend(other.deliveries)
        self.watched.extend(other.watched)
        self.parked.extend(other.parked)
