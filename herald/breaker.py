"""Circuit breaker per provider, its state shared by every worker process through Redis.

    closed ──(error rate ≥ threshold over the rolling window, volume ≥ minimum)──▶ open
    open ──(cool-down elapsed)──▶ half_open: `probes` calls let through, across all processes
    half_open ──probe succeeds──▶ closed (window cleared)
    half_open ──probe fails──▶ open (new cool-down)
    any ──trip(reason, for_s)──▶ open (a platform pause: bad credentials, config)
    any ──reset()──▶ closed (operator)

Redis keys (hash tag `{<provider>}` so both live in one Cluster slot):
`<prefix>breaker:{<provider>}` (hash: state, open_until, probes, probe_deadline, reason, trips)
and `<prefix>breaker:{<provider>}:win` (hash of per-bucket success/failure counts). Every
transition runs in one Lua script on Redis `TIME`, so processes never disagree because of clocks.
A probe permit that is never reported (its worker died) is re-issued after `probe_timeout_s`.

Local fast path: each process caches the state and batches its success/failure counts, going to
Redis once per `sync_interval_s` (or every `flush_every` recorded calls) instead of per call;
the answers of one batch of calls (`record_outcomes`, dispatch's chunk of sends) are counted
together and synced at most once, after the last of them.
While the cache says *closed*, `allow` costs no round trip; while it says *open* with cool-down
left, neither. Staleness bound: a process may keep calling a provider for at most
`sync_interval_s` (or `flush_every` of its own calls, whichever comes first) after another
process opened the breaker, and its own failures reach the shared window within the same bound
(for answers recorded together: once the batch's last answer is recorded).
Half-open permits always go to Redis (they are few by design).

Not thread-safe by itself beyond a coarse lock: share one instance per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis

from herald.outcomes import Outcome, RateLimited

__all__ = [
    "Admission",
    "BreakerConfig",
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "counts_as_failure",
]

_SCRIPT = """
if redis.replicate_commands then redis.replicate_commands() end  -- TIME, then writes (Redis < 5)
local op = ARGV[1]
local window_ms, bucket_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local min_volume, max_rate = tonumber(ARGV[4]), tonumber(ARGV[5])
local cooldown_ms, n_probes, probe_ms = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local a, b = tonumber(ARGV[9]), tonumber(ARGV[10])
local reason_arg = ARGV[11]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'state', 'open_until', 'probes', 'probe_deadline')
local state = h[1] or 'closed'
local open_until, probes, probe_deadline = tonumber(h[2] or '0'), tonumber(h[3] or '0'),
  tonumber(h[4] or '0')
local allowed, wait = 0, 0

local function save(fields)
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('PEXPIRE', KEYS[1], 86400000)
end
local function half_open()
  state, probes, probe_deadline = 'half_open', n_probes, now + probe_ms
  save({'state', state, 'probes', probes, 'probe_deadline', probe_deadline})
end
local function open(reason, dur)
  state, open_until = 'open', now + dur
  save({'state', state, 'open_until', open_until, 'reason', reason, 'changed_at', now})
  redis.call('HINCRBY', KEYS[1], 'trips', 1)
  redis.call('DEL', KEYS[2])
end
local function close()
  state = 'closed'
  save({'state', state, 'probes', 0, 'reason', '', 'changed_at', now})
  redis.call('DEL', KEYS[2])
end
local function window(add_ok, add_err)
  local cur = math.floor(now / bucket_ms)
  local oldest = cur - math.floor(window_ms / bucket_ms) + 1
  if add_ok > 0 then redis.call('HINCRBY', KEYS[2], 'o:' .. cur, add_ok) end
  if add_err > 0 then redis.call('HINCRBY', KEYS[2], 'e:' .. cur, add_err) end
  if add_ok + add_err > 0 then redis.call('PEXPIRE', KEYS[2], window_ms * 2) end
  local ok, err = 0, 0
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    local kind, bucket = string.sub(all[i], 1, 1), tonumber(string.sub(all[i], 3))
    if bucket < oldest then redis.call('HDEL', KEYS[2], all[i])
    elseif kind == 'o' then ok = ok + tonumber(all[i + 1])
    else err = err + tonumber(all[i + 1]) end
  end
  return ok, err
end

if state == 'open' and now >= open_until then half_open() end
if state == 'half_open' and now >= probe_deadline then half_open() end

local ok, err = 0, 0
if op == 'sync' or (op == 'result' and state == 'closed') then
  if state == 'closed' then
    ok, err = window(a, b)
    if ok + err >= min_volume and err >= max_rate * (ok + err) then
      open('error_rate', cooldown_ms)
    end
  end
elseif op == 'result' and state == 'half_open' then
  if a > 0 then close() else open('probe_failed', cooldown_ms) end
elseif op == 'probe' then
  if state == 'closed' then allowed = 1
  elseif state == 'half_open' and probes > 0 then
    allowed = 1
    probes = redis.call('HINCRBY', KEYS[1], 'probes', -1)
  end
elseif op == 'trip' then
  open(reason_arg, a)
elseif op == 'reset' then
  close()
elseif op == 'peek' and state == 'closed' then
  ok, err = window(0, 0)
end
if state == 'open' then wait = open_until - now
elseif state == 'half_open' and allowed == 0 then wait = probe_deadline - now end
local extra = redis.call('HMGET', KEYS[1], 'trips', 'reason')
return {state, allowed, wait, ok, err, tonumber(extra[1] or '0'), extra[2] or ''}
"""


class BreakerState(StrEnum):
    """The three states of a circuit breaker."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds of one provider's breaker (times in seconds)."""

    window_s: float = 30.0
    bucket_s: float = 1.0
    min_volume: int = 20
    error_rate: float = 0.5
    cooldown_s: float = 30.0
    probes: int = 3
    probe_timeout_s: float = 10.0
    sync_interval_s: float = 0.25
    flush_every: int = 500

    def __post_init__(self) -> None:
        if not 0.0 < self.error_rate <= 1.0:
            raise ValueError("error_rate must be in (0, 1]")
        if self.bucket_s <= 0 or self.window_s < self.bucket_s:
            raise ValueError("breaker needs 0 < bucket_s <= window_s")
        if self.probes < 1 or self.min_volume < 1 or self.flush_every < 1:
            raise ValueError("probes, min_volume and flush_every must be >= 1")


@dataclass(frozen=True, slots=True)
class Admission:
    """Answer of `allow`: call the provider or not; `probe` calls must be reported with
    `record(..., probe=True)`; `retry_in_s` says when asking again may succeed."""

    allowed: bool
    state: BreakerState
    probe: bool = False
    retry_in_s: float = 0.0


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """Shared state of one provider's breaker, for metrics and dashboards."""

    provider: str
    state: BreakerState
    successes: int
    failures: int
    retry_in_s: float
    trips: int
    reason: str

    @property
    def error_rate(self) -> float:
        """Failures over calls in the current window (0.0 when empty or not closed)."""
        total = self.successes + self.failures
        return self.failures / total if total else 0.0


@dataclass
class _Local:
    state: BreakerState = BreakerState.CLOSED
    deny_until: float = 0.0  # local monotonic time until which allow() refuses without Redis
    synced_at: float = float("-inf")
    pending_ok: int = 0
    pending_err: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def counts_as_failure(outcome: Outcome) -> bool | None:
    """Whether an outcome is a provider failure for the breaker (None: don't count it).

    5xx, network errors, unknown outcomes and platform errors are failures; an answer about the
    message itself (accepted, permanent, token dead) proves the provider healthy; 429 is the
    shaper's business, not a fault.
    """
    if isinstance(outcome, RateLimited):
        return None
    return outcome.kind in ("retryable", "unknown", "platform_error")


class CircuitBreaker:
    """Per-provider circuit breakers shared across processes (one instance per process)."""

    def __init__(
        self,
        client: redis.Redis,
        config: BreakerConfig | None = None,
        *,
        overrides: Mapping[str, BreakerConfig] | None = None,
        prefix: str = "herald:",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._default = config or BreakerConfig()
        self._overrides = dict(overrides or {})
        self._prefix = prefix
        self._clock = clock
        self._script = client.register_script(_SCRIPT)
        self._local: dict[str, _Local] = {}
        self._guard = threading.Lock()

    def config(self, provider: str) -> BreakerConfig:
        """The thresholds in force for `provider`."""
        return self._overrides.get(provider, self._default)

    def allow(self, provider: str) -> Admission:
        """Ask before each provider call; a refused call is not an attempt (see retry)."""
        loc = self._loc(provider)
        with loc.lock:
            if self._clock() - loc.synced_at >= self.config(provider).sync_interval_s:
                self._call(provider, loc, "sync")
            now = self._clock()
            if loc.state is BreakerState.CLOSED:
                return Admission(True, BreakerState.CLOSED)
            if now < loc.deny_until:
                return Admission(False, loc.state, retry_in_s=loc.deny_until - now)
            reply = self._call(provider, loc, "probe")
        allowed = bool(reply[1])
        state = BreakerState(_text(reply[0]))
        probe = allowed and state is not BreakerState.CLOSED
        return Admission(allowed, state, probe, 0.0 if allowed else int(reply[2]) / 1000.0)

    def record(self, provider: str, ok: bool, *, probe: bool = False) -> None:
        """Report a call's result; probes are reported at once, others batched locally."""
        loc = self._loc(provider)
        with loc.lock:
            if probe:
                self._call(provider, loc, "result", 1 if ok else 0, 0 if ok else 1)
                return
            if self._count(loc, ok):
                self._sync_if_due(provider, loc)

    def record_outcomes(self, results: Iterable[tuple[Outcome, Admission]]) -> None:
        """`record` for the typed answers of one batch of calls (429 is not counted, see
        `counts_as_failure`), each provider's counts synced at most once at the end (when
        due): a batch's answers are known together, and a dispatch batch of 8,000 pushes
        otherwise stopped for a Redis round trip every `flush_every` of them (7 % of the
        dispatch job's busy time in a 50k campaign)."""
        touched: set[str] = set()
        for outcome, admission in results:
            failed = counts_as_failure(outcome)
            if admission.probe:  # a throttled probe proves the provider answers
                self.record(outcome.provider, not failed, probe=True)
            elif failed is not None:
                loc = self._loc(outcome.provider)
                with loc.lock:
                    if self._count(loc, not failed):
                        touched.add(outcome.provider)
        for provider in touched:
            loc = self._loc(provider)
            with loc.lock:
                self._sync_if_due(provider, loc)

    @staticmethod
    def _count(loc: _Local, ok: bool) -> bool:
        """Count a result locally; False for a stale-cache call during open/half-open (not
        part of any window)."""
        if loc.state is not BreakerState.CLOSED:
            return False
        if ok:
            loc.pending_ok += 1
        else:
            loc.pending_err += 1
        return True

    def _sync_if_due(self, provider: str, loc: _Local) -> None:
        if loc.state is not BreakerState.CLOSED:
            return  # opened meanwhile (a probe or a trip): its counts wait for the next sync
        cfg = self.config(provider)
        due = self._clock() - loc.synced_at >= cfg.sync_interval_s
        if due or loc.pending_ok + loc.pending_err >= cfg.flush_every:
            self._call(provider, loc, "sync")

    def trip(self, provider: str, reason: str, for_s: float) -> None:
        """Open the breaker now for `for_s` seconds (platform pause), then half-open as usual."""
        loc = self._loc(provider)
        with loc.lock:
            self._call(provider, loc, "trip", int(for_s * 1000), 0, reason)

    def reset(self, provider: str) -> None:
        """Close the breaker now (operator action, e.g. after fixing credentials)."""
        loc = self._loc(provider)
        with loc.lock:
            self._call(provider, loc, "reset", 0, 0)

    def flush(self) -> None:
        """Push locally batched counts to Redis now (e.g. before a worker stops)."""
        for provider, loc in list(self._local.items()):
            with loc.lock:
                if loc.pending_ok or loc.pending_err:
                    self._call(provider, loc, "sync")

    def state(self, provider: str) -> BreakerState:
        """The shared (authoritative) state, read from Redis."""
        return self.snapshot([provider])[0].state

    def snapshot(self, providers: Iterable[str]) -> list[BreakerSnapshot]:
        """Shared state of each provider's breaker in one pipelined round trip."""
        names = list(providers)
        pipe = self._client.pipeline(transaction=False)
        for provider in names:
            self._run(provider, "peek", client=pipe)
        replies = pipe.execute()
        return [_snapshot(p, r) for p, r in zip(names, replies, strict=True)]

    def _loc(self, provider: str) -> _Local:
        loc = self._local.get(provider)
        if loc is None:
            with self._guard:
                loc = self._local.setdefault(provider, _Local())
        return loc

    def _call(
        self,
        provider: str,
        loc: _Local,
        op: str,
        a: int | None = None,
        b: int = 0,
        reason: str = "",
    ) -> list[Any]:
        if a is None:
            a, b = loc.pending_ok, loc.pending_err
        reply: list[Any] = self._run(provider, op, a, b, reason)
        if op in ("sync", "result"):
            loc.pending_ok = loc.pending_err = 0
        now = self._clock()
        loc.synced_at = now
        loc.state = BreakerState(_text(reply[0]))
        wait_s = int(reply[2]) / 1000.0
        # Refuse locally while open, or while half-open with no permit left (for at most one
        # sync interval, so a closing breaker is noticed promptly).
        if loc.state is BreakerState.OPEN:
            loc.deny_until = now + wait_s
        elif loc.state is BreakerState.HALF_OPEN and op == "probe" and not int(reply[1]):
            loc.deny_until = now + min(wait_s, self.config(provider).sync_interval_s)
        else:
            loc.deny_until = now
        return reply

    def _run(
        self,
        provider: str,
        op: str,
        a: int = 0,
        b: int = 0,
        reason: str = "",
        client: redis.Redis | None = None,
    ) -> list[Any]:
        cfg = self.config(provider)
        key = f"{self._prefix}breaker:{{{provider}}}"
        args: list[str | int | float] = [
            op, int(cfg.window_s * 1000), int(cfg.bucket_s * 1000), cfg.min_volume,
            cfg.error_rate, int(cfg.cooldown_s * 1000), cfg.probes,
            int(cfg.probe_timeout_s * 1000), a, b, reason,
        ]  # fmt: skip
        reply: list[Any] = self._script(keys=[key, f"{key}:win"], args=args, client=client)
        return reply


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _snapshot(provider: str, reply: list[Any]) -> BreakerSnapshot:
    return BreakerSnapshot(
        provider=provider,
        state=BreakerState(_text(reply[0])),
        successes=int(reply[3]),
        failures=int(reply[4]),
        retry_in_s=int(reply[2]) / 1000.0,
        trips=int(reply[5]),
        reason=_text(reply[6]),
    )
