"""Pure-ASGI body size limit: 413 before parsing, for declared and chunked bodies alike.

A declared `Content-Length` above the limit is answered 413 without reading the body; a body
without one (chunked) is counted as it streams and cut off with 413 once it passes the limit.
Callback paths get their own (larger) limit: providers batch events (SendGrid up to ~768 KB);
segment uploads (`PUT /v1/segments/{id}`, streamed into ClickHouse) theirs (gigabytes).
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import problem_response


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a streamed body passes the limit (FastAPI re-raises it)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes")


class BodyLimitMiddleware:
    """Reject request bodies larger than `limit` bytes (`callback_limit` under /v1/callbacks/,
    `upload_limit` for a segment upload)."""

    def __init__(self, app: ASGIApp, limit: int, callback_limit: int, upload_limit: int) -> None:
        self.app = app
        self.limit = limit
        self.callback_limit = callback_limit
        self.upload_limit = upload_limit

    def limit_of(self, scope: Scope) -> int:
        """The body limit of the request `scope`."""
        path: str = scope.get("path", "")
        if path.startswith("/v1/callbacks/"):
            return self.callback_limit
        if path.startswith("/v1/segments/") and scope.get("method") == "PUT":
            return self.upload_limit
        return self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await _reject(scope, send, limit)
                    return
                break
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _reject(scope, send, limit)


async def _reject(scope: Scope, send: Send, limit: int) -> None:
    response = problem_response(
        413, "payload_too_large", f"request body exceeds {limit} bytes", limit_bytes=limit
    )

    async def no_body() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)
