"""A batch's `Outputs` as Kafka records (Avro, Confluent framing).

    delivery events   herald.delivery-events        key delivery_id
    retries           herald.retry.{class}          key delivery_id (the retry job holds them);
                                                    address and content sealed until expiry
    dead letters      herald.dead-letters           key source topic; value = the delivery as
                                                    it stood (Avro Delivery), sealed until it
                                                    expires (herald/sealing.py), replayable by
                                                    infra.dlq with its delivery_id, expire_at
    device changes    herald.devices                key user_id (token cleanup, dead address)
    fallbacks         herald.deliveries.{channel}.{class}   key delivery_id (herald.fallback)

Records are built by trusted code, so serializers skip the per-record schema check; one that
fastavro still refuses (a bug) becomes an `encode_failed` dead letter, never a lost record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from herald.config import HeraldSettings
from herald.dead_letters import dead_letter
from herald.errors import SerdeError
from herald.kafka_records import superseded_header
from herald.sealing import seal_delivery
from herald.status_keys import supersedes
from herald.topics import DELIVERY_EVENTS, DEVICES, load_topics, physical_subject
from schemas.registry import SchemaRegistry
from schemas.serde import AvroSerializer
from sinks.dispatch.work import DeadLetterOut, Outputs
from sinks.kafka import DEAD_LETTER_TOPIC, DeadLetterSealer, KafkaRecord

__all__ = ["JOB", "RecordEncoder", "deliveries_topic", "retry_topic"]

log = logging.getLogger(__name__)

JOB = "dispatch"
EVENTS_TOPIC = DELIVERY_EVENTS
DEVICES_TOPIC = DEVICES


def deliveries_topic(channel: str, traffic_class: str) -> str:
    """Logical topic of ready deliveries of a channel and class."""
    return f"herald.deliveries.{channel}.{traffic_class}"


def retry_topic(traffic_class: str) -> str:
    """Logical retry topic of a class."""
    return f"herald.retry.{traffic_class}"


class RecordEncoder:
    """Encodes `Outputs`; one serializer per logical topic, built on first use."""

    def __init__(
        self,
        settings: HeraldSettings,
        registry: SchemaRegistry,
        secret_types: frozenset[str] = frozenset(),
    ) -> None:
        self.kafka = settings.kafka
        self.registry = registry
        self.specs = load_topics()
        self.seal = DeadLetterSealer(settings)  # a letter's value, until its message expires
        # deliveries and retries of these types leave sealed again (herald/sealing.py)
        self.secret_types = secret_types
        self._serializers: dict[str, Callable[[Mapping[str, Any]], bytes]] = {}
        self.events_topic = self.kafka.topic(EVENTS_TOPIC)

    def serializer(self, logical: str) -> Callable[[Mapping[str, Any]], bytes]:
        """The (unvalidated) serializer of a logical topic."""
        found = self._serializers.get(logical)
        if found is None:
            spec = self.specs[logical]
            subject = physical_subject(spec, self.kafka)
            found = AvroSerializer(self.registry, subject, spec.schema, validate=False)
            self._serializers[logical] = found
        return found

    def encode(self, out: Outputs) -> list[KafkaRecord]:
        """Every record of `out`: events, retries, fallback deliveries, dead letters."""
        records = [self._one(EVENTS_TOPIC, ev["delivery_id"], ev) for ev in out.events]
        self._label_superseded(out.events, records)
        for rec in out.deliveries:
            topic = deliveries_topic(rec["channel"], rec["traffic_class"])
            records.append(self._one(topic, rec["delivery_id"], self.kept(rec)))
        for rec in out.retries:
            topic = retry_topic(rec["traffic_class"])
            records.append(self._one(topic, rec["delivery_id"], self.kept(rec, always=True)))
        for letter in out.dead_letters:
            records.append(self._dead(letter))
        return records

    def _label_superseded(self, events: list[dict[str, Any]], records: list[KafkaRecord]) -> None:
        """Mark each event the next event of its delivery in `events` supersedes (both encoded:
        an event that became a dead letter supersedes nothing). Pairwise is enough: whatever the
        status before a marked event, its delivery's status after the next one is the same
        with or without it, so a run of marked events may all be skipped."""
        later: dict[str, int] = {}  # delivery -> index of its next event, walking backwards
        for i in range(len(events) - 1, -1, -1):
            delivery = events[i]["delivery_id"]
            if records[i].topic != self.events_topic:
                later.pop(delivery, None)
                continue
            j = later.get(delivery)
            if j is not None and _superseded(events[i], events[j]):
                headers = superseded_header(events[i]["channel"], events[i]["state"])
                records[i] = records[i]._replace(headers=headers)
            later[delivery] = i

    def kept(self, rec: dict[str, Any], always: bool = False) -> dict[str, Any]:
        """A delivery as Kafka may keep it (herald/sealing.py): a secret type's sealed, and
        with `always` every one (a retry record: the retry topics keep them for days, longer
        than most messages live, so its address and content expire with the message)."""
        if not always and rec.get("notification_type") not in self.secret_types:
            return rec
        return seal_delivery(self.seal.sealer, rec)

    def device_record(self, user_id: str, record: Mapping[str, Any]) -> KafkaRecord:
        """A contact_points record for herald.devices (raises SerdeError: the caller decides)."""
        value = self.serializer(DEVICES_TOPIC)(record)
        return KafkaRecord(self.kafka.topic(DEVICES_TOPIC), user_id, value)

    def _one(self, logical: str, key: str, value: Mapping[str, Any]) -> KafkaRecord:
        topic = self.kafka.topic(logical)
        try:
            return KafkaRecord(topic, key, self.serializer(logical)(value))
        except SerdeError as exc:
            log.error("encode.failed job=%s topic=%s reason=%s", JOB, topic, exc.reason)
            letter = dead_letter(
                source_topic=topic, reason="encode_failed", job=JOB, key=key,
                value=orjson.dumps(value, default=str), detail=f"{exc.reason}: {exc.detail}",
                delivery_id=key,
            )  # fmt: skip
            return self._letter(letter)

    def _dead(self, out: DeadLetterOut) -> KafkaRecord:
        rec = out.record
        logical = deliveries_topic(rec["channel"], rec["traffic_class"])
        source = self.kafka.topic(logical)
        msg = out.message
        value = self.serializer(logical)(self.kept(rec))
        letter = dead_letter(
            source_topic=source, reason=out.reason.split(":", 1)[0], detail=out.reason, job=JOB,
            partition=msg.partition if msg else -1, offset=msg.offset if msg else -1,
            key=rec["delivery_id"], value=value, attempts=int(rec.get("attempt") or 0),
            delivery_id=rec["delivery_id"], expire_at=rec.get("expire_at"),
        )  # fmt: skip
        log.warning("dispatch.dead_lettered reason=%s attempts=%s", out.reason, rec.get("attempt"))
        return self._letter(letter)

    def _letter(self, letter: dict[str, Any]) -> KafkaRecord:
        letter = self.seal(letter)
        value = self.serializer(DEAD_LETTER_TOPIC)(letter)
        return KafkaRecord(self.kafka.topic(DEAD_LETTER_TOPIC), letter["source_topic"], value)


def _superseded(event: Mapping[str, Any], later: Mapping[str, Any]) -> bool:
    """`later` (the same delivery's next event, produced after `event` in one batch) takes the
    hot status from wherever `event` would: a consumer keeping only the current state may skip
    `event`."""
    return event.get("generation", 0) == later.get("generation", 0) and supersedes(
        event["channel"], event["state"], later["state"]
    )
