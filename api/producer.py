"""A small Kafka client for upstream services: publish notification requests and social events.

    producer = HeraldProducer.from_settings(HeraldSettings(), tenant_id="orders")
    nid = producer.send_notification({"request_id": "order-42-shipped",
                                      "notification_type": "order_shipped",
                                      "recipients": {"user_ids": ["u-1"]},
                                      "params": {"order_id": "42"}})
    producer.flush()          # raises DeliveryError if any record was not acknowledged

Same contract as `POST /v1/notifications` without the HTTP hop: the body is validated by the
API's model and the server-side catalog (unknown type, template version, locale, channel or a
missing param → `InvalidRequest` with the API's machine code), the traffic class comes from the
catalog (herald.requests.{class}), records are Avro in the Confluent wire format (schemas
registered in the registry), and the producer is idempotent with acks=all. `notification_id` is
`ids.notification_id(tenant, request_id)` — the id the API would give — so a request sent
twice (here, through the API, or by the outbox relay after a crash) is one notification.

`send_*` return once the record is queued; `flush()` or `send_notification_sync()` wait for the
broker's acknowledgement. Only a flushed (or `on_delivery`-confirmed) record is durable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pydantic import ValidationError

from herald import ids, tracing
from herald.catalog import Catalog, load_catalog
from herald.config import HeraldSettings, KafkaSettings
from herald.errors import DeliveryError, InvalidRequest
from herald.topics import SOCIAL_EVENTS, load_topics, physical_subject
from schemas.registry import SchemaRegistry, make_registry
from schemas.serde import AvroSerializer

__all__ = ["HeraldProducer", "PRODUCER_CONFIG"]

log = logging.getLogger(__name__)

PRODUCER_CONFIG: dict[str, str | int | bool] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "message.timeout.ms": 30_000,
    "allow.auto.create.topics": False,
}
SOCIAL_TOPIC = SOCIAL_EVENTS

OnDelivery = Callable[[str, Exception | None], None]


class HeraldProducer:
    """Publishes `notification_request` and `social_event` records for one tenant."""

    def __init__(
        self,
        kafka: KafkaSettings,
        registry: SchemaRegistry,
        *,
        tenant_id: str,
        catalog: Catalog | None = None,
        source: str = "producer",
        producer_config: Mapping[str, str | int | bool] | None = None,
    ) -> None:
        self.kafka = kafka
        self.tenant_id = tenant_id
        self.catalog = catalog or load_catalog()
        self.source = source
        config = {**kafka.client_config(), **PRODUCER_CONFIG, **(producer_config or {})}
        self._producer = Producer({**config, "client.id": f"herald-producer-{tenant_id}"})
        topics = load_topics()
        self._serializers: dict[str, AvroSerializer] = {
            name: AvroSerializer(registry, physical_subject(spec, kafka), spec.schema)
            for name, spec in topics.items()
            if name.startswith("herald.requests.") or name == SOCIAL_TOPIC
        }
        self._errors: list[Exception] = []
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls, settings: HeraldSettings, tenant_id: str, **kwargs: Any
    ) -> HeraldProducer:
        """A producer for the Kafka and registry named by `settings`."""
        return cls(settings.kafka, make_registry(settings.registry), tenant_id=tenant_id, **kwargs)

    def notification_record(
        self,
        request: Mapping[str, Any] | Any,
        accepted_at: datetime | None = None,
        traceparent: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Validate `request` (dict or NotificationCreate); returns (topic, record).
        `traceparent`: the caller's W3C trace context, kept when valid (herald/tracing.py)."""
        from api.intake import check_against_catalog
        from api.models import NotificationCreate, TrafficClass, to_request_record
        from api.problems import ProblemError

        try:
            model = (
                request
                if isinstance(request, NotificationCreate)
                else NotificationCreate.model_validate(request)
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidRequest("validation_error", first["msg"], list(first["loc"])) from None
        try:
            nt = check_against_catalog(model, self.catalog)
        except ProblemError as exc:
            loc = exc.errors[0]["loc"] if exc.errors else []
            raise InvalidRequest(exc.code, exc.detail or "", loc) from None
        nid = ids.notification_id(self.tenant_id, model.request_id)
        when = accepted_at or datetime.now(UTC)
        record = to_request_record(
            model,
            nid,
            self.tenant_id,
            cast(TrafficClass, nt.traffic_class),
            when,
            self.source,  # type: ignore[arg-type]
            template_version=nt.template_version,
            traceparent=tracing.traceparent(traceparent),
        )
        return f"herald.requests.{nt.traffic_class}", record

    def send_notification(
        self,
        request: Mapping[str, Any] | Any,
        on_delivery: OnDelivery | None = None,
        traceparent: str | None = None,
    ) -> str:
        """Queue one notification request; returns its notification_id."""
        topic, record = self.notification_record(request, traceparent=traceparent)
        self._produce(topic, record["notification_id"], record, on_delivery)
        return str(record["notification_id"])

    def send_notification_sync(
        self, request: Mapping[str, Any] | Any, timeout: float = 30.0
    ) -> str:
        """Send and wait for the broker's ack; raises DeliveryError when not acknowledged."""
        done = threading.Event()
        failure: list[Exception] = []

        def acked(_: str, err: Exception | None) -> None:
            if err is not None:
                failure.append(err)
            done.set()

        nid = self.send_notification(request, acked)
        self._producer.flush(timeout)
        if not done.is_set():
            raise DeliveryError(f"no acknowledgement within {timeout}s")
        if failure:
            raise DeliveryError(str(failure[0]))
        return nid

    def publish_social_event(
        self, event: Mapping[str, Any], on_delivery: OnDelivery | None = None
    ) -> str:
        """Queue one `social_event` (key recipient_id); returns its event_id."""
        record = {"tenant_id": self.tenant_id, **event}
        self._produce(SOCIAL_TOPIC, str(record.get("recipient_id", "")), record, on_delivery)
        return str(record.get("event_id"))

    def _produce(
        self, topic: str, key: str, record: Mapping[str, Any], on_delivery: OnDelivery | None
    ) -> None:
        from herald.errors import SerdeError

        try:
            value = self._serializers[topic](record)
        except SerdeError as exc:
            raise InvalidRequest(exc.reason, exc.detail) from None

        def report(err: KafkaError | None, _msg: Message) -> None:
            failure = None if err is None else DeliveryError(f"{topic}: {err.name()}")
            if failure is not None:
                with self._lock:
                    self._errors.append(failure)
            if on_delivery is not None:
                on_delivery(key, failure)

        while True:
            try:
                self._producer.produce(self.kafka.topic(topic), value, key, on_delivery=report)
                break
            except BufferError:
                self._producer.poll(0.1)  # local queue full: serve callbacks, then retry
            except KafkaException as exc:
                raise DeliveryError(f"produce refused: {exc.args[0]}") from exc
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every queued record; raises DeliveryError if any was not acknowledged."""
        remaining = self._producer.flush(timeout)
        with self._lock:
            errors, self._errors = self._errors, []
        if remaining:
            raise DeliveryError(f"{remaining} records not acknowledged within {timeout}s")
        if errors:
            raise DeliveryError(f"{len(errors)} records failed, first: {errors[0]}")

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks."""
        return int(self._producer.poll(timeout))

    def close(self, timeout: float = 30.0) -> None:
        """Flush (errors are raised) and release the client."""
        self.flush(timeout)
