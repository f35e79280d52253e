"""The topic catalog covers SPEC §1 and is created idempotently on a real broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from herald import topics
from herald.config import HeraldSettings
from herald.errors import ConfigError
from herald.topics import load_topics
from infra.topics import create_topics
from schemas import schema_names

CLASSES = ("transactional", "normal", "bulk")
CHANNELS = ("push", "sms", "email", "inapp")


def test_catalog_covers_every_topic_of_the_pipeline() -> None:
    names = set(load_topics())
    expected = {f"herald.requests.{c}" for c in CLASSES}
    expected |= {f"herald.deliveries.{ch}.{c}" for ch in CHANNELS for c in CLASSES}
    expected |= {f"herald.retry.{c}" for c in CLASSES}
    expected |= {
        "herald.social-events",
        "herald.preferences",
        "herald.devices",
        "herald.scheduled",
        "herald.dead-letters",
        "herald.delivery-events",
        "herald.receipts.raw",
    }
    assert expected <= names


def test_every_topic_the_code_names_is_in_the_catalog() -> None:
    """herald/topics.py spells the topics the code refers to; each must be declared."""
    named = {value for name, value in vars(topics).items() if name.isupper() and
             isinstance(value, str) and value.startswith("herald.")}  # fmt: skip
    assert len(named) == 7 and named <= set(load_topics())


def test_every_topic_has_a_schema_file_and_changelogs_are_compacted() -> None:
    topics = load_topics()
    available = set(schema_names())
    for spec in topics.values():
        assert spec.schema in available, f"{spec.name}: no schemas/{spec.schema}.avsc"
        assert spec.subject == f"{spec.name}-value"
    assert topics["herald.preferences"].cleanup_policy == "compact"
    assert topics["herald.devices"].cleanup_policy == "compact"


def test_invalid_catalog_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "topics.toml"
    bad.write_text('[[topic]]\nname = "x"\nkey = "k"\nschema = "s"\ncleanup_policy = "forever"\n')
    with pytest.raises(ConfigError, match="cleanup_policy"):
        load_topics(bad)
    bad.write_text('[[topic]]\nname = "x"\nschema = "s"\n')
    with pytest.raises(ConfigError, match="key"):
        load_topics(bad)


def test_create_is_idempotent_on_the_real_broker(settings: HeraldSettings) -> None:
    # the `settings` fixture already created every topic under its prefix
    assert create_topics(settings.kafka) == []
    admin = AdminClient(settings.kafka.client_config())
    metadata = admin.list_topics(timeout=10).topics
    for spec in load_topics().values():
        physical = settings.kafka.topic(spec.name)
        assert physical in metadata
        assert len(metadata[physical].partitions) == spec.partitions
