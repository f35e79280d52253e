"""Verification of provider webhook signatures (for `POST /v1/callbacks/{provider}`).

Each function returns True only for an authentic payload and never raises on malformed input.

- Twilio: `X-Twilio-Signature` = base64(HMAC-SHA1(auth token, full URL + for each POST param
  sorted by name: name + value)). Twilio may sign the URL with or without an explicit default
  port, so both forms are tried (as the official helper libraries do).
- Vonage: signed DLRs carry `sig` and `timestamp`; sig = hex HMAC (sha256 default; md5, sha1,
  sha512, or the legacy `md5hash` = md5(params + secret)) over `&name=value` of every other
  param sorted by name, with '&' and '=' inside values replaced by '_'. Compared
  case-insensitively; `max_age_s` bounds the age of `timestamp`.
- SendGrid: `X-Twilio-Email-Event-Webhook-Signature` = base64 DER ECDSA P-256/SHA-256 over the
  `X-Twilio-Email-Event-Webhook-Timestamp` header value + the raw body, checked with the
  base64 DER (SubjectPublicKeyInfo) public key shown in the SendGrid console.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import time
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key

__all__ = ["twilio_signature", "verify_sendgrid", "verify_twilio", "verify_vonage"]

_DEFAULT_PORTS = {"https": 443, "http": 80}


def _same(expected: str, given: str) -> bool:
    """Constant-time equality of two texts; any text (`compare_digest` refuses non-ASCII `str`:
    a header of other characters is simply not the signature)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))


def twilio_signature(url: str, params: Mapping[str, str], auth_token: str) -> str:
    """The X-Twilio-Signature Twilio computes for a POST of `params` to `url`."""
    data = url + "".join(name + params[name] for name in sorted(params))
    mac = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode()


def _url_variants(url: str) -> list[str]:
    parts = urlsplit(url)
    default = _DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    if default is None or not host:
        return [url]
    if parts.port is None:
        other = parts._replace(netloc=f"{parts.netloc}:{default}")
    elif parts.port == default:
        other = parts._replace(netloc=parts.netloc.rsplit(":", 1)[0])
    else:
        return [url]
    return [url, urlunsplit(other)]


def verify_twilio(url: str, params: Mapping[str, str], signature: str, auth_token: str) -> bool:
    """Whether `signature` (X-Twilio-Signature) is Twilio's for this URL and form params."""
    if not signature or not auth_token:
        return False
    return any(
        _same(twilio_signature(candidate, params, auth_token), signature)
        for candidate in _url_variants(url)
    )


_VONAGE_HASHES = {
    "md5": hashlib.md5,
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}


def verify_vonage(
    params: Mapping[str, str],
    secret: str,
    *,
    method: str = "sha256",
    max_age_s: float | None = 300.0,
    now: float | None = None,
) -> bool:
    """Whether the `sig` in a Vonage signed webhook's `params` matches `secret`.

    `max_age_s` rejects a `timestamp` older (or further in the future) than that many seconds;
    None disables the check.
    """
    sig = params.get("sig")
    if not sig or not secret:
        return False
    if max_age_s is not None:
        try:
            stamp = float(params["timestamp"])
        except (KeyError, ValueError):
            return False
        if (
            not math.isfinite(stamp)
            or abs((now if now is not None else time.time()) - stamp) > max_age_s
        ):
            return False
    text = "".join(
        f"&{name}={str(params[name]).replace('&', '_').replace('=', '_')}"
        for name in sorted(params)
        if name != "sig"
    )
    if method == "md5hash":
        expected = hashlib.md5((text + secret).encode()).hexdigest()
    elif method in _VONAGE_HASHES:
        expected = hmac.new(secret.encode(), text.encode(), _VONAGE_HASHES[method]).hexdigest()
    else:
        return False
    return _same(expected.lower(), sig.lower())


def verify_sendgrid(public_key_b64: str, signature_b64: str, timestamp: str, body: bytes) -> bool:
    """Whether a SendGrid Event Webhook POST (raw `body`) is signed by the account's key."""
    try:
        key = load_der_public_key(base64.b64decode(public_key_b64))
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
