"""Receipt normalization per provider, the per-delivery fold and the hot-status compare-and-set."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herald import ids, states
from herald.delivery_fold import (
    DeadAddress,
    DeliveryFold,
    Emit,
    Fact,
    FoldConfig,
    MsgJoin,
    Unmatched,
)
from herald.receipts import (
    BadReceipt,
    ReceiptEvent,
    address_tag,
    joins_by_message_id,
    kills_address,
    normalize,
    opts_out,
)
from herald.status_keys import (
    StatusUpdate,
    allowed_sources,
    counts_key,
    status_key,
    write_statuses,
)
from sinks.provider_registry import register_receipt_formats

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CFG = FoldConfig(hold_ttl=timedelta(minutes=10), state_ttl=timedelta(days=1))


@pytest.fixture(scope="module", autouse=True)
def _provider_formats() -> None:
    """The providers' receipt formats live in their folders (sinks/providers/<vendor>/);
    the receipts job registers them when it starts, and so do these tests."""
    register_receipt_formats()


def raw(provider: str, body: bytes, content_type: str = "", **headers: str) -> dict[str, Any]:
    return {
        "receipt_id": "rc-1", "provider": provider, "received_at": NOW,
        "content_type": content_type, "headers": headers, "body": body,
        "signature_valid": True, "remote_addr": None,
    }  # fmt: skip


def twilio(status: str, sid: str = "SM1", **extra: str) -> dict[str, Any]:
    form = {"MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status,
            "AccountSid": "AC1", "From": "+15550001", "To": "+15550002", "ApiVersion": "2010-04-01",
            **extra}  # fmt: skip
    return raw("sms_a", urlencode(form).encode(), "application/x-www-form-urlencoded")


# -- normalization ---------------------------------------------------------------------------


def test_twilio_status_callback() -> None:
    [ev] = normalize(twilio("undelivered", ErrorCode="30003", NewField="kept"))
    assert (ev.provider_msg_id, ev.state, ev.reason) == ("SM1", "FAILED_PERMANENT", "twilio_30003")
    assert ev.attributes["error_code"] == "30003"
    assert ev.attributes["x.NewField"] == "kept"  # unknown fields are kept
    assert "+1555" not in orjson.dumps(ev.attributes).decode()  # phone numbers are not
    assert ev.provider_event_id.startswith("sha256:")
    # the same callback again (another receive time) is the same event
    again = {**twilio("undelivered", ErrorCode="30003", NewField="kept"), "received_at": NOW}
    assert normalize(again)[0].provider_event_id == ev.provider_event_id
    assert normalize(twilio("delivered"))[0].provider_event_id != ev.provider_event_id


def test_a_replayed_twilio_callback_with_another_unsigned_token_is_the_same_event() -> None:
    body = twilio("sent")
    body["headers"] = {"i-twilio-idempotency-token": "tok-9"}
    [ev] = normalize(body)
    assert ev.headers == {"i-twilio-idempotency-token": "tok-9"}  # kept for re-driving
    replay = {**twilio("sent"), "headers": {"i-twilio-idempotency-token": "forged-1"}}
    assert normalize(replay)[0].provider_event_id == ev.provider_event_id
    assert normalize(twilio("sent"))[0].provider_event_id == ev.provider_event_id


def test_vonage_dlr_form_and_json() -> None:
    dlr = {"messageId": "0A1", "status": "failed", "err-code": "3", "msisdn": "447700900000",
           "message-timestamp": "2026-03-01 11:59:00", "client-ref": "d-1", "sig": "x",
           "network-code": "23410", "extra": "yes"}  # fmt: skip
    [form] = normalize(raw("sms_b", urlencode(dlr).encode(), "application/x-www-form-urlencoded"))
    [js] = normalize(raw("sms_b", orjson.dumps(dlr), "application/json"))
    for ev in (form, js):
        assert (ev.provider_msg_id, ev.delivery_hint) == ("0A1", "d-1")
        assert (ev.state, ev.reason) == ("FAILED_PERMANENT", "vonage_err_3")
        assert ev.occurred_at == datetime(2026, 3, 1, 11, 59, tzinfo=UTC)
        assert "sig" not in str(ev.attributes) and "447700" not in str(ev.attributes)
        assert ev.attributes["x.extra"] == "yes"
    assert form.provider_event_id == js.provider_event_id
    unknown = {**dlr, "status": "unknown", "err-code": "1"}
    [ev] = normalize(raw("sms_b", urlencode(unknown).encode()))
    assert ev.state == "DELIVERY_UNKNOWN"  # the carrier never said: unknown, not failed


def test_sendgrid_batch_holds_many_events() -> None:
    base = {"email": "a@example.com", "sg_message_id": "MSG1.recvd-abc-1-0", "delivery_id": "d-1"}
    batch = [
        {**base, "event": "processed", "sg_event_id": "e1", "timestamp": 1772366400},
        {**base, "event": "delivered", "sg_event_id": "e2", "timestamp": 1772366401},
        {**base, "event": "click", "sg_event_id": "e3", "url": "https://x.test/a", "new": 1},
        {**base, "event": "spamreport", "sg_event_id": "e4"},
    ]
    events = normalize(raw("email", orjson.dumps(batch), "application/json"))
    assert [e.state for e in events] == ["PROVIDER_ACCEPTED", "DELIVERED", "CLICKED", None]
    assert {e.provider_msg_id for e in events} == {"MSG1"}  # the X-Message-Id prefix
    assert {e.delivery_hint for e in events} == {"d-1"}
    assert [e.provider_event_id for e in events] == [f"sendgrid:e{i}" for i in range(1, 5)]
    assert events[1].occurred_at == datetime.fromtimestamp(1772366401, UTC)
    assert "link_hash" in events[2].attributes and events[2].attributes["x.new"] == "1"
    assert "example.com" not in str([e.attributes for e in events])
    assert orjson.loads(events[1].payload) == [batch[1]]  # each event keeps its own payload


def sendgrid(*events: dict[str, Any]) -> list[ReceiptEvent]:
    base = {"email": "a@example.com", "sg_message_id": "MSG1.recvd-abc-1-0", "timestamp": 1}
    batch = [{**base, "sg_event_id": f"e{i}", **e} for i, e in enumerate(events)]
    return normalize(raw("email", orjson.dumps(batch), "application/json"))


def test_dead_address_receipts_per_provider() -> None:
    bounce, blocked, spam, unsub, dropped = sendgrid(
        {"event": "bounce"}, {"event": "bounce", "type": "blocked"}, {"event": "spamreport"},
        {"event": "unsubscribe"}, {"event": "dropped"},
    )  # fmt: skip
    assert [kills_address(e) for e in (bounce, blocked, spam, unsub, dropped)] == [
        True, False, False, False, False,  # blocked: the receiving server's policy
    ]  # fmt: skip
    # a spam report or an unsubscribe is a marketing opt-out, the address still works
    assert [opts_out(e) for e in (bounce, blocked, spam, unsub, dropped)] == [
        False, False, True, True, False,
    ]  # fmt: skip
    [stop] = normalize(twilio("undelivered", ErrorCode="21610"))
    [carrier] = normalize(twilio("undelivered", ErrorCode="30003"))  # unreachable handset: retry
    assert kills_address(stop) and not kills_address(carrier)
    form = {"messageId": "M1", "status": "failed", "err-code": "9", "msisdn": "15550002"}
    body = urlencode(form).encode()
    [illegal] = normalize(raw("sms_b", body, "application/x-www-form-urlencoded"))
    assert illegal.reason == "vonage_err_9" and kills_address(illegal)


def test_address_tag_is_short_stable_and_case_folds_email() -> None:
    key = b"k1"
    assert address_tag("A@Example.com", key) == address_tag(" a@example.com", key)
    assert address_tag("A@Example.com", key) != address_tag("b@x.io", key)
    assert len(address_tag("+15550100", key)) == 8
    assert address_tag("+15550100", key) != address_tag("+1555", key)
    # keyed: without the key, trying every phone number gives nothing back
    assert address_tag("+15550100", key) != address_tag("+15550100", b"k2")
    assert address_tag("+15550100", key) != hashlib.sha256(b"+15550100").hexdigest()[:8]


def test_internal_events_carry_the_delivery() -> None:
    [ev] = normalize(raw("inbox", orjson.dumps({"delivery_id": "d-9", "event": "read"})))
    assert (ev.delivery_hint, ev.state, ev.provider_msg_id) == ("d-9", "READ", None)
    # a push's open is no receipt: the app POSTs the push's signed URL (api/routes/tracking.py)
    with pytest.raises(BadReceipt, match="no receipt format"):
        normalize(raw("app", orjson.dumps([{"delivery_id": "d-8", "event": "opened"}])))


@pytest.mark.parametrize(
    ("provider", "body", "reason"),
    [
        ("fax", b"x", "unknown_provider"),
        ("sms_a", b"", "empty_receipt"),
        ("sms_a", b"MessageSid=SM1", "unparseable_receipt"),
        ("email", b"[not json", "unparseable_receipt"),
        ("email", b"[]", "empty_receipt"),
        ("email", b"[1]", "unparseable_receipt"),
        ("sms_b", b"\xff\xfe", "unparseable_receipt"),
        ("inbox", b'{"event": "read"}', "unparseable_receipt"),
    ],
)
def test_bad_receipts_raise_with_a_reason(provider: str, body: bytes, reason: str) -> None:
    with pytest.raises(BadReceipt) as err:
        normalize(raw(provider, body))
    assert err.value.reason == reason


# -- fold --------------------------------------------------------------------------------------


def event(state: str, at: datetime = NOW, **changes: Any) -> dict[str, Any]:
    return {
        "event_id": ids.event_id("d-1", state, 1), "delivery_id": "d-1", "notification_id": "n-1",
        "user_id": "u-1", "tenant_id": "t-1", "notification_type": "order_shipped",
        "channel": "sms", "traffic_class": "normal", "state": state, "reason": None,
        "provider": "sms_a", "provider_msg_id": "SM1", "attempt": 1, "latency_ms": 500,
        "occurred_at": at, "recorded_at": at, "attributes": {}, **changes,
    }  # fmt: skip


def receipt(
    status: str, event_id: str, at: datetime = NOW, generation: int | None = None
) -> ReceiptEvent:
    [ev] = normalize(twilio(status))
    return replace(ev, provider_event_id=event_id, occurred_at=at, generation=generation)


def emitted(out: list[Any]) -> list[str]:
    return [o.event["state"] for o in out if isinstance(o, Emit)]


def statuses(out: list[Any]) -> list[str]:
    return [o.state for o in out if isinstance(o, StatusUpdate)]


def outcomes(out: list[Any]) -> list[str]:
    return [o.row["outcome"] for o in out if isinstance(o, Fact)]


def test_delivered_sent_delivered_never_regresses() -> None:
    fold = DeliveryFold()
    fold.on_event(event("PROVIDER_ACCEPTED"), NOW, CFG)
    later = NOW + timedelta(seconds=3)
    out = fold.on_receipt(receipt("delivered", "e-d"), later, CFG)
    assert emitted(out) == ["DELIVERED"] and outcomes(out) == ["applied"]
    [emit] = [o for o in out if isinstance(o, Emit)]
    assert emit.event["event_id"] == ids.event_id("d-1", "DELIVERED", 1)
    assert emit.event["latency_ms"] == 500 and emit.event["attributes"]["raw_receipt_id"] == "rc-1"
    out = fold.on_receipt(receipt("sent", "e-s"), later, CFG)
    assert emitted(out) == [] and outcomes(out) == ["stale"]
    out = fold.on_receipt(receipt("delivered", "e-d"), later, CFG)  # the same webhook again
    assert out == []
    out = fold.on_receipt(receipt("delivered", "e-d2"), later, CFG)  # another copy, new id
    assert outcomes(out) == ["duplicate"]
    assert fold.state is states.State.DELIVERED
    # our own DELIVERED event read back from the topic changes nothing
    assert fold.on_event(emit.event, later, CFG) == []


def test_receipt_before_any_event_is_held_then_applied() -> None:
    fold = DeliveryFold()
    assert fold.on_receipt(receipt("delivered", "e-d"), NOW, CFG) == []
    assert fold.next_at() == NOW + CFG.hold_ttl
    out = fold.on_event(event("PROVIDER_ACCEPTED"), NOW, CFG)
    assert statuses(out) == ["PROVIDER_ACCEPTED", "DELIVERED"] and emitted(out) == ["DELIVERED"]


def test_held_receipt_expires_unmatched() -> None:
    fold = DeliveryFold()
    fold.on_receipt(receipt("delivered", "e-d"), NOW, CFG)
    assert fold.on_timer(NOW + timedelta(minutes=5), CFG) == []
    [gone] = fold.on_timer(NOW + CFG.hold_ttl, CFG)
    assert isinstance(gone, Unmatched) and fold.expired(NOW + CFG.hold_ttl)


def test_observation_window_gives_delivery_unknown_then_a_late_receipt_resolves_it() -> None:
    cfg = FoldConfig(windows={"sms": timedelta(seconds=30)})
    fold = DeliveryFold()
    fold.on_event(event("PROVIDER_ACCEPTED"), NOW, cfg)
    assert fold.next_at() == NOW + timedelta(seconds=30)
    assert fold.on_timer(NOW + timedelta(seconds=29), cfg) == []
    out = fold.on_timer(NOW + timedelta(seconds=30), cfg)
    assert emitted(out) == ["DELIVERY_UNKNOWN"]
    [emit] = [o for o in out if isinstance(o, Emit)]
    assert emit.event["reason"] == "no_receipt_in_window"
    out = fold.on_receipt(receipt("delivered", "e-late"), NOW + timedelta(minutes=5), cfg)
    assert emitted(out) == ["DELIVERED"]


def test_premature_open_waits_for_delivered() -> None:
    fold = DeliveryFold()
    email = {"channel": "email", "provider": "email"}
    fold.on_event(event("PROVIDER_ACCEPTED", **email), NOW, CFG)
    out = fold.on_event(event("OPENED", channel="email", provider=None), NOW, CFG)  # pixel
    assert statuses(out) == [] and fold.state is states.State.PROVIDER_ACCEPTED
    out = fold.on_event(event("DELIVERED", **email), NOW, CFG)
    assert statuses(out) == ["DELIVERED", "OPENED"] and emitted(out) == []  # both already on topic


def test_several_premature_events_are_all_resolved() -> None:
    fold = DeliveryFold()
    email = {"channel": "email", "provider": "email"}
    fold.on_event(event("PROVIDER_ACCEPTED", **email), NOW, CFG)
    for state in ("CLICKED", "OPENED"):  # clicked first: opened is stale once clicked
        fold.on_event(event(state, **email), NOW, CFG)
    out = fold.on_event(event("DELIVERED", **email), NOW, CFG)
    assert statuses(out) == ["DELIVERED", "CLICKED"] and fold.pending == []


def test_unmappable_receipt_is_kept_and_counted() -> None:
    fold = DeliveryFold()
    fold.on_event(event("PROVIDER_ACCEPTED"), NOW, CFG)
    out = fold.on_receipt(receipt("read", "e-r"), NOW, CFG)  # sms has no read signal
    assert outcomes(out) == ["unmappable"] and fold.state is states.State.PROVIDER_ACCEPTED


def test_bounce_names_the_address_the_message_went_to() -> None:
    tag = address_tag("a@example.com", b"k1")
    sent = {"channel": "email", "provider": "email", "provider_msg_id": "MSG1"}
    tagged = event("PROVIDER_ACCEPTED", attributes={"address_tag": tag}, **sent)
    fold = DeliveryFold()
    fold.on_event(tagged, NOW, CFG)
    bounce, again = sendgrid({"event": "bounce"}, {"event": "bounce"})
    out = fold.on_receipt(bounce, NOW, CFG)
    assert emitted(out) == ["FAILED_PERMANENT"]
    assert [o for o in out if isinstance(o, DeadAddress)] == [
        DeadAddress("u-1", "email", tag, "bounce")
    ]
    assert not any(isinstance(o, DeadAddress) for o in fold.on_receipt(bounce, NOW, CFG))  # dup
    untagged = DeliveryFold()  # sent before dispatch tagged addresses: nothing to compare with
    untagged.on_event(event("PROVIDER_ACCEPTED", **sent), NOW, CFG)
    assert not any(isinstance(o, DeadAddress) for o in untagged.on_receipt(again, NOW, CFG))
    delivered = DeliveryFold()
    delivered.on_event(tagged, NOW, CFG)
    [ok] = sendgrid({"event": "delivered"})
    assert not any(isinstance(o, DeadAddress) for o in delivered.on_receipt(ok, NOW, CFG))


def test_msg_join_holds_until_the_send_record() -> None:
    join = MsgJoin()
    ev = receipt("delivered", "e-d")
    assert join.on_receipt(ev, NOW, CFG) == []
    sent = replace(ev, generation=1)  # stamped with the generation of the send it answers
    assert join.on_accepted("d-1", 1, NOW, CFG) == [("d-1", sent)]
    assert join.on_receipt(ev, NOW, CFG) == [("d-1", sent)]
    assert not join.expired(NOW) and join.expired(NOW + CFG.state_ttl)
    del join.generation  # as restored from a snapshot taken before generations existed
    assert join.snapshot().on_receipt(ev, NOW, CFG) == [("d-1", replace(ev, generation=0))]
    late = MsgJoin()
    late.on_receipt(ev, NOW, CFG)
    assert late.on_timer(NOW + CFG.hold_ttl) == [Unmatched(ev)] and late.expired(NOW)


def test_a_replay_generation_supersedes_the_failed_one_and_earlier_sends_are_stale() -> None:
    fold = DeliveryFold()
    fold.on_event(event("SENDING"), NOW, CFG)
    out = fold.on_event(event("FAILED_PERMANENT", reason="retries_exhausted"), NOW, CFG)
    assert statuses(out) == ["FAILED_PERMANENT"]
    assert fold.on_receipt(receipt("delivered", "e-1", generation=1), NOW, CFG) == []  # held
    replay = {"generation": 1, "provider_msg_id": "SM2"}
    out = fold.on_event(event("SENDING", **replay), NOW, CFG)  # the DLQ replay's first event
    assert statuses(out) == ["SENDING", "DELIVERED"] and fold.held == []
    assert {o.generation for o in out if isinstance(o, StatusUpdate)} == {1}
    [emit] = [o.event for o in out if isinstance(o, Emit)]
    assert emit["generation"] == 1
    assert emit["event_id"] == ids.event_id("d-1", "DELIVERED", 1, "", 1)
    assert emit["event_id"] != ids.event_id("d-1", "DELIVERED", 1)
    assert fold.on_event(event("RETRY_SCHEDULED"), NOW, CFG) == []  # generation 0, late
    out = fold.on_receipt(receipt("failed", "e-0", generation=0), NOW, CFG)  # the first send's
    assert outcomes(out) == ["stale"] and statuses(out) == []
    assert fold.state is states.State.DELIVERED


def test_fold_from_a_snapshot_before_generations_is_generation_0() -> None:
    import pickle

    fold = DeliveryFold()
    fold.on_event(event("FAILED_PERMANENT"), NOW, CFG)
    assert fold.ctx is not None
    del fold.ctx.generation  # as restored from a snapshot taken before the field existed
    restored = pickle.loads(pickle.dumps(fold.snapshot()))
    assert restored.on_event(event("SENDING"), NOW, CFG) == []
    assert statuses(restored.on_event(event("SENDING", generation=1), NOW, CFG)) == ["SENDING"]


def test_state_ttl_is_short_once_nothing_can_change() -> None:
    fold = DeliveryFold()
    fold.on_event(event("PROVIDER_ACCEPTED"), NOW, CFG)
    assert fold.idle_until == NOW + CFG.state_ttl  # still waiting for a receipt
    fold.on_receipt(receipt("delivered", "e-d"), NOW, CFG)
    assert fold.idle_until == NOW + CFG.final_ttl  # sms: nothing after DELIVERED
    assert fold.expired(NOW + CFG.final_ttl)


def test_fold_state_survives_a_snapshot() -> None:
    import pickle

    fold = DeliveryFold()
    fold.on_event(event("PROVIDER_ACCEPTED"), NOW, CFG)
    fold.on_receipt(receipt("delivered", "e-d"), NOW, CFG)
    copy = pickle.loads(pickle.dumps(fold.snapshot()))
    assert (
        copy.state is states.State.DELIVERED
        and copy.on_receipt(receipt("delivered", "e-d"), NOW, CFG) == []
    )


# -- hot status --------------------------------------------------------------------------------


def test_status_layout_matches_the_api() -> None:
    from api.status import status_entry as api_entry
    from herald import keys

    assert status_key("n-1") == keys.status("n-1")
    update = StatusUpdate("n-1", "d-1", "DELIVERED", "sms", "u-1", NOW, "x", "sms_a")
    assert update.entry() == api_entry(
        state="DELIVERED", channel="sms", user_id="u-1", updated_at=NOW, reason="x",
        provider="sms_a",
    )  # fmt: skip
    assert "PROVIDER_ACCEPTED" in allowed_sources("sms", "DELIVERED")
    assert "DELIVERED" not in allowed_sources("sms", "PROVIDER_ACCEPTED")


@pytest.fixture
def redis_client(stack: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.settings.redis.url)
    yield client
    client.close()


@pytest.mark.integration
def test_status_compare_and_set_never_goes_backwards(redis_client: redis.Redis) -> None:
    nid = f"n-{ids.notification_id('t', str(datetime.now(UTC)))}"

    def put(state: str) -> bool:
        [ok] = write_statuses(redis_client, [StatusUpdate(nid, "d-1", state, "sms", "u", NOW)])
        return ok

    assert put("PLANNED") and put("PROVIDER_ACCEPTED") and put("DELIVERED")
    assert not put("PROVIDER_ACCEPTED")  # late `sent`
    assert not put("DELIVERED")  # duplicate
    assert not put("READ")  # sms has no read signal
    stored = orjson.loads(redis_client.hget(status_key(nid), "d-1"))  # type: ignore[arg-type]
    assert stored["state"] == "DELIVERED"
    assert 0 < redis_client.ttl(status_key(nid)) <= 30 * 24 * 3600


@pytest.mark.integration
def test_a_push_opened_before_its_answer_is_recorded_stays_read(redis_client: redis.Redis) -> None:
    """A push's READ (the app's open) may reach the hot status before dispatch's answer for it:
    it replaces PLANNED, and the late PROVIDER_ACCEPTED changes nothing, as the receipts fold
    did when it held a premature open. An email's open still waits for its delivery (the receipts
    fold holds it until then)."""
    nid = f"n-{ids.notification_id('t', str(datetime.now(UTC)))}"

    def put(delivery: str, state: str, channel: str) -> bool:
        [ok] = write_statuses(redis_client, [StatusUpdate(nid, delivery, state, channel, "u", NOW)])
        return ok

    assert put("d-push", "PLANNED", "push") and put("d-push", "READ", "push")
    assert not put("d-push", "PROVIDER_ACCEPTED", "push") and not put("d-push", "SENDING", "push")
    assert put("d-email", "PLANNED", "email") and not put("d-email", "OPENED", "email")
    stored = orjson.loads(redis_client.hget(status_key(nid), "d-push"))  # type: ignore[arg-type]
    assert stored["state"] == "READ"
    counts = {k.decode(): int(v) for k, v in redis_client.hgetall(counts_key(nid)).items()}
    assert {k: v for k, v in counts.items() if v} == {"READ": 1, "PLANNED": 1}


@pytest.mark.integration
def test_status_of_a_later_generation_supersedes_any_earlier_state(
    redis_client: redis.Redis,
) -> None:
    nid = f"n-{ids.notification_id('t', str(datetime.now(UTC)))}"

    def put(state: str, generation: int) -> bool:
        update = StatusUpdate(nid, "d-1", state, "sms", "u", NOW, generation=generation)
        [ok] = write_statuses(redis_client, [update])
        return ok

    # an entry written before generations existed: generation 0
    legacy = {"state": "FAILED_PERMANENT", "channel": "sms", "user_id": "u", "updated_at": "x"}
    redis_client.hset(status_key(nid), "d-1", orjson.dumps(legacy))
    assert not put("PROVIDER_ACCEPTED", 0)  # FAILED_PERMANENT is final within a generation
    assert put("SENDING", 1)  # a DLQ replay's first event
    assert not put("FAILED_PERMANENT", 0)  # a late event of the first generation
    assert put("PROVIDER_ACCEPTED", 1) and put("DELIVERED", 1)
    assert not put("SENDING", 1)  # within a generation the rank rules hold
    stored = orjson.loads(redis_client.hget(status_key(nid), "d-1"))  # type: ignore[arg-type]
    assert (stored["state"], stored["generation"]) == ("DELIVERED", 1)


@pytest.mark.integration
def test_the_status_script_reads_state_and_generation_of_any_entry(
    redis_client: redis.Redis,
) -> None:
    """The compare-and-set reads state and generation of any entry: another writer's key order,
    or a user id spelling a generation, never changes the answer."""
    nid = f"n-{ids.notification_id('t', str(datetime.now(UTC)))}"

    def put(delivery: str, state: str, generation: int = 0, user: str = "u") -> bool:
        update = StatusUpdate(nid, delivery, state, "sms", user, NOW, generation=generation)
        [ok] = write_statuses(redis_client, [update])
        return ok

    foreign = {"generation": 2, "user_id": "u", "state": "DELIVERED", "channel": "sms"}
    redis_client.hset(status_key(nid), "d-1", orjson.dumps(foreign))
    assert not put("d-1", "PROVIDER_ACCEPTED", 2) and not put("d-1", "FAILED_PERMANENT", 1)
    assert put("d-1", "SENDING", 3)
    spelled = 'u","generation":9}'
    assert put("d-2", "PROVIDER_ACCEPTED", 0, user=spelled)
    assert put("d-2", "DELIVERED", 0, user=spelled)  # generation 0, not 9
    stored = orjson.loads(redis_client.hget(status_key(nid), "d-2"))  # type: ignore[arg-type]
    assert (stored["state"], stored["user_id"]) == ("DELIVERED", spelled)


# -- hostile input ---------------------------------------------------------------------------

_HOSTILE = st.one_of(
    st.sampled_from([1e20, float("inf"), float("-inf"), float("nan"), -1, 10**30, True, "",
                     "1e20", "inf", "nan", "x" * 5000, "\x00\ud800", None]),
    st.text(max_size=30), st.integers(), st.floats(), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)  # fmt: skip
_FIELDS = {
    "sms_a": ["MessageSid", "MessageStatus", "ErrorCode", "To", "SmsStatus", "RawDlrDoneDate"],
    "sms_b": ["messageId", "status", "err-code", "message-timestamp", "scts", "client-ref"],
    "email": ["event", "sg_message_id", "sg_event_id", "timestamp", "delivery_id", "reason",
              "status", "url", "type", "category", "asm_group_id"],
    "inbox": ["delivery_id", "event", "event_id", "occurred_at"],
}  # fmt: skip
_VALID = {
    "sms_a": {"MessageSid": "SM1", "MessageStatus": "delivered"},
    "sms_b": {"messageId": "m1", "status": "delivered"},
    "email": {"event": "delivered", "sg_message_id": "x.y"},
    "inbox": {"delivery_id": "d", "event": "read"},
}


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(provider=st.sampled_from(sorted(_FIELDS)), data=st.data(), as_form=st.booleans())
def test_any_field_value_is_an_event_or_bad_receipt_never_a_crash(
    provider: str, data: st.DataObject, as_form: bool
) -> None:
    """Whatever a signed provider puts in a field (numbers beyond any date, nan, nesting, lone
    surrogates), normalize gives events with a real instant or raises BadReceipt: the receipts
    job dead-letters it and goes on (it once crash-looped on a timestamp of 1e20)."""
    names = data.draw(st.lists(st.sampled_from(_FIELDS[provider]), unique=True))
    item = {**_VALID[provider], **{name: data.draw(_HOSTILE) for name in names}}
    if as_form and provider in ("sms_a", "sms_b"):
        texts = {k: v if isinstance(v, str) else json.dumps(v) for k, v in item.items()}
        body = urlencode(texts, errors="surrogatepass").encode()
        ctype = "application/x-www-form-urlencoded"
    else:
        body, ctype = json.dumps([item]).encode("utf-8", "surrogatepass"), "application/json"
    try:
        events = normalize(raw(provider, body, ctype))
    except BadReceipt:
        return
    assert all(1970 <= ev.occurred_at.year <= 9999 for ev in events)


def test_only_receipts_that_name_the_message_are_joined_by_its_id() -> None:
    """The receipts job keeps a PROVIDER_ACCEPTED for a later receipt only where one can come
    by message id (SMS carriers, email): push has no receipts and the inbox names the delivery,
    so a push campaign leaves no join state behind."""
    from dataflows.receipts import _accepted_key

    assert [p for p in ("sms_a", "sms_b", "email", "apns", "fcm", "inbox")
            if joins_by_message_id(p)] == ["sms_a", "sms_b", "email"]  # fmt: skip
    accepted = {"state": "PROVIDER_ACCEPTED", "delivery_id": "d-1", "provider_msg_id": "m-1"}
    assert _accepted_key({**accepted, "provider": "apns"}) is None
    assert _accepted_key({**accepted, "provider": "sms_a"}) == ("sms_a|m-1", ("pa", ("d-1", 0)))


def test_a_push_holds_no_fold_state() -> None:
    """Every event of a push only moves its hot status in the receipts job (no receipt can come
    for it: its open is an event with its context), so a campaign leaves no state per delivery;
    every channel with receipts is folded."""
    from dataflows.receipts import _status_only

    push = ("PLANNED", "SENDING", "PROVIDER_ACCEPTED", "FAILED_PERMANENT", "READ")
    assert all(_status_only({"channel": "push", "state": s}) for s in push)
    assert not any(_status_only({"channel": c, "state": s}) for c in ("sms", "email", "inapp")
                   for s in ("PLANNED", "SENDING", "PROVIDER_ACCEPTED"))  # fmt: skip
