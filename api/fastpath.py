"""POST /v1/notifications served at the ASGI layer (the hot path; same contract as the route).

FastAPI's routing, middleware and dependency machinery cost about as much CPU as the accept
pipeline itself. This outermost middleware answers exactly `POST /v1/notifications`: it
authenticates from the headers, enforces the body limit while reading, parses and validates
with pydantic (`model_validate_json`), then runs the same `accept()` as the documented FastAPI
route, so errors, idempotency and 202-after-ack are identical. Everything else passes through.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.models import NotificationCreate
from api.problems import ProblemError, problem_response, validation_problem
from api.routes.notifications import accept
from api.state import AppState, authenticate_key

log = logging.getLogger(__name__)
PATH = "/v1/notifications"


class NotificationsFastPath:
    """Serve POST /v1/notifications directly; delegate every other request to `app`."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.st = state
        self.limit = state.api.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await self._handle(scope, receive)
        except ProblemError as exc:
            response = problem_response(
                exc.status, exc.code, exc.detail, errors=exc.errors, headers=exc.headers,
                **exc.extra,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - answer 500 problem, never crash the server
            log.error("api.unhandled_error error=%s", type(exc).__name__, exc_info=exc)
            response = problem_response(500, "internal_error", "unexpected error; it was logged")
        await response(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive) -> Response:
        headers = dict(scope["headers"])
        key = headers.get(b"x-api-key")
        if key is None:
            auth = headers.get(b"authorization", b"")
            key = auth[7:].strip() if auth[:7].lower() == b"bearer " else None
        tenant = authenticate_key(
            self.st, key.decode("latin-1") if key else None, "notifications:write"
        )
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            raise _too_large(self.limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ProblemError(400, "client_disconnected", "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise _too_large(self.limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            body = NotificationCreate.model_validate_json(b"".join(chunks))
        except ValidationError as exc:
            self.st.metrics.rejected.labels("validation_error").inc()
            return validation_problem(exc.errors(), prefix=("body",))
        ip = headers.get(b"x-end-user-ip")
        device = headers.get(b"x-end-user-device")
        trace = headers.get(b"traceparent")
        return await accept(
            self.st, tenant, body, ip.decode("latin-1") if ip else None,
            device.decode("latin-1") if device else None,
            trace.decode("latin-1") if trace else None,
        )  # fmt: skip


def _too_large(limit: int) -> ProblemError:
    return ProblemError(
        413, "payload_too_large", f"request body exceeds {limit} bytes", limit_bytes=limit
    )
