"""Provider callbacks: signatures verified (forged → 401/403, counted), raw payload kept."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest

from api.app import create_app
from api.settings import ProviderSecrets
from herald.config import HeraldSettings
from infra.simulators.receipts import sign_sendgrid, sign_twilio, sign_vonage
from tests.api.conftest import (
    EMAIL_KEYS,
    SMS_A_TOKEN,
    SMS_B_SECRET,
    RunningApi,
    make_api_settings,
    make_tenants,
    read_topic,
    serve,
)


def test_twilio_status_callback_is_kept_raw(api: RunningApi) -> None:
    url = f"{api.url}/v1/callbacks/sms_a"
    params = {"MessageSid": "SM1", "MessageStatus": "delivered", "To": "+41791234567",
              "NewField": "kept"}  # fmt: skip
    body = urlencode(params).encode()
    headers = {"content-type": "application/x-www-form-urlencoded",
               "x-twilio-signature": sign_twilio(SMS_A_TOKEN, url, params),
               "authorization": "Basic c2VjcmV0"}  # fmt: skip
    with api.client(key=None) as http:
        resp = http.post("/v1/callbacks/sms_a", content=body, headers=headers)
    assert resp.status_code == 204, resp.text
    [(key, receipt)] = api.read_topic("herald.receipts.raw", 1)
    assert key == "sms_a" and receipt["body"] == body and receipt["signature_valid"] is True
    assert receipt["headers"]["x-twilio-signature"] == headers["x-twilio-signature"]
    assert "authorization" not in receipt["headers"]
    assert receipt["content_type"] == "application/x-www-form-urlencoded"


@pytest.mark.parametrize("fmt", ["form", "json"])
def test_vonage_dlr(api: RunningApi, fmt: str) -> None:
    dlr = {"msisdn": "41791234567", "messageId": "m-1", "status": "delivered", "err-code": "0",
           "timestamp": str(int(time.time())), "extra": "x"}  # fmt: skip
    dlr["sig"] = sign_vonage(SMS_B_SECRET, dlr, "sha256")
    if fmt == "json":
        body, ctype = json.dumps(dlr).encode(), "application/json"
    else:
        body, ctype = urlencode(dlr).encode(), "application/x-www-form-urlencoded"
    with api.client(key=None) as http:
        ok = http.post("/v1/callbacks/sms_b", content=body, headers={"content-type": ctype})
        forged = dict(dlr, status="failed")
        bad = http.post("/v1/callbacks/sms_b", content=urlencode(forged).encode(),
                        headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert ok.status_code == 204, ok.text
    assert bad.status_code == 403 and bad.json()["code"] == "invalid_signature"
    [(_, receipt)] = api.read_topic("herald.receipts.raw", 1, settle=1.0)
    assert receipt["body"] == body


def test_sendgrid_events(api: RunningApi) -> None:
    body = json.dumps([{"email": "a@b.ch", "event": "delivered", "sg_event_id": "e1",
                        "custom_field": {"nested": True}}]).encode()  # fmt: skip
    stamp = str(int(time.time()))
    headers = {"content-type": "application/json",
               "x-twilio-email-event-webhook-timestamp": stamp,
               "x-twilio-email-event-webhook-signature":
                   sign_sendgrid(EMAIL_KEYS.private_pem, stamp, body)}  # fmt: skip
    with api.client(key=None) as http:
        assert http.post("/v1/callbacks/email", content=body, headers=headers).status_code == 204
        tampered = body.replace(b"delivered", b"bounce")
        resp = http.post("/v1/callbacks/email", content=tampered, headers=headers)
        assert resp.status_code == 403
        old = dict(headers, **{"x-twilio-email-event-webhook-timestamp": "1000000000"})
        assert http.post("/v1/callbacks/email", content=body, headers=old).status_code == 403
    [(_, receipt)] = api.read_topic("herald.receipts.raw", 1, settle=1.0)
    assert json.loads(receipt["body"])[0]["custom_field"] == {"nested": True}


def test_forged_and_unsigned_are_rejected_and_counted(api: RunningApi) -> None:
    params = {"MessageSid": "SM1", "MessageStatus": "delivered"}
    form = {"content-type": "application/x-www-form-urlencoded"}
    with api.client(key=None) as http:
        unsigned = http.post("/v1/callbacks/sms_a", content=urlencode(params), headers=form)
        forged = http.post(
            "/v1/callbacks/sms_a", content=urlencode(params),
            headers={**form, "x-twilio-signature": sign_twilio("wrong", "http://x", params)},
        )  # fmt: skip
        metrics = http.get("/metrics").text
    assert unsigned.status_code == 401 and unsigned.json()["code"] == "missing_signature"
    assert forged.status_code == 403 and forged.json()["code"] == "invalid_signature"
    assert 'provider="sms_a",reason="invalid_signature"} 1.0' in metrics
    assert 'provider="sms_a",reason="missing_signature"} 1.0' in metrics


def test_non_ascii_signatures_and_non_finite_timestamps_are_403_not_500(api: RunningApi) -> None:
    params = {"MessageSid": "SM1", "MessageStatus": "delivered"}
    form = {"content-type": "application/x-www-form-urlencoded"}
    dlr = {"messageId": "m-1", "status": "delivered", "timestamp": "nan"}
    dlr["sig"] = sign_vonage(SMS_B_SECRET, dlr, "sha256")  # signed, but of no instant
    with api.client(key=None) as http:
        twilio = http.post("/v1/callbacks/sms_a", content=urlencode(params),
                           headers={**form, "x-twilio-signature": "sïgné".encode()})  # fmt: skip
        vonage = http.post("/v1/callbacks/sms_b", content=urlencode(dict(dlr, sig="é")),
                           headers=form)  # fmt: skip
        stale = http.post("/v1/callbacks/sms_b", content=urlencode(dlr), headers=form)
        email = http.post("/v1/callbacks/email", content=b"[]", headers={
            "x-twilio-email-event-webhook-timestamp": str(int(time.time())),
            "x-twilio-email-event-webhook-signature": "ÿÿ".encode("latin-1")})  # fmt: skip
    for resp in (twilio, vonage, stale, email):
        assert resp.status_code == 403, resp.text
        assert resp.json()["code"] in ("invalid_signature", "stale_timestamp")


@pytest.mark.parametrize("provider", ["apns", "fcm", "nope"])
def test_providers_without_callbacks_are_404(api: RunningApi, provider: str) -> None:
    with api.client(key=None) as http:
        resp = http.post(f"/v1/callbacks/{provider}", content=b"{}")
    assert resp.status_code == 404 and resp.json()["code"] == "unknown_provider"


def test_real_simulator_callbacks_verify_with_its_own_secrets(
    settings: HeraldSettings, tmp_path: Path
) -> None:
    """sms_a and sms_b simulators post signed receipts; the API reads their credentials.json."""
    from infra.simulators.launcher import start_simulator

    sims = tmp_path / "simulators"
    app = create_app(
        settings, api=make_api_settings(), providers=ProviderSecrets(simulator_dir=sims),
        tenants=make_tenants(),
    )  # fmt: skip
    for url in serve(app):
        with (
            start_simulator("sms_a", sims / "sms_a") as twilio,
            start_simulator("sms_b", sims / "sms_b", callback_url=f"{url}/v1/callbacks/sms_b")
            as vonage,
        ):  # fmt: skip
            creds = twilio.credentials()
            sid, token = creds["account_sid"], creds["auth_token"]
            resp = httpx.post(
                f"{twilio.base_url}/2010-04-01/Accounts/{sid}/Messages.json",
                data={"To": "+41791234567", "From": "+15005550006", "Body": "hi",
                      "StatusCallback": f"{url}/v1/callbacks/sms_a"},
                auth=(sid, token),
            )  # fmt: skip
            assert resp.status_code == 201, resp.text
            v = vonage.credentials()
            resp = httpx.post(
                f"{vonage.base_url}/sms/json",
                data={"api_key": v["api_key"], "api_secret": v["api_secret"], "from": "Herald",
                      "to": "41791234567", "text": "hi", "status-report-req": "1"},
            )  # fmt: skip
            assert resp.status_code == 200, resp.text
            receipts = read_topic(settings, "herald.receipts.raw", 4, timeout=20)
    providers = sorted(k for k, _ in receipts)
    assert providers == ["sms_a", "sms_a", "sms_b", "sms_b"], providers
    assert all(r["signature_valid"] for _, r in receipts)
