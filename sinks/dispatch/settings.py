"""Settings of the dispatch jobs (env prefix `HERALD_DISPATCH_`), loaded only in entry points.

Provider endpoints and credentials are the clients' own settings (`HERALD_APNS_*`,
`HERALD_FCM_*`, `HERALD_TWILIO_*`, `HERALD_VONAGE_*`, `HERALD_SENDGRID_*`, see
sinks/providers/config.py). Dict-valued fields take JSON in the environment, e.g.

    HERALD_DISPATCH_RATES='{"sms_a": {"rate": 10000, "reserved": 3000}}'
    HERALD_DISPATCH_BACKOFF='{"bulk": {"base_s": 10, "cap_s": 600, "max_attempts": 6}}'

Every process that calls a provider must use the same `rates` for it (the token bucket is shared
through Redis). The send guard's PENDING TTL must outlast the longest hold of a guard: the
shaping wait of a batch plus two provider calls (an A→B failover), with a 50 % margin;
this is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from herald.backoff import BackoffPolicy
from herald.breaker import BreakerConfig
from herald.providers import DEFAULT_PROVIDER
from herald.shaping import ProviderRate
from sinks.provider_registry import specs

__all__ = ["BackoffModel", "BreakerModel", "DispatchSettings", "RateModel"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateModel(_Model):
    """A provider's budget (herald.shaping.ProviderRate): tokens = provider calls per second."""

    rate: float = Field(gt=0)
    reserved: float = Field(default=0.0, ge=0)
    transactional_cap: float | None = None
    burst_s: float = Field(default=0.1, gt=0)
    jitter_s: float = Field(
        default=0.025,
        ge=0,
        description="transit-time variance kept out of the bucket depth, so that the provider "
        "sees at most rate x T + rate x burst_s (herald.shaping.ProviderRate)",
    )

    def build(self) -> ProviderRate:
        """The validated ProviderRate (ConfigError when inconsistent)."""
        return ProviderRate(
            self.rate, self.reserved, self.transactional_cap, self.burst_s, jitter_s=self.jitter_s
        )


class BackoffModel(_Model):
    """Retry budget of a traffic class (herald.backoff.BackoffPolicy)."""

    base_s: float = 1.0
    cap_s: float = 300.0
    max_attempts: int = 8
    max_total_s: float | None = 3600.0
    retry_after_spread: float = 1.0

    def build(self) -> BackoffPolicy:
        """The validated BackoffPolicy."""
        return BackoffPolicy(**self.model_dump())


class BreakerModel(_Model):
    """Circuit breaker thresholds (herald.breaker.BreakerConfig)."""

    window_s: float = 30.0
    bucket_s: float = 1.0
    min_volume: int = 20
    error_rate: float = 0.5
    cooldown_s: float = 30.0
    probes: int = 3
    probe_timeout_s: float = 10.0
    sync_interval_s: float = 0.25
    flush_every: int = 500

    def build(self) -> BreakerConfig:
        """The validated BreakerConfig."""
        return BreakerConfig(**self.model_dump())


def _default_rates() -> dict[str, RateModel]:
    """Each registered provider's default budget (its module's SPEC)."""
    return {s.name: RateModel(rate=s.rate, reserved=s.reserved) for s in specs()}


def _default_backoff() -> dict[str, BackoffModel]:
    return {
        "transactional": BackoffModel(base_s=0.5, cap_s=30.0, max_attempts=6, max_total_s=900.0),
        "normal": BackoffModel(base_s=2.0, cap_s=300.0, max_attempts=8, max_total_s=6 * 3600.0),
        "bulk": BackoffModel(base_s=5.0, cap_s=900.0, max_attempts=8, max_total_s=24 * 3600.0),
    }


class DispatchSettings(BaseSettings):
    """Knobs of the dispatch and retry jobs (env prefix `HERALD_DISPATCH_`)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_DISPATCH_")

    # The notification-type catalog (bypass_opt_out, failover_on_unknown); None = the default.
    catalog_path: Path | None = None
    # Prefix of the shaper, breaker and guard keys in Redis (tests isolate themselves with it).
    state_prefix: str = "herald:"
    # Send guard: PENDING (transactional, before the call) and SENT/CLAIMED TTLs.
    pending_ttl_s: float = 60.0
    sent_ttl_s: float = 7 * 86400.0
    # A worker's lease on its PENDINGs (herald.guard): a killed worker's are taken over once it
    # lapses (or at once by the process that takes its seat), not after pending_ttl_s.
    lease_ttl_s: float = Field(default=2.0, gt=0)
    # Provider budgets (providers without one, e.g. the inbox, are not shaped).
    rates: dict[str, RateModel] = Field(default_factory=_default_rates)
    # Longest wait for tokens per batch; what is not granted by then goes to the retry topic.
    shape_max_wait_s: float = Field(default=10.0, gt=0)
    backoff: dict[str, BackoffModel] = Field(default_factory=_default_backoff)
    breaker: BreakerModel = Field(default_factory=BreakerModel)
    breaker_overrides: dict[str, BreakerModel] = Field(default_factory=dict)
    # Pause of a provider after a platform error (auth/config), before half-open probes.
    platform_pause_s: float = Field(default=60.0, gt=0)
    # Channel -> provider when a delivery names none (push uses its platform).
    default_providers: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_PROVIDER))
    # Records read per Kafka partition and poll (the sink's batch is at most partitions x this).
    batch_size: int = Field(default=1000, ge=1)
    # Deliveries dispatched together (one guard/re-check round trip, one set of sends).
    max_slice: int = Field(default=1000, ge=1)
    # A channel's bulk job reads and dispatches this many at once instead (batch_size and
    # max_slice both): each slice pays its round trips and its Kafka flush once, and a push
    # campaign (no receipts, a 40k/s budget) drained at 2,600 sends/s with 1,000 against 3,600
    # with 8,000 on the whole stack (bench/results/fullstack_session18). Channels with a small
    # budget keep max_slice: a slice's own work must stay shorter than the bucket's depth.
    bulk_slices: dict[str, int] = Field(default_factory=lambda: {"push": 8000})
    # A delivery due later than now + this goes (back) to the retry topic to be held there.
    early_tolerance_s: float = Field(default=0.5, ge=0)
    # Upper bound of a provider call, as the guard TTL check assumes it.
    call_timeout_s: float = Field(default=10.0, gt=0)
    # Reconciliation of an Unknown outcome (sinks/dispatch/reconcile.py): ask the provider this
    # long after the call (SendGrid's activity feed lags), and keep asking until this long after
    # the first attempt when it cannot tell.
    reconcile_after_s: float = Field(default=15.0, gt=0)
    reconcile_window_s: float = Field(default=3600.0, gt=0)
    # A worker's send lease on a notification (herald.controls): a cancel or pause is answered
    # once none is left, so it outlasts a batch's sends (a dead worker's lapses after it).
    control_lease_s: float = Field(default=60.0, gt=0)
    # While a batch waits for rate tokens, how often it checks again for a pause or cancel of
    # its notifications (one Redis round trip): how late a pause may take effect mid-batch.
    control_recheck_s: float = Field(default=0.5, gt=0)

    @model_validator(mode="after")
    def _check(self) -> DispatchSettings:
        hold = 1.5 * (self.shape_max_wait_s + 2 * self.call_timeout_s)
        if self.pending_ttl_s <= hold:
            raise ValueError(
                f"pending_ttl_s ({self.pending_ttl_s}) must exceed 1.5 x (shape_max_wait_s + "
                f"2 x call_timeout_s) = {hold}"
            )
        for rate in self.rates.values():
            rate.build()
        small = {c: n for c, n in self.bulk_slices.items() if n < 1}
        if small:
            raise ValueError(f"bulk_slices must be >= 1: {small}")
        return self

    def for_job(self, channel: str, traffic_class: str) -> DispatchSettings:
        """These settings as the dispatch job of `channel` and `traffic_class` uses them."""
        n = self.bulk_slices.get(channel) if traffic_class == "bulk" else None
        return self if n is None else self.model_copy(update={"max_slice": n, "batch_size": n})

    def provider_rates(self) -> dict[str, ProviderRate]:
        """`rates` as herald.shaping budgets."""
        return {name: model.build() for name, model in self.rates.items()}

    def backoff_for(self, traffic_class: str) -> BackoffPolicy:
        """The backoff of a traffic class (normal's when the class has none)."""
        model = self.backoff.get(traffic_class) or self.backoff.get("normal") or BackoffModel()
        return model.build()

    def breaker_config(self) -> tuple[BreakerConfig, dict[str, BreakerConfig]]:
        """(default breaker config, per-provider overrides)."""
        return self.breaker.build(), {k: v.build() for k, v in self.breaker_overrides.items()}

    def with_overrides(self, **changes: Any) -> DispatchSettings:
        """A validated copy with fields replaced (tests, benchmarks)."""
        return DispatchSettings.model_validate({**self.model_dump(), **changes})
