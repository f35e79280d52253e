"""POST /v1/callbacks/{provider}: verify the provider's signature, append the raw receipt.

    sms_a   Twilio-style status callback (form) + X-Twilio-Signature (HMAC-SHA1, URL + params)
    sms_b   Vonage-style DLR (form, JSON or query) with `sig` + `timestamp` (HMAC / md5hash)
    email   SendGrid-style event webhook (JSON array) + ECDSA P-256 signature and timestamp
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
from typing import Annotated, Any
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from api.problems import ProblemError, problem_responses
from api.signatures import verify_sendgrid, verify_twilio, verify_vonage
from api.state import AppState, now_utc, state_of
from herald.providers import WEBHOOK
from herald.topics import RECEIPTS_RAW

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


def _verify(st: AppState, provider: str, request: Request, body: bytes) -> None:
    """Raise the right problem unless the payload is authentic."""
    secrets = st.providers
    headers = request.headers
    if provider == "sms_a":
        token = secrets.sms_a_token()
        if not token:
            raise _not_configured(st, provider)
        signature = headers.get("x-twilio-signature")
        if not signature:
            raise _reject(st, provider, 401, "missing_signature")
        if not verify_twilio(_public_url(st, request), _form(body), signature, token):
            raise _reject(st, provider, 403, "invalid_signature")
    elif provider == "sms_b":
        secret, method = secrets.sms_b_secret()
        if not secret:
            raise _not_configured(st, provider)
        params = _vonage_params(request, body)
        if not params.get("sig"):
            raise _reject(st, provider, 401, "missing_signature")
        if not verify_vonage(params, secret, method=method, max_age_s=secrets.max_skew_seconds):
            raise _reject(st, provider, 403, "invalid_signature")
    else:
        key = secrets.email_public_key()
        if not key:
            raise _not_configured(st, provider)
        signature, stamp = headers.get(SENDGRID_SIG), headers.get(SENDGRID_TS)
        if not signature or not stamp:
            raise _reject(st, provider, 401, "missing_signature")
        try:
            fresh = abs(time.time() - int(stamp)) <= secrets.max_skew_seconds
        except ValueError:
            fresh = False
        if not fresh:
            raise _reject(st, provider, 403, "stale_timestamp")
        if not verify_sendgrid(key, signature, stamp, body):
            raise _reject(st, provider, 403, "invalid_signature")


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
