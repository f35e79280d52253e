"""Run-time fault decisions and counters of one simulator process.

`Faults` turns the current `SimConfig` into per-request decisions (latency, rate limit, injected
error, hang after accept); `Stats` counts what happened and keeps, per address, the ids of the
messages accepted for it so tests can count duplicates (`GET /_admin/stats`), and a log of
`[unix time, address, outcome]` per provider request so end-to-end tests can measure when each
message arrived and how retries spread (`GET /_admin/stats?log=1`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from typing import Any

from infra.simulators.config import LatencyConfig, SimConfig, sample_ms

__all__ = ["Faults", "Stats"]


class Faults:
    """Decisions drawn from a `SimConfig`; `update()` swaps the config atomically."""

    def __init__(self, config: SimConfig) -> None:
        self.rng = random.Random(config.seed)
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self.update(config)

    def update(self, config: SimConfig) -> None:
        """Install a new config (rate-limit bucket refilled, error table rebuilt)."""
        self.config = config
        if config.seed is not None:
            self.rng.seed(config.seed)
        self.invalid = frozenset(config.invalid)
        self.unregistered = frozenset(config.unregistered)
        self._errors: list[tuple[float, str]] = []
        acc = 0.0
        for kind, p in config.errors.items():
            if p > 0:
                acc += p
                self._errors.append((acc, kind))
        self._burst = config.rate_burst or max(1.0, config.rate_limit or 0.0)
        self._tokens = self._burst
        self._stamp = time.monotonic()

    def sample(self, latency: LatencyConfig) -> float:
        """One latency sample in seconds."""
        return sample_ms(latency, self.rng) / 1000.0

    async def delay(self) -> None:
        """Sleep for one sample of the configured service latency."""
        seconds = self.sample(self.config.latency)
        if seconds > 0:
            await asyncio.sleep(seconds)

    def throttle(self) -> float | None:
        """None if the request may pass the rate limit, else the Retry-After in seconds."""
        rate = self.config.rate_limit
        if rate is None:
            return None
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return float(max(1, math.ceil((1.0 - self._tokens) / rate)))

    def pick_error(self) -> str | None:
        """An injected error kind drawn from the error mix, or None."""
        if not self._errors:
            return None
        r = self.rng.random()
        for bound, kind in self._errors:
            if r < bound:
                return kind
        return None

    def hang(self) -> bool:
        """Whether this accepted request should never be answered."""
        p = self.config.timeout_after_accept
        return p > 0 and self.rng.random() < p

    def lose(self) -> bool:
        """Whether this request is lost before the provider takes it (never answered)."""
        p = self.config.lose_before_accept
        return p > 0 and self.rng.random() < p

    def chance(self, p: float) -> bool:
        """True with probability `p`."""
        return p > 0 and self.rng.random() < p

    def choose(self, weights: dict[str, float]) -> str:
        """A key of `weights` drawn proportionally to its weight."""
        total = sum(weights.values())
        r = self.rng.random() * total
        for key, w in weights.items():
            r -= w
            if r < 0:
                return key
        return next(iter(weights))


class Stats:
    """Counters of one simulator process (reset by `POST /_admin/reset`)."""

    def __init__(self) -> None:
        self.record_log = True  # follows SimConfig.record_ids (set by the simulator)
        self.reset()

    def reset(self) -> None:
        """Zero every counter and forget the accepted-id log."""
        self.requests = 0
        self.accepted = 0
        self.hung = 0
        self.lost = 0
        self.rate_limited = 0
        self.errors: Counter[str] = Counter()
        self.callbacks: Counter[str] = Counter()
        self.accepted_ids: dict[str, list[list[str | None]]] = {}
        self.extra: Counter[str] = Counter()
        self.log: list[tuple[float, str | None, str]] = []
        self.last_accepted_at: float | None = None  # unix time of the last accepted message
        # the last accepted message's headers and bodies per address (providers that have
        # them: the email simulator keeps List-Unsubscribe for tests), when recording ids
        self.messages: dict[str, dict[str, Any]] = {}

    def error(self, kind: str, address: str | None = None) -> None:
        """Count one answered error of `kind` (wire reason or code); log it when recording."""
        self.errors[kind] += 1
        if self.record_log:
            self.log.append((time.time(), address, kind))

    def accept(self, address: str, msg_id: str, ref: str | None, record: bool) -> None:
        """Count one accepted message; keep `[msg_id, ref]` under its address if `record`."""
        self.accepted += 1
        self.last_accepted_at = now = time.time()
        if record:
            self.accepted_ids.setdefault(address, []).append([msg_id, ref])
            self.log.append((now, address, "accepted"))

    def snapshot(self, include_ids: bool = True, include_log: bool = False) -> dict[str, Any]:
        """JSON-able view for `GET /_admin/stats`."""
        out: dict[str, Any] = {
            "requests": self.requests,
            "accepted": self.accepted,
            "last_accepted_at": self.last_accepted_at,
            "hung": self.hung,
            "lost": self.lost,
            "rate_limited": self.rate_limited,
            "errors": dict(self.errors),
            "callbacks": dict(self.callbacks),
            **dict(self.extra),
        }
        if include_ids:
            out["accepted_ids"] = self.accepted_ids
            if self.messages:
                out["messages"] = self.messages
        if include_log:
            out["log"] = self.log
        return out
