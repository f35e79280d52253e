"""The .avsc contracts: one per schema name in herald/topics.toml, documented, well-formed."""

from __future__ import annotations

import json
from typing import Any

import pytest

import schemas
from herald.errors import SchemaError
from herald.topics import load_topics

EXPECTED = {
    "contact_points",
    "dead_letter",
    "delivery",
    "delivery_event",
    "notification_request",
    "raw_receipt",
    "social_event",
    "user_preferences",
}


def _records(schema: Any) -> list[dict[str, Any]]:
    """Every record definition reachable from `schema` (nested, in unions, arrays, maps)."""
    if isinstance(schema, list):
        return [r for s in schema for r in _records(s)]
    if not isinstance(schema, dict):
        return []
    found: list[dict[str, Any]] = []
    if schema.get("type") == "record":
        found.append(schema)
        for field in schema["fields"]:
            found += _records(field["type"])
    elif schema.get("type") == "array":
        found += _records(schema["items"])
    elif schema.get("type") == "map":
        found += _records(schema["values"])
    return found


def test_one_schema_per_topic_schema_name() -> None:
    used = {spec.schema for spec in load_topics().values()}
    assert used == EXPECTED
    assert set(schemas.schema_names()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_schema_is_documented_and_namespaced(name: str) -> None:
    raw = json.loads(schemas.schema_text(name))
    assert raw["namespace"] == "herald"
    assert raw["type"] == "record"
    for record in _records(raw):
        assert record.get("doc"), f"{record['name']} has no doc"
        for field in record["fields"]:
            assert field.get("doc"), f"{record['name']}.{field['name']} has no doc"
            ftype = field["type"]
            if isinstance(ftype, list) and "null" in ftype:
                assert ftype[0] == "null" and field.get("default", "missing") is None, (
                    f"{record['name']}.{field['name']}: nullable fields are ['null', T] with "
                    "default null"
                )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_schema_is_parsed_and_cached(name: str) -> None:
    parsed = schemas.load_schema(name)
    assert parsed["name"].startswith("herald.")
    assert schemas.load_schema(name) is parsed


def test_schema_text_is_canonical_json() -> None:
    text = schemas.schema_text("delivery")
    assert "\n" not in text
    assert schemas.canonical_json(text) == text


def test_unknown_schema_name_raises() -> None:
    with pytest.raises(SchemaError):
        schemas.schema_text("no_such_schema")


def test_delivery_event_fields_are_the_clickhouse_contract() -> None:
    """Shared with the ClickHouse table: names and order must not change."""
    fields = [f["name"] for f in json.loads(schemas.schema_text("delivery_event"))["fields"]]
    assert fields == [
        "event_id", "delivery_id", "notification_id", "user_id", "tenant_id",
        "notification_type", "channel", "traffic_class", "state", "reason", "provider",
        "provider_msg_id", "attempt", "latency_ms", "occurred_at", "recorded_at", "attributes",
        "generation", "traceparent",
    ]  # fmt: skip
