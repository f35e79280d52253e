"""Signed status callbacks: `X-Twilio-Signature` = base64(HMAC-SHA1(auth token, the full URL +
for each POST param sorted by name: name + value)). Twilio may sign the URL with or without an
explicit default port, so both forms are tried (as the official helper libraries do)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from herald.providers import CallbackCredentials, CallbackRequest
from sinks.providers.signing import form_params, same_text

__all__ = ["twilio_signature", "verify", "verify_twilio"]

SIGNATURE = "x-twilio-signature"
_DEFAULT_PORTS = {"https": 443, "http": 80}


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
        same_text(twilio_signature(candidate, params, auth_token), signature)
        for candidate in _url_variants(url)
    )


def verify(request: CallbackRequest, credentials: CallbackCredentials, _skew: int) -> str | None:
    """None for an authentic callback; else why not (herald.providers.CallbackCheck). Twilio
    signs no timestamp: replays are harmless (receipts are idempotent per event)."""
    signature = request.headers.get(SIGNATURE)
    if not signature:
        return "missing_signature"
    if not verify_twilio(request.url, form_params(request.body), signature, credentials.secret):
        return "invalid_signature"
    return None
