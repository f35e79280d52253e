"""An OTP's content and number stay sealed in every record Kafka keeps (herald/sealing.py):
dispatch opens them just before the send, writes its retry sealed again, and a delivery whose
key is gone before it expired becomes a dead letter instead of an empty message."""

from __future__ import annotations

from typing import Any

import pytest

from herald.config import HeraldSettings
from herald.kafka_records import Decoded, KafkaMessage
from herald.sealing import Sealer, key_name, open_delivery, seal_delivery, shred_hour
from infra.simulators.launcher import RunningSimulator
from sinks.dispatch.sink import DispatchSink
from tests.dataflows.helpers import consume, decoder
from tests.sinks.dispatch_helpers import accepted_for, delivery, dispatch_settings, factories

pytestmark = pytest.mark.integration

CODE = "Your login code is 731904"
SMS_TX = "herald.deliveries.sms.transactional"


def dispatch(settings: HeraldSettings, sims: dict[str, RunningSimulator],
             deliveries: list[dict[str, Any]]) -> None:  # fmt: skip
    """One batch through the real sink partition (producing to Kafka)."""
    cfg = dispatch_settings(backoff={"transactional": {"max_attempts": 5}})
    sink = DispatchSink(settings, cfg, factories=factories(sims, settings.redis.url))
    part = sink.build("dispatch", 0, 1)
    try:
        topic = settings.kafka.topic(SMS_TX)
        part.write_batch([Decoded(KafkaMessage(topic, 0, i, d["delivery_id"].encode(), b""), d)
                          for i, d in enumerate(deliveries)])  # fmt: skip
    finally:
        part.close()


def otp(sealer: Sealer) -> dict[str, Any]:
    plain = delivery("sms", rendered={"title": None, "body": CODE, "subject": None, "data": {}})
    return seal_delivery(sealer, plain)  # as the plan job writes it


def test_an_otp_is_sent_opened_and_retried_sealed(
    settings: HeraldSettings, sms_a: RunningSimulator, sms_b: RunningSimulator
) -> None:
    sealer = Sealer(settings.redis.client())
    sealed = otp(sealer)
    assert sealed["address"] is None and sealed["rendered"]["body"] == ""
    sms_a.configure(errors={"500": 1.0})
    sms_b.configure(errors={"500": 1.0})
    dispatch(settings, {"sms_a": sms_a, "sms_b": sms_b}, [sealed])
    [raw] = [v for _k, v in consume(settings, "herald.retry.transactional")]
    assert b"731904" not in raw and b"5550006" not in raw
    retry = decoder(settings)(raw)
    opened, why = open_delivery(sealer, retry)
    assert why is None and opened is not None
    assert (opened["address"], opened["rendered"]["body"]) == ("+15005550006", CODE)

    sms_a.configure(errors={})
    sms_b.configure(errors={})
    dispatch(settings, {"sms_a": sms_a, "sms_b": sms_b}, [{**retry, "next_attempt_at": None}])
    sent = sms_a.stats()["requests"] + sms_b.stats()["requests"]
    assert sent >= 1
    assert accepted_for(sms_a, "+15005550006") + accepted_for(sms_b, "15005550006") == 1


def test_a_sealed_otp_whose_key_is_gone_is_dead_lettered_not_sent(
    settings: HeraldSettings, sms_a: RunningSimulator, sms_b: RunningSimulator
) -> None:
    client = settings.redis.client()
    sealed = otp(Sealer(client))
    client.delete(key_name(shred_hour(sealed["expire_at"]).strftime("%Y%m%d%H")))  # Redis lost it
    dispatch(settings, {"sms_a": sms_a, "sms_b": sms_b}, [sealed])
    letters = [decoder(settings)(v) for _k, v in consume(settings, "herald.dead-letters")]
    assert [(x["reason"], x["delivery_id"]) for x in letters] == [
        ("shredded", sealed["delivery_id"])
    ]
    assert sms_a.stats()["requests"] == sms_b.stats()["requests"] == 0


def test_every_retry_record_is_sealed_whatever_its_type(
    settings: HeraldSettings, sms_a: RunningSimulator, sms_b: RunningSimulator
) -> None:
    """A marketing SMS (not `secret`) deferred for a retry: its number and text are sealed in
    the retry topic, which keeps records longer than the message lives."""
    sms_a.configure(errors={"500": 1.0})
    sms_b.configure(errors={"500": 1.0})
    promo = delivery("sms", notification_type="marketing_campaign", category="marketing",
                     rendered={"title": None, "body": "20% off today", "subject": None,
                               "data": {}})  # fmt: skip
    dispatch(settings, {"sms_a": sms_a, "sms_b": sms_b}, [promo])
    [raw] = [v for _k, v in consume(settings, "herald.retry.transactional")]
    assert b"20% off" not in raw and b"5550006" not in raw
    opened, _ = open_delivery(Sealer(settings.redis.client()), decoder(settings)(raw))
    assert opened is not None and opened["rendered"]["body"] == "20% off today"
