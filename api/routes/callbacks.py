"""POST /v1/callbacks/{provider}: verify the provider's signature, append the raw receipt.

    sms_a, sms_b, sms_c, email   the check in the provider's folder (its SPEC.callback,
                                 sinks/providers/<vendor>/signature.py; the secret and settings
                                 it is given: ProviderSecrets.credentials_for, api/settings.py)
    apns, fcm and anything else  404 (those providers send no callbacks)

No signature → 401, wrong or stale signature → 403 (both counted in
`herald_api_callbacks_rejected_total{provider,reason}`); a provider without a configured secret
→ 503 so it retries once the secret is set (never accepted unsigned). A verified payload goes
unchanged (body bytes, headers minus auth/cookies, unknown fields kept) to herald.receipts.raw
as a `raw_receipt`; 204 once Kafka acked, 503 if not (providers retry on non-2xx).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from api.problems import ProblemError, problem_responses
from api.state import AppState, now_utc, state_of
from herald.providers import WEBHOOK, CallbackCheck, CallbackRequest
from herald.topics import RECEIPTS_RAW
from sinks.provider_registry import specs

log = logging.getLogger(__name__)
router = APIRouter(tags=["callbacks"])

PROVIDERS = WEBHOOK
_DROP_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key"}


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


def _public_url(st: AppState, request: Request) -> str:
    if st.api.public_base_url:
        query = request.url.query
        return (
            st.api.public_base_url.rstrip("/") + request.url.path + (f"?{query}" if query else "")
        )
    return str(request.url)


Check = Callable[[AppState, Request, bytes], "str | None"]
_NOT_CONFIGURED = "not_configured"


def _registered(name: str, check: CallbackCheck) -> Check:
    def verify(st: AppState, request: Request, body: bytes) -> str | None:
        credentials = st.providers.credentials_for(name, check)
        if credentials is None:
            return _NOT_CONFIGURED
        headers = {k.lower(): v for k, v in request.headers.items()}
        call = CallbackRequest(_public_url(st, request), headers, dict(request.query_params), body)
        return check.verify(call, credentials, st.providers.max_skew_seconds)

    return verify


# provider -> its signature check (None: authentic; else why not), from each provider's folder
# (its SPEC.callback, sinks/provider_registry.py)
CHECKS: dict[str, Check] = {
    spec.name: _registered(spec.name, spec.callback) for spec in specs() if spec.callback
}


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
