"""One-click unsubscribe (RFC 8058): POST/GET /v1/unsubscribe/{token}.

Marketing email carries this URL in `List-Unsubscribe` (with `List-Unsubscribe-Post:
List-Unsubscribe=One-Click`) and as a link in its body (sinks/providers/sendgrid/client.py). The
token (herald/links.py, kind "u") names the user and the opt-out ("marketing:email"); it is
the authorization, so there is no API key.

- POST (the mail client's one-click POST, body `List-Unsubscribe=One-Click`, or the button of the
  page below): records the opt-out the way PUT preferences records a change — under
  `prefs:{user}:lock`, the next version, the record on herald.preferences acked by Kafka, then
  the Redis copy — and answers 200 with a short page. Repeating it changes nothing.
- GET (a person who clicked the link, or a link scanner fetching it): a page with a button that
  POSTs; nothing is recorded, so a scanner unsubscribes nobody.
- A tampered or malformed token: 400 `invalid_unsubscribe_token`.
"""

from __future__ import annotations

import html
import logging
import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse

from api.problems import ProblemError, problem_responses
from api.state import AppState, now_utc, state_of, to_ms, user_lock, wait_restored
from herald import keys, links
from herald.topics import PREFERENCES
from herald.user_records import empty_preferences, with_opt_out

log = logging.getLogger(__name__)
router = APIRouter(tags=["unsubscribe"])

Token = Annotated[str, Path(min_length=3, max_length=links.MAX_TOKEN)]
_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>
<body><h1>{title}</h1><p>{text}</p>{form}</body></html>"""


def _claims(st: AppState, token: str) -> tuple[str, str]:
    """(user_id, "category:channel") of a valid unsubscribe token; 400 otherwise."""
    try:
        claims = links.verify(st.settings.links.secret_bytes(), "u", token)
    except links.BadToken as exc:
        st.metrics.rejected.labels("invalid_unsubscribe_token").inc()
        raise ProblemError(400, "invalid_unsubscribe_token", str(exc)) from exc
    return str(claims["u"]), str(claims["k"])


def _page(title: str, text: str, form: str = "") -> HTMLResponse:
    body = _PAGE.format(title=html.escape(title), text=html.escape(text), form=form)
    headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    return HTMLResponse(body, headers=headers)


@router.get(
    "/v1/unsubscribe/{token}",
    response_class=HTMLResponse,
    responses=problem_responses(400),
    summary="The unsubscribe page of a link in an email (records nothing)",
)
async def unsubscribe_page(token: Token, request: Request) -> HTMLResponse:
    """A page whose button POSTs the same URL."""
    _user, entry = _claims(state_of(request), token)
    category, _, channel = entry.partition(":")
    form = '<form method="post"><button type="submit">Unsubscribe</button></form>'
    return _page("Unsubscribe", f"Stop receiving {category} {channel} from us?", form)


@router.post(
    "/v1/unsubscribe/{token}",
    response_class=HTMLResponse,
    responses=problem_responses(400, 503),
    summary="One-click unsubscribe (RFC 8058): records the opt-out of the token",
)
async def unsubscribe(token: Token, request: Request) -> HTMLResponse:
    """Record the token's opt-out in the user's preferences (idempotent)."""
    st = state_of(request)
    user_id, entry = _claims(st, token)
    async with user_lock(st, keys.prefs_lock(user_id), "preferences_busy"):
        added = await _opt_out(st, user_id, entry)
    log.info("api.unsubscribed entry=%s changed=%s", entry, added)
    category, _, channel = entry.partition(":")
    return _page("Unsubscribed", f"You will not receive {category} {channel} from us any more.")


async def _opt_out(st: AppState, user_id: str, entry: str) -> bool:
    """Add `entry` to the user's preferences (under their lock); False when it was there."""
    now = now_utc()
    raw = await st.redis.get(keys.prefs(user_id))
    if raw is None:
        await wait_restored(st)  # no copy: defaults, once the copies hold every user
        raw = await st.redis.get(keys.prefs(user_id))
    current = orjson.loads(raw) if raw is not None else empty_preferences(user_id, 0)
    if entry in (current.get("category_channel_opt_out") or ()):
        return False
    now_us = time.time_ns() // 1000
    version = int(await st.script(keys.NEXT_VERSION, [keys.prefs_version(user_id)], [now_us]))
    record = with_opt_out(current, entry, version, to_ms(now))
    assert record is not None  # the entry is not there (checked under the lock)
    await st.publish(PREFERENCES, user_id, record)
    await st.script(keys.COPY_IF_NEWER, [keys.prefs(user_id)], [orjson.dumps(record), version])
    return True
