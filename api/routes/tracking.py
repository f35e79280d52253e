"""Tracking: GET /t/o/{token}.gif (email open pixel), GET /t/c/{token} (email click redirect),
POST /t/p/{token} (push opened: the app reports it with the `herald_opened` URL of the push).

Both verify the HMAC token (herald/links.py; tampered → 400), then emit an OPENED / CLICKED
`delivery_event` to herald.delivery-events without waiting for the ack (tracking is analytics,
never on the user's critical path; a refused record is counted and logged). Event ids are
deterministic (`ids.event_id`), so repeated opens collapse into one event and repeated clicks
on the same link into one per link. No API key: the signature is the authorization.

An open or click belongs to the delivery's latest generation (api/engagement.py: the token
cannot say which send the mail came from).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from api.engagement import Engagement, emit
from api.problems import ProblemError, problem_responses
from api.state import AppState, state_of
from herald import links as tracking

log = logging.getLogger(__name__)
router = APIRouter(tags=["tracking"])

PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
_NO_STORE = {"Cache-Control": "no-store, max-age=0", "Referrer-Policy": "no-referrer"}
Token = Annotated[str, Path(min_length=3, max_length=tracking.MAX_TOKEN)]


async def _emit(
    st: AppState, kind: str, state: str, claims: dict[str, str], discriminator: str
) -> None:
    attributes = {"source": "tracking"}
    if "l" in claims:
        attributes["link_host"] = urlsplit(claims["l"]).hostname or ""
    of = Engagement(
        claims["d"], claims["n"], claims["u"], "email", claims.get("t", ""),
        claims.get("y", ""), claims.get("c", ""), attributes,
    )  # fmt: skip
    await emit(st, [of], state, kind, discriminator)


def _verify(st: AppState, kind: tracking.Kind, token: str) -> dict[str, str]:
    try:
        return tracking.verify(st.settings.links.secret_bytes(), kind, token)
    except tracking.BadToken as exc:
        st.metrics.tracking_rejected.labels({"o": "open", "c": "click"}.get(kind, "push")).inc()
        raise ProblemError(400, "invalid_tracking_token", str(exc)) from None


@router.get(
    "/t/o/{token}.gif", responses={200: {"content": {"image/gif": {}}},
                                   **problem_responses(400)},
    summary="Email open pixel",
)  # fmt: skip
async def open_pixel(token: Token, request: Request) -> Response:
    """A 1x1 GIF; records OPENED for the delivery in the token."""
    st = state_of(request)
    claims = _verify(st, "o", token)
    await _emit(st, "open", "OPENED", claims, "")
    return Response(PIXEL, media_type="image/gif", headers=_NO_STORE)


@router.get(
    "/t/c/{token}", status_code=302, responses={302: {"description": "Redirect to the link"},
                                                **problem_responses(400)},
    summary="Signed click redirect",
)  # fmt: skip
async def click(token: Token, request: Request) -> Response:
    """302 to the URL inside the signed token; records CLICKED (one event per link)."""
    st = state_of(request)
    claims = _verify(st, "c", token)
    link = claims["l"]
    await _emit(st, "click", "CLICKED", claims, hashlib.sha256(link.encode()).hexdigest()[:16])
    return Response(status_code=302, headers={"Location": link, **_NO_STORE})


@router.post(
    "/t/p/{token}", status_code=204, responses=problem_responses(400),
    summary="Push opened: the app reports that the user opened a push",
)  # fmt: skip
async def push_opened(token: Token, request: Request) -> Response:
    """Records READ (via opened) for the push delivery in the token (the `herald_opened` URL
    of the push's data, herald/links.py)."""
    st = state_of(request)
    claims = _verify(st, "p", token)
    of = Engagement(
        claims["d"], claims["n"], claims["u"], "push", claims.get("t", ""),
        claims.get("y", ""), claims.get("c", ""), {"source": "app", "via": "opened"},
    )  # fmt: skip
    await emit(st, [of], "READ", "push_open")
    return Response(status_code=204, headers=_NO_STORE)
