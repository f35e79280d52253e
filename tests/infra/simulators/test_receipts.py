"""Receipts: signed, delayed, duplicated and out-of-order callbacks from the SMS/email sims."""

from __future__ import annotations

from typing import Any

import httpx

from infra.simulators.launcher import RunningSimulator
from infra.simulators.recorder import CallbackRecorder
from sinks.providers.sendgrid.signature import verify_sendgrid
from sinks.providers.twilio.signature import verify_twilio
from sinks.providers.vonage.signature import verify_vonage

FAST = {"delay": {"kind": "fixed", "ms": 20}, "step_ms": 150}


def twilio_send(sim: RunningSimulator, to: str, callback: str | None = None) -> str:
    creds = sim.credentials()
    form = {"To": to, "From": "+15005550006", "Body": "hello"}
    if callback:
        form["StatusCallback"] = callback
    resp = httpx.post(
        f"{sim.base_url}/2010-04-01/Accounts/{creds['account_sid']}/Messages.json",
        data=form,
        auth=(creds["account_sid"], creds["auth_token"]),
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["sid"])


def test_twilio_status_callbacks_signed_in_order(
    sms_a: RunningSimulator, recorder: CallbackRecorder
) -> None:
    sms_a.configure(receipts=FAST)
    sid = twilio_send(sms_a, "+447700900100")
    got = recorder.wait_for(2)
    url = recorder.url("/v1/callbacks/sms_a")
    token = sms_a.credentials()["auth_token"]
    assert [r.form()["MessageStatus"] for r in got] == ["sent", "delivered"]
    for r in got:
        form = r.form()
        assert form["MessageSid"] == sid and form["AccountSid"].startswith("AC")
        assert verify_twilio(url, form, r.headers["x-twilio-signature"], token)
        assert not verify_twilio(
            url, {**form, "MessageStatus": "read"}, r.headers["x-twilio-signature"], token
        )


def test_one_messages_callbacks_stay_in_order_behind_a_slow_first_one(
    sms_a: RunningSimulator,
) -> None:
    """The first callback is taken only after three step gaps: the second waits for its answer
    instead of overtaking it (on a busy machine a first connection was once slower than the
    gap, and "delivered" arrived before "sent")."""
    sms_a.configure(receipts=FAST)
    with CallbackRecorder(slow_first_s=3 * FAST["step_ms"] / 1000) as slow:  # type: ignore[operator]
        twilio_send(sms_a, "+447700900101", callback=slow.url("/v1/callbacks/sms_a"))
        got = slow.wait_for(2)
    assert [r.form()["MessageStatus"] for r in got] == ["sent", "delivered"]


def test_twilio_duplicated_and_out_of_order(
    sms_a: RunningSimulator, recorder: CallbackRecorder
) -> None:
    sms_a.configure(
        receipts={
            **FAST,
            "duplicate": 1.0,
            "out_of_order": 1.0,
            "outcomes": {"undelivered:30003": 1.0},
        }
    )
    twilio_send(sms_a, "+447700900101")
    got = recorder.wait_for(4)
    statuses = [r.form()["MessageStatus"] for r in got]
    assert statuses == ["undelivered", "undelivered", "sent", "sent"]
    assert got[0].form()["ErrorCode"] == "30003"
    # a repeated status carries the same idempotency token, as Twilio's webhook retries do
    assert (
        got[0].headers["i-twilio-idempotency-token"] == got[1].headers["i-twilio-idempotency-token"]
    )
    assert sms_a.stats()["callbacks"]["duplicated"] == 2


def test_twilio_status_callback_param_overrides_default(
    sms_a: RunningSimulator, recorder: CallbackRecorder
) -> None:
    sms_a.configure(receipts={**FAST, "outcomes": {"failed:30008": 1.0}})
    url = recorder.url("/v1/callbacks/sms_a?delivery=d-9")
    twilio_send(sms_a, "+447700900102", callback=url)
    got = recorder.wait_for(1)
    assert got[0].path == "/v1/callbacks/sms_a?delivery=d-9"
    assert got[0].form()["MessageStatus"] == "failed"
    token = sms_a.credentials()["auth_token"]
    assert verify_twilio(url, got[0].form(), got[0].headers["x-twilio-signature"], token)


def vonage_send(sim: RunningSimulator, text: str = "hello", ref: str = "d-1") -> dict[str, Any]:
    creds = sim.credentials()
    resp = httpx.post(
        f"{sim.base_url}/sms/json",
        data={
            "api_key": creds["api_key"],
            "api_secret": creds["api_secret"],
            "to": "447700900200",
            "from": "Herald",
            "text": text,
            "client-ref": ref,
        },
    )
    assert resp.status_code == 200
    result: dict[str, Any] = resp.json()
    return result


def test_vonage_dlrs_signed_per_part(sms_b: RunningSimulator, recorder: CallbackRecorder) -> None:
    sms_b.configure(receipts={**FAST, "outcomes": {"delivered:0": 1.0}})
    reply = vonage_send(sms_b, text="x" * 200)  # two parts → two DLR sequences
    assert reply["message-count"] == "2"
    assert {m["status"] for m in reply["messages"]} == {"0"}
    got = recorder.wait_for(4)
    secret = sms_b.credentials()["signature_secret"]
    ids = {m["message-id"] for m in reply["messages"]}
    for r in got:
        dlr = r.form()
        assert dlr["messageId"] in ids and dlr["client-ref"] == "d-1"
        assert verify_vonage(dlr, secret)
        assert not verify_vonage({**dlr, "status": "failed"}, secret)
    assert sorted(r.form()["status"] for r in got) == ["accepted"] * 2 + ["delivered"] * 2


def test_vonage_json_dlrs_out_of_order(sms_b: RunningSimulator, recorder: CallbackRecorder) -> None:
    sms_b.configure(
        dlr_format="json",
        receipts={**FAST, "out_of_order": 1.0, "outcomes": {"failed:9": 1.0}},
    )
    vonage_send(sms_b)
    got = recorder.wait_for(2)
    dlrs = [r.json() for r in got]
    assert [d["status"] for d in dlrs] == ["failed", "accepted"]  # final before intermediate
    assert dlrs[0]["err-code"] == "9"
    secret = sms_b.credentials()["signature_secret"]
    assert all(verify_vonage(d, secret) for d in dlrs)


def mail(sim: RunningSimulator, to: str, delivery_id: str) -> httpx.Response:
    return httpx.post(
        f"{sim.base_url}/v3/mail/send",
        json={
            "personalizations": [
                {"to": [{"email": to}], "custom_args": {"delivery_id": delivery_id}}
            ],
            "from": {"email": "noreply@herald.dev"},
            "subject": "s",
            "content": [{"type": "text/plain", "value": "hello"}],
        },
        headers={"authorization": f"Bearer {sim.credentials()['api_key']}"},
    )


def events(recorder: CallbackRecorder, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(50):
        out = [e for r in recorder.requests for e in r.json()]
        if len(out) >= n:
            break
        recorder.wait_for(len(recorder.requests) + 1, timeout=2)
    return out


def test_sendgrid_event_webhook_batches_are_signed(
    email: RunningSimulator, recorder: CallbackRecorder
) -> None:
    email.configure(unregistered=["gone@example.com"], receipts={**FAST, "batch_ms": 30})
    assert mail(email, "ok@example.com", "d-ok").status_code == 202
    assert mail(email, "gone@example.com", "d-gone").status_code == 202
    got = events(recorder, 4)
    public_key = email.credentials()["webhook_public_key"]
    for r in recorder.requests:
        sig = r.headers["x-twilio-email-event-webhook-signature"]
        stamp = r.headers["x-twilio-email-event-webhook-timestamp"]
        assert verify_sendgrid(public_key, sig, stamp, r.body)
        assert not verify_sendgrid(public_key, sig, stamp, r.body + b" ")
    by_id = {(e["delivery_id"], e["event"]) for e in got}
    assert by_id == {
        ("d-ok", "processed"),
        ("d-ok", "delivered"),
        ("d-gone", "processed"),
        ("d-gone", "bounce"),
    }


def test_sendgrid_duplicates_keep_event_id_and_can_reorder(
    email: RunningSimulator, recorder: CallbackRecorder
) -> None:
    email.configure(receipts={**FAST, "batch_ms": 30, "duplicate": 1.0, "out_of_order": 1.0})
    mail(email, "dup@example.com", "d-dup")
    got = events(recorder, 4)
    assert [e["event"] for e in got] == ["delivered", "delivered", "processed", "processed"]
    assert got[0]["sg_event_id"] == got[1]["sg_event_id"] != got[2]["sg_event_id"]
