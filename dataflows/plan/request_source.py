"""The plan job's input: requests of one class, expanded into resumable 1,000-user batches.

    RequestSource(kafka, topic, ...)   items: AudienceBatch | dead-letter dict

Each Kafka partition of herald.requests.{class} is one Bytewax partition that:
1. reads records (an inner `KafkaSource` partition: assigned, no group, offset in the snapshot),
   decodes them and hands them to `admit` (catalog validation + request dedup), which returns a
   `PlanRequest`, a dead letter, or None for a duplicate;
2. turns inline user_ids into audience batches at once, and queues a segment request as an
   `Expansion` that yields one batch per call from the `AudienceStore` (keyset cursor);
3. snapshots `(next offset, pending expansions)`: an expansion carries its request, the next batch
   number and the cursor, so a restart resumes a 50M audience at its first unfinished batch (the
   batches of the last uncommitted epoch are emitted again: same delivery ids, deduplicated
   downstream). At most `MAX_PENDING` expansions are queued before reading pauses.

`fanout_batches_per_second` (> 0) paces expansions per partition.

Before each page the partition records how many users of the audience were planned so far and
reads the notification's control (herald.controls): a paused expansion waits, re-checked every
`PAUSE_RECHECK_S`, while the others go on; a cancelled one goes on too, and the planner ends
its users as SUPPRESSED `cancelled`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from dataflows.plan.audience import AudienceStore
from herald.config import KafkaSettings
from herald.controls import PAUSE_RECHECK_S, PAUSED, PlanControls
from herald.dead_letters import dead_letter
from herald.errors import SerdeError
from herald.kafka_records import KafkaMessage
from herald.planning import AudienceBatch, PlanRequest, chunk_users
from sources.kafka import KafkaPartition, KafkaSource

__all__ = ["Admit", "Expansion", "RequestSource"]

log = logging.getLogger(__name__)

MAX_PENDING = 4
JOB = "plan"

# (message, decoded record) pairs -> one result each: admitted, dead letter, or None (duplicate)
Admit = Callable[
    [Sequence[tuple[KafkaMessage, dict[str, Any]]]], list[PlanRequest | dict[str, Any] | None]
]
Item = AudienceBatch | dict[str, Any]


@dataclass(frozen=True, slots=True)
class Expansion:
    """A segment request being expanded: the next batch number and the keyset cursor."""

    request: PlanRequest
    batch_no: int = 0
    cursor: str = ""
    users: int = 0


State = tuple[int | None, tuple[Expansion, ...]]

# Audience batches read from the store in one query: a query's cost is mostly its own (a round
# trip, and the embedded ClickHouse runs one statement at a time, behind the warehouse's
# inserts during a campaign), not its rows. An expansion's first page is one batch: its users
# are planned and reach dispatch while the next page is read and planned (a 50k push
# campaign's first send: 0.63-0.83 s after its POST, three campaigns; 0.8-1.05 s before).
PAGE_BATCHES = 10


class RequestSource(FixedPartitionedSource[Item, State]):
    """See the module docstring. `audience()` builds a store per partition (on first use)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        *,
        deserializer: Callable[[bytes | None], dict[str, Any]],
        admit: Admit,
        audience: Callable[[], AudienceStore],
        controls: Callable[[], PlanControls],
        batch_size: int = 1000,
        fanout_batches_per_second: float = 0.0,
        bounded: bool = False,
    ) -> None:
        self.inner = KafkaSource(kafka, [topic], batch_size=500, stop_at_end=bounded)
        self.deserializer = deserializer
        self.admit = admit
        self.audience = audience
        self.controls = controls
        self.batch_size = batch_size
        self.pace = (
            timedelta(seconds=1 / fanout_batches_per_second)
            if fanout_batches_per_second > 0
            else None
        )

    def list_parts(self) -> list[str]:
        """One partition per Kafka partition of the topic."""
        return self.inner.list_parts()

    def build_part(
        self, step_id: str, for_part: str, resume_state: State | None
    ) -> _RequestPartition:
        """Resume at the snapshot's offset with its pending expansions."""
        offset, expansions = resume_state if resume_state is not None else (None, ())
        for exp in expansions:
            log.info(
                "plan.audience_resume notification_id=%s batch=%d users=%d",
                exp.request.notification_id, exp.batch_no, exp.users,
            )  # fmt: skip
        kafka_part = self.inner.build_part(step_id, for_part, offset)
        return _RequestPartition(self, kafka_part, list(expansions))


class _RequestPartition(StatefulSourcePartition[Item, State]):
    def __init__(
        self,
        source: RequestSource,
        kafka_part: KafkaPartition,
        expansions: list[Expansion],
    ) -> None:
        self._src = source
        self._kafka = kafka_part
        self._expansions = expansions
        self._store: AudienceStore | None = None
        self._controls: PlanControls | None = None
        self._eof = False
        self._next_expansion = datetime.now(UTC)
        self._paused_seen = 0  # paused expansions met in a row

    def next_batch(self) -> list[Item]:
        """One audience batch of the oldest expansion (when due), then new requests."""
        out: list[Item] = []
        if self._expansions and datetime.now(UTC) >= self._next_expansion:
            out.extend(self._expand())
        if len(self._expansions) < MAX_PENDING and not self._eof:
            # an idle worker may wait for records, not while an expansion is pending
            self._kafka.may_block = not self._expansions
            try:
                out.extend(self._read(list(self._kafka.next_batch())))
            except StopIteration:
                self._eof = True
        if self._eof and not self._expansions and not out:
            raise StopIteration
        return out

    def next_awake(self) -> datetime | None:
        """At the pace (or the pause re-check) while expanding, else Bytewax's default (an idle
        worker waits in the shared consumer's poll, sources/consumer.py)."""
        if self._expansions:
            paced = self._src.pace or self._next_expansion > datetime.now(UTC)
            return self._next_expansion if paced else None
        return None

    def snapshot(self) -> State:
        """(next offset, pending expansions): everything a restart needs."""
        return self._kafka.snapshot(), tuple(self._expansions)

    def close(self) -> None:
        """Close the consumer and the audience client."""
        self._kafka.close()
        if self._store is not None:
            self._store.close()

    def _read(self, messages: list[KafkaMessage]) -> list[Item]:
        out: list[Item] = []
        decoded: list[tuple[KafkaMessage, dict[str, Any]]] = []
        for msg in messages:
            try:
                decoded.append((msg, self._src.deserializer(msg.value)))
            except SerdeError as exc:
                out.append(msg.dead_letter(exc.reason, exc.detail, JOB))
        for (msg, rec), result in zip(decoded, self._src.admit(decoded), strict=True):
            if result is None:
                log.info("plan.duplicate_request offset=%d partition=%d", msg.offset, msg.partition)
            elif isinstance(result, dict):
                out.append(result)
            elif result.segment_id is not None:
                log.info("plan.audience_start notification_id=%s", result.notification_id)
                self._expansions.append(Expansion(result))
            else:
                user_ids = rec["recipients"]["user_ids"]
                out.extend(chunk_users(result, user_ids, self._src.batch_size))
        return out

    def _expand(self) -> list[Item]:
        """The next page of the oldest expansion as audience batches (`PAGE_BATCHES` batches a
        query; one for its first page, and when paced); the cursor moves past everything
        returned."""
        exp = self._expansions[0]
        if self._store is None:
            self._store = self._src.audience()
        if self._controls is None:
            self._controls = self._src.controls()
        controls, nid = self._controls, exp.request.notification_id
        if controls.planned(nid, exp.users) == PAUSED:
            return self._paused()
        self._paused_seen = 0
        assert exp.request.segment_id is not None
        size = self._src.batch_size
        one = self._src.pace is not None or exp.batch_no == 0  # paced, or its first page
        want = size if one else size * PAGE_BATCHES
        members = self._store.page(exp.request.segment_id, exp.cursor, want)
        if self._src.pace is not None:
            self._next_expansion = datetime.now(UTC) + self._src.pace
        last = len(members) < want
        chunks = [members[i : i + size] for i in range(0, len(members), size)]
        if last:
            self._expansions.pop(0)
            controls.planned(nid, exp.users + len(members), exp.users + len(members))
            log.info(
                "plan.audience_done notification_id=%s batches=%d users=%d",
                exp.request.notification_id, exp.batch_no + len(chunks),
                exp.users + len(members),
            )  # fmt: skip
            if not members and exp.batch_no == 0:
                return [_empty_segment(exp.request)]
        else:
            self._expansions[0] = replace(
                exp,
                batch_no=exp.batch_no + len(chunks),
                cursor=members[-1][0],
                users=exp.users + len(members),
            )
        out: list[Item] = []
        for i, chunk in enumerate(chunks):
            batch_no = exp.batch_no + i
            if batch_no % 100 == 0:
                log.info(
                    "plan.audience_batch notification_id=%s batch=%d users=%d",
                    exp.request.notification_id, batch_no, exp.users + i * size + len(chunk),
                )  # fmt: skip
            final = last and i == len(chunks) - 1
            out.append(AudienceBatch(exp.request, batch_no, tuple(chunk), final))
        return out

    def _paused(self) -> list[Item]:
        """The oldest expansion is paused: the next one goes first; when every pending one has
        been found paused in turn, the partition waits `PAUSE_RECHECK_S` before looking again."""
        self._expansions.append(self._expansions.pop(0))
        self._paused_seen += 1
        if self._paused_seen >= len(self._expansions):
            self._paused_seen = 0
            self._next_expansion = datetime.now(UTC) + timedelta(seconds=PAUSE_RECHECK_S)
        return []


def _empty_segment(request: PlanRequest) -> dict[str, Any]:
    topic, partition, offset = request.origin.rsplit(":", 2)
    return dead_letter(
        source_topic=topic, partition=int(partition), offset=int(offset),
        key=request.notification_id, reason="empty_segment", job=JOB,
        detail="segment has no members (unknown or empty snapshot)",
    )  # fmt: skip
