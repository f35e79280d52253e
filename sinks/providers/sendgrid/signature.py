"""Signed event webhooks: `X-Twilio-Email-Event-Webhook-Signature` = base64 DER ECDSA
P-256/SHA-256 over the `X-Twilio-Email-Event-Webhook-Timestamp` header value + the raw body,
checked with the public key shown in the SendGrid console (base64 DER SubjectPublicKeyInfo, or
the same as PEM); the timestamp's age is bounded."""

from __future__ import annotations

import base64
import binascii
import time

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from herald.providers import CallbackCredentials, CallbackRequest

__all__ = ["SIGNATURE", "TIMESTAMP", "verify", "verify_sendgrid"]

SIGNATURE = "x-twilio-email-event-webhook-signature"
TIMESTAMP = "x-twilio-email-event-webhook-timestamp"


def verify_sendgrid(public_key_b64: str, signature_b64: str, timestamp: str, body: bytes) -> bool:
    """Whether a SendGrid Event Webhook POST (raw `body`) is signed by the account's key
    (base64 DER or PEM)."""
    try:
        key = (
            load_pem_public_key(public_key_b64.encode())
            if public_key_b64.lstrip().startswith("-----BEGIN")
            else load_der_public_key(base64.b64decode(public_key_b64))
        )
        signature = base64.b64decode(signature_b64, validate=True)
    except (ValueError, binascii.Error):
        return False
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return False
    try:
        key.verify(signature, timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def verify(request: CallbackRequest, credentials: CallbackCredentials, skew: int) -> str | None:
    """None for an authentic, fresh webhook; else why not (herald.providers.CallbackCheck)."""
    signature, stamp = request.headers.get(SIGNATURE), request.headers.get(TIMESTAMP)
    if not signature or not stamp:
        return "missing_signature"
    try:
        fresh = abs(time.time() - int(stamp)) <= skew
    except ValueError:
        fresh = False
    if not fresh:
        return "stale_timestamp"
    if not verify_sendgrid(credentials.secret, signature, stamp, request.body):
        return "invalid_signature"
    return None
