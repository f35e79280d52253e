"""dataflows._encode: spliced records are the serializer's bytes; a bad splice falls back."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dataflows._encode import Encoder
from herald.catalog import load_catalog
from herald.config import HeraldSettings, RegistrySettings
from herald.plan_records import Output, Renderer, plan_user, user_records
from herald.planning import UserView, admit_request
from herald.policy import ContactPoints, Device, Preferences
from herald.sealing import Sealer, open_delivery
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.kafka import KafkaRecord

CATALOG = load_catalog()
NOW = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)


def campaign_outputs(users: int) -> list[Output]:
    """A campaign's records for `users` users planned together (shared prototypes)."""
    request = admit_request({
        "notification_id": "n-enc", "request_id": "r", "tenant_id": "acme",
        "notification_type": "marketing_campaign", "traffic_class": "bulk",
        "recipients": {"user_ids": ["x"], "segment_id": None},
        "params": {"headline": "Sale", "offer": "20% off", "cta_url": "https://x.test"},
        "accepted_at": NOW, "source": "api",
    }, CATALOG, "t:0:1")  # fmt: skip
    renderer, out = Renderer(CATALOG), []
    for i in range(users):
        user = f"u-{i}"
        opted_out = frozenset({"marketing"} if i % 5 == 0 else ())
        prefs = Preferences(user, locale=["en", "de", None][i % 3], category_opt_out=opted_out)
        devices = (Device(f"d-{i}", "fcm", f"tok-{i}"),) if i % 4 else ()
        contacts = ContactPoints(user, devices, email=f"{user}@x.test", email_verified=True)
        view = UserView(user, None, prefs, contacts)
        records, rejected = user_records(
            renderer, request, view, plan_user(CATALOG, request, view, NOW), NOW
        )
        assert rejected == []
        out.extend(records)
    return out


@pytest.fixture
def encoder(tmp_path: Path) -> Encoder:
    settings = HeraldSettings(registry=RegistrySettings(path=tmp_path / "registry"))
    return Encoder(settings, make_registry(settings.registry), "plan")


def decoded(encoder: Encoder, records: list[Any]) -> list[dict[str, Any]]:
    decode = AvroDeserializer(encoder.registry)
    return [decode(r.value) for r in records]


def test_every_spliced_record_decodes_to_its_value(encoder: Encoder) -> None:
    outputs = campaign_outputs(60)
    assert all(o.shape is not None for o in outputs)
    assert len({id(o.shape) for o in outputs}) < len(outputs) / 4  # shapes are shared
    records = encoder(outputs)
    assert all(isinstance(r, KafkaRecord) for r in records)
    assert [r.key for r in records] == [o.key for o in outputs]
    for output, record in zip(outputs, decoded(encoder, records), strict=True):
        sealed = {"sealed": None} if "rendered" in output.value else {}  # deliveries only
        assert record == {**output.value, "generation": 0, **sealed}


def test_a_splice_that_disagrees_with_the_serializer_falls_back(
    encoder: Encoder, caplog: pytest.LogCaptureFixture
) -> None:
    outputs = campaign_outputs(12)
    for topic in {o.topic for o in outputs}:
        _physical, _serialize, splicer = encoder._serializer(topic)  # noqa: SLF001
        assert splicer is not None
        good = splicer.encoder.segments

        def bad(value: Any, good: Any = good) -> tuple[bytes, ...]:
            return (b"\x00", *good(value)[1:])  # a wrong byte in the shared fields

        splicer.encoder.segments = bad  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        records = encoder(outputs)
    assert "encode.splice_mismatch" in caplog.text
    for output, record in zip(outputs, decoded(encoder, records), strict=True):
        sealed = {"sealed": None} if "rendered" in output.value else {}  # deliveries only
        assert record == {**output.value, "generation": 0, **sealed}


def test_a_secret_types_deliveries_are_sealed_never_spliced(settings: HeraldSettings) -> None:
    """otp_login (`secret`): the plan job's records hold neither the code nor the number;
    dispatch's `open_delivery` gets both back until the delivery expires."""
    now = datetime.now(UTC)  # sealed until it expires: five minutes from now
    request = admit_request({
        "notification_id": "n-otp", "request_id": "r", "tenant_id": "acme",
        "notification_type": "otp_login", "traffic_class": "transactional",
        "recipients": {"user_ids": ["u-1"], "segment_id": None}, "params": {"code": "551177"},
        "accepted_at": now, "source": "api",
    }, CATALOG, "t:0:1")  # fmt: skip
    contacts = ContactPoints("u-1", phone="+41791234567", phone_verified=True)
    view = UserView("u-1", None, Preferences("u-1"), contacts)
    records, _ = user_records(
        Renderer(CATALOG), request, view, plan_user(CATALOG, request, view, now), now
    )
    encoder = Encoder(settings, make_registry(settings.registry), "plan", CATALOG.secret_types)
    assert all(encoder.splice_parts(o) is None for o in records if "rendered" in o.value)
    out = encoder(records)
    [sms] = [r for r in out if isinstance(r, KafkaRecord) and ".sms." in r.topic]
    assert b"551177" not in sms.value and b"791234567" not in sms.value
    kept = AvroDeserializer(encoder.registry)(sms.value)
    assert kept["address"] is None and kept["sealed"]
    opened, why = open_delivery(Sealer(settings.redis.client()), kept)
    assert why is None and opened is not None and opened["address"] == "+41791234567"
    assert "551177" in opened["rendered"]["body"]
