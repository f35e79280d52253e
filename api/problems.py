"""RFC 7807 problem+json errors with a machine-readable `code` and field paths.

Every error the API answers has this shape (media type `application/problem+json`):

    {"type": "urn:herald:problem:<code>", "title": "...", "status": 422, "code": "<code>",
     "detail": "...", "errors": [{"loc": ["body", "recipients", "user_ids"],
                                  "code": "too_long", "msg": "..."}], ...extra}

`ProblemError` is raised by handlers; `install_problem_handlers` maps it, FastAPI's validation
errors and Starlette's HTTP errors onto that shape. Messages never echo input values (they may
be phone numbers, OTP codes or message bodies).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Unprocessable entity",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


class FieldError(BaseModel):
    """One invalid field: where, what kind of error, and a value-free message."""

    loc: list[str | int]
    code: str
    msg: str


class Problem(BaseModel):
    """The problem+json body (documented in the OpenAPI schema)."""

    type: str
    title: str
    status: int
    code: str
    detail: str | None = None
    errors: list[FieldError] = Field(default_factory=list)


class ProblemError(Exception):
    """Raise from a handler to answer a problem; `extra` fields are added to the body."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str | None = None,
        *,
        errors: Sequence[Mapping[str, Any]] = (),
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(f"{status} {code}")
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers or {})
        self.extra = extra


def problem_response(
    status: int,
    code: str,
    detail: str | None = None,
    *,
    errors: Sequence[Mapping[str, Any]] = (),
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A problem+json response."""
    body: dict[str, Any] = {
        "type": f"urn:herald:problem:{code}",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "code": code,
    }
    if detail:
        body["detail"] = detail
    body["errors"] = list(errors)
    body.update(extra)
    return Response(
        orjson.dumps(body), status_code=status, headers=dict(headers or {}),
        media_type=PROBLEM_MEDIA_TYPE,
    )  # fmt: skip


# Top-level codes for well-known field errors (first matching error wins).
def _special_code(err: Mapping[str, Any]) -> str | None:
    loc = [str(p) for p in err.get("loc", ())]
    kind = err.get("type", "")
    if kind == "json_invalid":
        return "malformed_json"
    if loc and loc[-1] == "timezone":
        return "invalid_timezone"
    if loc and loc[-1] == "e164":
        return "invalid_phone"
    if loc and loc[-1] == "user_ids" and kind == "too_long":
        return "too_many_recipients"
    if loc and loc[-1] == "locale":
        return "invalid_locale"
    return None


def field_errors(raw: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI error dicts -> `[{loc, code, msg}]` without input values."""
    out = []
    for err in raw:
        msg = str(err.get("msg", ""))
        if len(msg) > 300:
            msg = msg[:300] + "..."
        out.append(
            {"loc": list(err.get("loc", ())), "code": err.get("type", "invalid"), "msg": msg}
        )
    return out


def validation_problem(raw: Sequence[Mapping[str, Any]], prefix: tuple[str, ...] = ()) -> Response:
    """422 for invalid input; `prefix` is prepended to locs (e.g. ("body",))."""
    errs = [{**e, "loc": [*prefix, *e.get("loc", ())]} for e in raw]
    code = next((c for c in map(_special_code, errs) if c), "validation_error")
    status = 400 if code == "malformed_json" else 422
    return problem_response(
        status, code, "the request is not valid; see errors", errors=field_errors(errs)
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Map every error onto problem+json."""

    async def on_problem(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem_response(
            exc.status, exc.code, exc.detail, errors=exc.errors, headers=exc.headers, **exc.extra
        )

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError | ValidationError)
        return validation_problem(exc.errors())

    async def on_http(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        detail = exc.detail if isinstance(exc.detail, str) else None
        return problem_response(exc.status_code, code, detail, headers=exc.headers)

    async def on_crash(_: Request, exc: Exception) -> Response:
        log.error("api.unhandled_error error=%s", type(exc).__name__, exc_info=exc)
        return problem_response(500, "internal_error", "unexpected error; it was logged")

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_crash)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for problem statuses."""
    return {
        s: {"model": Problem, "description": _TITLES.get(s, "Error"),
            "content": {PROBLEM_MEDIA_TYPE: {}}}
        for s in statuses
    }  # fmt: skip


def dumps(obj: Any) -> bytes:
    """orjson with datetimes as RFC 3339 (`Z` for UTC)."""
    return orjson.dumps(obj, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC)
