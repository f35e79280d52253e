"""The users' state records as the API and the sinks both change them (schemas/user_preferences
and contact_points): the defaults, an opt-out added by an unsubscribe, a dead device removed.

The API validates what users send (api/models.py) and writes through these; the consent sink
(an unsubscribe from a mail client) and the dispatch sinks (a dead device token) write the same
records, so the changes live here, below both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from herald.versions import next_version

__all__ = ["DEFAULT_PREFERENCES", "empty_preferences", "with_opt_out", "without_device"]

# A user who never set preferences (the defaults of api.models.PreferencesIn; a test keeps the
# two equal).
DEFAULT_PREFERENCES: dict[str, Any] = {
    "global_opt_out": False,
    "category_opt_out": [],
    "channel_opt_out": [],
    "category_channel_opt_out": [],
    "quiet_hours": None,
    "timezone": None,
    "locale": None,
}


def empty_preferences(user_id: str, updated_at: Any) -> dict[str, Any]:
    """The `user_preferences` record of a user who never set any (version 0)."""
    fresh = {k: list(v) if isinstance(v, list) else v for k, v in DEFAULT_PREFERENCES.items()}
    return {"user_id": user_id, **fresh, "updated_at": updated_at, "version": 0}


def with_opt_out(
    record: dict[str, Any], entry: str, version: int, updated_at: Any
) -> dict[str, Any] | None:
    """`record` (user_preferences) with `entry` ("marketing:email") added to its category ×
    channel opt-outs at `version`; None when it is there already (an unsubscribe from a mail
    client, sinks/consent.py and api/routes/unsubscribe.py)."""
    pairs = record.get("category_channel_opt_out") or []
    if entry in pairs:
        return None
    return {**record, "category_channel_opt_out": sorted({*pairs, entry}),
            "updated_at": updated_at, "version": version}  # fmt: skip


def without_device(current: dict[str, Any], device_id: str, now: datetime) -> dict[str, Any]:
    """`current` contact points without device `device_id` (unchanged record if absent)."""
    kept = [d for d in current["devices"] if d["device_id"] != device_id]
    if len(kept) == len(current["devices"]):
        return current
    version = next_version(current["version"])
    return {**current, "devices": kept, "updated_at": now, "version": version}
