"""The receipts job against real Kafka, Redis and ClickHouse: in-process (bounded) and as the
process `herald up` runs, with out-of-order, duplicated, early and unmatched receipts."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest
import redis
from bytewax.testing import run_main

from dataflows.receipts import ReceiptsSettings, build_flow
from herald import ids, keys
from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from herald.kafka_records import SUPERSEDED
from herald.receipts import address_tag
from herald.sealing import Sealer, open_delivery
from herald.status_keys import counts_key, status_key
from sinks.dispatch.fallback import watch_key
from tests.dataflows.helpers import consume, decoder, encoder, opened, produce
from tests.dataflows.test_accepted import Job, assert_no_job_errors
from tests.schemas.examples import example

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EVENTS = "herald.delivery-events"
RAW = "herald.receipts.raw"


class World:
    """Deliveries and receipts of one test (ids prefixed by the test's topic prefix)."""

    def __init__(self, settings: HeraldSettings) -> None:
        self.settings = settings
        self.p = settings.kafka.topic_prefix
        self.nid = f"{self.p}n"
        self.tenant = f"{self.p}tenant"
        self.enc_event = encoder(settings, EVENTS)
        self.enc_raw = encoder(settings, RAW)
        self.now = datetime.now(UTC).replace(microsecond=0)

    def d(self, name: str) -> str:
        return f"{self.p}{name}"

    def accepted(
        self, name: str, channel: str, provider: str, msg_id: str, user: str = "u-1",
        generation: int = 0, **attributes: str,
    ) -> None:  # fmt: skip
        """dispatch's PROVIDER_ACCEPTED event for delivery `name` (of a DLQ replay generation)."""
        delivery = self.d(name)
        event = {
            "event_id": ids.event_id(delivery, "PROVIDER_ACCEPTED", 1, "", generation),
            "delivery_id": delivery, "generation": generation,
            "notification_id": self.nid, "user_id": user, "tenant_id": self.tenant,
            "notification_type": "order_shipped", "channel": channel, "traffic_class": "normal",
            "state": "PROVIDER_ACCEPTED", "reason": None, "provider": provider,
            "provider_msg_id": msg_id, "attempt": 1, "latency_ms": 250,
            "occurred_at": self.now, "recorded_at": self.now, "attributes": attributes,
        }  # fmt: skip
        produce(self.settings, EVENTS, [(delivery.encode(), self.enc_event(event))])

    def receipt(self, provider: str, body: bytes, ctype: str, **headers: str) -> None:
        record = {
            "receipt_id": f"rc-{time.monotonic_ns()}", "provider": provider,
            "received_at": datetime.now(UTC), "content_type": ctype, "headers": headers,
            "body": body, "signature_valid": True, "remote_addr": None,
        }  # fmt: skip
        produce(self.settings, RAW, [(provider.encode(), self.enc_raw(record))])

    def twilio(self, sid: str, status: str, **extra: str) -> None:
        form = {"MessageSid": sid, "MessageStatus": status, "To": "+15550100", "ApiVersion": "x",
                **extra}  # fmt: skip
        token = f"{sid}:{status}"  # Twilio repeats the token when it repeats a webhook
        self.receipt("sms_a", urlencode(form).encode(), "application/x-www-form-urlencoded",
                     **{"i-twilio-idempotency-token": token})  # fmt: skip

    def sendgrid(self, msg_id: str, delivery: str, *events: str) -> None:
        batch = [
            {"email": "a@example.com", "event": e, "sg_event_id": f"{msg_id}-{e}",
             "sg_message_id": f"{msg_id}.recvd-1-0", "timestamp": int(self.now.timestamp()),
             "delivery_id": self.d(delivery)}
            for e in events
        ]  # fmt: skip
        self.receipt("email", orjson.dumps(batch), "application/json")

    def emitted(self) -> dict[str, list[dict[str, Any]]]:
        """Events this job appended, by delivery id (the PROVIDER_ACCEPTED inputs left out)."""
        decode = decoder(self.settings)
        out: dict[str, list[dict[str, Any]]] = {}
        for _k, value in consume(self.settings, EVENTS):
            event = decode(value)
            if event["attributes"].get("source") == "receipts":
                out.setdefault(event["delivery_id"], []).append(event)
        return out

    def status(self) -> dict[str, str]:
        client = redis.Redis.from_url(self.settings.redis.url)
        try:
            raw = client.hgetall(status_key(self.nid))
        finally:
            client.close()
        return {k.decode(): orjson.loads(v)["state"] for k, v in raw.items()}

    def facts(self) -> list[tuple[str, str, str, str]]:
        client = herald_client(self.settings.clickhouse)
        try:
            rows = client.query(
                "SELECT provider, status, outcome, delivery_id FROM receipt_events FINAL"
                " WHERE receipt_id != '' AND (tenant_id = {t:String} OR (tenant_id = ''"
                " AND provider_msg_id LIKE {p:String})) ORDER BY provider, status, outcome",
                parameters={"t": self.tenant, "p": f"{self.p}%"},
            ).result_rows
        finally:
            client.close()
        return [tuple(r) for r in rows]  # type: ignore[misc]


class FlowJob(Job):
    """`python -m bytewax.run <import_str>` as a real process (Job's stop and output)."""

    def __init__(self, import_str: str, env: dict[str, str], *args: str) -> None:
        argv = [sys.executable, "-m", "bytewax.run", import_str, *args]
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.3)


def test_out_of_order_and_duplicated_receipts_bounded(settings: HeraldSettings) -> None:
    """delivered -> sent -> delivered, and the same SendGrid webhook three times."""
    w = World(settings)
    w.twilio(f"{w.p}SM1", "delivered")  # before its send record: held, then joined
    w.accepted("sms-1", "sms", "sms_a", f"{w.p}SM1")
    w.accepted("mail-1", "email", "email", f"{w.p}MSG1")
    w.twilio(f"{w.p}SM1", "sent")
    w.twilio(f"{w.p}SM1", "delivered")
    for _ in range(3):
        w.sendgrid(f"{w.p}MSG1", "mail-1", "processed", "delivered", "open")
    w.receipt("sms_a", b"\x00garbage", "application/x-www-form-urlencoded")

    run_main(
        build_flow(settings, bounded=True, receipts=ReceiptsSettings()),
        epoch_interval=timedelta(milliseconds=200),
    )

    emitted = w.emitted()
    sms, mail = w.d("sms-1"), w.d("mail-1")
    assert [e["state"] for e in emitted[sms]] == ["DELIVERED"]
    assert [e["state"] for e in emitted[mail]] == ["DELIVERED", "OPENED"]
    assert emitted[sms][0]["event_id"] == ids.event_id(sms, "DELIVERED", 1)
    assert emitted[sms][0]["latency_ms"] is not None
    assert w.status() == {sms: "DELIVERED", mail: "OPENED"}
    facts = w.facts()
    assert ("sms_a", "sent", "stale", sms) in facts
    assert ("sms_a", "delivered", "applied", sms) in facts
    assert [f for f in facts if f[0] == "email"] == [
        ("email", "delivered", "applied", mail),
        ("email", "open", "applied", mail),
        ("email", "processed", "duplicate", mail),  # PROVIDER_ACCEPTED was already the state
    ]
    letters = [decoder(settings)(v) for _k, v in consume(settings, "herald.dead-letters")]
    assert [(d["job"], d["reason"]) for d in letters] == [("receipts", "unparseable_receipt")]


def test_every_push_event_only_moves_the_hot_status_bounded(settings: HeraldSettings) -> None:
    """A push's events, the app's open (READ, recorded by the API from the push's signed URL)
    included, only move its hot status: the job emits nothing for it, so it holds no fold state
    (`_status_only`). A SENDING re-read after the provider's answer changes nothing, and a raw
    receipt from an "app" source (which no route accepts) is a dead letter, not a guess."""
    w = World(settings)
    delivery = w.d("push-1")
    base = {
        "delivery_id": delivery, "generation": 0, "notification_id": w.nid, "user_id": "u-1",
        "tenant_id": w.tenant, "notification_type": "marketing_campaign", "channel": "push",
        "traffic_class": "bulk", "reason": None, "provider": "apns", "provider_msg_id": None,
        "attempt": 1, "latency_ms": 900, "occurred_at": w.now, "recorded_at": w.now,
        "attributes": {},
    }  # fmt: skip

    def event(state: str, **attributes: str) -> tuple[bytes, bytes]:
        value = {**base, "event_id": ids.event_id(delivery, state, 1), "state": state,
                 "attributes": attributes}  # fmt: skip
        if state == "PROVIDER_ACCEPTED":
            value["provider_msg_id"] = f"{w.p}apns-1"
        return delivery.encode(), w.enc_event(value)

    produce(settings, EVENTS, [event("PLANNED"), event("SENDING")])
    run_main(build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))
    assert w.status() == {delivery: "SENDING"}

    opened_read = event("READ", source="app", via="opened")  # api/routes/tracking.py
    produce(settings, EVENTS, [event("PROVIDER_ACCEPTED"), event("SENDING"), opened_read])
    body = orjson.dumps([{"delivery_id": delivery, "event": "opened"}])
    w.receipt("app", body, "application/json")
    run_main(build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))

    assert w.status() == {delivery: "READ"}  # a push opened in the app (herald.states)
    assert w.emitted() == {}
    letters = [decoder(settings)(v) for _k, v in consume(settings, "herald.dead-letters")]
    assert [(d["job"], d["reason"]) for d in letters] == [("receipts", "unknown_provider")]


def test_a_superseded_push_sending_is_dropped_unread_bounded(settings: HeraldSettings) -> None:
    """Dispatch marks a push SENDING produced with its outcome (herald-superseded): receipts
    drops it without decoding it (here its bytes are not even Avro), the outcome moves the
    status from PLANNED, and the counts hold one delivery. A marked event of a channel whose
    SENDING the fold needs is still read."""
    w = World(settings)
    push, sms = w.d("push-2"), w.d("sms-2")

    def event(delivery: str, channel: str, state: str) -> tuple[bytes, bytes]:
        value = {
            "event_id": ids.event_id(delivery, state, 1), "delivery_id": delivery,
            "generation": 0, "notification_id": w.nid, "user_id": "u-1",
            "tenant_id": w.tenant, "notification_type": "marketing_campaign",
            "channel": channel, "traffic_class": "bulk", "state": state, "reason": None,
            "provider": "apns" if channel == "push" else "sms_a",
            "provider_msg_id": f"{delivery}-msg" if state == "PROVIDER_ACCEPTED" else None,
            "attempt": 1, "latency_ms": 5, "occurred_at": w.now, "recorded_at": w.now,
            "attributes": {},
        }  # fmt: skip
        return delivery.encode(), w.enc_event(value)

    marked = [(SUPERSEDED, b"push/SENDING")]
    produce(settings, EVENTS, [
        event(push, "push", "PLANNED"), (push.encode(), b"not avro"),
        event(push, "push", "PROVIDER_ACCEPTED"),
        event(sms, "sms", "PLANNED"), event(sms, "sms", "SENDING"),
        event(sms, "sms", "PROVIDER_ACCEPTED"),
    ], headers=[None, marked, None, None, [(SUPERSEDED, b"sms/SENDING")], None])  # fmt: skip
    run_main(build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))

    assert w.status() == {push: "PROVIDER_ACCEPTED", sms: "PROVIDER_ACCEPTED"}
    client = redis.Redis.from_url(settings.redis.url)
    try:
        counts = client.hgetall(counts_key(w.nid))
    finally:
        client.close()
    assert {k.decode(): int(v) for k, v in counts.items() if int(v)} == {"PROVIDER_ACCEPTED": 2}
    letters = consume(settings, "herald.dead-letters")
    assert [v for _k, v in letters if push.encode() in (v or b"")] == []


def test_hostile_timestamps_neither_stop_the_job_nor_lose_the_receipt_bounded(
    settings: HeraldSettings,
) -> None:
    """Timestamps of 1e20, inf and nan (each once crashed the job on the same offset): each
    receipt is applied at its receive time, and the receipts after them are applied too."""
    w = World(settings)
    w.accepted("mail-1", "email", "email", f"{w.p}MSG1")
    w.accepted("sms-1", "sms", "sms_a", f"{w.p}SM1")
    for stamp, event in ((1e20, "delivered"), ("inf", "open"), ("nan", "click")):
        item = {"email": "a@example.com", "event": event, "sg_event_id": f"{w.p}{event}",
                "sg_message_id": f"{w.p}MSG1.recvd-1-0", "timestamp": stamp,
                "delivery_id": w.d("mail-1")}  # fmt: skip
        w.receipt("email", orjson.dumps([item]), "application/json")
    w.twilio(f"{w.p}SM1", "delivered")

    run_main(
        build_flow(settings, bounded=True, receipts=ReceiptsSettings()),
        epoch_interval=timedelta(milliseconds=200),
    )

    emitted = w.emitted()
    mail = emitted[w.d("mail-1")]
    assert [e["state"] for e in mail] == ["DELIVERED", "OPENED", "CLICKED"]
    assert all(abs(e["occurred_at"] - w.now) < timedelta(minutes=5) for e in mail)
    assert w.status() == {w.d("mail-1"): "CLICKED", w.d("sms-1"): "DELIVERED"}


def test_receipts_join_the_generation_of_the_send_they_answer_bounded(
    settings: HeraldSettings,
) -> None:
    """A delivery sent again by a DLQ replay (generation 1, a new message id): the replay's DLR
    delivers it, a late DLR of the first send is stale, whatever the two inputs' interleaving."""
    w = World(settings)
    w.accepted("sms-1", "sms", "sms_a", f"{w.p}SM1")
    w.accepted("sms-1", "sms", "sms_a", f"{w.p}SM2", generation=1)
    w.twilio(f"{w.p}SM1", "undelivered")
    w.twilio(f"{w.p}SM2", "delivered")
    w.twilio(f"{w.p}SM1", "delivered")  # late, about the first send

    run_main(
        build_flow(settings, bounded=True, receipts=ReceiptsSettings()),
        epoch_interval=timedelta(milliseconds=200),
    )

    sms = w.d("sms-1")
    assert w.status() == {sms: "DELIVERED"}
    delivered = [e for e in w.emitted()[sms] if e["state"] == "DELIVERED"]
    assert [(e["generation"], e["event_id"]) for e in delivered] == [
        (1, ids.event_id(sms, "DELIVERED", 1, "", 1))
    ]
    assert ("sms_a", "delivered", "stale", sms) in w.facts()


def test_dead_address_receipts_disable_the_address_the_message_went_to(
    settings: HeraldSettings,
) -> None:
    """A bounce and a STOP disable that email and that phone; a bounce of an address the user
    has changed since leaves the new one alone."""
    w = World(settings)
    client = redis.Redis.from_url(settings.redis.url)
    ann, bob = w.d("ann"), w.d("bob")
    copies = {
        ann: {"email": {"address": "Ann@Example.com", "verified": True},
              "phone": {"e164": "+15550101", "verified": True}},
        bob: {"email": {"address": "new@example.com", "verified": True}, "phone": None},
    }  # fmt: skip
    for user, fields in copies.items():
        record = {"user_id": user, "devices": [], "updated_at": 0, "version": 3, **fields}
        client.set(keys.contact_points(user), orjson.dumps(record))
    w.accepted("ann-mail", "email", "email", f"{w.p}MSG1", user=ann,
               address_tag=address_tag("ann@example.com", settings.pii.key_bytes()))  # fmt: skip
    w.accepted("ann-sms", "sms", "sms_a", f"{w.p}SM1", user=ann,
               address_tag=address_tag("+15550101", settings.pii.key_bytes()))  # fmt: skip
    w.accepted("bob-mail", "email", "email", f"{w.p}MSG2", user=bob,
               address_tag=address_tag("old@example.com", settings.pii.key_bytes()))  # fmt: skip
    w.sendgrid(f"{w.p}MSG1", "ann-mail", "processed", "bounce")
    w.twilio(f"{w.p}SM1", "undelivered", ErrorCode="21610")  # the recipient replied STOP
    w.sendgrid(f"{w.p}MSG2", "bob-mail", "processed", "bounce")

    run_main(
        build_flow(settings, bounded=True, receipts=ReceiptsSettings()),
        epoch_interval=timedelta(milliseconds=200),
    )

    after = {u: orjson.loads(client.get(keys.contact_points(u))) for u in (ann, bob)}
    client.close()
    assert (after[ann]["email"], after[ann]["phone"]) == (None, None)
    assert after[ann]["disabled"] == ["email", "phone"]
    assert after[ann]["version"] > 3
    assert after[bob] == {"user_id": bob, "devices": [], "updated_at": 0, "version": 3,
                          **copies[bob]}  # fmt: skip
    decode = decoder(settings)
    published = [decode(v) for _k, v in consume(settings, "herald.devices")]
    # one published change per dead address, each a newer version
    assert [r["user_id"] for r in published] == [ann, ann]
    assert 3 < published[0]["version"] < published[1]["version"] == after[ann]["version"]
    assert published[-1]["email"] is None and published[-1]["phone"] is None
    assert w.status() == {w.d("ann-mail"): "FAILED_PERMANENT", w.d("ann-sms"): "FAILED_PERMANENT",
                          w.d("bob-mail"): "FAILED_PERMANENT"}  # fmt: skip


def test_unsubscribe_and_spam_report_opt_out_of_marketing_email(settings: HeraldSettings) -> None:
    """An unsubscribe and a spam report are marketing opt-outs recorded as preference changes
    (the copy and herald.preferences, a newer version, the user's other choices kept); the
    email address stays, so transactional mail still reaches it."""
    w = World(settings)
    client = redis.Redis.from_url(settings.redis.url)
    cat, dan = w.d("cat"), w.d("dan")
    contacts = {"user_id": cat, "devices": [], "phone": None, "updated_at": 0, "version": 3,
                "email": {"address": "cat@example.com", "verified": True}}  # fmt: skip
    client.set(keys.contact_points(cat), orjson.dumps(contacts))
    prefs = {"user_id": cat, "global_opt_out": False, "category_opt_out": [],
             "channel_opt_out": [], "category_channel_opt_out": ["social:sms"],
             "quiet_hours": {"start": "22:00", "end": "07:00"}, "timezone": "Europe/Zurich",
             "locale": "de", "updated_at": 0, "version": 5}  # fmt: skip
    client.set(keys.prefs(cat), orjson.dumps(prefs))
    client.set(keys.users_restored(settings.kafka.topic_prefix), 1)  # dan has no copy: defaults
    w.accepted("cat-mail", "email", "email", f"{w.p}MSG1", user=cat,
               address_tag=address_tag("cat@example.com", settings.pii.key_bytes()))  # fmt: skip
    w.accepted("dan-mail", "email", "email", f"{w.p}MSG2", user=dan,
               address_tag=address_tag("dan@example.com", settings.pii.key_bytes()))  # fmt: skip
    w.sendgrid(f"{w.p}MSG1", "cat-mail", "delivered", "unsubscribe")
    w.sendgrid(f"{w.p}MSG1", "cat-mail", "delivered", "spamreport")  # the same opt-out again
    w.sendgrid(f"{w.p}MSG2", "dan-mail", "delivered", "spamreport")

    run_main(
        build_flow(settings, bounded=True, receipts=ReceiptsSettings()),
        epoch_interval=timedelta(milliseconds=200),
    )

    after = {u: orjson.loads(client.get(keys.prefs(u))) for u in (cat, dan)}
    assert orjson.loads(client.get(keys.contact_points(cat))) == contacts  # the address stays
    client.close()
    assert after[cat]["category_channel_opt_out"] == ["marketing:email", "social:sms"]
    assert {k: v for k, v in after[cat].items()
            if k not in ("category_channel_opt_out", "version", "updated_at")} == {
        k: v for k, v in prefs.items() if k not in ("category_channel_opt_out", "version",
                                                    "updated_at")}  # fmt: skip
    assert after[cat]["version"] > 5
    assert after[dan]["category_channel_opt_out"] == ["marketing:email"]
    assert after[dan]["global_opt_out"] is False and after[dan]["quiet_hours"] is None
    published = [decoder(settings)(v) for _k, v in consume(settings, "herald.preferences")]
    assert sorted(r["user_id"] for r in published) == sorted([cat, dan])  # once per user
    assert all(r["category_channel_opt_out"][0] == "marketing:email" for r in published)
    assert w.status() == {w.d("cat-mail"): "DELIVERED", w.d("dan-mail"): "DELIVERED"}


def test_job_process_holds_expires_and_watches(
    settings: HeraldSettings, subprocess_env: dict[str, str]
) -> None:
    """The real process: early receipt joined, unmatched one dead-lettered (re-drivable),
    DELIVERY_UNKNOWN after the observation window, Vonage DLR joined by its client-ref."""
    env = {
        **subprocess_env, "HERALD_RECEIPTS_HOLD_TTL_S": "2",
        "HERALD_RECEIPTS_OBSERVATION_WINDOWS_S": '{"sms": 3}',
    }  # fmt: skip
    job = FlowJob("dataflows.receipts:build_flow()", env, "-s", "1")
    w = World(settings)
    try:
        w.twilio(f"{w.p}SM2", "delivered")
        w.twilio(f"{w.p}SM-none", "delivered")  # nobody ever sent this
        time.sleep(0.5)
        w.accepted("sms-2", "sms", "sms_a", f"{w.p}SM2")
        w.accepted("sms-3", "sms", "sms_a", f"{w.p}SM3")  # no receipt: DELIVERY_UNKNOWN
        w.accepted("sms-4", "sms", "sms_b", f"{w.p}V4")
        dlr = {"messageId": f"{w.p}V4-part2", "status": "delivered", "err-code": "0",
               "client-ref": w.d("sms-4"), "msisdn": "447700900000"}  # fmt: skip
        w.receipt("sms_b", urlencode(dlr).encode(), "application/x-www-form-urlencoded")

        expected = {w.d("sms-2"): "DELIVERED", w.d("sms-3"): "DELIVERY_UNKNOWN",
                    w.d("sms-4"): "DELIVERED"}  # fmt: skip
        wait_for(lambda: w.status() == expected)
        letters: list[dict[str, Any]] = []

        def unmatched() -> bool:
            letters[:] = [
                decoder(settings)(v) for _k, v in consume(settings, "herald.dead-letters")
            ]
            return bool(letters)

        wait_for(unmatched)
        assert job.proc.poll() is None, "the job keeps running"
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    [letter] = letters
    assert (letter["reason"], letter["source_topic"]) == (
        "receipt_unmatched",
        settings.kafka.topic(RAW),
    )
    again = decoder(settings)(opened(settings, letter["value"]))  # the receipt, to re-drive
    assert again["provider"] == "sms_a" and b"SM-none" in again["body"]
    unknown = w.emitted()[w.d("sms-3")]
    assert [(e["state"], e["reason"]) for e in unknown] == [
        ("DELIVERY_UNKNOWN", "no_receipt_in_window")
    ]
    wait_for(lambda: ("sms_a", "delivered", "unmatched", "") in w.facts())


PUSH_CONTENT = {"channel": "push", "locale": "en", "template_version": 1,
                "rendered": {"title": "Login code", "body": "Your code is 424242",
                             "subject": None, "data": {}}}  # fmt: skip


def test_a_late_failure_falls_back_to_the_next_step_once(settings: HeraldSettings) -> None:
    """An OTP the SMS provider accepted, then reported undelivered: the type's fallback (push,
    to the user's device) follows once, as at send time; a second failure receipt adds
    nothing, and the kept delivery is gone."""
    w = World(settings)
    client = redis.Redis.from_url(settings.redis.url)
    user, did = w.d("eve"), w.d("otp")
    device = {"device_id": "dev-eve", "platform": "apns", "token": "a" * 64, "app_id": None,
              "registered_at": 0, "valid": True, "verified": True}  # fmt: skip
    contacts = {"user_id": user, "devices": [device], "phone": None, "email": None,
                "updated_at": 0, "version": 3}  # fmt: skip
    client.set(keys.contact_points(user), orjson.dumps(contacts))
    source = {
        **example("delivery"), "delivery_id": did, "notification_id": w.nid, "user_id": user,
        "tenant_id": w.tenant, "notification_type": "otp_login", "category": "transactional",
        "traffic_class": "transactional", "channel": "sms", "provider": "sms_a",
        "address": "+15550100", "platform": None, "attempt": 1, "next_attempt_at": None,
        "not_before": None, "expire_at": datetime.now(UTC) + timedelta(minutes=5),
        "fallback": ["push"], "fallback_content": [PUSH_CONTENT],
    }  # fmt: skip
    kept = encoder(settings, "herald.deliveries.sms.transactional")(source)
    client.set(watch_key(did), kept)  # as dispatch keeps an accepted delivery with a fallback
    w.accepted("otp", "sms", "sms_a", f"{w.p}SM9", user=user)
    w.twilio(f"{w.p}SM9", "undelivered", ErrorCode="30003")
    w.twilio(f"{w.p}SM9", "undelivered", ErrorCode="30005")  # a second failure: no second one

    run_main(
        build_flow(settings, bounded=True, receipts=ReceiptsSettings()),
        epoch_interval=timedelta(milliseconds=200),
    )

    decode = decoder(settings)
    raw = [v for _k, v in consume(settings, "herald.deliveries.push.transactional")]
    assert all(b"424242" not in v for v in raw)  # an OTP's content is kept sealed
    pushes = [open_delivery(Sealer(client), decode(v))[0] or {} for v in raw]
    assert [(d["user_id"], d["address"], d["rendered"]["body"]) for d in pushes] == [
        (user, "a" * 64, "Your code is 424242")
    ]
    assert pushes[0]["delivery_id"] == ids.delivery_id(w.nid, user, "push", "dev-eve")
    events = [decode(v) for _k, v in consume(settings, EVENTS)]
    planned = [e for e in events if e["delivery_id"] == pushes[0]["delivery_id"]]
    assert [(e["state"], e["attributes"]["fallback_cause"]) for e in planned] == [
        ("PLANNED", "receipt:twilio_30003")
    ]
    assert w.status()[did] == "FAILED_PERMANENT"
    assert client.get(watch_key(did)) is None
    client.close()
