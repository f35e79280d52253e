"""The API's Redis copies of preferences and contact points, as dispatch uses them.

Layout (herald/keys.py): `prefs:{user}` holds the latest user_preferences record as JSON and
`cp:{user}` the latest contact_points record (timestamps as epoch ms), each written by the API
after Kafka acknowledged the change; `cp:{user}:lock` serializes read-modify-writes of contact
points (the API's device routes hold the same lock).

- `preferences(users)`: the latest preferences for the opt-out re-check just before sending
  (one pipelined round trip per batch). A user without a copy (preferences only ever produced
  straight to Kafka) is not re-checked: the plan job's decision stands.
- `resolve(deliveries)`: fills a null `address` (sms → verified-or-not phone, email → address,
  inapp → user id) from the contact points copy.
- `remove_token(user, token, publish)`: token cleanup after APNs 410 / FCM UNREGISTERED: under
  the lock, the user's record without the device that has this token (next version) is
  published on herald.devices (compacted; `publish` returns after Kafka's ack) and then written
  back as the copy, exactly as the API's DELETE /v1/devices does. Other devices stay.
- `disable_address(user, channel, address, publish)`: the same for a dead phone number or email
  address (Twilio 21211/21614, SendGrid invalid address): the phone (or email) is removed from
  the record when it is still the one that was rejected and named in its `disabled` list, so
  later plans skip that channel (`address_disabled`) while the user's other channels are still
  served.
  `disable_matching(user, channel, matches, publish)` is the same with a predicate over the
  current address (the receipts job compares `herald.receipts.address_tag`s: a bounce or a
  carrier's "dead number" receipt names no address).
- `reachability(user)`: (preferences, contact points record) for a cross-channel fallback's
  policy re-check (herald.fallback), one pipelined round trip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

import orjson
import redis
from redis.exceptions import LockError

from herald import keys
from herald.errors import HeraldError
from herald.policy import Preferences
from herald.user_records import without_device
from herald.versions import next_version

__all__ = ["ContactStore", "CleanupResult"]

_FIELDS = {"sms": ("phone", "e164"), "email": ("email", "address")}

log = logging.getLogger(__name__)

CleanupResult = Literal["removed", "absent", "no_copy", "busy"]
Publish = Callable[[str, dict[str, Any]], None]


def _ms(value: Any) -> Any:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else value


class ContactStore:
    """Reads and token cleanups against the API's copies (sync client of the sink)."""

    def __init__(
        self, client: redis.Redis, *, lock_timeout_s: float = 30.0, cluster: bool = False
    ) -> None:
        self.client = client
        self.lock_timeout_s = lock_timeout_s
        self.cluster = cluster

    def preferences(self, user_ids: Iterable[str]) -> dict[str, Preferences | None]:
        """Latest preferences per user (None: no copy, or an unreadable one).

        One MGET on a single Redis; pipelined GETs on a cluster (keys live in users' slots).
        """
        users = list(dict.fromkeys(user_ids))
        if not users:
            return {}
        names = [keys.prefs(user) for user in users]
        if self.cluster:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            raws = pipe.execute()
        else:
            raws = self.client.mget(names)
        return {user: _prefs(user, raw) for user, raw in zip(users, raws, strict=True)}

    def resolve(self, deliveries: Iterable[dict[str, Any]]) -> None:
        """Fill a null `address` in place where the contact points copy knows it."""
        todo = [d for d in deliveries if not d.get("address")]
        for d in todo:
            if d["channel"] == "inapp":
                d["address"] = d["user_id"]
        todo = [d for d in todo if d["channel"] in ("sms", "email")]
        if not todo:
            return
        pipe = self.client.pipeline(transaction=False)
        for d in todo:
            pipe.get(keys.contact_points(d["user_id"]))
        for d, raw in zip(todo, pipe.execute(), strict=True):
            record = orjson.loads(raw) if raw else {}
            if d["channel"] == "sms":
                d["address"] = (record.get("phone") or {}).get("e164")
            else:
                d["address"] = (record.get("email") or {}).get("address")

    def reachability(self, user_id: str) -> tuple[Preferences | None, dict[str, Any] | None]:
        """(latest preferences, contact points record) of one user; None where no copy."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(keys.prefs(user_id))
        pipe.get(keys.contact_points(user_id))
        raw_prefs, raw_cp = pipe.execute()
        try:
            record = orjson.loads(raw_cp) if raw_cp else None
        except orjson.JSONDecodeError:
            record = None
        return _prefs(user_id, raw_prefs), record

    def remove_token(
        self, user_id: str, token: str, publish: Publish, now: datetime
    ) -> CleanupResult:
        """Remove the device holding `token` from `user_id`'s contact points (see module doc)."""

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            device = next((d for d in current["devices"] if d.get("token") == token), None)
            if device is None:
                return None
            log.info("dispatch.token_removed platform=%s", device.get("platform"))
            return without_device(current, device["device_id"], now)

        return self._update(user_id, change, publish)

    def disable_address(
        self, user_id: str, channel: str, address: str, publish: Publish, now: datetime
    ) -> CleanupResult:
        """Remove a dead phone (channel sms) or email address from the contact points."""
        return self.disable_matching(user_id, channel, address.__eq__, publish, now)

    def disable_matching(
        self,
        user_id: str,
        channel: str,
        matches: Callable[[str], bool],
        publish: Publish,
        now: datetime,
    ) -> CleanupResult:
        """Remove the user's phone (sms) or email address when `matches(address)`."""
        name, key = _FIELDS[channel]

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            address = (current.get(name) or {}).get(key)
            if not address or not matches(str(address)):
                return None  # changed since (a new number): nothing to disable
            log.info("contacts.address_disabled channel=%s", channel)
            disabled = sorted({*(current.get("disabled") or ()), name})
            return {**current, name: None, "disabled": disabled, "updated_at": now,
                    "version": next_version(current["version"])}  # fmt: skip

        return self._update(user_id, change, publish)

    def _update(
        self,
        user_id: str,
        change: Callable[[dict[str, Any]], dict[str, Any] | None],
        publish: Publish,
    ) -> CleanupResult:
        """Under the lock: read the copy, apply `change`, publish (acked), write the copy back."""
        lock = self.client.lock(
            keys.contact_points_lock(user_id), timeout=self.lock_timeout_s, blocking_timeout=5
        )
        try:
            with lock:
                raw = self.client.get(keys.contact_points(user_id))
                if raw is None:
                    return "no_copy"
                changed = change(orjson.loads(raw))
                if changed is None:
                    return "absent"
                record = {**changed, "updated_at": _ms(changed["updated_at"])}
                publish(user_id, record)
                self.client.set(keys.contact_points(user_id), orjson.dumps(record))
                return "removed"
        except LockError:
            log.warning("dispatch.contact_update_busy")
            return "busy"


def _prefs(user: str, raw: bytes | str | None) -> Preferences | None:
    if raw is None:
        return None
    try:
        record: Mapping[str, Any] = orjson.loads(raw)
        return Preferences.from_record({**record, "user_id": user})
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, HeraldError) as exc:
        log.warning("dispatch.prefs_unreadable error=%s", type(exc).__name__)
        return None
