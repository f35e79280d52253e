"""Pure checks of a notification request against the catalog and the clock (no I/O).

Every check raises a 422 `ProblemError` with a machine code and the field path:

    unknown_notification_type   body.notification_type is not in the catalog
    unknown_template_version    body.template_version is not a version of that type
    unknown_locale              no template of the type exists for body.locale or its parents
                                (an explicit locale is a promise; user preferences fall back)
    channel_not_allowed         body.channels names a channel the type cannot use
    missing_param               body.params lacks a parameter the template requires
    send_at_in_past             send_at more than `send_at_max_past_seconds` ago
    send_at_too_far             send_at beyond the schedule horizon (HERALD_SCHEDULE_HORIZON_DAYS)
    expire_at_in_past           expire_at is not in the future
    otp_requires_user_ids       OTP types go to explicit users, never to a segment
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import orjson

from api.models import NotificationCreate
from api.problems import ProblemError
from herald.catalog import Catalog, NotificationType
from herald.catalog_fields import locale_parents
from herald.catalog_fields import normalize_locale as _normalize
from herald.errors import CatalogLookupError


def _unprocessable(code: str, loc: list[str | int], msg: str) -> ProblemError:
    return ProblemError(422, code, msg, errors=[{"loc": loc, "code": code, "msg": msg}])


def check_against_catalog(body: NotificationCreate, catalog: Catalog) -> NotificationType:
    """The type's catalog entry, once the request fits it; raises 422 otherwise."""
    try:
        nt = catalog.get(body.notification_type)
    except CatalogLookupError:
        raise _unprocessable(
            "unknown_notification_type", ["body", "notification_type"],
            "not a notification type of the catalog",
        ) from None  # fmt: skip
    try:
        tset = nt.template_set(body.template_version)
    except CatalogLookupError:
        raise _unprocessable(
            "unknown_template_version", ["body", "template_version"],
            f"{nt.name} has no template version {body.template_version}",
        ) from None  # fmt: skip
    if body.channels is not None:
        allowed = set(nt.allowed_channels)
        for i, channel in enumerate(body.channels):
            if channel not in allowed:
                raise _unprocessable(
                    "channel_not_allowed", ["body", "channels", i],
                    f"{nt.name} cannot be sent on {channel}; allowed: {sorted(allowed)}",
                )  # fmt: skip
    if body.locale is not None:
        try:
            chain = set(locale_parents(_normalize(body.locale)))
        except CatalogLookupError:
            raise _unprocessable("invalid_locale", ["body", "locale"], "not a BCP 47 tag") from None
        if not any(loc in chain for _, loc in tset.sources):
            raise _unprocessable(
                "unknown_locale", ["body", "locale"],
                f"{nt.name} has no template in this locale or its parents",
            )  # fmt: skip
    for name in sorted(tset.params):
        if name not in body.params:
            raise _unprocessable(
                "missing_param", ["body", "params", name], f"the template needs param {name!r}"
            )
    if nt.otp and body.recipients.segment_id is not None:
        raise _unprocessable(
            "otp_requires_user_ids", ["body", "recipients", "segment_id"],
            "OTP types are sent to explicit user_ids",
        )  # fmt: skip
    return nt


def check_times(
    body: NotificationCreate, now: datetime, max_past_seconds: int, max_future_days: int
) -> None:
    """send_at/expire_at sanity; raises 422."""
    if body.send_at is not None:
        if body.send_at < now - timedelta(seconds=max_past_seconds):
            raise _unprocessable(
                "send_at_in_past", ["body", "send_at"],
                f"send_at is more than {max_past_seconds}s in the past",
            )  # fmt: skip
        if body.send_at > now + timedelta(days=max_future_days):
            raise _unprocessable(
                "send_at_too_far", ["body", "send_at"],
                f"send_at is more than {max_future_days} days ahead",
            )  # fmt: skip
    if body.expire_at is not None and body.expire_at <= now:
        raise _unprocessable("expire_at_in_past", ["body", "expire_at"], "expire_at has passed")


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return value


def body_hash(body: NotificationCreate) -> str:
    """SHA-256 of the request's meaning (key names, whitespace and time-zone offsets ignored)."""
    data = body.model_dump(exclude={"request_id"})
    canonical = {k: _jsonable(v) for k, v in data.items()}
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()
