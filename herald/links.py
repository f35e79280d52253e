"""Signed links Herald sends: email open pixels, click redirects and one-click unsubscribes,
and the "opened" URL in a push's data.

    token = base64url(JSON claims) "." base64url(HMAC-SHA256(secret, kind + "|" + claims))

Kinds: "o" open, "c" click, "p" push opened, "u" unsubscribe, "i" an end user's inbox token
(claims `t` tenant_id, `u` user_id, `e` expiry in epoch seconds: api/auth.py). Open, click and
push claims: `d` delivery_id, `n` notification_id, `u` user_id, `t` tenant_id, `y` notification
type, `c` traffic class, and for clicks `l` the target URL (http/https only). Unsubscribe
claims: `u` user_id and `k` the "category:channel" opt-out it records. The kind is part of the
MAC, so an open token cannot be replayed as a click or an unsubscribe. A click redirects only to
the URL inside a valid token: there is no URL parameter, so the endpoint is never an open
redirect.

The secret and the public base URL of the API are `herald.config.LinksSettings` (the API
verifies, dispatch signs: sinks/providers/sendgrid/client.py tracks every email's links and opens
and puts the unsubscribe link in marketing mail, with RFC 8058's `List-Unsubscribe` and
`List-Unsubscribe-Post` headers; the APNs and FCM clients put `herald_opened` in the push).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson

Kind = Literal["o", "c", "p", "u", "i"]
MAX_TOKEN = 4096
# the claims every token of a kind carries
_REQUIRED: dict[str, str] = {"o": "dnu", "c": "dnu", "p": "dnu", "u": "uk", "i": "tue"}


class BadToken(ValueError):
    """The token is malformed, tampered with, or carries an unsafe URL."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def safe_url(url: str) -> bool:
    """Only absolute http(s) URLs with a host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc) and "\\" not in url


def sign(secret: bytes, kind: Kind, claims: dict[str, str]) -> str:
    """A token of `kind` carrying `claims`."""
    if kind == "c" and not safe_url(claims.get("l", "")):
        raise BadToken("click target must be an absolute http(s) URL")
    body = orjson.dumps(claims, option=orjson.OPT_SORT_KEYS)
    mac = hmac.new(secret, kind.encode() + b"|" + body, hashlib.sha256).digest()
    return f"{_b64(body)}.{_b64(mac)}"


def verify(secret: bytes, kind: Kind, token: str) -> dict[str, Any]:
    """The claims of a valid token; raises BadToken otherwise."""
    if len(token) > MAX_TOKEN or token.count(".") != 1:
        raise BadToken("malformed token")
    body_b64, mac_b64 = token.split(".")
    try:
        body, mac = _unb64(body_b64), _unb64(mac_b64)
    except (binascii.Error, ValueError):
        raise BadToken("malformed token") from None
    expected = hmac.new(secret, kind.encode() + b"|" + body, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise BadToken("bad signature")
    try:
        claims = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadToken("malformed claims") from None
    required = _REQUIRED[kind]
    if not isinstance(claims, dict) or not all(isinstance(claims.get(k), str) for k in required):
        raise BadToken("missing claims")
    if kind == "c" and not safe_url(str(claims.get("l", ""))):
        raise BadToken("unsafe target")
    return claims


def _claims(delivery: Mapping[str, Any]) -> dict[str, str]:
    return {
        "d": str(delivery["delivery_id"]), "n": str(delivery["notification_id"]),
        "u": str(delivery["user_id"]), "t": str(delivery.get("tenant_id") or ""),
        "y": str(delivery.get("notification_type") or ""),
        "c": str(delivery.get("traffic_class") or ""),
    }  # fmt: skip


def open_pixel_url(base_url: str, secret: bytes, delivery: Mapping[str, Any]) -> str:
    """`<base>/t/o/<token>.gif` for one email delivery."""
    return f"{base_url.rstrip('/')}/t/o/{sign(secret, 'o', _claims(delivery))}.gif"


def click_url(base_url: str, secret: bytes, delivery: Mapping[str, Any], target: str) -> str:
    """`<base>/t/c/<token>` redirecting to `target`."""
    return f"{base_url.rstrip('/')}/t/c/{sign(secret, 'c', {**_claims(delivery), 'l': target})}"


def unsubscribe_url(base_url: str, secret: bytes, user_id: str, entry: str) -> str:
    """`<base>/v1/unsubscribe/<token>`: records the opt-out `entry` ("marketing:email") of
    `user_id` when POSTed (RFC 8058 one-click; api/routes/unsubscribe.py)."""
    return f"{base_url.rstrip('/')}/v1/unsubscribe/{sign(secret, 'u', {'u': user_id, 'k': entry})}"


def push_opened_url(base_url: str, secret: bytes, delivery: Mapping[str, Any]) -> str:
    """`<base>/t/p/<token>`: the app POSTs it when the user opens the push (READ, reason
    opened); dispatch puts it into the push's data as `herald_opened`."""
    return f"{base_url.rstrip('/')}/t/p/{sign(secret, 'p', _claims(delivery))}"
