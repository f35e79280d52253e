"""Signed delivery receipts: a DLR (form, JSON or query string) carries `sig` and `timestamp`;
sig = hex HMAC (sha256 by default; md5, sha1, sha512, or the legacy `md5hash` = md5(params +
secret)) over `&name=value` of every other param sorted by name, with '&' and '=' inside values
replaced by '_'. Compared case-insensitively; the timestamp's age is bounded. The method is the
check's setting `signature_method` (the account's choice in Vonage's dashboard)."""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Mapping
from typing import Any

import orjson

from herald.providers import CallbackCredentials, CallbackRequest
from sinks.providers.signing import form_params, same_text

__all__ = ["DEFAULT_METHOD", "params_of", "verify", "verify_vonage"]

DEFAULT_METHOD = "sha256"
_HASHES = {"md5": hashlib.md5, "sha1": hashlib.sha1, "sha256": hashlib.sha256,
           "sha512": hashlib.sha512}  # fmt: skip


def verify_vonage(
    params: Mapping[str, str],
    secret: str,
    *,
    method: str = DEFAULT_METHOD,
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
    elif method in _HASHES:
        expected = hmac.new(secret.encode(), text.encode(), _HASHES[method]).hexdigest()
    else:
        return False
    return same_text(expected.lower(), sig.lower())


def params_of(request: CallbackRequest) -> dict[str, str]:
    """A DLR's params: the query string, and the body's fields (JSON object or form)."""
    params: dict[str, str] = dict(request.query)
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            data: Any = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            params.update({str(k): v if isinstance(v, str) else orjson.dumps(v).decode()
                           for k, v in data.items()})  # fmt: skip
    else:
        params.update(form_params(request.body))
    return params


def verify(request: CallbackRequest, credentials: CallbackCredentials, skew: int) -> str | None:
    """None for an authentic, fresh DLR; else why not (herald.providers.CallbackCheck)."""
    params = params_of(request)
    if not params.get("sig"):
        return "missing_signature"
    method = credentials.settings.get("signature_method") or DEFAULT_METHOD
    if not verify_vonage(params, credentials.secret, method=method, max_age_s=skew):
        return "invalid_signature"
    return None
