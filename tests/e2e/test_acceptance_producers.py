"""A producer outside Herald: confluent-kafka only, pointed at the stack's `registry_url`.

The records are produced with confluent-kafka's `SerializingProducer`, `AvroSerializer` and
`SchemaRegistryClient` (the schemas read from the registry, as a service in another language
would), never with Herald's producer or serializers; Herald's client only checks the outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import StringSerializer

from herald import ids
from tests.e2e._helpers import REACHED, UserPool, email_of
from tests.e2e._stack import E2EStack

pytestmark = pytest.mark.integration

TENANT = "dev"  # the embedded stack's dev key belongs to it
LIKES = 1200


def _producer(e2e: E2EStack, topic: str) -> SerializingProducer:
    status = json.loads(e2e.cli("status", "--json").stdout)
    registry = SchemaRegistryClient({"url": status["registry_url"]})
    schema = registry.get_latest_version(f"{topic}-value").schema.schema_str
    return SerializingProducer({
        "bootstrap.servers": status["env"]["HERALD_KAFKA_BOOTSTRAP_SERVERS"],
        "key.serializer": StringSerializer("utf_8"),
        "value.serializer": AvroSerializer(registry, schema, conf={"auto.register.schemas": False}),
    })  # fmt: skip


def test_a_confluent_producer_sends_a_notification_and_a_like_storm(
    e2e: E2EStack, pool: UserPool
) -> None:
    [(user, _phone)] = pool.take(1).items()
    [(poster, _)] = pool.take(1).items()
    request_id = f"ext-{uuid.uuid4().hex[:8]}"
    nid = ids.notification_id(TENANT, request_id)  # the id the API would give it
    now = datetime.now(UTC)
    request: dict[str, Any] = {
        "notification_id": nid, "request_id": request_id, "tenant_id": TENANT,
        "notification_type": "order_shipped", "traffic_class": "normal",
        "recipients": {"user_ids": [user], "segment_id": None}, "template_version": None,
        "params": {"order_id": "ext-1"}, "channels": ["email"], "locale": None,
        "send_at": None, "send_local_time": None, "expire_at": None, "accepted_at": now,
        "source": "producer",
    }  # fmt: skip
    requests = _producer(e2e, "herald.requests.normal")
    requests.produce("herald.requests.normal", key=nid, value=request)
    assert requests.flush(30) == 0

    run = uuid.uuid4().hex[:8]
    first = now - timedelta(seconds=660)  # inside one 10-minute window that has ended
    likes = _producer(e2e, "herald.social-events")
    for i in range(LIKES):
        likes.produce("herald.social-events", key=poster, value={
            "event_id": f"{run}-like-{i}", "event_type": "like", "actor_id": f"{run}-u{i}",
            "actor_name": f"user{i}", "recipient_id": poster, "object_id": f"post-{run}",
            "object_type": "post", "occurred_at": first + timedelta(milliseconds=400 * i),
            "tenant_id": TENANT,
        })  # fmt: skip
        likes.poll(0)
    assert likes.flush(30) == 0

    delivered = e2e.client.wait_for(nid, "email", REACHED, timeout=120)
    assert delivered["user_id"] == user
    status = e2e.client.status(nid)  # visible to its tenant like an API request
    assert status["notification_id"] == nid
    sim = e2e.client.sim("email").stats(ids=True)
    assert email_of(user) in json.dumps(sim)

    deadline = time.monotonic() + 180
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not items:
        items = [i for i in e2e.client.inbox(poster)["items"] if "like" in i["body"].lower()]
        if not items:
            time.sleep(1)
    assert len(items) == 1, items
    assert f"{LIKES - 3:,}" in items[0]["body"] or str(LIKES - 3) in items[0]["body"]


NODE_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"


NO_NODE = shutil.which("node") is None or shutil.which("npm") is None


@pytest.mark.skipif(NO_NODE, reason="node/npm not installed: the Node example needs Node 20")
def test_a_node_service_produces_a_notification(e2e: E2EStack, pool: UserPool) -> None:
    """examples/node/produce.mjs (kafkajs + @kafkajs/confluent-schema-registry, no Herald
    code) produces an order_shipped request; it is delivered and visible like an API one."""
    installed = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_EXAMPLE,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    [(user, _phone)] = pool.take(1).items()
    status = json.loads(e2e.cli("status", "--json").stdout)
    env = {**os.environ, "KAFKA": status["env"]["HERALD_KAFKA_BOOTSTRAP_SERVERS"],
           "REGISTRY_URL": status["registry_url"], "TENANT": TENANT}  # fmt: skip
    request_id = f"node-{uuid.uuid4().hex[:8]}"
    produced = subprocess.run(["node", "produce.mjs", request_id, user, "node-1"],
                              cwd=NODE_EXAMPLE, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    assert produced.returncode == 0, produced.stdout + produced.stderr
    nid = produced.stdout.strip()
    assert nid == ids.notification_id(TENANT, request_id)  # the same id as the API's
    delivered = e2e.client.wait_for(nid, "email", REACHED, timeout=120)
    assert delivered["user_id"] == user
    assert e2e.client.status(nid)["notification_type"] == "order_shipped"
