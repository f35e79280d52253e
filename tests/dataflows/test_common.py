"""Consumer settings per traffic class (dataflows._common)."""

from __future__ import annotations

from dataflows._common import TRANSACTIONAL_CONSUMER_CONFIG, class_consumer_config
from sources.kafka import DEFAULT_CONSUMER_CONFIG


def test_only_the_transactional_class_waits_less_in_an_empty_fetch() -> None:
    assert class_consumer_config("transactional") == TRANSACTIONAL_CONSUMER_CONFIG
    assert class_consumer_config("normal") is None
    assert class_consumer_config("bulk") is None
    wait = "fetch.wait.max.ms"
    assert int(TRANSACTIONAL_CONSUMER_CONFIG[wait]) < int(DEFAULT_CONSUMER_CONFIG[wait])
