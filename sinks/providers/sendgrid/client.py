"""SendGrid v3 Mail Send client (email): JSON, Bearer API key.

One personalization per delivery; the delivery id travels as `custom_args.delivery_id` and comes
back on every Event Webhook event. SendGrid has no idempotency key, so an unknown outcome is
reconciled first: `lookup` asks the Email Activity API for messages with that custom arg
(`GET /v3/messages?query=unique_args['delivery_id']="..."`; SendGrid's feed lags by up to
minutes: a "not found" younger than `activity_lag_s` is not believed, the reconciliation asks
again later).

Outcome map (PROVIDERS.md §6):
    202                 Accepted(X-Message-Id)
    400, 413 (other 4xx) Permanent
    429                 RateLimited (Retry-After, else X-RateLimit-Reset)
    401, 403            PlatformError
    5xx                 Retryable
Bounces, spam reports and unsubscribes arrive as webhook events, not here.

Every email is sent as HTML (the rendered body) with a plain-text part. With `links` (a base URL),
each http(s) link of the HTML goes through a signed click redirect and an open pixel ends it
(herald/links.py; the API turns them into CLICKED and OPENED events of the delivery). Marketing
and social mail (every category but transactional) also carries a one-click unsubscribe
(RFC 8058) when `links` has a base URL: `List-Unsubscribe: <URL>` and `List-Unsubscribe-Post:
List-Unsubscribe=One-Click` headers, and the same URL as a link at the end of the body; the URL
(herald/links.py) records `<category>:email` in the user's preferences when POSTed
(api/routes/unsubscribe.py).
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

import httpx
import orjson

from herald.config import LinksSettings
from herald.links import click_url, open_pixel_url, safe_url, unsubscribe_url
from herald.outcomes import (
    Accepted,
    Lookup,
    Outcome,
    Permanent,
    PlatformError,
    RateLimited,
    Retryable,
)
from sinks.providers.base import Delivery, ProviderClient, parse_retry_after
from sinks.providers.config import SendGridConfig

__all__ = ["SendGridClient"]


class SendGridClient(ProviderClient):
    """Sends one email per call to `/v3/mail/send`."""

    provider = "email"

    def __init__(self, config: SendGridConfig, links: LinksSettings | None = None) -> None:
        super().__init__(config)
        self.sendgrid = config
        self.lookup_lag_s = config.activity_lag_s
        self._links = links if links is not None and links.base_url else None
        self._headers = {
            "authorization": f"Bearer {config.api_key.get_secret_value()}",
            "content-type": "application/json",
        }

    def _mail(self, delivery: Delivery) -> dict[str, Any]:
        cfg = self.sendgrid
        rendered: dict[str, Any] = delivery.get("rendered") or {}
        data: dict[str, Any] = rendered.get("data") or {}
        body = str(rendered.get("body", ""))
        page = str(data.get("html") or body)  # the rendered email body is HTML (herald/render.py)
        plain = body if data.get("html") else _text_of(body)
        if self._links is not None:
            page = _tracked(page, delivery, self._links)
        content = [{"type": "text/plain", "value": plain}, {"type": "text/html", "value": page}]
        sender: dict[str, str] = {"email": cfg.from_email}
        if cfg.from_name:
            sender["name"] = cfg.from_name
        mail: dict[str, Any] = {
            "personalizations": [
                {
                    "to": [{"email": delivery.get("address")}],
                    "custom_args": {"delivery_id": str(delivery.get("delivery_id"))},
                }
            ],
            "from": sender,
            "subject": rendered.get("subject") or rendered.get("title") or "",
            "content": content,
        }
        if delivery.get("notification_type"):
            mail["categories"] = [str(delivery["notification_type"])]
        category = str(delivery.get("category") or "transactional")
        if self._links is not None and category != "transactional":
            self._unsubscribe(mail, self._links, str(delivery.get("user_id")), category)
        return mail

    @staticmethod
    def _unsubscribe(mail: dict[str, Any], links: LinksSettings, user: str, category: str) -> None:
        """RFC 8058 headers and a link in each body part (see the module docstring)."""
        assert links.base_url is not None
        url = unsubscribe_url(links.base_url, links.secret_bytes(), user, f"{category}:email")
        mail["headers"] = {
            "List-Unsubscribe": f"<{url}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        }
        for part in mail["content"]:
            if part["type"] == "text/html":
                part["value"] += f'<p><a href="{html.escape(url)}">Unsubscribe</a></p>'
            else:
                part["value"] += f"\n\nUnsubscribe: {url}"

    lookups = True

    async def _lookup(self, delivery: Delivery) -> Lookup:
        query = f"unique_args['delivery_id']=\"{delivery.get('delivery_id')}\""
        resp = await self.http.get(
            "/v3/messages", params={"query": query, "limit": 1}, headers=self._headers
        )
        resp.raise_for_status()
        messages = orjson.loads(resp.content).get("messages") or []
        return Lookup(True, str(messages[0].get("msg_id") or "")) if messages else Lookup(False)

    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        if not delivery.get("address"):
            return Permanent("missing_address", provider=self.provider)
        resp = await self.http.post(
            "/v3/mail/send", headers=self._headers, content=orjson.dumps(self._mail(delivery))
        )
        return self._map(resp, start)

    def _map(self, resp: httpx.Response, start: float) -> Outcome:
        status = resp.status_code
        kw: dict[str, Any] = {
            "provider": self.provider,
            "status_code": status,
            "latency_ms": self._ms(start),
        }
        if status in (200, 202):
            return Accepted(resp.headers.get("x-message-id", ""), **kw)
        reason = _reason(resp)
        if status == 429:
            return RateLimited(_retry_after(resp), **kw)
        if status >= 500:
            return Retryable(reason, parse_retry_after(resp.headers.get("retry-after")), **kw)
        if status in (401, 403):
            return PlatformError(reason, **kw)
        return Permanent(reason, **kw)


_LINK = re.compile(r'href="(https?://[^"]+)"', re.IGNORECASE)
_TAG = re.compile(r"<[^>]+>")


def _text_of(page: str) -> str:
    """The plain-text part of an HTML body: its text, tags dropped, entities decoded."""
    return html.unescape(_TAG.sub("", page.replace("</p>", "</p>\n"))).strip()


def _tracked(page: str, delivery: Delivery, links: LinksSettings) -> str:
    """`page` with each http(s) link through a signed click redirect and an open pixel at the
    end (herald/links.py: the API records CLICKED / OPENED events for the delivery)."""
    assert links.base_url is not None
    base, secret = links.base_url, links.secret_bytes()

    def redirect(match: re.Match[str]) -> str:
        target = html.unescape(match.group(1))
        if not safe_url(target):
            return match.group(0)
        return f'href="{html.escape(click_url(base, secret, delivery, target))}"'

    pixel = html.escape(open_pixel_url(base, secret, delivery))
    return _LINK.sub(redirect, page) + f'<img src="{pixel}" width="1" height="1" alt="">'


def _retry_after(resp: httpx.Response) -> float | None:
    after = parse_retry_after(resp.headers.get("retry-after"))
    if after is not None:
        return after
    reset = resp.headers.get("x-ratelimit-reset")
    try:
        return max(0.0, float(reset) - time.time()) if reset else None
    except ValueError:
        return None


def _reason(resp: httpx.Response) -> str:
    """`http_<status>` plus the first error's field (never the message: it may hold data)."""
    try:
        field = orjson.loads(resp.content)["errors"][0].get("field")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        field = None
    return f"http_{resp.status_code}" + (f":{field}" if field else "")
