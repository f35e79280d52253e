"""The dispatch side of a cross-channel fallback: when to fall back, and its I/O.

herald.fallback decides (pure); `FallbackRouter` reads what the decision needs (the API's Redis
copies of the user's preferences and contact points, one round trip, only on this rare path)
and puts the result into the batch's `Outputs`: new deliveries on their channel's deliveries
topic, held ones on the retry topic, their PLANNED/SCHEDULED events, and notes on the source's
terminal event.

When (`unusable`, `ends`): a delivery ends FAILED_PERMANENT or with a dead address, or no
provider of its channel is usable (breaker refused and no same-channel alternate left, or the
provider paused for an auth/config failure). Never after UNKNOWN (the user may have it).
A push delivery is one device: it falls back only when the user has no other valid device
(another device was, or will be, served by its own delivery).

Late failures: a delivery the provider accepted can still fail later (an SMS DLR "undelivered",
an email bounce). Dispatch keeps each accepted delivery that has a cross-channel step under
`watch_key` (its Avro Delivery value, until its expiry, at most `WATCH_MAX_S`), and the
receipts job, when a receipt fails it, runs the same `FallbackRouter` with it
(sinks/late_fallback.py).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from herald.catalog import Catalog
from herald.dispatching import instant
from herald.fallback import Fallback, fall_back, has_cross_channel_step
from herald.retry import Action, FailPermanent, PausePlatform, Retry, TokenCleanup
from sinks.dispatch.contacts import ContactStore
from sinks.dispatch.work import Outputs

__all__ = ["WATCH_MAX_S", "FallbackRouter", "ends", "unusable", "watch_key", "watch_ttl"]

WATCH_MAX_S = 3 * 86400  # the longest an accepted delivery is kept for a late failure

log = logging.getLogger(__name__)


def watch_key(delivery_id: str) -> str:
    """Where an accepted delivery with a cross-channel step waits for a late failure."""
    return f"fbw:{{{delivery_id}}}"


def watch_ttl(delivery: dict[str, Any], now: datetime) -> int:
    """Seconds to keep it: until its expiry (a fallback never follows one), 60 s to
    `WATCH_MAX_S`."""
    expire_at = instant(delivery.get("expire_at"))
    left = WATCH_MAX_S if expire_at is None else (expire_at - now).total_seconds()
    return int(min(WATCH_MAX_S, max(60.0, left)))


def unusable(action: Action) -> str | None:
    """Why no provider of the channel can take the delivery now (None: one can, or will)."""
    if isinstance(action, Retry) and not action.counts_as_attempt:
        return "breaker_open" if action.reason == "breaker_open" else None
    if isinstance(action, PausePlatform) and action.failover_to is None:
        return f"platform:{action.reason}"
    return None


def ends(action: Action) -> bool:
    """Whether `action` ends the delivery on its channel for good (a fallback may follow)."""
    return isinstance(action, FailPermanent | TokenCleanup)


class FallbackRouter:
    """Runs herald.fallback for one delivery with the user's current copies."""

    def __init__(self, catalog: Catalog, contacts: ContactStore) -> None:
        self.catalog = catalog
        self.contacts = contacts

    def route(self, delivery: dict[str, Any], cause: str, now: datetime) -> Fallback:
        """The fallback of `delivery` (empty when none is configured or none is usable)."""
        if not has_cross_channel_step(delivery):
            return Fallback()
        prefs, record = self.contacts.reachability(delivery["user_id"])
        if delivery["channel"] == "push" and _other_device(record, delivery.get("address")):
            return Fallback(skipped=[("*", "other_devices")])
        fb = fall_back(
            delivery, cause, nt=self.catalog.types.get(delivery["notification_type"]),
            prefs=prefs, contacts=record, now=now,
            quiet_channels=frozenset(self.catalog.quiet_hours_channels),
            default_timezone=self.catalog.default_timezone,
        )  # fmt: skip
        log.info("dispatch.fallback from=%s to=%s cause=%s skipped=%s", delivery["channel"],
                 fb.to, cause, fb.source_attributes.get("fallback_skipped", ""))  # fmt: skip
        return fb

    @staticmethod
    def emit(fb: Fallback, out: Outputs) -> None:
        """Put a fallback's records into the batch outputs."""
        out.deliveries.extend(fb.deliveries)
        out.retries.extend(fb.held)
        out.events.extend(fb.events)


def _other_device(record: dict[str, Any] | None, token: str | None) -> bool:
    devices = (record or {}).get("devices") or ()
    return any(d.get("valid", True) and d.get("token") != token for d in devices)
