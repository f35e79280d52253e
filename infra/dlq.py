"""Replay of dispatch dead letters: the same delivery, a fresh retry budget, policy re-checked.

    replay_dead_letters(settings, since=..., reasons=..., delivery_ids=..., dry_run=False)
        -> DlqReplayResult

Dispatch dead-letters a delivery when its retries are exhausted or its total deadline passed
(sinks/dispatch/records.py): the letter's value is the Avro Delivery as it stood, its
`source_topic` the deliveries topic it came from. A replay reads herald.dead-letters (every
partition, from `since` or the beginning, up to the end it had when the replay started), keeps
the letters of job `dispatch` (optionally of some reasons or deliveries) and for each:

- already replayed (marker `<prefix>dlq:replayed:{dead_letter_id}`, 30 days) → skipped, unless
  `force`;
- `expire_at` passed → not replayed, an EXPIRED delivery event instead;
- the user opted out since (the API's Redis copy of the preferences; types with
  `bypass_opt_out` excepted) → not replayed, a SUPPRESSED event with the opt-out reason;
- otherwise the delivery goes back to its deliveries topic with the **same delivery_id and
  expire_at** (and provider and remaining fallback), `attempt`, `first_attempt_at` and
  `next_attempt_at` reset: a new retry budget, the same identity, so dispatch's send guard still
  stops a copy that was in fact delivered, and receipts still join it. Its `generation` is the
  letter's + 1: the replay's events carry it, so their ids differ from the original attempts'
  (herald.ids.event_id) and ClickHouse keeps both histories, and a higher generation's state
  supersedes the original FAILED_PERMANENT in the hot status (herald.status_keys, the receipts
  job's fold) and in ClickHouse's current state (migration 0009).

Records are produced (acks=all) before the markers are set: a replay interrupted in between is
re-driven by the next run and stopped by the send guard. `herald replay` calls this for dispatch
dead letters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)

from herald.catalog import Catalog, load_catalog
from herald.config import HeraldSettings
from herald.dispatching import event, recheck
from herald.errors import DeliveryError, SerdeError
from herald.sealing import Sealer
from herald.topics import DELIVERY_EVENTS
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.dispatch.contacts import ContactStore
from sinks.dispatch.records import RecordEncoder
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.sink import redis_client
from sinks.kafka import DEAD_LETTER_TOPIC

__all__ = ["DlqReplayResult", "replay_dead_letters"]

log = logging.getLogger(__name__)

JOB = "dispatch"
EVENTS_TOPIC = DELIVERY_EVENTS
MARK_TTL_S = 30 * 86400
Progress = Callable[[int], None]


@dataclass
class DlqReplayResult:
    """What a replay did: letters `scanned`, deliveries `replayed`, the rest by reason."""

    scanned: int = 0
    replayed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    delivery_ids: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        """Count one letter not replayed."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _letters(settings: HeraldSettings, since: datetime | None) -> Iterator[bytes]:
    """Values of herald.dead-letters from `since`, each partition read to its end (EOF).

    (End of partition, not the high watermark: Tansu may report the watermark of the last
    batch's first record.) A replay produces no dead letters, so the end does not move.
    """
    topic = settings.kafka.topic(DEAD_LETTER_TOPIC)
    conf = {**settings.kafka.client_config(), "group.id": "herald-dlq-replay",
            "enable.auto.commit": False, "enable.partition.eof": True}  # fmt: skip
    consumer = Consumer(conf)
    try:
        parts = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        starts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts]
        if since is not None:
            stamp = int(since.timestamp() * 1000)
            found = consumer.offsets_for_times(
                [TopicPartition(topic, p, stamp) for p in parts], timeout=30
            )
            starts = [tp if tp.offset >= 0 else TopicPartition(topic, tp.partition, OFFSET_END)
                      for tp in found]  # fmt: skip
        consumer.assign(starts)
        open_parts = set(parts)
        while open_parts:
            for msg in consumer.consume(500, 1.0):
                err = msg.error()
                if err is None:
                    if msg.value() is not None:
                        yield msg.value()  # type: ignore[misc]
                elif err.code() == KafkaError._PARTITION_EOF:
                    open_parts.discard(msg.partition() or 0)
    finally:
        consumer.close()


class _Replayer:
    """Decides and re-drives one letter at a time; produces at the end (`finish`)."""

    def __init__(self, settings: HeraldSettings, dispatch: DispatchSettings, catalog: Catalog,
                 now: datetime, dry_run: bool, force: bool) -> None:  # fmt: skip
        registry = make_registry(settings.registry)
        self.letters = AvroDeserializer(registry, "dead_letter")
        self.deliveries = AvroDeserializer(registry, "delivery")
        self.encoder = RecordEncoder(settings, registry)
        self.kafka = settings.kafka
        self.redis = redis_client(settings.redis)
        self.contacts = ContactStore(self.redis, cluster=settings.redis.cluster)
        self.sealer = Sealer(self.redis)
        self.catalog, self.now, self.dry_run, self.force = catalog, now, dry_run, force
        self.prefix = dispatch.state_prefix
        self.producer = Producer({**settings.kafka.client_config(), "acks": "all",
                                  "enable.idempotence": True})  # fmt: skip
        self.marks: list[str] = []
        self.failed: list[str] = []

    def add(self, raw: bytes, result: DlqReplayResult, reasons: Collection[str] | None,
            ids: Collection[str] | None) -> None:  # fmt: skip
        letter = self.letters(raw)
        if letter["job"] != JOB or letter.get("value") is None:
            return
        result.scanned += 1
        if (reasons and letter["reason"] not in reasons) or (
            ids and letter.get("delivery_id") not in ids
        ):
            result.skip("filtered")
            return
        if not self.force and self.redis.exists(self._mark(letter["dead_letter_id"])):
            result.skip("already_replayed")
            return
        value, why = self.sealer.readable(letter["value"])  # herald/sealing.py
        if value is None:
            result.skip(why or "shredded")
            return
        try:
            delivery = self.deliveries(value)
        except SerdeError as exc:
            result.skip(exc.reason)
            return
        self._decide(letter, delivery, result)

    def _decide(
        self, letter: dict[str, Any], delivery: dict[str, Any], result: DlqReplayResult
    ) -> None:
        nt = self.catalog.types.get(delivery["notification_type"])
        prefs = self.contacts.preferences([delivery["user_id"]]).get(delivery["user_id"])
        skip = recheck(delivery, self.now, prefs, bool(nt and nt.bypass_opt_out))
        did = delivery["delivery_id"]
        if skip is not None:
            result.skip("expired" if skip.reason == "expired" else "opted_out")
            made = int(delivery.get("attempt") or 0)
            ev = event(
                delivery, skip.state, attempt=made, now=self.now, reason=skip.reason,
                attributes={"by": "dlq_replay"},
            )  # fmt: skip
            value = self.encoder.serializer(EVENTS_TOPIC)(ev)
            self._produce(self.kafka.topic(EVENTS_TOPIC), did, value)
        else:
            fresh = {**delivery, "attempt": 0, "first_attempt_at": None, "next_attempt_at": None,
                     "generation": int(delivery.get("generation") or 0) + 1}  # fmt: skip
            logical = f"herald.deliveries.{fresh['channel']}.{fresh['traffic_class']}"
            self._produce(letter["source_topic"], did, self.encoder.serializer(logical)(fresh))
            result.replayed += 1
            result.delivery_ids.append(did)
        self.marks.append(letter["dead_letter_id"])

    def _produce(self, topic: str, key: str, value: bytes) -> None:
        if self.dry_run:
            return

        def done(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                self.failed.append(err.name())

        self.producer.produce(topic, value, key, on_delivery=done)
        self.producer.poll(0)

    def _mark(self, dead_letter_id: str) -> str:
        return f"{self.prefix}dlq:replayed:{{{dead_letter_id}}}"

    def finish(self) -> None:
        """Wait for Kafka's acks, then remember what was replayed."""
        if self.dry_run:
            return
        if self.producer.flush(60) or self.failed:
            raise DeliveryError(f"dlq replay: records not delivered: {self.failed[:3]}")
        pipe = self.redis.pipeline(transaction=False)
        for mark in self.marks:
            pipe.set(self._mark(mark), "1", ex=MARK_TTL_S)
        pipe.execute()

    def close(self) -> None:
        self.redis.close()


def replay_dead_letters(
    settings: HeraldSettings,
    *,
    dispatch: DispatchSettings | None = None,
    since: datetime | None = None,
    reasons: Collection[str] | None = None,
    delivery_ids: Collection[str] | None = None,
    dry_run: bool = False,
    force: bool = False,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> DlqReplayResult:
    """Re-drive dispatch's dead letters (see the module docstring); returns what was done."""
    dispatch = dispatch or DispatchSettings()
    catalog = load_catalog(dispatch.catalog_path)
    replayer = _Replayer(settings, dispatch, catalog, now or datetime.now(UTC), dry_run, force)
    result = DlqReplayResult()
    try:
        for raw in _letters(settings, since):
            replayer.add(raw, result, reasons, delivery_ids)
            if progress is not None:
                progress(result.scanned)
        replayer.finish()
    finally:
        replayer.close()
    log.info("dlq.replayed scanned=%d replayed=%d skipped=%s dry_run=%s",
             result.scanned, result.replayed, result.skipped, dry_run)  # fmt: skip
    return result
