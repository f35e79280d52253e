"""Send guards in Redis (seed 000 §5.2, SPEC §4): never lose a transactional message, never
send a bulk one twice.

One key per delivery, `guard:{<delivery_id>}` (the braces are a Redis Cluster hash tag), whose
value is one of

    PENDING:<owner>    a worker is calling the provider now (short TTL, transactional only)
    CLAIMED:<owner>    a bulk worker took it and will call the provider (long TTL)
    SENT:<msg_id>      the provider accepted it (long TTL)
    UNKNOWN:<owner>    the call's outcome is unknown; reconciliation owns it (long TTL): it
                       resolves it to SENT (`resolve_sent`) or takes it back to send again
                       (`reclaim`), both compare-and-set on the UNKNOWN value

Transactional, two-phase (`acquire` → provider call → `mark_sent` | `release` | `mark_unknown`):

    crash point                          what a redelivered message sees
    before the provider call             PENDING until its TTL lapses → Proceed: resent, no loss
    after the call, before `mark_sent`   the same → Proceed: **one duplicate**; the only window
                                         with a duplicate, at most `pending_ttl` long
    after `mark_sent`                    SENT → AlreadySent: skipped, no duplicate

Bulk, single pre-send guard (`SET NX` with the long TTL before the call): a crash anywhere after
`acquire` leaves CLAIMED, so the redelivered message is skipped — at most once, lost only in that
window. After a *definitive* failure (the provider certainly did not send: connect error,
rejection, 429) the sink calls `release` so the retry may proceed; after `Unknown` it must not.

`release` and `mark_unknown` act only on the caller's own PENDING/CLAIMED value (compare-and-set
in Lua), so a worker whose PENDING expired never frees a key another worker now holds. `mark_sent`
is unconditional: once a provider accepted the message, SENT is the truth.

Leases (`lease_ttl_s`, the dispatch job's guards): a guard names its owner in its PENDING values
(`PENDING:<owner>.<token>`) and keeps `guard-lease:{<owner>}` alive (TTL `lease_ttl_s`, renewed
three times per TTL by a thread; deleted by `close`). A redelivered message that finds a PENDING
whose owner's lease is gone (the worker was killed: it cannot be calling the provider any more)
takes the key over at once (compare-and-set on that exact value) instead of waiting out the
PENDING TTL: `Proceed(taken_over=True)`. The provider may have accepted the dead worker's call,
so a takeover may send a duplicate, as a lapsed PENDING would, only up to `pending_ttl_s`
sooner: an OTP in flight at a dispatch kill is resent within the lease TTL (seconds), not a
minute later. A live owner's PENDING still answers InFlight, retried when its lease would end.

Seats (`seat`, with leases): the stable name of a worker's place (the dispatch job's step and
worker index). A guard taking a seat ends the lease of the seat's previous owner
(`guard-seat:{<seat>}` names it): a process that replaces a dead one on the same seat (its
restart) frees the dead one's PENDINGs at once, without waiting out the lease.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import redis

__all__ = [
    "AlreadySent", "GuardResult", "InFlight", "Proceed", "SendGuard", "guard_key", "lease_key",
]  # fmt: skip

GuardClass = Literal["transactional", "normal", "bulk"]

log = logging.getLogger(__name__)

# KEYS[1] guard key; ARGV: value, ttl_ms. Returns {1, ""} when taken, else {0, value, pttl}.
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, ''} end
return {0, redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}
"""

# The same for a batch in one call (one Redis node: keys of many slots): KEYS guard keys;
# ARGV value_1, ttl_1, value_2, ttl_2, ... Returns one `_ACQUIRE` reply per key, in order.
_ACQUIRE_MANY = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[2 * i - 1], 'NX', 'PX', ARGV[2 * i]) then out[i] = {1, ''}
  else out[i] = {0, redis.call('GET', key) or '', redis.call('PTTL', key)} end
end
return out
"""

# KEYS[1] guard key; ARGV: expected value, new value ('' = delete), ttl_ms. 1 if swapped.
_SWAP_IF_OWNED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


def guard_key(delivery_id: str, prefix: str = "") -> str:
    """The guard key of a delivery: `<prefix>guard:{<delivery_id>}`."""
    return f"{prefix}guard:{{{delivery_id}}}"


def lease_key(owner: str, prefix: str = "") -> str:
    """The lease of a guard owner: `<prefix>guard-lease:{<owner>}`."""
    return f"{prefix}guard-lease:{{{owner}}}"


def _owner_of(value: str) -> str | None:
    """The owner named in a leased PENDING value (None: a guard without a lease wrote it)."""
    kind, _, token = value.partition(":")
    owner, dot, _rest = token.partition(".")
    return owner if kind == "PENDING" and dot else None


@dataclass(frozen=True, slots=True)
class Proceed:
    """The caller holds the guard: call the provider, then mark_sent/release/mark_unknown."""

    delivery_id: str
    token: str
    two_phase: bool
    # The key was taken from a dead owner's PENDING (module docstring, "Leases").
    taken_over: bool = False


@dataclass(frozen=True, slots=True)
class AlreadySent:
    """Skip: SENT (provider_msg_id known), bulk CLAIMED, or UNKNOWN (being reconciled)."""

    delivery_id: str
    state: Literal["sent", "claimed", "unknown"]
    provider_msg_id: str | None = None
    held: str = ""  # the guard's value (an UNKNOWN is resolved by compare-and-set on it)


@dataclass(frozen=True, slots=True)
class InFlight:
    """Another worker may be sending it right now: retry after `retry_after_s` (its TTL)."""

    delivery_id: str
    retry_after_s: float
    # The PENDING value found (who holds it), "" when unknown.
    holder: str = ""


GuardResult = Proceed | AlreadySent | InFlight


class SendGuard:
    """Two-phase (transactional) and single (normal, bulk) send guards over one Redis client.

    `client` may be a `redis.Redis` or `redis.RedisCluster`; every operation touches one key.
    `pending_ttl_s` must exceed the provider call's timeout (plus a margin, and both calls when
    the sink fails over A→B while holding the guard): a PENDING that lapses mid-call lets a
    second worker send too.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        pending_ttl_s: float = 60.0,
        sent_ttl_s: float = 7 * 86400.0,
        prefix: str = "",
        two_phase_classes: frozenset[str] = frozenset({"transactional"}),
        lease_ttl_s: float | None = None,
        seat: str | None = None,
    ) -> None:
        self._client = client
        self._pending_ms = max(int(pending_ttl_s * 1000), 1)
        self._sent_ms = max(int(sent_ttl_s * 1000), 1)
        self._prefix = prefix
        self._two_phase = two_phase_classes
        self._acquire = client.register_script(_ACQUIRE)
        self._acquire_many = client.register_script(_ACQUIRE_MANY)
        # A Cluster spreads the keys over slots: one script call per key there, pipelined.
        self._single_node = not isinstance(client, redis.RedisCluster)
        self._swap = client.register_script(_SWAP_IF_OWNED)
        self.owner = uuid.uuid4().hex[:16]
        self._lease_ms = int(lease_ttl_s * 1000) if lease_ttl_s else 0
        self._stop = threading.Event()
        if self._lease_ms:
            self._renew()
            if seat is not None:
                before = client.getset(f"{prefix}guard-seat:{{{seat}}}", self.owner)
                if before:
                    old = before.decode() if isinstance(before, bytes) else str(before)
                    client.delete(lease_key(old, prefix))
                    log.info("guard.seat_taken seat=%s previous_owner=%s", seat, old)
            threading.Thread(
                target=self._keep_lease, name=f"guard-lease-{self.owner}", daemon=True
            ).start()

    def _renew(self) -> None:
        self._client.set(lease_key(self.owner, self._prefix), b"1", px=self._lease_ms)

    def _keep_lease(self) -> None:
        while not self._stop.wait(self._lease_ms / 3000):
            try:
                self._renew()
            except redis.RedisError as exc:  # the next renewal tries again
                log.warning("guard.lease_renew_failed error=%s", type(exc).__name__)

    def close(self) -> None:
        """Stop renewing the lease and delete it: this owner's PENDINGs are free at once."""
        if self._lease_ms and not self._stop.is_set():
            self._stop.set()
            try:
                self._client.delete(lease_key(self.owner, self._prefix))
            except redis.RedisError as exc:
                log.warning("guard.lease_delete_failed error=%s", type(exc).__name__)

    def acquire(self, delivery_id: str, traffic_class: GuardClass) -> GuardResult:
        """Take the guard before the provider call (one round trip)."""
        return self.acquire_many([(delivery_id, traffic_class)])[0]

    def acquire_many(self, items: Sequence[tuple[str, GuardClass]]) -> list[GuardResult]:
        """`acquire` for a batch in one round trip (one script call on a single Redis node,
        a pipeline of per-key calls on a Cluster); results in the same order."""
        if not items:
            return []
        base = uuid.uuid4().hex[:24]  # one random prefix per batch, unique per key
        if self._lease_ms:
            base = f"{self.owner}.{base}"
        keys: list[str] = []
        args: list[str | int] = []
        tokens: list[tuple[str, bool]] = []
        for i, (delivery_id, traffic_class) in enumerate(items):
            two_phase = traffic_class in self._two_phase
            token = f"{base}{i:08x}"
            keys.append(self._key(delivery_id))
            args.append(f"PENDING:{token}" if two_phase else f"CLAIMED:{token}")
            args.append(self._pending_ms if two_phase else self._sent_ms)
            tokens.append((token, two_phase))
        if self._single_node:
            replies = self._acquire_many(keys=keys, args=args)
        else:
            pipe = self._client.pipeline(transaction=False)
            for i, key in enumerate(keys):
                self._acquire(keys=[key], args=args[2 * i : 2 * i + 2], client=pipe)
            replies = pipe.execute()
        results = [
            _result(delivery_id, token, two_phase, reply)
            for (delivery_id, _), (token, two_phase), reply in zip(
                items, tokens, replies, strict=True
            )
        ]
        if self._lease_ms:
            self._take_over_dead(results, base)
        return results

    def _take_over_dead(self, results: list[GuardResult], base: str) -> None:
        """Replace in `results` every InFlight held by an owner whose lease is gone with a
        Proceed of ours (compare-and-set on the value found)."""
        held = [
            (i, r, owner)
            for i, r in enumerate(results)
            if isinstance(r, InFlight)
            and (owner := _owner_of(r.holder)) is not None
            and owner != self.owner
        ]
        if not held:
            return
        owners = sorted({owner for _i, _r, owner in held})
        pipe = self._client.pipeline(transaction=False)
        for owner in owners:
            pipe.pttl(lease_key(owner, self._prefix))
        lease_ms = dict(zip(owners, pipe.execute(), strict=True))
        for i, r, owner in held:
            if int(lease_ms[owner]) > 0:  # alive: look again when its lease would have ended
                retry = min(r.retry_after_s, int(lease_ms[owner]) / 1000 + self._lease_ms / 3000)
                results[i] = InFlight(r.delivery_id, retry, r.holder)
        dead = [(i, r) for i, r, owner in held if int(lease_ms[owner]) <= 0]
        if not dead:
            return
        pipe = self._client.pipeline(transaction=False)
        tokens = [f"{base}t{i:08x}" for i, _r in dead]
        for (_i, r), token in zip(dead, tokens, strict=True):
            key = self._key(r.delivery_id)
            self._swap(keys=[key], args=[r.holder, f"PENDING:{token}", self._pending_ms],
                       client=pipe)  # fmt: skip
        for (i, r), token, swapped in zip(dead, tokens, pipe.execute(), strict=True):
            if swapped:
                log.warning("guard.taken_over delivery_id=%s from=%s", r.delivery_id,
                            _owner_of(r.holder))  # fmt: skip
                results[i] = Proceed(r.delivery_id, token, True, taken_over=True)

    def mark_sent(self, guard: Proceed, provider_msg_id: str = "") -> None:
        """The provider accepted: SENT with the long TTL (transactional; no-op for bulk)."""
        if guard.two_phase:
            key = self._key(guard.delivery_id)
            self._client.set(key, f"SENT:{provider_msg_id}", px=self._sent_ms)

    def mark_sent_many(self, sent: Sequence[tuple[Proceed, str]]) -> None:
        """`mark_sent` for a batch in one pipelined round trip."""
        pipe = self._client.pipeline(transaction=False)
        for guard, msg_id in sent:
            if guard.two_phase:
                pipe.set(self._key(guard.delivery_id), f"SENT:{msg_id}", px=self._sent_ms)
        pipe.execute()

    def release(self, guard: Proceed) -> bool:
        """The provider certainly did not send (definitive failure): free the key for a retry.

        Never call it after an `Unknown` outcome. Returns False when the key is no longer ours.
        """
        return self.release_many([guard])[0]

    def release_many(self, guards: Sequence[Proceed]) -> list[bool]:
        """`release` for a batch in one pipelined round trip; results in the same order."""
        if not guards:
            return []
        pipe = self._client.pipeline(transaction=False)
        for guard in guards:
            key = self._key(guard.delivery_id)
            self._swap(keys=[key], args=[_owned_value(guard), "", 0], client=pipe)
        return [bool(reply) for reply in pipe.execute()]

    def mark_unknown(self, guard: Proceed) -> bool:
        """The outcome is unknown: keep redeliveries away (long TTL) while it is reconciled."""
        return bool(
            self._swap(
                keys=[self._key(guard.delivery_id)],
                args=[_owned_value(guard), f"UNKNOWN:{guard.token}", self._sent_ms],
            )
        )

    def resolve_sent(self, found: AlreadySent, sent_marker: str) -> bool:
        """Reconciliation found the message at the provider: UNKNOWN → SENT (compare-and-set on
        the UNKNOWN found; False when another worker resolved it first)."""
        key = self._key(found.delivery_id)
        value = f"SENT:{sent_marker}"
        return bool(self._swap(keys=[key], args=[found.held, value, self._sent_ms]))

    def reclaim(self, found: AlreadySent, traffic_class: GuardClass) -> Proceed | None:
        """Reconciliation found the provider never got it: UNKNOWN → this worker's PENDING
        (CLAIMED for single-phase classes), to send it again; None when another worker
        resolved it first."""
        two_phase = traffic_class in self._two_phase
        token = f"{self.owner}.{uuid.uuid4().hex[:24]}" if self._lease_ms else uuid.uuid4().hex
        value = f"PENDING:{token}" if two_phase else f"CLAIMED:{token}"
        ttl = self._pending_ms if two_phase else self._sent_ms
        key = self._key(found.delivery_id)
        if self._swap(keys=[key], args=[found.held, value, ttl]):
            return Proceed(found.delivery_id, token, two_phase)
        return None

    def _key(self, delivery_id: str) -> str:
        return guard_key(delivery_id, self._prefix)


def _owned_value(guard: Proceed) -> str:
    return f"PENDING:{guard.token}" if guard.two_phase else f"CLAIMED:{guard.token}"


def _result(delivery_id: str, token: str, two_phase: bool, reply: list[object]) -> GuardResult:
    if int(reply[0]) == 1:  # type: ignore[call-overload]
        return Proceed(delivery_id, token, two_phase)
    raw = reply[1]
    value = raw.decode() if isinstance(raw, bytes) else str(raw)
    kind, _, rest = value.partition(":")
    if kind == "PENDING":
        pttl = int(reply[2])  # type: ignore[call-overload]
        return InFlight(delivery_id, max(pttl, 0) / 1000.0, value)
    if kind == "SENT":
        return AlreadySent(delivery_id, "sent", rest or None)
    if kind == "UNKNOWN":
        return AlreadySent(delivery_id, "unknown", held=value)
    if kind == "CLAIMED":
        return AlreadySent(delivery_id, "claimed")
    # The key vanished between SET NX and GET (expired): report in flight, retry at once.
    return InFlight(delivery_id, 0.0)
