"""Fault-injection configuration shared by every provider simulator.

One pydantic model per simulator (a subclass of `SimConfig`) is given at start (`--config`)
and patched at run time (`POST /_admin/config`). A patch replaces whole top-level fields:
`{"errors": {"Unregistered": 0.1}}` replaces the error mix, `{"latency": {...}}` the latency.

    latency               per-request service time: fixed | uniform | lognormal (ms)
    errors                probability per error kind (the simulator's wire reason/code names)
    rate_limit            requests/s (token bucket, burst = rate_burst or one second's worth);
                          over it → the provider's 429 shape with Retry-After
    timeout_after_accept  probability that an accepted request is recorded and never answered
    lose_before_accept    probability that a request is lost before the provider takes it:
                          never recorded (no message, no receipt, not in its lookup API) and
                          never answered (the client times out: an Unknown it must reconcile)
    invalid, unregistered addresses that always fail as invalid / dead
    receipts              status callbacks: delay, step gap, duplication, out-of-order, outcomes
"""

from __future__ import annotations

import math
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["LatencyConfig", "ReceiptConfig", "SimConfig", "sample_ms"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatencyConfig(_Model):
    """A latency distribution in milliseconds."""

    kind: Literal["fixed", "uniform", "lognormal"] = "fixed"
    ms: float = Field(default=0.0, ge=0, description="fixed: the latency")
    min_ms: float = Field(default=0.0, ge=0, description="uniform: lower bound")
    max_ms: float = Field(default=0.0, ge=0, description="uniform: upper bound")
    median_ms: float = Field(default=0.0, ge=0, description="lognormal: median")
    sigma: float = Field(default=0.5, ge=0, description="lognormal: sigma of the underlying normal")
    cap_ms: float = Field(default=60_000.0, gt=0, description="upper clamp for any sample")


def sample_ms(latency: LatencyConfig, rng: random.Random) -> float:
    """One sample (ms) of `latency`."""
    if latency.kind == "fixed":
        value = latency.ms
    elif latency.kind == "uniform":
        value = rng.uniform(latency.min_ms, max(latency.min_ms, latency.max_ms))
    else:
        value = (
            0.0
            if latency.median_ms <= 0
            else rng.lognormvariate(math.log(latency.median_ms), latency.sigma)
        )
    return min(value, latency.cap_ms)


class ReceiptConfig(_Model):
    """Status callbacks (SMS status, DLRs, email events) posted to the callback URL."""

    enabled: bool = True
    delay: LatencyConfig = Field(default_factory=lambda: LatencyConfig(ms=50.0))
    step_ms: float = Field(default=30.0, ge=0, description="gap between successive statuses")
    duplicate: float = Field(
        default=0.0, ge=0, le=1, description="probability to send a status twice"
    )
    out_of_order: float = Field(
        default=0.0, ge=0, le=1, description="probability that one message's statuses come reversed"
    )
    outcomes: dict[str, float] = Field(
        default_factory=lambda: {"delivered": 1.0},
        description="final outcome mix; names are per simulator (e.g. 'undelivered:30003')",
    )
    batch_ms: float = Field(default=100.0, gt=0, description="email: event webhook flush interval")
    batch_max: int = Field(default=100, ge=1, description="email: max events per webhook POST")
    retries: int = Field(
        default=2, ge=0, description="re-POSTs of a callback answered non-2xx/failed"
    )

    @model_validator(mode="after")
    def _check_outcomes(self) -> ReceiptConfig:
        if any(p < 0 for p in self.outcomes.values()) or not sum(self.outcomes.values()) > 0:
            raise ValueError("receipts.outcomes needs non-negative weights with a positive sum")
        return self


class SimConfig(_Model):
    """Fault injection common to all simulators; subclasses add provider credentials."""

    seed: int | None = None
    latency: LatencyConfig = Field(default_factory=lambda: LatencyConfig())
    errors: dict[str, float] = Field(default_factory=dict)
    rate_limit: float | None = Field(default=None, gt=0, description="requests/s before 429")
    rate_burst: float | None = Field(default=None, gt=0)
    retry_after_s: float = Field(default=1.0, ge=0, description="Retry-After for injected 429/503")
    timeout_after_accept: float = Field(default=0.0, ge=0, le=1)
    lose_before_accept: float = Field(default=0.0, ge=0, le=1)
    invalid: list[str] = Field(default_factory=list)
    unregistered: list[str] = Field(default_factory=list)
    record_ids: bool = Field(
        default=True, description="keep accepted ids per address (admin stats)"
    )
    receipts: ReceiptConfig = Field(default_factory=lambda: ReceiptConfig())

    @model_validator(mode="after")
    def _check_errors(self) -> SimConfig:
        if any(p < 0 or p > 1 for p in self.errors.values()):
            raise ValueError("errors: each probability must be within [0, 1]")
        if sum(self.errors.values()) + self.timeout_after_accept > 1.0 + 1e-9:
            raise ValueError("errors + timeout_after_accept must sum to <= 1")
        if self.lose_before_accept + self.timeout_after_accept > 1.0 + 1e-9:
            raise ValueError("lose_before_accept + timeout_after_accept must sum to <= 1")
        return self

    def patched(self, patch: dict[str, Any]) -> SimConfig:
        """A validated copy with whole top-level fields replaced by `patch`."""
        return type(self).model_validate({**self.model_dump(), **patch})
