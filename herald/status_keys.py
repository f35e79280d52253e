"""Hot delivery status in Redis: the layout GET /v1/notifications/{id} reads, written never
backwards.

    status:{<notification_id>}   hash   delivery_id -> JSON {state, reason, channel, user_id,
                                        provider, updated_at (RFC 3339, Z), generation};
                                        TTL 30 days
    counts:{<notification_id>}   hash   state -> number of deliveries in it now (kept by the
                                        same script, so a 1M campaign's progress is one HGETALL)

This is the layout of herald/keys.py (`keys.status`) and api/status.py (`status_entry`), which the
API reads; tests/herald/test_receipts.py checks that both sides agree.

Writers never overwrite blindly: `StatusUpdate` carries the states the new state may be entered
from (per channel, herald.states transition table), and one Lua script compares and sets: the
entry is written when the field is absent, or its current state is one of those sources. A
state equal to the current one, a late `sent` after `delivered`, or a retried write after a
crash is a no-op, so every writer (plan, dispatch, receipts) may write at-least-once and in any
order without a delivery ever going backwards. One widening (`status_sources`): on a channel
without a delivered signal (push), an engagement may also replace the states before the send's
answer, since the app's open may arrive before dispatch has recorded that answer.

Generations (DLQ replays, infra.dlq) come first: an update of a higher generation than the
entry's is written whatever the states (a replay accepted by the provider leaves the original
FAILED_PERMANENT), one of a lower generation never is, and within one generation the rules above
apply. An entry without `generation` (written before generations existed) is generation 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING

import orjson

from herald import states

if TYPE_CHECKING:
    import redis

__all__ = [
    "CAS_SCRIPT",
    "HEADER_IF_MISSING",
    "STATUS_TTL_SECONDS",
    "StatusUpdate",
    "allowed_sources",
    "counts_key",
    "header_key",
    "request_header",
    "status_entry",
    "status_key",
    "status_sources",
    "supersedes",
    "write_headers",
    "write_statuses",
]

STATUS_TTL_SECONDS = 30 * 24 * 3600

# KEYS[1] status hash, KEYS[2] counts hash (one notification's); ARGV[1] ttl ms, then per
# update: delivery_id, entry JSON, new state, generation, number of sources, sources... Applied
# in order; returns 1 (written) or 0 per update. One call carries up to CAS_CHUNK updates: a
# campaign's batch is a few calls instead of one per delivery (Redis and client time per update
# fell by half), and no call holds Redis for long.
CAS_SCRIPT = """
local ttl = tonumber(ARGV[1])
local out, written, i = {}, false, 2
while i <= #ARGV do
  local id, entry, state = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local gen, first, last = tonumber(ARGV[i + 3]), i + 5, i + 4 + tonumber(ARGV[i + 4])
  i = last + 1
  local write, from = true, nil
  local current = redis.call('HGET', KEYS[1], id)
  if current then
    local ok, doc = pcall(cjson.decode, current)
    if ok and type(doc) == 'table' and type(doc['state']) == 'string' then
      from = doc['state']
      local had = tonumber(doc['generation']) or 0
      if gen < had then
        write = false
      elseif gen == had then
        write = false
        if from ~= state then
          for j = first, last do
            if ARGV[j] == from then write = true; break end
          end
        end
      end
    end
  end
  if write then
    redis.call('HSET', KEYS[1], id, entry)
    if from ~= state then
      redis.call('HINCRBY', KEYS[2], state, 1)
      if from then redis.call('HINCRBY', KEYS[2], from, -1) end
    end
    written = true
  end
  out[#out + 1] = write and 1 or 0
end
if written and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return out
"""
CAS_CHUNK = 200


# KEYS[1] notif:{nid}; ARGV: ttl seconds, then field, value pairs. Written only where missing:
# the API's own header (written at accept) stays as it is.
HEADER_IF_MISSING = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


def header_key(notification_id: str) -> str:
    """The header hash of one notification (herald/keys.py `notif`)."""
    return f"notif:{{{notification_id}}}"


def request_header(
    tenant_id: str, request_id: str, notification_type: str, traffic_class: str,
    accepted_ms: int, user_count: int, segment_id: str | None, otp: bool,
) -> dict[str, str]:  # fmt: skip
    """The fields of `notif:{nid}`: who sent what, when, to whom. GET /v1/notifications/{id}
    answers a tenant only for a notification whose header names it. Written by the API at
    accept, and by the accepted job for a request another producer put on a request topic."""
    return {
        "tenant_id": tenant_id, "request_id": request_id,
        "notification_type": notification_type, "traffic_class": traffic_class,
        "accepted_at": str(accepted_ms),
        "recipients": f"segment:{segment_id}" if segment_id is not None else f"users:{user_count}",
        "otp": "1" if otp else "0",
    }  # fmt: skip


def write_headers(
    client: redis.Redis, headers: Sequence[tuple[str, dict[str, str]]],
    ttl_seconds: int = STATUS_TTL_SECONDS,
) -> None:  # fmt: skip
    """(notification_id, header) pairs, each where no header exists yet, in one round trip."""
    if not headers:
        return
    script = client.register_script(HEADER_IF_MISSING)
    pipe = client.pipeline(transaction=False)
    for nid, header in headers:
        pairs = [item for kv in header.items() for item in kv]
        script(keys=[header_key(nid)], args=[ttl_seconds, *pairs], client=pipe)
    pipe.execute()


def status_key(notification_id: str) -> str:
    """The status hash of one notification (hash tag: one Cluster slot per notification)."""
    return f"status:{{{notification_id}}}"


def counts_key(notification_id: str) -> str:
    """Deliveries per current state of one notification (same slot as its status hash)."""
    return f"counts:{{{notification_id}}}"


def status_entry(
    *, state: str, channel: str, user_id: str, updated_at: datetime,
    reason: str | None = None, provider: str | None = None, generation: int = 0,
) -> bytes:  # fmt: skip
    """The JSON value of one `status:{nid}` field (written by the API, plan, dispatch, receipts)."""
    return orjson.dumps(
        {"state": state, "reason": reason, "channel": channel, "user_id": user_id,
         "provider": provider, "updated_at": updated_at, "generation": generation},
        option=orjson.OPT_UTC_Z,
    )  # fmt: skip


@cache
def allowed_sources(channel: str, state: str) -> tuple[str, ...]:
    """States of `channel` from which `state` may be entered (herald.states tables)."""
    table = states.TABLES.get(channel, {})
    return tuple(sorted(str(s) for s, targets in table.items() if state in targets))


# Engagement states, and the states before a send's answer that an engagement may replace on a
# channel without a delivered signal (`status_sources`).
_ENGAGED = frozenset({"READ", "OPENED", "CLICKED"})
_UNANSWERED = frozenset({"ACCEPTED", "PLANNED", "SCHEDULED", "QUEUED", "SENDING",
                         "RETRY_SCHEDULED", "PROVIDER_ACCEPTED", "UNKNOWN"})  # fmt: skip


@cache
def status_sources(channel: str, state: str) -> tuple[str, ...]:
    """States of `channel` a hot-status write of `state` may replace: `allowed_sources`, and,
    for an engagement (READ, OPENED, CLICKED) on a channel without a delivered signal (push),
    every state before the send's answer as well. There the engagement comes from the user's
    app, not from the provider, and may reach the hot status before the send's own answer
    (dispatch records a slice's answers once the slice is sent): written then, it stays, since
    no state before it is entered from an engagement."""
    sources = allowed_sources(channel, state)
    caps = states.CAPABILITIES.get(channel)
    if state not in _ENGAGED or caps is None or caps.delivered is not states.Support.NOT_PROVIDED:
        return sources
    return tuple(sorted(set(sources) | _UNANSWERED))


@cache
def supersedes(channel: str, state: str, later: str) -> bool:
    """Whether a delivery's `later` state, written right after `state` (same generation), leaves
    the hot status as writing both would: it is entered from every state `state` is entered
    from, and from `state` itself. A writer may then skip `state`'s update (`herald-superseded`,
    herald/kafka_records.py). Not when `later` equals a source of `state`: the compare-and-set
    would keep that older entry."""
    sources = set(allowed_sources(channel, state))
    after = set(allowed_sources(channel, later))
    return later != state and state in after and sources <= after and later not in sources


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """One delivery's new current state, to be compare-and-set into its notification's hash."""

    notification_id: str
    delivery_id: str
    state: str
    channel: str
    user_id: str
    updated_at: datetime
    reason: str | None = None
    provider: str | None = None
    generation: int = 0

    def entry(self) -> bytes:
        """The JSON stored in the hash field."""
        return status_entry(
            state=self.state, channel=self.channel, user_id=self.user_id,
            updated_at=self.updated_at, reason=self.reason, provider=self.provider,
            generation=self.generation,
        )  # fmt: skip

    def args(self) -> list[str | bytes | int]:
        """This update's part of `CAS_SCRIPT`'s ARGV."""
        sources: Sequence[str] = status_sources(self.channel, self.state)
        return [self.delivery_id, self.entry(), self.state, self.generation, len(sources),
                *sources]  # fmt: skip


def write_statuses(
    client: redis.Redis, updates: Iterable[StatusUpdate], ttl_seconds: int = STATUS_TTL_SECONDS
) -> list[bool]:
    """Compare-and-set every update in one pipelined round trip; True where it was written.

    Updates of one delivery are applied in the given order (one notification's go to the same
    script calls, in order).
    """
    batch = list(updates)
    if not batch:
        return []
    by_notification: dict[str, list[int]] = {}
    for i, update in enumerate(batch):
        by_notification.setdefault(update.notification_id, []).append(i)
    script = client.register_script(CAS_SCRIPT)
    pipe = client.pipeline(transaction=False)
    calls: list[list[int]] = []
    for nid, positions in by_notification.items():
        for start in range(0, len(positions), CAS_CHUNK):
            chunk = positions[start : start + CAS_CHUNK]
            args: list[str | bytes | int] = [ttl_seconds * 1000]
            for i in chunk:
                args += batch[i].args()
            script(keys=[status_key(nid), counts_key(nid)], args=args, client=pipe)
            calls.append(chunk)
    written = [False] * len(batch)
    for chunk, replies in zip(calls, pipe.execute(), strict=True):
        for i, reply in zip(chunk, replies, strict=True):
            written[i] = bool(reply)
    return written
