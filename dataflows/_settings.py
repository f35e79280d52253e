"""Settings of the planning jobs (digest, plan, schedule) and the job clock.

`PlanningSettings` reads `HERALD_PLANNING_*` like the classes of `herald.config` (it belongs there
as `HeraldSettings.planning`; it lives here until that file takes it). Loaded only in the jobs'
`build_flow` when no instance is passed.

The job clock is the system clock plus `clock_offset_seconds`. The offset exists for tests (a
quiet-hours or DST scenario at a chosen instant, windows closing without waiting ten minutes)
and must stay 0 in production: every time decision of the planning jobs reads `Clock.now()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from dataflows._runtime import configure_process
from herald.config import HeraldSettings

__all__ = ["Clock", "PlanningSettings", "entry_settings"]


class PlanningSettings(BaseSettings):
    """Knobs of the digest, plan and schedule jobs (env prefix `HERALD_PLANNING_`)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_PLANNING_")

    # The notification-type catalog; None = herald/catalog.toml.
    catalog_path: Path | None = None
    # Test-only shift of the job clock (see the module docstring). Never set in production.
    clock_offset_seconds: float = 0.0

    # plan: users per audience batch (the unit of fan-out progress and of resumption).
    audience_batch_size: int = 1000
    # plan: audience batches per second and request partition; 0 = as fast as possible.
    fanout_batches_per_second: float = 0.0
    # plan: users whose parsed copies (preferences, contact points) a process keeps between
    # batches, per generation (at most twice as many; dataflows/_user_copies.py).
    state_cache_users: int = 50_000
    # plan: longest a request's notification_id is remembered to drop duplicate requests
    # (shorter for requests that expire earlier: until their expiry).
    request_dedup_ttl_seconds: int = 7 * 86400

    # digest: a window closes this long after its end (events in flight still make it).
    digest_grace_seconds: float = 2.0
    # digest: a key's state (seen event ids) is dropped this long after its last window closed.
    digest_idle_ttl_seconds: int = 3600

    # schedule: bucket length and shards per bucket (keys of the `buckets` step).
    schedule_bucket_seconds: int = 60
    schedule_shards: int = 8
    # schedule: releases of normal/bulk deliveries are spread over this window after not_before.
    schedule_jitter_seconds: float = 120.0

    def clock(self) -> Clock:
        """The job clock (system clock + offset)."""
        return Clock(timedelta(seconds=self.clock_offset_seconds))


@dataclass(frozen=True, slots=True)
class Clock:
    """`now()` = the system's UTC time plus a fixed offset (0 in production)."""

    offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        """The current job time, timezone-aware UTC."""
        return datetime.now(UTC) + self.offset


def entry_settings(settings: HeraldSettings | None) -> HeraldSettings:
    """`settings`, or, when a job is the entry point (None): configure logging, serve /metrics
    (HERALD_METRICS_PORT) and load the settings from the environment."""
    if settings is not None:
        return settings
    configure_process()
    return HeraldSettings()
