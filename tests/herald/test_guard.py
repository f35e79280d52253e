"""Send guards against a real Redis, at every crash point of seed 000 §5.2."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
import redis

from herald.guard import (
    AlreadySent,
    GuardClass,
    InFlight,
    Proceed,
    SendGuard,
    guard_key,
    lease_key,
)

PENDING_TTL = 0.6  # short, yet long enough that "still in flight" holds on a loaded box


@pytest.fixture
def url(stack) -> str:  # type: ignore[no-untyped-def]
    return str(stack.settings.redis.url)


@pytest.fixture
def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


def make_guard(client: redis.Redis, prefix: str) -> SendGuard:
    """A guard as one worker process would build it (each 'process' gets its own)."""
    return SendGuard(client, pending_ttl_s=PENDING_TTL, sent_ttl_s=3600, prefix=prefix)


class Provider:
    """Counts provider acceptances per delivery (what the recipient would receive)."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()

    def send(self, delivery_id: str) -> str:
        self.sent[delivery_id] += 1
        return f"msg-{delivery_id}-{self.sent[delivery_id]}"


def worker(
    guard: SendGuard,
    provider: Provider,
    delivery_id: str,
    traffic_class: GuardClass = "transactional",
    crash: str | None = None,
) -> object:
    """One dispatch of one message; `crash` stops the worker at that point."""
    result = guard.acquire(delivery_id, traffic_class)
    if not isinstance(result, Proceed) or crash == "before_call":
        return result
    msg_id = provider.send(delivery_id)
    if crash == "after_call":
        return result
    guard.mark_sent(result, msg_id)
    return result


def test_key_uses_a_cluster_hash_tag() -> None:
    assert guard_key("d-1") == "guard:{d-1}"
    assert guard_key("d-1", "herald:") == "herald:guard:{d-1}"


def test_transactional_happy_path_then_redelivery_is_skipped(
    client: redis.Redis, prefix: str
) -> None:
    guard, provider = make_guard(client, prefix), Provider()
    assert isinstance(worker(guard, provider, "d1"), Proceed)
    again = worker(make_guard(client, prefix), provider, "d1")
    assert again == AlreadySent("d1", "sent", "msg-d1-1")
    assert provider.sent["d1"] == 1
    assert client.pttl(guard_key("d1", prefix)) > 3_000_000  # SENT keeps the long TTL


def test_crash_before_the_call_is_resent_after_the_pending_ttl(
    client: redis.Redis, prefix: str
) -> None:
    provider = Provider()
    assert isinstance(worker(make_guard(client, prefix), provider, "d2", crash="before_call"),
                      Proceed)  # fmt: skip
    # Redelivered at once: someone may be sending → retry later, don't send.
    redelivered = worker(make_guard(client, prefix), provider, "d2")
    assert isinstance(redelivered, InFlight) and 0 < redelivered.retry_after_s <= PENDING_TTL
    time.sleep(redelivered.retry_after_s + 0.05)
    assert isinstance(worker(make_guard(client, prefix), provider, "d2"), Proceed)
    assert provider.sent["d2"] == 1  # no loss, no duplicate


def test_crash_after_the_call_before_sent_is_the_only_duplicate_window(
    client: redis.Redis, prefix: str
) -> None:
    provider = Provider()
    worker(make_guard(client, prefix), provider, "d3", crash="after_call")
    # Within the PENDING TTL a redelivery waits instead of sending...
    assert isinstance(worker(make_guard(client, prefix), provider, "d3"), InFlight)
    time.sleep(PENDING_TTL + 0.05)
    # ...after it, the message is sent again: the documented duplicate (at most one per crash).
    assert isinstance(worker(make_guard(client, prefix), provider, "d3"), Proceed)
    assert provider.sent["d3"] == 2
    # Now SENT: every later redelivery is skipped.
    assert isinstance(worker(make_guard(client, prefix), provider, "d3"), AlreadySent)
    assert provider.sent["d3"] == 2


def test_definitive_failure_releases_the_key_for_an_immediate_retry(
    client: redis.Redis, prefix: str
) -> None:
    guard = make_guard(client, prefix)
    held = guard.acquire("d4", "transactional")
    assert isinstance(held, Proceed)
    assert guard.release(held) is True
    assert isinstance(guard.acquire("d4", "transactional"), Proceed)


def test_release_never_frees_a_key_another_worker_holds(client: redis.Redis, prefix: str) -> None:
    slow = make_guard(client, prefix)
    stale = slow.acquire("d5", "transactional")
    assert isinstance(stale, Proceed)
    time.sleep(PENDING_TTL + 0.05)  # the slow worker's PENDING lapsed mid-call
    fresh = make_guard(client, prefix).acquire("d5", "transactional")
    assert isinstance(fresh, Proceed)
    assert slow.release(stale) is False
    assert isinstance(slow.acquire("d5", "transactional"), InFlight)  # fresh one still holds it
    # A late acceptance is still recorded: SENT wins over anyone's PENDING.
    slow.mark_sent(stale, "late-msg")
    assert slow.acquire("d5", "transactional") == AlreadySent("d5", "sent", "late-msg")


def test_unknown_outcome_keeps_redeliveries_away(client: redis.Redis, prefix: str) -> None:
    guard = make_guard(client, prefix)
    held = guard.acquire("d6", "transactional")
    assert isinstance(held, Proceed) and guard.mark_unknown(held)
    time.sleep(PENDING_TTL + 0.05)
    again = guard.acquire("d6", "transactional")
    assert isinstance(again, AlreadySent) and again.state == "unknown"
    assert again.held == f"UNKNOWN:{held.token}"


def test_reconciliation_resolves_an_unknown_once(client: redis.Redis, prefix: str) -> None:
    """UNKNOWN → SENT (found at the provider) or → a PENDING of ours (never got it), each a
    compare-and-set on the UNKNOWN value: the second of two reconcilers gets nothing."""
    guard = make_guard(client, prefix)
    for did in ("d7", "d8"):
        held = guard.acquire(did, "transactional")
        assert isinstance(held, Proceed) and guard.mark_unknown(held)
    found = guard.acquire("d7", "transactional")
    lost = guard.acquire("d8", "transactional")
    assert isinstance(found, AlreadySent) and isinstance(lost, AlreadySent)
    assert guard.resolve_sent(found, "sms_a|1|SM1") and not guard.resolve_sent(found, "x")
    assert guard.acquire("d7", "transactional") == AlreadySent("d7", "sent", "sms_a|1|SM1")
    mine = guard.reclaim(lost, "transactional")
    assert isinstance(mine, Proceed) and guard.reclaim(lost, "transactional") is None
    assert isinstance(guard.acquire("d8", "transactional"), InFlight)  # ours, sending again


def test_bulk_single_guard_is_at_most_once(client: redis.Redis, prefix: str) -> None:
    provider = Provider()
    for crash in ("before_call", "after_call", None):
        delivery_id = f"b-{crash}"
        first = worker(make_guard(client, prefix), provider, delivery_id, "bulk", crash=crash)
        assert isinstance(first, Proceed) and not first.two_phase
        time.sleep(0.01)
        again = worker(make_guard(client, prefix), provider, delivery_id, "bulk")
        assert again == AlreadySent(delivery_id, "claimed")
        assert client.pttl(guard_key(delivery_id, prefix)) > 3_000_000
    # Crash before the call loses that message (accepted for bulk); never a duplicate.
    assert provider.sent == Counter({"b-after_call": 1, "b-None": 1})


def test_bulk_definitive_failure_releases_for_the_retry(client: redis.Redis, prefix: str) -> None:
    guard = make_guard(client, prefix)
    held = guard.acquire("b7", "bulk")
    assert isinstance(held, Proceed) and guard.release(held)
    assert isinstance(guard.acquire("b7", "bulk"), Proceed)


def test_concurrent_workers_exactly_one_proceeds(url: str, prefix: str) -> None:
    results: list[object] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def race(traffic_class: GuardClass) -> None:
        own = SendGuard(redis.Redis.from_url(url), pending_ttl_s=5, prefix=prefix)
        barrier.wait()
        result = own.acquire(f"race-{traffic_class}", traffic_class)
        with lock:
            results.append(result)

    for traffic_class in ("transactional", "bulk"):
        results.clear()
        threads = [threading.Thread(target=race, args=(traffic_class,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(isinstance(r, Proceed) for r in results) == 1
        losers = InFlight if traffic_class == "transactional" else AlreadySent
        assert sum(isinstance(r, losers) for r in results) == 7


def test_batch_acquire_and_mark_sent(client: redis.Redis, prefix: str) -> None:
    guard = make_guard(client, prefix)
    guard.mark_sent_many([])
    assert isinstance(guard.acquire("m2", "transactional"), Proceed)
    results = guard.acquire_many([("m1", "transactional"), ("m2", "transactional"), ("m3", "bulk")])
    assert isinstance(results[0], Proceed) and isinstance(results[1], InFlight)
    assert isinstance(results[2], Proceed)
    proceeds = [r for r in results if isinstance(r, Proceed)]
    guard.mark_sent_many([(p, f"id-{p.delivery_id}") for p in proceeds])
    again = guard.acquire_many([("m1", "transactional"), ("m3", "bulk")])
    assert again == [AlreadySent("m1", "sent", "id-m1"), AlreadySent("m3", "claimed")]


def test_batch_release_frees_only_the_callers_own_keys(client: redis.Redis, prefix: str) -> None:
    guard = make_guard(client, prefix)
    assert guard.release_many([]) == []
    mine = guard.acquire_many([("r1", "transactional"), ("r2", "bulk")])
    assert all(isinstance(r, Proceed) for r in mine)
    stale = Proceed("r1", "not-the-owner", two_phase=True)
    assert guard.release_many([stale, *mine]) == [False, True, True]  # type: ignore[list-item]
    again = guard.acquire_many([("r1", "transactional"), ("r2", "bulk")])
    assert all(isinstance(r, Proceed) for r in again)


LEASE = 0.3


def leased(client: redis.Redis, prefix: str, seat: str | None = None) -> SendGuard:
    """A guard with a lease, as the dispatch job builds it."""
    return SendGuard(client, pending_ttl_s=60, sent_ttl_s=3600, prefix=prefix,
                     lease_ttl_s=LEASE, seat=seat)  # fmt: skip


def killed(guard: SendGuard) -> None:
    """What SIGKILL leaves of a guard: its lease is no longer renewed (and is not deleted)."""
    guard._stop.set()


def test_a_killed_owners_pending_is_taken_over_when_its_lease_ends(
    client: redis.Redis, prefix: str
) -> None:
    """A worker dies between its PENDING and the provider's answer: the redelivered message is
    sent again once the lease lapses (seconds), not after the 60 s PENDING TTL."""
    provider, dead = Provider(), leased(client, prefix)
    assert isinstance(worker(dead, provider, "d-lease", crash="after_call"), Proceed)
    killed(dead)
    successor = leased(client, prefix)
    try:
        first = successor.acquire("d-lease", "transactional")
        assert isinstance(first, InFlight) and first.retry_after_s <= LEASE * 2  # not 60 s
        deadline = time.monotonic() + 10
        while not isinstance(result := successor.acquire("d-lease", "transactional"), Proceed):
            assert time.monotonic() < deadline, result
            time.sleep(first.retry_after_s)
        assert result.taken_over and client.pttl(lease_key(dead.owner, prefix)) < 0
        provider.send("d-lease")
        successor.mark_sent(result, "msg-2")
        assert provider.sent["d-lease"] == 2  # the crash window's one duplicate, no loss
        assert successor.acquire("d-lease", "transactional") == AlreadySent(
            "d-lease", "sent", "msg-2"
        )
    finally:
        successor.close()


def test_a_live_owner_keeps_its_pending(client: redis.Redis, prefix: str) -> None:
    """The owner's thread renews its lease: after several lease lengths another worker still
    finds it alive and waits."""
    owner, other = leased(client, prefix), leased(client, prefix)
    try:
        assert isinstance(owner.acquire("d-live", "transactional"), Proceed)
        started = time.monotonic()
        while time.monotonic() - started < 3 * LEASE:
            assert isinstance(other.acquire("d-live", "transactional"), InFlight)
            time.sleep(LEASE / 3)
        assert client.pttl(lease_key(owner.owner, prefix)) > 0
    finally:
        owner.close()
        other.close()
    assert client.exists(lease_key(owner.owner, prefix)) == 0  # a clean stop ends the lease


def test_the_process_taking_a_seat_frees_its_predecessor_at_once(
    client: redis.Redis, prefix: str
) -> None:
    """A restarted worker (same seat) ends the lease of the one it replaces: the PENDING that
    one left is taken over on the first look."""
    provider, dead = Provider(), leased(client, prefix, seat="dispatch/w0")
    worker(dead, provider, "d-seat", crash="after_call")
    killed(dead)
    restarted = leased(client, prefix, seat="dispatch/w0")
    try:
        result = restarted.acquire("d-seat", "transactional")
        assert isinstance(result, Proceed) and result.taken_over
    finally:
        restarted.close()
