"""Bulk inputs of `herald demo` that a real deployment gets from other systems, not the API.

- a campaign audience: N users' contact points (an iPhone each, or an email address) on the
  `herald.devices` changelog (as a user service's bulk import would publish them) and the
  segment snapshot in ClickHouse `segment_members` (as a segmentation job would write it);
- a like storm: social events on `herald.social-events`, through `HeraldProducer`, the upstream
  client every producing service uses.

Each writer waits for the broker's acknowledgement (acks=all) before returning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer

from api.producer import PRODUCER_CONFIG, HeraldProducer
from herald.config import HeraldSettings
from herald.errors import DeliveryError
from herald.topics import DEVICES
from schemas.registry import make_registry
from sinks.kafka import topic_serializer

__all__ = ["campaign_address", "campaign_user", "load_audience", "publish_events"]

Progress = Callable[[int], None]
CONTACTS_TOPIC = DEVICES


def campaign_user(run_id: str, i: int) -> str:
    """The i-th campaign user of a run; zero-padded so user_id order is numeric order."""
    return f"{run_id}-c{i:07d}"


def campaign_address(user: str, channel: str) -> str:
    """Where a campaign user is reached: an APNs token (64 hex) for push, else an address."""
    if channel == "push":
        return hashlib.sha256(user.encode()).hexdigest()
    return f"{user}@example.test"


def _contact_points(run_id: str, count: int, channel: str) -> Iterable[tuple[str, dict[str, Any]]]:
    now = datetime.now(UTC)
    for i in range(count):
        user = campaign_user(run_id, i)
        address = campaign_address(user, channel)
        record: dict[str, Any] = {"user_id": user, "updated_at": now, "version": 1}
        if channel == "push":
            device = {"device_id": f"{user}-iphone", "platform": "apns", "token": address,
                      "registered_at": now, "valid": True}  # fmt: skip
            record |= {"devices": [device], "email": None}
        else:
            record |= {"devices": [], "email": {"address": address, "verified": True}}
        yield user, record


def load_audience(
    settings: HeraldSettings,
    ch: Any,
    run_id: str,
    segment_id: str,
    count: int,
    channel: str,
    progress: Progress | None = None,
) -> None:
    """Publish `count` users' contact points (`channel` only), then the segment snapshot."""
    encode = topic_serializer(settings.kafka, make_registry(settings.registry), CONTACTS_TOPIC)
    producer = Producer({**settings.kafka.client_config(), **PRODUCER_CONFIG})
    physical = settings.kafka.topic(CONTACTS_TOPIC)
    errors: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for n, (user, record) in enumerate(_contact_points(run_id, count, channel), start=1):
        value = encode(record)
        while True:
            try:
                producer.produce(physical, value, user.encode(), on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 5000 == 0:
            producer.poll(0)
            if progress:
                progress(5000)
    if producer.flush(120) or errors:
        raise DeliveryError(f"contact points not acknowledged: {errors[:1] or 'timeout'}")
    if progress:
        progress(count % 5000)
    batch = 100_000
    for lo in range(0, count, batch):
        rows = [
            [segment_id, campaign_user(run_id, i), {}] for i in range(lo, min(count, lo + batch))
        ]
        ch.insert("segment_members", rows, column_names=["segment_id", "user_id", "params"])


def publish_events(settings: HeraldSettings, tenant_id: str, events: list[dict[str, Any]]) -> None:
    """Publish social events as an upstream service does, and wait for the acknowledgements."""
    producer = HeraldProducer.from_settings(settings, tenant_id=tenant_id)
    try:
        for event in events:
            producer.publish_social_event(event)
    finally:
        producer.close()
