"""Dead addresses reported by receipts: disable the phone or email in the user's contact points.

    AddressSink(settings)       Bytewax sink; items are herald.delivery_fold.DeadAddress

A hard bounce or a carrier's "dead number" receipt (herald.receipts.kills_address)
names no address, only the delivery. The receipts job knows the `address_tag` of the address
that delivery went to (from dispatch's PROVIDER_ACCEPTED event); this sink removes the user's
current phone (or email) only when its tag is that one, so a number changed since the send is
kept. The change goes exactly where dispatch's own dead-address path sends it
(sinks.dispatch.contacts.ContactStore): under the user's lock, the new record on herald.devices
(acked by Kafka) and then the API's Redis copy, so the plan job skips that channel from then on
(`address_disabled`) and the user's other channels are still served.

At-least-once: a batch written again after a restart finds the address gone ("absent") and
changes nothing. A Redis or Kafka failure raises: the job stops and resumes from its snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bytewax.outputs import DynamicSink

from herald.config import HeraldSettings
from herald.delivery_fold import DeadAddress
from herald.receipts import address_tag
from herald.topics import DEVICES
from schemas.registry import make_registry
from sinks.dispatch.contacts import ContactStore
from sinks.kafka import KafkaRecord, topic_serializer
from sinks.user_changes import UserChangePartition

__all__ = ["AddressSink"]

log = logging.getLogger(__name__)

DEVICES_TOPIC = DEVICES


def _tagged(tag: str, key: bytes) -> Callable[[str], bool]:
    return lambda address: address_tag(address, key) == tag


class AddressSink(DynamicSink[DeadAddress]):
    """Disable dead addresses; one Redis client and one producer per worker."""

    def __init__(self, settings: HeraldSettings) -> None:
        self.settings = settings

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _AddressPartition:
        """Called once per worker."""
        return _AddressPartition(self.settings, f"{step_id}/w{worker_index}")


class _AddressPartition(UserChangePartition[DeadAddress]):
    def __init__(self, settings: HeraldSettings, name: str) -> None:
        super().__init__(settings, "addresses", name)
        self.pii_key = settings.pii.key_bytes()
        kafka = settings.kafka
        self.contacts = ContactStore(self.redis, cluster=settings.redis.cluster)
        self.topic = kafka.topic(DEVICES_TOPIC)
        self.serialize = topic_serializer(kafka, make_registry(settings.registry), DEVICES_TOPIC)

    def write_batch(self, items: list[DeadAddress]) -> None:
        """Disable each address that still has its tag; returns after Kafka acked the changes."""
        now = datetime.now(UTC)
        for item in items:
            matches = _tagged(item.address_tag, self.pii_key)
            result = self.contacts.disable_matching(
                item.user_id, item.channel, matches, self._publish, now
            )
            log.info("receipts.dead_address channel=%s reason=%s result=%s",
                     item.channel, item.reason, result)  # fmt: skip

    def _publish(self, user_id: str, record: dict[str, Any]) -> None:
        """Produce the new contact points and wait for the ack (before the Redis copy)."""
        self.producer.submit([KafkaRecord(self.topic, user_id, self.serialize(record))])
        self.producer.flush()
