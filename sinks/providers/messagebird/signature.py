"""Signed status reports: `MessageBird-Signature` is the hex HMAC-SHA256, under the signing
key, of `MessageBird-Request-Timestamp` (Unix seconds), a dot and the request body; the
timestamp must be within the API's allowed skew."""

from __future__ import annotations

import hashlib
import hmac
import time

from herald.providers import CallbackCredentials, CallbackRequest

__all__ = ["signature", "verify"]

SIGNATURE = "messagebird-signature"
TIMESTAMP = "messagebird-request-timestamp"


def signature(key: str, timestamp: str, body: bytes) -> str:
    """The signature of one report."""
    return hmac.new(key.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(
    request: CallbackRequest, credentials: CallbackCredentials, max_skew_s: int
) -> str | None:
    """None for an authentic, fresh report; else why not (herald.providers.CallbackCheck)."""
    given, stamp = request.headers.get(SIGNATURE), request.headers.get(TIMESTAMP)
    if not given or not stamp:
        return "missing_signature"
    try:
        fresh = abs(time.time() - int(stamp)) <= max_skew_s
    except ValueError:
        fresh = False
    if not fresh:
        return "stale_timestamp"
    try:
        same = hmac.compare_digest(
            signature(credentials.secret, stamp, request.body), given.lower()
        )
    except (TypeError, UnicodeEncodeError):  # non-ASCII header value
        same = False
    return None if same else "invalid_signature"
