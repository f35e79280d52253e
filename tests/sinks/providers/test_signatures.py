"""Webhook signature verification with the providers' documented algorithms."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sinks.providers.sendgrid.signature import verify_sendgrid
from sinks.providers.twilio.signature import twilio_signature, verify_twilio
from sinks.providers.vonage.signature import verify_vonage

# The example from Twilio's "Webhooks security" documentation.
TWILIO_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TWILIO_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+12349013030",
    "Digits": "1234",
    "From": "+12349013030",
    "To": "+18005551212",
}


def test_twilio_documented_example() -> None:
    assert twilio_signature(TWILIO_URL, TWILIO_PARAMS, "12345") == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert verify_twilio(TWILIO_URL, TWILIO_PARAMS, "0/KCTR6DLpKmkAf8muzZqo1nDgQ=", "12345")


def test_twilio_rejects_tampering_and_accepts_default_port_variant() -> None:
    sig = twilio_signature(TWILIO_URL, TWILIO_PARAMS, "12345")
    assert not verify_twilio(TWILIO_URL, {**TWILIO_PARAMS, "Digits": "0000"}, sig, "12345")
    assert not verify_twilio(TWILIO_URL, TWILIO_PARAMS, sig, "54321")
    assert not verify_twilio(TWILIO_URL, TWILIO_PARAMS, "", "12345")
    with_port = "https://mycompany.com:443/myapp.php?foo=1&bar=2"
    assert verify_twilio(with_port, TWILIO_PARAMS, sig, "12345")


def _vonage_sig(params: dict[str, str], secret: str) -> str:
    text = "".join(f"&{k}={params[k].replace('&', '_').replace('=', '_')}" for k in sorted(params))
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest().upper()


def test_vonage_hmac_sha256_case_insensitive_and_fresh() -> None:
    now = time.time()
    params = {
        "messageId": "m-1",
        "status": "delivered",
        "msisdn": "447700900000",
        "client-ref": "a=b&c",
        "timestamp": str(int(now)),
    }
    signed = {**params, "sig": _vonage_sig(params, "s3cret")}
    assert verify_vonage(signed, "s3cret")
    assert not verify_vonage(signed, "other")
    assert not verify_vonage({**signed, "status": "failed"}, "s3cret")
    assert not verify_vonage(signed, "s3cret", now=now + 3600)  # stale timestamp
    assert verify_vonage(signed, "s3cret", max_age_s=None, now=now + 3600)
    assert not verify_vonage(params, "s3cret")  # unsigned
    md5 = hashlib.md5(
        (
            "".join(f"&{k}={v}" for k, v in sorted({"a": "1", "timestamp": str(int(now))}.items()))
            + "s3cret"
        ).encode()
    ).hexdigest()
    assert verify_vonage(
        {"a": "1", "timestamp": str(int(now)), "sig": md5}, "s3cret", method="md5hash"
    )


def test_sendgrid_ecdsa_over_timestamp_and_body() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    public_b64 = base64.b64encode(
        key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    ).decode()
    body, stamp = b'[{"event":"delivered","sg_event_id":"x"}]', "1700000000"
    sig = base64.b64encode(key.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))).decode()
    assert verify_sendgrid(public_b64, sig, stamp, body)
    assert not verify_sendgrid(public_b64, sig, "1700000001", body)
    assert not verify_sendgrid(public_b64, sig, stamp, body.replace(b"delivered", b"bounce"))
    assert not verify_sendgrid(public_b64, "not base64!", stamp, body)
    assert not verify_sendgrid("garbage", sig, stamp, body)
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert verify_sendgrid(pem.decode(), sig, stamp, body)  # the console's key, as PEM
    assert not verify_sendgrid("-----BEGIN PUBLIC KEY-----\nbroken", sig, stamp, body)
