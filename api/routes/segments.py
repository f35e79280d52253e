"""Segments: audiences a tenant uploads or selects with a query, then targets with campaigns.

    PUT    /v1/segments/{segment_id}     members streamed as application/x-ndjson or text/csv → 201
    POST   /v1/segments                  {"segment_id", "query"}: a read-only query's rows → 201
    GET    /v1/segments?cursor=&limit=   the tenant's segments in segment_id order
    GET    /v1/segments/{segment_id}     one segment: size (distinct users), source, created_at
    DELETE /v1/segments/{segment_id}     unregister it and delete its members → 204

Scopes: segments:write (PUT, DELETE), segments:read (GET), segments:query (POST: the query reads
whatever the API's ClickHouse user may read, so only keys trusted with that hold it). A key's
`segments` allow-list bounds every route (403 `segment_not_allowed`). Ownership, immutability and
the answers for another tenant's ids: api/segments.py. A campaign (POST /v1/notifications with
`recipients.segment_id`) is 404 `segment_not_found` for another tenant's or a deleted segment.

The upload is never held whole: a worker thread parses it as it arrives (api/segment_intake.py)
and inserts `segment_insert_rows` members at a time; a bad line is 422 `invalid_line` naming it
and nothing of the segment is kept.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StringConstraints
from starlette.requests import ClientDisconnect

from api import segments
from api.models import PATH_ID_PATTERN
from api.problems import ProblemError, dumps, problem_responses
from api.routes import PathId
from api.segment_intake import FORMATS, BodyReader
from api.segment_store import Segment, SegmentPage
from api.state import guarded

log = logging.getLogger(__name__)
router = APIRouter(tags=["segments"])

SegmentId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=PATH_ID_PATTERN)]
BODY_IDLE_S = 60.0  # an upload that sends nothing for this long is abandoned

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "One member a line: a JSON string (the user id) or an object with "
        "`user_id` and optional `params` (string values); or CSV with a header row naming "
        "`user_id` and the params' columns.",
        "content": {
            "application/x-ndjson": {
                "schema": {"type": "string"},
                "example": '{"user_id": "u1", "params": {"first_name": "Ada"}}\n"u2"\n',
            },
            "text/csv": {
                "schema": {"type": "string"},
                "example": "user_id,first_name\nu1,Ada\nu2,\n",
            },
        },
    }
}


class SegmentQuery(BaseModel):
    """Body of `POST /v1/segments`: the rows of `query` are the members (column 1 the user id,
    optional column 2 a Map(String, String) of params). One SELECT, no SETTINGS or FORMAT."""

    model_config = ConfigDict(extra="forbid")

    segment_id: SegmentId
    query: Annotated[str, StringConstraints(min_length=1, max_length=65536)]


def _json(body: BaseModel, status: int = 200) -> Response:
    return Response(dumps(body.model_dump()), status_code=status, media_type="application/json")


@router.put(
    "/v1/segments/{segment_id}", status_code=201, response_model=Segment,
    responses=problem_responses(400, 401, 403, 409, 413, 415, 422, 429, 503),
    summary="Upload a segment's members (streamed NDJSON or CSV)", openapi_extra=_UPLOAD_BODY,
)  # fmt: skip
async def upload_segment(segment_id: PathId, request: Request) -> Response:
    """Create `segment_id` from the body, parsed and inserted as it streams in."""
    st, tenant = await guarded(request, "segments:write")
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    parse = FORMATS.get(media_type)
    if parse is None:
        raise ProblemError(
            415, "unsupported_media_type", f"send one of {', '.join(FORMATS)}",
            media_types=list(FORMATS),
        )  # fmt: skip
    reader = BodyReader(request.stream(), asyncio.get_running_loop(), BODY_IDLE_S)
    fill = segments.upload_fill(st.segments, segment_id, parse, reader, st.api.segment_insert_rows)
    try:
        segment = await segments.create(st, tenant, segment_id, "upload", fill)
    except (ClientDisconnect, TimeoutError) as exc:
        raise ProblemError(400, "upload_interrupted", "the body stopped before its end") from exc
    log.info("api.segment_uploaded bytes=%d", reader.received)
    return _json(segment, 201)


@router.post(
    "/v1/segments", status_code=201, response_model=Segment,
    responses=problem_responses(400, 401, 403, 409, 413, 422, 429, 503),
    summary="Create a segment from a read-only ClickHouse query",
)  # fmt: skip
async def query_segment(body: SegmentQuery, request: Request) -> Response:
    """Run `query` with readonly=1 and `segment_query_timeout_seconds`, streaming its rows into
    the segment; ClickHouse's refusal (bad SQL, a write, a table function, the time limit) is
    422 `invalid_query` with its message."""
    st, tenant = await guarded(request, "segments:query")
    sql = body.query.strip().rstrip(";").strip()
    api = st.api
    fill = segments.query_fill(
        st.segments, body.segment_id, sql, api.segment_query_timeout_seconds,
        api.segment_insert_rows,
    )  # fmt: skip
    return _json(await segments.create(st, tenant, body.segment_id, "query", fill), 201)


@router.get(
    "/v1/segments", response_model=SegmentPage,
    responses=problem_responses(401, 403, 422, 429, 503), summary="List the tenant's segments",
)  # fmt: skip
async def list_segments(
    request: Request,
    cursor: Annotated[str | None, Query(max_length=128, pattern=PATH_ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """Segment_id order; pass `next_cursor` back as `cursor` for the next page. Only segments
    the key may use (its `segments` allow-list) are listed."""
    st, tenant = await guarded(request, "segments:read")
    store, allowed = st.segments, tenant.segments
    rows = []
    if allowed is None or allowed:  # an empty allow-list: no segment to show
        rows = await store.run(store.page, tenant.tenant_id, cursor or "", limit + 1, allowed)
    next_cursor = rows[limit - 1].segment_id if len(rows) > limit else None
    page = SegmentPage(segments=[row.view() for row in rows[:limit]], next_cursor=next_cursor)
    return _json(page)


@router.get(
    "/v1/segments/{segment_id}", response_model=Segment,
    responses=problem_responses(401, 403, 404, 429, 503), summary="Show a segment",
)  # fmt: skip
async def get_segment(segment_id: PathId, request: Request) -> Response:
    """The segment's size (distinct users), source and creation time; 404 `segment_not_found`
    for an unknown, deleted or another tenant's segment."""
    st, tenant = await guarded(request, "segments:read")
    return _json((await segments.visible(st, tenant, segment_id)).view())


@router.delete(
    "/v1/segments/{segment_id}", status_code=204,
    responses=problem_responses(401, 403, 404, 409, 429, 503), summary="Delete a segment",
)  # fmt: skip
async def delete_segment(segment_id: PathId, request: Request) -> Response:
    """Campaigns to it are refused from now on and a fan-out reading it stops; its id may be
    used again by this tenant only."""
    st, tenant = await guarded(request, "segments:write")
    await segments.delete(st, tenant, segment_id)
    return Response(status_code=204)
