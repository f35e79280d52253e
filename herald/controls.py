"""Cancel, pause and resume of one notification: the Redis layout and the rules every job reads.

    notif:{nid}    hash (the status header, herald.status_keys)
        control         running | paused | cancelled (absent = running); cancelled is final
        control_at      epoch ms of the last change
        lease:<seat>    epoch ms until which dispatch worker <seat> may be sending deliveries of
                        this notification (set when it checked `control`, removed after its sends)
        users_planned   users of the audience handed to planning so far (the plan job)
        users_total     the audience's size once known (at accept for user ids; when a segment's
                        expansion ends)
    parked:{nid}   list  deliveries dispatch met while the notification was paused,
                         "<logical topic> <key> <base64 Avro value>" (text, so the API's
                         decoding client reads it); put back on their topics by
                         resume and cancel (the API), so dispatch decides them again

Who reads what (each a check, never a copy that could go stale):
- the plan job's request source stops expanding a paused segment and re-checks every
  `PAUSE_RECHECK_S`; the planner plans the users of a cancelled notification as SUPPRESSED
  `cancelled` (so every user of the audience ends in a state, and the counts add up);
- dispatch checks once per batch, just before sending: a cancelled delivery ends SUPPRESSED
  `cancelled`, a paused one is parked (SCHEDULED `paused`); otherwise the worker takes a lease.
  While a batch waits for rate tokens (a campaign at its budget: a slice can take up to the
  shaping wait), it checks again every `control_recheck_s` and withholds what is not sent yet
  the same way, so a pause or cancel takes effect within about that time, not at the end of
  the batch. The API answers a cancel or a pause once no lease is left (or after its settle
  time): no send starts after that answer.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable, Mapping

import redis

from herald.states import State
from herald.status_keys import header_key

__all__ = [
    "CANCELLED",
    "CONTROLS",
    "LEASE_PREFIX",
    "PAUSED",
    "PAUSE_RECHECK_S",
    "RUNNING",
    "DispatchControls",
    "PlanControls",
    "parked_entry",
    "parked_key",
    "progress",
    "split_parked",
]

log = logging.getLogger(__name__)

RUNNING, PAUSED, CANCELLED = "running", "paused", "cancelled"
CONTROLS = (RUNNING, PAUSED, CANCELLED)
LEASE_PREFIX = "lease:"
PAUSE_RECHECK_S = 0.5

SENT_STATES = frozenset(
    {State.PROVIDER_ACCEPTED, State.DELIVERED, State.DELIVERY_UNKNOWN, State.READ,
     State.OPENED, State.CLICKED}
)  # fmt: skip
NOT_SENT_STATES = frozenset({State.SUPPRESSED, State.EXPIRED, State.FAILED_PERMANENT})

# KEYS[1] notif:{nid}; ARGV: seat, lease until (epoch ms). The control, or "" when running
# (then the lease is taken). A notification without a header has no control and takes no lease.
_LEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return '' end
local control = redis.call('HGET', KEYS[1], 'control')
if control == 'paused' or control == 'cancelled' then return control end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ''
"""

# KEYS[1] notif:{nid}, KEYS[2] parked:{nid}; ARGV: parked entry. 1 when parked; 0 when the
# notification is no longer paused (resumed or cancelled meanwhile: the caller puts the
# delivery back on its topic). Checked and pushed in one step, so resume and cancel, which
# change the control and then take the list, never leave a delivery behind.
_PARK = """
if redis.call('HGET', KEYS[1], 'control') ~= 'paused' then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"""

# KEYS[1] notif:{nid}; ARGV: users planned so far, users total ("" = unknown yet). The control.
_PLANNED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return '' end
redis.call('HSET', KEYS[1], 'users_planned', ARGV[1])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'users_total', ARGV[2]) end
return redis.call('HGET', KEYS[1], 'control') or ''
"""


def parked_key(notification_id: str) -> str:
    """The deliveries dispatch parked while `notification_id` was paused (same slot as its
    header)."""
    return f"parked:{{{notification_id}}}"


def parked_entry(topic: str, key: str, value: bytes) -> str:
    """One parked delivery: its logical topic, Kafka key (ids have no spaces) and value."""
    return f"{topic} {key} {base64.b64encode(value).decode()}"


def split_parked(entry: bytes | str) -> tuple[str, str, bytes]:
    """(logical topic, key, value) of a `parked_entry`."""
    topic, key, value = _text(entry).split(" ", 2)
    return topic, key, base64.b64decode(value)


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return value or ""


class DispatchControls:
    """Dispatch's check of a batch's notifications (one pipelined round trip), and the leases
    it holds while it sends (released in one more)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, seat: str, lease_s: float) -> None:
        self.client = client
        self.field = LEASE_PREFIX + seat
        self.lease_ms = int(lease_s * 1000)
        self._script = client.register_script(_LEASE)
        self._park = client.register_script(_PARK)
        self._held: list[str] = []

    def hold(self, notification_ids: Iterable[str], now_ms: int) -> dict[str, str]:
        """{nid: paused | cancelled} for the notifications that are not running; a lease on
        each running one, until `release`."""
        nids = list(dict.fromkeys(notification_ids))
        if not nids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for nid in nids:
            self._script(keys=[header_key(nid)], args=[self.field, now_ms + self.lease_ms],
                         client=pipe)  # fmt: skip
        found: dict[str, str] = {}
        for nid, control in zip(nids, pipe.execute(), strict=True):
            text = _text(control)
            if text:
                found[nid] = text
            else:
                self._held.append(nid)
        return found

    def check(self, notification_ids: Iterable[str]) -> dict[str, str]:
        """{nid: paused | cancelled} for the notifications that are no longer running (one
        pipelined round trip; no lease taken: the batch holds them already). A check Redis
        does not answer finds nothing: the batch goes on under its leases, and the API's
        answer to a pause still waits for them."""
        nids = list(dict.fromkeys(notification_ids))
        if not nids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for nid in nids:
            pipe.hget(header_key(nid), "control")
        try:
            replies = pipe.execute()
        except redis.RedisError as exc:
            log.warning("dispatch.control_recheck_failed error=%s", type(exc).__name__)
            return {}
        found: dict[str, str] = {}
        for nid, control in zip(nids, replies, strict=True):
            text = _text(control)
            if text in (PAUSED, CANCELLED):
                found[nid] = text
        return found

    def park(self, entries: list[tuple[str, str]]) -> list[bool]:
        """Park (notification_id, `parked_entry`) pairs; False where the notification is no
        longer paused (the caller sends that delivery back to its topic)."""
        if not entries:
            return []
        pipe = self.client.pipeline(transaction=False)
        for nid, entry in entries:
            self._park(keys=[header_key(nid), parked_key(nid)], args=[entry], client=pipe)
        return [bool(r) for r in pipe.execute()]

    def release(self) -> None:
        """Drop the leases taken since the last release (the batch's sends are over)."""
        if not self._held:
            return
        pipe = self.client.pipeline(transaction=False)
        for nid in self._held:
            pipe.hdel(header_key(nid), self.field)
        self._held = []
        pipe.execute()


class PlanControls:
    """The plan job's side: record how far an audience was planned, read its control."""

    def __init__(self, client: redis.Redis | redis.RedisCluster) -> None:
        self.client = client
        self._planned = client.register_script(_PLANNED)

    def planned(self, notification_id: str, users: int, total: int | None = None) -> str:
        """Record `users` planned (and the total once known); the current control."""
        args = [users, "" if total is None else total]
        return _text(self._planned(keys=[header_key(notification_id)], args=args))

    def cancelled(self, notification_ids: Iterable[str]) -> set[str]:
        """Those of `notification_ids` that are cancelled (one pipelined round trip)."""
        nids = list(dict.fromkeys(notification_ids))
        if not nids:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for nid in nids:
            pipe.hget(header_key(nid), "control")
        return {nid for nid, c in zip(nids, pipe.execute(), strict=True) if _text(c) == CANCELLED}


def progress(header: Mapping[str, str], counts: Mapping[str, int]) -> dict[str, int | str | None]:
    """A notification's progress from its header and its per-state delivery counts: users
    planned of the total, deliveries sent, ended without a send, and still on their way."""
    sent = sum(n for s, n in counts.items() if s in SENT_STATES)
    not_sent = sum(n for s, n in counts.items() if s in NOT_SENT_STATES)
    total = sum(counts.values())
    users_total = header.get("users_total")
    if users_total is None and header.get("recipients", "").startswith("users:"):
        users_total = header["recipients"].removeprefix("users:")
    planned = header.get("users_planned")  # segments only: user ids are planned at once
    return {
        "control": header.get("control") or RUNNING,
        "users_total": int(users_total) if users_total else None,
        "users_planned": int(planned) if planned else None,
        "deliveries": total,
        "sent": sent,
        "not_sent": not_sent,
        "remaining": total - sent - not_sent,
    }
