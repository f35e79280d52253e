"""Load and observation for the fault-injection run (bench/recovery.py, tests/e2e_faults).

    Producer     POSTs requests at a steady rate from a pool of threads; a request whose POST
                 failed (connection refused while the API is down, 503 while Redis restarts,
                 timeout) is retried with the same request_id and body, as a real producer does,
                 so only 202-answered requests enter the ledger;
    ProviderPoll snapshots every simulator's `/_admin/stats` (accepted ids per address) about
                 once a second into a `infra.ledger.ProviderView`, keyed by the simulator's pid
                 (a restarted simulator starts its counters from zero), and on demand right
                 before a simulator is killed.

OTPs cycle through a pool of users (one phone each; the run raises the API's per-phone OTP
limit, HERALD_API_OTP_PER_PHONE, since a load test is no abuse) and bulk requests through a pool
of email users, each at most three times (the marketing daily cap). Registering a user per
request would cost more API calls than the load itself on a busy machine. The ledger splits the
copies at one address by the provider message ids Herald recorded (infra/ledger.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from herald.ids import notification_id
from infra.ledger import ExpectedDelivery, ProviderView
from infra.stackclient import DEV_API_KEY, SIMULATORS, StackClient

__all__ = ["Accepted", "Producer", "ProviderPoll", "otp_phone", "register_users"]

TENANT = "dev"  # the embedded stack's dev tenant (api/tenants.toml)
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


def otp_phone(i: int) -> str:
    """A distinct E.164 number per OTP user (+1 415 plus seven digits)."""
    return f"+1415{i:07d}"


def bulk_email(j: int) -> str:
    return f"fault-bulk-{j}@example.com"


@dataclass
class Accepted:
    """One request the API answered 202, with the deliveries it owes."""

    request_id: str
    notification_id: str
    kind: str  # "otp" | "bulk"
    sent_at: float  # monotonic time of the first POST attempt
    accepted_at: float  # monotonic time of the 202
    attempts: int
    expected: list[ExpectedDelivery]


def _post_until_accepted(
    http: httpx.Client, body: dict[str, Any], stop_at: float
) -> tuple[str | None, int, str]:
    """POST until 202 or `stop_at`; (notification_id or None, attempts, last error)."""
    attempts, last = 0, ""
    while time.monotonic() < stop_at:
        attempts += 1
        try:
            resp = http.post("/v1/notifications", json=body)
        except httpx.HTTPError as exc:  # API down or restarting: retry with the same request_id
            last = type(exc).__name__
            time.sleep(0.3)
            continue
        if resp.status_code == 202:
            return str(resp.json()["notification_id"]), attempts, ""
        last = f"HTTP {resp.status_code}: {resp.text[:200]}"
        if resp.status_code not in RETRYABLE_STATUS:
            return None, attempts, last
        time.sleep(0.3)
    return None, attempts, last


def register_users(stack: StackClient, n_otp: int, n_bulk: int, threads: int = 16) -> None:
    """PUT the contact points of every OTP user (phone) and bulk user (email), in parallel."""

    def put(job: tuple[str, dict[str, str]]) -> None:
        user, kwargs = job
        for _ in range(20):
            try:
                stack.put_contact_points(user, **kwargs)
                return
            except Exception:  # a loaded API may time out; the PUT is idempotent
                time.sleep(0.5)
        stack.put_contact_points(user, **kwargs)

    jobs = [(f"fault-otp-{i}", {"phone": otp_phone(i)}) for i in range(n_otp)]
    jobs += [(f"fault-bulk-{j}", {"email": bulk_email(j)}) for j in range(n_bulk)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, jobs))


@dataclass
class Producer:
    """Steady OTP load (`rate`/s) plus a bulk request of `bulk_size` users every `bulk_every` s."""

    api_url: str
    rate: float
    otp_users: int
    bulk_users: int
    bulk_every: float = 2.0
    bulk_size: int = 10
    workers: int = 32
    retry_for: float = 120.0
    accepted: list[Accepted] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (request_id, last error)
    unconfirmed: list[Accepted] = field(default_factory=list)  # the refused, as ledger entries
    otp_sent: int = 0
    bulk_sent: int = 0
    _queue: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, otp_limit: int, bulk_limit: int) -> None:
        """Start sending; stops by itself after `otp_limit` OTPs and `bulk_limit` bulk users."""
        self._threads = [threading.Thread(target=self._pace, args=(otp_limit, bulk_limit))]
        self._threads += [threading.Thread(target=self._work) for _ in range(self.workers)]
        for t in self._threads:
            t.daemon = True
            t.start()

    def stop(self, drain_timeout: float = 150.0) -> None:
        """Stop pacing, let in-flight requests finish their retries, join the threads."""
        self._stop.set()
        for _ in range(self.workers):
            self._queue.put(None)
        deadline = time.monotonic() + drain_timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _pace(self, otp_limit: int, bulk_limit: int) -> None:
        start = time.monotonic()
        next_bulk = start
        while not self._stop.is_set() and self.otp_sent < otp_limit:
            now = time.monotonic()
            due = int((now - start) * self.rate) + 1
            while self.otp_sent < min(due, otp_limit):
                i = self.otp_sent
                self._queue.put(
                    {
                        "request_id": f"fault-otp-{i}",
                        "notification_type": "otp_login",
                        "recipients": {"user_ids": [f"fault-otp-{i % self.otp_users}"]},
                        "params": {"code": f"{(i * 7919) % 1_000_000:06d}"},
                    }
                )
                self.otp_sent += 1
            if now >= next_bulk and (self.bulk_sent + 1) * self.bulk_size <= bulk_limit:
                k = self.bulk_sent
                users = range(k * self.bulk_size, (k + 1) * self.bulk_size)
                self._queue.put(
                    {
                        "request_id": f"fault-bulk-{k}",
                        "notification_type": "promo_weekly",
                        "recipients": {
                            "user_ids": [f"fault-bulk-{j % self.bulk_users}" for j in users]
                        },
                        "params": {"week": "48", "highlights_url": "https://example.com/w48"},
                    }
                )
                self.bulk_sent += 1
                next_bulk += self.bulk_every
            time.sleep(0.01)

    def _work(self) -> None:
        headers = {"X-API-Key": DEV_API_KEY}
        with httpx.Client(base_url=self.api_url, headers=headers, timeout=10.0) as http:
            while (body := self._queue.get()) is not None:
                sent_at = time.monotonic()
                nid, attempts, err = _post_until_accepted(http, body, sent_at + self.retry_for)
                with self._lock:
                    if nid is None:
                        # never answered 202, yet a timed-out write may still have become
                        # durable: its deliveries are "unconfirmed", so a copy is no stray
                        self.refused.append((body["request_id"], err))
                        nid = notification_id(TENANT, body["request_id"])
                        entry = self._entry(body, nid, sent_at, attempts)
                        for i, e in enumerate(entry.expected):
                            entry.expected[i] = replace(e, traffic_class="unconfirmed")
                        self.unconfirmed.append(entry)
                    else:
                        self.accepted.append(self._entry(body, nid, sent_at, attempts))

    @staticmethod
    def _entry(body: dict[str, Any], nid: str, sent_at: float, attempts: int) -> Accepted:
        users: list[str] = body["recipients"]["user_ids"]
        if body["notification_type"] == "otp_login":
            i = int(users[0].rsplit("-", 1)[1])
            exp = [ExpectedDelivery(nid, users[0], "sms", otp_phone(i), "transactional")]
            kind = "otp"
        else:
            exp = [
                ExpectedDelivery(nid, u, "email", bulk_email(int(u.rsplit("-", 1)[1])), "bulk")
                for u in users
            ]
            kind = "bulk"
        now = time.monotonic()
        return Accepted(body["request_id"], nid, kind, sent_at, now, attempts, exp)


class ProviderPoll:
    """Keeps a ProviderView of every simulator up to date (a background thread)."""

    def __init__(self, stack: StackClient, pid_of: Callable[[str], int], every: float = 1.0):
        self.stack = stack
        self.pid_of = pid_of
        self.every = every
        self.view = ProviderView()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def snapshot(self, name: str) -> bool:
        """Take one snapshot of simulator `name` now; False when it did not answer."""
        try:
            pid = self.pid_of(f"sim-{name}")
            stats = self.stack.sim(name).stats(ids=True)
        except Exception:  # down or restarting: the next round catches up
            return False
        with self._lock:
            self.view.observe(name, pid, stats, at=time.monotonic())
        return True

    def snapshot_all(self) -> None:
        for name in SIMULATORS:
            self.snapshot(name)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.snapshot_all()
