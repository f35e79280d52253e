"""The API served over real HTTP (uvicorn in a background thread) on the session's services.

`api` gives a running app for one test (own topic prefix and registry via `settings`), its
base URL, keys for a full-scope tenant, a read-only tenant and a tenant with a tiny rate limit,
and helpers to read what the app wrote to Kafka.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from confluent_kafka import Consumer, TopicPartition

from api.app import create_app
from api.auth import SCOPES, Tenants, hash_key
from api.settings import ApiSettings, ProviderSecrets
from herald.config import HeraldSettings
from infra.process import free_port
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from tests.conftest import mark_users_restored

FULL_KEY = "hk_test_full_0123456789abcdef"
READ_KEY = "hk_test_read_0123456789abcdef"
SLOW_KEY = "hk_test_slow_0123456789abcdef"
ORDERS_KEY = "hk_test_orders_0123456789abcdef"  # may send order_shipped only, to no segment
DEVICES_KEY = "hk_test_devices_0123456789abcdef"  # devices:write/read only
SEGMENTS_KEY = "hk_test_segments_0123456789abcdef"  # acme's, segments:write/read only (no query)
RIVAL_KEY = "hk_test_rival_0123456789abcdef"  # another tenant with every scope
SMS_A_TOKEN = "test-twilio-auth-token"
SMS_B_SECRET = "test-vonage-signature-secret"


def make_tenants() -> Tenants:
    return Tenants.from_dict(
        {
            "tenants": {
                "acme": {
                    "rate_limit_per_second": 10_000,
                    "keys": [
                        {"id": "full", "sha256": hash_key(FULL_KEY), "scopes": sorted(SCOPES)},
                        {
                            "id": "segments",
                            "sha256": hash_key(SEGMENTS_KEY),
                            "scopes": ["segments:write", "segments:read"],
                        },
                    ],
                },
                "rival": {
                    "rate_limit_per_second": 10_000,
                    "keys": [
                        {"id": "rival", "sha256": hash_key(RIVAL_KEY), "scopes": sorted(SCOPES)}
                    ],
                },
                "reader": {
                    "keys": [
                        {"id": "ro", "sha256": hash_key(READ_KEY), "scopes": ["notifications:read"]}
                    ]
                },
                "orders": {
                    "keys": [
                        {
                            "id": "orders",
                            "sha256": hash_key(ORDERS_KEY),
                            "scopes": sorted(SCOPES),
                            "types": ["order_shipped"],
                            "segments": [],
                        }  # fmt: skip
                    ]
                },
                "devices": {
                    "keys": [
                        {
                            "id": "devices",
                            "sha256": hash_key(DEVICES_KEY),
                            "scopes": ["devices:write", "devices:read"],
                        }  # fmt: skip
                    ]
                },
                "slow": {
                    "rate_limit_per_second": 3,
                    "keys": [
                        {"id": "slow", "sha256": hash_key(SLOW_KEY), "scopes": sorted(SCOPES)}
                    ],
                },
            }
        }
    )


@dataclass
class RunningApi:
    url: str
    settings: HeraldSettings
    app: Any

    def client(self, key: str | None = FULL_KEY, **kw: Any) -> httpx.Client:
        headers = {"X-API-Key": key} if key else {}
        headers.update(kw.pop("headers", {}))
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0, **kw)

    def read_topic(
        self, topic: str, expect: int, timeout: float = 15.0, settle: float = 0.0
    ) -> list[tuple[str, dict]]:
        """See `read_topic`."""
        return read_topic(self.settings, topic, expect, timeout, settle)


def read_topic(
    settings: HeraldSettings, topic: str, expect: int, timeout: float = 15.0, settle: float = 0.0
) -> list[tuple[str, dict]]:
    """Decode `expect` records of logical `topic` (all partitions, from the start), then
    keep reading `settle` seconds more to catch extra records."""
    physical = settings.kafka.topic(topic)
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": "unused",
         "enable.auto.commit": False}
    )  # fmt: skip
    meta = consumer.list_topics(physical, timeout=10).topics[physical]
    consumer.assign([TopicPartition(physical, p, 0) for p in meta.partitions])
    deser = AvroDeserializer(make_registry(settings.registry))
    out: list[tuple[str, dict]] = []
    deadline = time.monotonic() + timeout
    try:
        settled_at: float | None = None
        while time.monotonic() < deadline:
            if len(out) >= expect:
                settled_at = settled_at or time.monotonic() + settle
                if time.monotonic() >= settled_at:
                    break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            key = msg.key().decode() if msg.key() else ""
            out.append((key, deser(msg.value())))
    finally:
        consumer.close()
    return out


def serve(app: Any) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            access_log=False, ws="websockets-sansio", lifespan="on")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def make_api_settings(**changes: Any) -> ApiSettings:
    base = {"otp_per_phone": (3, 600), "otp_per_ip": (5, 600), "otp_per_device": (4, 600),
            "sms_allowed_prefixes": ["+41", "+49", "+1", "+86"]}  # fmt: skip
    return ApiSettings(**{**base, **changes})


@pytest.fixture
def api(settings: HeraldSettings) -> Iterator[RunningApi]:
    providers = ProviderSecrets(
        sms_a_auth_token=SMS_A_TOKEN, sms_b_signature_secret=SMS_B_SECRET,
        email_webhook_public_key=EMAIL_KEYS.public_b64,
    )  # fmt: skip
    mark_users_restored(settings.redis.url, settings.kafka.topic_prefix)
    app = create_app(settings, api=make_api_settings(), providers=providers, tenants=make_tenants())
    for url in serve(app):
        yield RunningApi(url, settings, app)


class _EmailKeys:
    """A P-256 key pair for SendGrid-style signatures (made once per session)."""

    def __init__(self) -> None:
        import base64

        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP256R1())
        self.private_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )  # fmt: skip
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.public_b64 = base64.b64encode(der).decode()


EMAIL_KEYS = _EmailKeys()
