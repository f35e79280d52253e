"""Global rate shaping per provider: one token bucket shared by every worker and process.

One Lua script per `acquire` does everything atomically in Redis, on Redis `TIME` (never a
worker's clock), so no worker ever assumes the whole quota. Keys (hash tag `{<provider>}`):
`<prefix>shape:{<provider>}` (hash: tokens, refill time, usage averages) and two sorted sets of
the flows active in the last `tenant_idle_s` (`...:flows` for normal/bulk, `...:txn` for
transactional tenants).

Budget (example: rate 10k/s, reserved 3k/s):

- **Global bucket G**: refills at `rate`, depth `rate * burst_s`. Every token granted to anyone
  comes out of G, so over any interval T the grants never exceed `rate * T + depth`. With a
  `jitter_s` allowance the bucket runs with `burst_s - jitter_s` instead (below, `burst_s` is
  that), so the bound also holds where the requests arrive (ProviderRate).
- **Priority by level instead of split buckets.** A request may only take G's tokens *above its
  floor*: transactional (while its usage is within `reserved`) down to 0; a normal/bulk flow
  within its fair share down to `L1 = reserved * burst_s`; any flow above its share (and
  transactional beyond its reserve) down to `L2 = L1 + (depth - L1) / 4`. Saturated bulk therefore
  keeps G at L1..L2 and still gets the *whole* rate while transactional is idle (the held-back
  tokens are a standing buffer, not a rate) — bulk borrows the unused reserve. The moment
  transactional traffic arrives it takes the held tokens and every refill below L1 before any
  bulk flow can: it gets its reserve back on its very next request, with no demand estimate to
  wait for, and bulk drops to `rate - transactional usage` (never below `rate - cap`).
- **OTP flood cap**: transactional also draws from its own bucket T (rate `transactional_cap`,
  default `reserved`), so a flood gets at most the cap and can't eat bulk's share.
- **Tenant fairness** (max-min): each flow (class × tenant) has an exponentially averaged usage
  (tokens granted) and demand (tokens asked), time constant `tenant_tau_s`. The fair level is
  water-filled over the active flows' demand: the pool (`rate - transactional usage` for
  normal/bulk, `cap` inside transactional) is split equally, flows asking less than their split
  keep what they ask and the rest is split again among the others (recomputed at most every
  100 ms, O(k log k) for k active flows). Flows whose usage is below the level take priority
  (floor L1; inside transactional, T's floor 0 instead of half its depth); flows at or above it
  only get what the others leave (work-conserving): one campaign cannot take the whole bulk
  budget, a light flow gets what it asks for at once, a lone campaign still gets everything.
  Normal-class flows compete with bulk flows as equals; the number of processes a tenant runs
  does not buy it a larger share.

Redis: any version with Lua and `TIME` in scripts (effects replication, default since 5.0);
Cluster-safe (all keys of a provider share its hash tag). Beyond 2000 active flows in a class
the fair level falls back to an equal split.

`acquire(provider, traffic_class, tenant, n)` grants up to `n` tokens in one round trip (a sink
takes its whole batch at once) and says how long to wait before the rest may be available.
Batches should stay well below the bucket depth (`rate * burst_s`). All processes must use the
same `ProviderRate` for a provider (it travels with each call; a change applies at once).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import redis

from herald.errors import ConfigError

__all__ = ["Grant", "ProviderRate", "RateShaper", "ShaperSnapshot", "TrafficClass"]

TrafficClass = Literal["transactional", "normal", "bulk"]
_CLASSES = ("transactional", "normal", "bulk")

_SCRIPT = """
if redis.replicate_commands then redis.replicate_commands() end  -- TIME, then writes (Redis < 5)
local mode, class, tenant, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local rate, reserved, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local burst_s, tau, idle_ms = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local gmax, tmax = rate * burst_s, math.max(cap * burst_s, 1)
local l1 = reserved * burst_s
local l2 = l1 + (gmax - l1) / 4
local h = redis.call('HMGET', KEYS[1], 'g', 't', 'ts', 'ut', 'utt')
local g, tk, ts = tonumber(h[1] or gmax), tonumber(h[2] or tmax), tonumber(h[3] or now)
local dt = math.max(now - ts, 0)
g = math.min(gmax, g + rate * dt)
tk = math.min(tmax, tk + cap * dt)
local function decay(u, at)
  if not u or not at then return 0 end
  return tonumber(u) * math.exp(-math.max(now - tonumber(at), 0) / tau)
end
local u_tr = decay(h[4], h[5])
local function f6(x) return string.format('%.6f', x) end

if mode == 'peek' then
  local out = {f6(g), f6(tk), f6(u_tr), f6(now)}
  local all = redis.call('HGETALL', KEYS[1])
  local at = {}
  for i = 1, #all, 2 do at[all[i]] = all[i + 1] end
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'u:' then
      local flow = string.sub(all[i], 3)
      table.insert(out, flow)
      table.insert(out, f6(decay(all[i + 1], at['ut:' .. flow])))
    end
  end
  return out
end

local set = KEYS[2]
if class == 'transactional' then set = KEYS[3] end
local flow = class .. ':' .. tenant
local cutoff = string.format('%.3f', now * 1000 - idle_ms)
local stale = redis.call('ZRANGEBYSCORE', set, '-inf', '(' .. cutoff)
for _, f in ipairs(stale) do redis.call('HDEL', KEYS[1], 'u:' .. f, 'a:' .. f, 'ut:' .. f) end
if #stale > 0 then redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. cutoff) end
redis.call('ZADD', set, string.format('%.3f', now * 1000), flow)
local fu = redis.call('HMGET', KEYS[1], 'u:' .. flow, 'a:' .. flow, 'ut:' .. flow)
local u_f, a_f = decay(fu[1], fu[3]), decay(fu[2], fu[3]) + n / tau

-- Max-min fair level of the active flows of `set` sharing `pool`: water-filling over their
-- demand (averaged tokens asked; a backlogged flow asks again and again, so its demand is
-- never mistaken for satisfied). Recomputed at most every 100 ms per class, cached.
local function fair_level(pool, field)
  local c = redis.call('HMGET', KEYS[1], field, field .. '_at')
  if c[1] and c[2] and now - tonumber(c[2]) < 0.1 then return tonumber(c[1]) end
  local flows = redis.call('ZRANGE', set, 0, -1)
  if #flows > 2000 then return pool / #flows end  -- unpack() limit: plain equal split
  local fields = {}
  for _, f in ipairs(flows) do
    fields[#fields + 1] = 'a:' .. f
    fields[#fields + 1] = 'ut:' .. f
  end
  local vals = redis.call('HMGET', KEYS[1], unpack(fields))
  local demand = {}
  for i = 1, #flows do demand[i] = decay(vals[2 * i - 1], vals[2 * i]) end
  table.sort(demand)
  local level, remaining = pool, pool
  for i, d in ipairs(demand) do
    local split = remaining / (#demand - i + 1)
    if d >= split then level = split break end
    remaining = remaining - d
  end
  redis.call('HSET', KEYS[1], field, f6(level), field .. '_at', f6(now))
  return level
end

local gfloor, tfloor, avail = l2, 0, 0
if class == 'transactional' then
  if reserved > 0 and u_tr <= reserved * 1.1 then gfloor = 0 end
  if u_f >= fair_level(cap, 'lvl_t') then tfloor = tmax / 2 end
  avail = math.min(g - gfloor, tk - tfloor)
else
  if u_f < fair_level(math.max(rate - math.min(u_tr, cap), 0), 'lvl_b') then gfloor = l1 end
  avail = g - gfloor
end
local granted = math.max(0, math.min(n, math.floor(avail)))
if granted > 0 then
  g = g - granted
  u_f = u_f + granted / tau
  if class == 'transactional' then
    tk = tk - granted
    u_tr = u_tr + granted / tau
  end
end
redis.call('HSET', KEYS[1], 'g', f6(g), 't', f6(tk), 'ts', f6(now), 'ut', f6(u_tr),
  'utt', f6(now), 'u:' .. flow, f6(u_f), 'a:' .. flow, f6(a_f), 'ut:' .. flow, f6(now))
local ttl = math.max(math.floor(idle_ms * 10), 3600000)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
local wait = 0
if granted < n then
  local need = n - granted
  wait = (math.min(gfloor + need, gmax) - g) / rate
  if class == 'transactional' then
    wait = math.max(wait, (math.min(tfloor + need, tmax) - tk) / cap)
  end
  wait = math.max(wait, 0.0005)
end
return {granted, f6(wait), f6(now)}
"""


@dataclass(frozen=True, slots=True)
class ProviderRate:
    """A provider's budget in tokens (calls or messages) per second.

    `reserved` is transactional's priority share; `transactional_cap` (default `reserved`) caps
    transactional traffic (OTP floods); `burst_s` sizes the bucket depth as seconds of `rate`.

    `jitter_s` is the transit-time variance the budget leaves room for: the bucket runs with
    `burst_s - jitter_s` seconds of depth, so that requests which reach the provider up to
    `jitter_s` earlier or later relative to each other than their tokens were granted still fit
    `rate * T + depth` there (grants alone stay within `rate * T + rate * (burst_s - jitter_s)`).
    """

    rate: float
    reserved: float = 0.0
    transactional_cap: float | None = None
    burst_s: float = 0.1
    tenant_tau_s: float = 1.0
    tenant_idle_s: float = 2.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst_s <= 0:
            raise ConfigError("rate and burst_s must be positive")
        if not 0 <= self.jitter_s < self.burst_s:
            raise ConfigError("jitter_s must be in [0, burst_s)")
        if not 0 <= self.reserved < self.rate:
            raise ConfigError("reserved must be in [0, rate)")
        if not self.reserved <= self.cap <= self.rate or self.cap <= 0:
            raise ConfigError("transactional_cap must be in [reserved, rate] and positive")
        if self.tenant_tau_s <= 0 or self.tenant_idle_s <= 0:
            raise ConfigError("tenant_tau_s and tenant_idle_s must be positive")

    @property
    def cap(self) -> float:
        """The effective transactional cap (tokens/s)."""
        if self.transactional_cap is not None:
            return self.transactional_cap
        return self.reserved if self.reserved > 0 else self.rate

    @property
    def depth(self) -> float:
        """Bucket depth: the most any interval can exceed `rate * interval` by."""
        return self.rate * self.burst_s


class Grant(NamedTuple):
    """`granted` tokens (0..n); `wait_s` before the rest may be available (0 when all were
    granted); `server_time` the Redis time of the grant (epoch seconds, for measurements)."""

    granted: int
    wait_s: float
    server_time: float


@dataclass(frozen=True, slots=True)
class ShaperSnapshot:
    """A provider's shared bucket for metrics/dashboards (usage in tokens/s, averaged)."""

    provider: str
    tokens: float
    transactional_tokens: float
    transactional_usage: float
    flow_usage: dict[str, float]
    server_time: float


class RateShaper:
    """Token buckets per provider, enforced globally through Redis (any number of processes)."""

    def __init__(
        self, client: redis.Redis, rates: Mapping[str, ProviderRate], *, prefix: str = "herald:"
    ) -> None:
        self._client = client
        self._rates = dict(rates)
        self._prefix = prefix
        self._script = client.register_script(_SCRIPT)

    def rate(self, provider: str) -> ProviderRate:
        """The configured budget of `provider` (ConfigError if none)."""
        try:
            return self._rates[provider]
        except KeyError:
            raise ConfigError(f"no rate configured for provider {provider!r}") from None

    def acquire(self, provider: str, traffic_class: TrafficClass, tenant: str, n: int) -> Grant:
        """Take up to `n` tokens for one batch in one round trip; never blocks."""
        if traffic_class not in _CLASSES:
            raise ValueError(f"unknown traffic class {traffic_class!r}")
        if n <= 0:
            return Grant(0, 0.0, 0.0)
        reply = self._run(provider, "acquire", traffic_class, tenant, n)
        return Grant(int(reply[0]), float(reply[1]), float(reply[2]))

    def take(
        self,
        provider: str,
        traffic_class: TrafficClass,
        tenant: str,
        n: int,
        max_wait_s: float,
    ) -> int:
        """Acquire until `n` tokens are granted or `max_wait_s` passed (sleeps); returns count.

        For callers that may block (benchmarks, simple sinks); a Bytewax sink prefers `acquire`
        and defers the rest of its batch.
        """
        deadline = time.monotonic() + max_wait_s
        got = 0
        while got < n:
            grant = self.acquire(provider, traffic_class, tenant, n - got)
            got += grant.granted
            remaining = deadline - time.monotonic()
            if got >= n or remaining <= 0:
                break
            time.sleep(min(grant.wait_s, remaining))
        return got

    def snapshot(self, provider: str) -> ShaperSnapshot:
        """Current tokens and averaged usage of `provider`'s bucket (no side effects)."""
        reply = self._run(provider, "peek", "bulk", "", 0)
        values = [r.decode() if isinstance(r, bytes) else str(r) for r in reply]
        flows = {values[i]: float(values[i + 1]) for i in range(4, len(values), 2)}
        return ShaperSnapshot(
            provider,
            float(values[0]),
            float(values[1]),
            float(values[2]),
            flows,
            float(values[3]),
        )

    def _run(self, provider: str, mode: str, cls: str, tenant: str, n: int) -> list[Any]:
        cfg = self.rate(provider)
        base = f"{self._prefix}shape:{{{provider}}}"
        args: list[str | int | float] = [
            mode, cls, tenant, n, cfg.rate, cfg.reserved, cfg.cap, cfg.burst_s - cfg.jitter_s,
            cfg.tenant_tau_s, int(cfg.tenant_idle_s * 1000),
        ]  # fmt: skip
        reply: list[Any] = self._script(keys=[base, f"{base}:flows", f"{base}:txn"], args=args)
        return reply
