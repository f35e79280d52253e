"""The registry's HTTP API against confluent-kafka's own client and serializers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

import schemas
from schemas.registry import ConfluentRegistry, FileRegistry
from schemas.registry_server import create_app
from schemas.serde import AvroDeserializer as HeraldDeserializer
from schemas.serde import AvroSerializer as HeraldSerializer
from tests.api.conftest import serve
from tests.schemas.examples import example

V1 = json.dumps({"type": "record", "name": "Thing", "namespace": "test", "fields": [
    {"name": "id", "type": "string"}]})  # fmt: skip
V2 = json.dumps({"type": "record", "name": "Thing", "namespace": "test", "fields": [
    {"name": "id", "type": "string"}, {"name": "n", "type": "int", "default": 0}]})  # fmt: skip
BREAKING = json.dumps({"type": "record", "name": "Thing", "namespace": "test", "fields": [
    {"name": "id", "type": "int"}]})  # fmt: skip


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FileRegistry]]:
    registry = FileRegistry(tmp_path / "registry")
    for url in serve(create_app(registry)):
        yield url, registry


def test_confluent_client_registers_reads_and_versions(served: tuple[str, FileRegistry]) -> None:
    url, registry = served
    client = SchemaRegistryClient({"url": url})
    first = client.register_schema("things-value", Schema(V1, "AVRO"))
    assert client.register_schema("things-value", Schema(V1, "AVRO")) == first  # idempotent
    second = client.register_schema("things-value", Schema(V2, "AVRO"))
    assert json.loads(client.get_schema(first).schema_str) == json.loads(V1)
    assert client.get_subjects() == ["things-value"]
    assert client.get_versions("things-value") == [1, 2]
    latest = client.get_latest_version("things-value")
    assert (latest.version, latest.schema_id) == (2, second)
    assert client.lookup_schema("things-value", Schema(V1, "AVRO")).version == 1
    assert client.test_compatibility("things-value", Schema(V2, "AVRO")) is True
    assert client.get_compatibility() == "BACKWARD_TRANSITIVE"
    assert registry.subject_versions("things-value") == [first, second]  # Herald's own view


def test_an_incompatible_change_is_409_with_confluents_body(
    served: tuple[str, FileRegistry],
) -> None:
    url, _registry = served
    client = SchemaRegistryClient({"url": url})
    client.register_schema("things-value", Schema(V1, "AVRO"))
    assert client.test_compatibility("things-value", Schema(BREAKING, "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("things-value", Schema(BREAKING, "AVRO"))
    assert refused.value.http_status_code == 409 and refused.value.error_code == 409
    raw = httpx.post(f"{url}/subjects/things-value/versions", json={"schema": BREAKING})
    assert raw.status_code == 409 and set(raw.json()) == {"error_code", "message"}
    assert client.get_versions("things-value") == [1]  # nothing registered
    for path, code in (("/schemas/ids/999", 40403), ("/subjects/nope/versions", 40401),
                       ("/subjects/things-value/versions/7", 40402)):  # fmt: skip
        assert httpx.get(url + path).json()["error_code"] == code
    bad = httpx.post(f"{url}/subjects/x/versions", json={"schema": "{not avro"})
    assert bad.status_code == 422 and bad.json()["error_code"] == 42201


def test_confluent_serializers_and_herald_share_ids(served: tuple[str, FileRegistry]) -> None:
    """A record written by confluent-kafka's AvroSerializer through the URL is read by Herald's
    file registry under the same id, and the other way round."""
    url, registry = served
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext("things", MessageField.VALUE)
    data = AvroSerializer(client, V1)({"id": "a"}, ctx)
    assert (
        data is not None and int.from_bytes(data[1:5], "big") in registry.subjects()["things-value"]
    )
    herald_id = registry.register("others-value", V2)
    written = b"\x00" + herald_id.to_bytes(4, "big") + b"\x02b\x04"
    assert AvroDeserializer(client)(written, ctx) == {"id": "b", "n": 2}


@pytest.mark.parametrize("name", schemas.schema_names())
def test_herald_and_confluent_serializers_agree_byte_for_byte(
    served: tuple[str, FileRegistry], name: str
) -> None:
    """Every Herald schema, Herald's compiled writer against confluent-kafka's AvroSerializer
    (both on the served URL, as producers outside Herald are): the same bytes for the same
    record, and each side reads what the other wrote."""
    url, _registry = served
    client = SchemaRegistryClient({"url": url})
    subject = f"{name}-value"
    ctx = SerializationContext(name, MessageField.VALUE)
    ours = HeraldSerializer(ConfluentRegistry(url), subject, name)(example(name))
    theirs = AvroSerializer(
        client, schemas.schema_text(name), conf={"auto.register.schemas": False}
    )(example(name), ctx)
    assert theirs == ours
    read_by_confluent = AvroDeserializer(client)(ours, ctx)
    assert read_by_confluent == example(name)
    assert HeraldDeserializer(ConfluentRegistry(url), name)(theirs) == example(name)
