"""Idempotent creation of the catalog's topics (herald/topics.toml) on a Kafka cluster."""

from __future__ import annotations

from herald.config import KafkaSettings
from herald.errors import InfraError
from herald.topics import TopicSpec, load_topics

__all__ = ["create_topics"]


def create_topics(
    kafka: KafkaSettings,
    topics: dict[str, TopicSpec] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create every missing topic; existing topics are left alone. Returns the names created."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = topics if topics is not None else load_topics()
    admin = AdminClient(dict(kafka.client_config()))
    new = [
        NewTopic(
            kafka.topic(spec.name),
            num_partitions=spec.partitions,
            replication_factor=spec.replication_factor,
            config=spec.config(),
        )
        for spec in topics.values()
    ]
    created: list[str] = []
    for name, future in admin.create_topics(new, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except Exception as exc:  # KafkaException wraps a KafkaError
            err = exc.args[0] if exc.args else None
            if getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise InfraError(f"cannot create topic {name}: {exc}") from exc
    return created
