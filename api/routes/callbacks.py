"""POST /v1/callbacks/{provider}: verify the provider's signature, append the raw receipt.

    sms_a   Twilio-style status callback (form) + X-Twilio-Signature (HMAC-SHA1, URL + params)
    sms_b   Vonage-style DLR (form, JSON or query) with `sig` + `timestamp` (HMAC / md5hash)
    email   SendGrid-style event webhook (JSON array) + ECDSA P-256 signature and timestamp
    others  the check in the provider's folder (its SPEC.callback, sinks/provider_registry.py)
    apns, fcm and anything else → 404 (those providers send no callbacks)

No signature → 401, wrong or stale signature → 403 (both counted in
`herald_api_callbacks_rejected_total{provider,reason}`); a provider without a configured secret
→ 503 so it retries once the secret is set (never accepted unsigned). A verified payload goes
unchanged (body bytes, headers minus auth/cookies, unknown fields kept) to herald.receipts.raw
as a `raw_receipt`; 204 once Kafka acked, 503 if not (providers retry on non-2xx).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from api.problems import ProblemError, problem_responses
from api.signatures import verify_sendgrid, verify_twilio, verify_vonage
from api.state import AppState, now_utc, state_of
from herald.providers import WEBHOOK, CallbackCheck, CallbackRequest
from herald.topics import RECEIPTS_RAW
from sinks.provider_registry import specs

log = logging.getLogger(__name__)
router = APIRouter(tags=["callbacks"])

PROVIDERS = WEBHOOK
_DROP_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key"}
SENDGRID_SIG = "x-twilio-email-event-webhook-signature"
SENDGRID_TS = "x-twilio-email-event-webhook-timestamp"


def _reject(st: AppState, provider: str, status: int, reason: str) -> ProblemError:
    st.metrics.callbacks_rejected.labels(provider, reason).inc()
    log.warning("api.callback_rejected provider=%s reason=%s", provider, reason)
    return ProblemError(status, reason, f"{provider} callback refused: {reason}")


def _not_configured(st: AppState, provider: str) -> ProblemError:
    st.metrics.callbacks_rejected.labels(provider, "not_configured").inc()
    return ProblemError(
        503, "provider_not_configured", f"no signature secret configured for {provider}",
        headers={"Retry-After": "60"},
    )  # fmt: skip


def _form(body: bytes) -> dict[str, str]:
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return {}


def _public_url(st: AppState, request: Request) -> str:
    if st.api.public_base_url:
        query = request.url.query
        return (
            st.api.public_base_url.rstrip("/") + request.url.path + (f"?{query}" if query else "")
        )
    return str(request.url)


def _vonage_params(request: Request, body: bytes) -> dict[str, str]:
    params: dict[str, str] = dict(request.query_params)
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            data: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            params.update({str(k): v if isinstance(v, str) else orjson.dumps(v).decode()
                           for k, v in data.items()})  # fmt: skip
    else:
        params.update(_form(body))
    return params


def _twilio(st: AppState, request: Request, body: bytes) -> str | None:
    token = st.providers.sms_a_token()
    if not token:
        return _NOT_CONFIGURED
    signature = request.headers.get("x-twilio-signature")
    if not signature:
        return "missing_signature"
    if not verify_twilio(_public_url(st, request), _form(body), signature, token):
        return "invalid_signature"
    return None


def _vonage(st: AppState, request: Request, body: bytes) -> str | None:
    secret, method = st.providers.sms_b_secret()
    if not secret:
        return _NOT_CONFIGURED
    params = _vonage_params(request, body)
    if not params.get("sig"):
        return "missing_signature"
    max_age = st.providers.max_skew_seconds
    if not verify_vonage(params, secret, method=method, max_age_s=max_age):
        return "invalid_signature"
    return None


def _sendgrid(st: AppState, request: Request, body: bytes) -> str | None:
    key = st.providers.email_public_key()
    if not key:
        return _NOT_CONFIGURED
    signature, stamp = request.headers.get(SENDGRID_SIG), request.headers.get(SENDGRID_TS)
    if not signature or not stamp:
        return "missing_signature"
    try:
        fresh = abs(time.time() - int(stamp)) <= st.providers.max_skew_seconds
    except ValueError:
        fresh = False
    if not fresh:
        return "stale_timestamp"
    if not verify_sendgrid(key, signature, stamp, body):
        return "invalid_signature"
    return None


Check = Callable[[AppState, Request, bytes], "str | None"]
_NOT_CONFIGURED = "not_configured"
# provider -> its signature check (None: authentic; else why not). The providers whose check
# lives in their own folder (SPEC.callback, sinks/provider_registry.py) are added below.
CHECKS: dict[str, Check] = {"sms_a": _twilio, "sms_b": _vonage, "email": _sendgrid}


def _registered(name: str, check: CallbackCheck) -> Check:
    def verify(st: AppState, request: Request, body: bytes) -> str | None:
        secret = st.providers.secret_for(name, check.secret)
        if not secret:
            return _NOT_CONFIGURED
        headers = {k.lower(): v for k, v in request.headers.items()}
        call = CallbackRequest(_public_url(st, request), headers, dict(request.query_params), body)
        return check.verify(call, secret, st.providers.max_skew_seconds)

    return verify


for _spec in specs():
    if _spec.callback is not None:
        CHECKS[_spec.name] = _registered(_spec.name, _spec.callback)


def _verify(st: AppState, provider: str, request: Request, body: bytes) -> None:
    """Raise the right problem unless the payload is authentic."""
    why = CHECKS[provider](st, request, body)
    if why == _NOT_CONFIGURED:
        raise _not_configured(st, provider)
    if why is not None:
        raise _reject(st, provider, 401 if why == "missing_signature" else 403, why)


@router.post(
    "/v1/callbacks/{provider}",
    status_code=204,
    responses=problem_responses(401, 403, 404, 413, 503),
    summary="Provider delivery receipts (signature verified, stored raw)",
)
async def provider_callback(
    provider: Annotated[str, Path(max_length=32)], request: Request
) -> Response:
    """Verify, append to herald.receipts.raw (acked), answer 204."""
    st = state_of(request)
    if provider not in PROVIDERS:
        raise ProblemError(404, "unknown_provider", "this provider sends no callbacks here")
    body = await request.body()
    _verify(st, provider, request, body)
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS}
    record = {
        "receipt_id": str(uuid.uuid4()),
        "provider": provider,
        "received_at": now_utc(),
        "content_type": request.headers.get("content-type", ""),
        "headers": headers,
        "body": body,
        "signature_valid": True,
        "remote_addr": request.client.host if request.client else None,
    }
    await st.publish(RECEIPTS_RAW, provider, record)
    st.metrics.callbacks.labels(provider).inc()
    return Response(status_code=204)
