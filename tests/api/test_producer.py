"""api.producer: upstream client publishing Avro requests and social events to Kafka."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from api.producer import HeraldProducer
from herald import ids
from herald.config import HeraldSettings
from herald.errors import DeliveryError, InvalidRequest
from tests.api.conftest import read_topic


def request(**changes: object) -> dict[str, object]:
    base = {
        "request_id": f"r-{uuid.uuid4().hex}",
        "notification_type": "payment_result",
        "recipients": {"user_ids": ["u-1"]},
        "params": {"amount": "9.90", "currency": "CHF", "status": "paid", "order_id": "7"},
    }
    return {**base, **changes}


def test_requests_go_to_the_catalog_class_with_the_api_id(settings: HeraldSettings) -> None:
    producer = HeraldProducer.from_settings(settings, tenant_id="orders")
    req = request()
    nid = producer.send_notification_sync(req)
    assert nid == ids.notification_id("orders", str(req["request_id"]))
    [(key, record)] = read_topic(settings, "herald.requests.transactional", 1)
    assert key == nid and record["source"] == "producer" and record["tenant_id"] == "orders"


def test_social_events_are_keyed_by_recipient(settings: HeraldSettings) -> None:
    producer = HeraldProducer.from_settings(settings, tenant_id="social")
    event = {
        "event_id": "e-1",
        "event_type": "like",
        "actor_id": "a-1",
        "recipient_id": "u-9",
        "object_id": "p-1",
        "object_type": "post",
        "occurred_at": datetime.now(UTC),
    }
    producer.publish_social_event(event)
    producer.flush()
    [(key, record)] = read_topic(settings, "herald.social-events", 1)
    assert key == "u-9" and record["tenant_id"] == "social" and record["event_type"] == "like"


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"notification_type": "nope"}, "unknown_notification_type"),
        ({"params": {}}, "missing_param"),
        ({"recipients": {"user_ids": []}}, "validation_error"),
    ],
)
def test_invalid_requests_raise_with_the_api_code(
    settings: HeraldSettings, changes: dict[str, object], code: str
) -> None:
    producer = HeraldProducer.from_settings(settings, tenant_id="orders")
    with pytest.raises(InvalidRequest) as info:
        producer.send_notification(request(**changes))
    assert info.value.code == code


def test_invalid_social_event_is_a_schema_violation(settings: HeraldSettings) -> None:
    producer = HeraldProducer.from_settings(settings, tenant_id="social")
    with pytest.raises(InvalidRequest) as info:
        producer.publish_social_event({"event_id": "e", "event_type": "like"})
    assert info.value.code == "schema_violation"


def test_unreachable_broker_is_a_delivery_error(settings: HeraldSettings) -> None:
    dead = settings.kafka.model_copy(update={"bootstrap_servers": "127.0.0.1:9"})
    producer = HeraldProducer.from_settings(
        settings.model_copy(update={"kafka": dead}), tenant_id="orders",
        producer_config={"message.timeout.ms": 1000},
    )  # fmt: skip
    with pytest.raises(DeliveryError):
        producer.send_notification_sync(request(), timeout=5)
