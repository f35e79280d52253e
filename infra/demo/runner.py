"""The orchestration behind `herald demo`: a guided run of the seeds' promises.

    herald demo [--run-dir DIR] [--campaign-size N] [--likes N] [--keep]

Uses the stack running in the run directory (`make run` / `herald up`), or starts one detached
and stops it at the end (unless --keep). Seven scenes, each printing what it does and what it
saw, then a summary table; the exit code is 0 only if every scene passed.

    1 like storm → one notification      5 unsubscribe honoured mid-campaign
    2 OTP fast during a campaign         6 marketing held by quiet hours until morning
    3 SMS provider A failing → B         7 opens, clicks, reads; an unread notice escalates
    4 APNs 410 → token removed, other device served

Scene 6 needs no clock tricks: its user's quiet window ends a minute or two from now in the
user's time zone. Its message is sent first and checked last, so the wait overlaps the others.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

from herald.errors import InfraError, StackNotRunningError
from infra.demo import campaign, context, engagement, scenes
from infra.demo.loader import campaign_user, load_audience
from infra.demo.logic import QuietPlan, SceneResult, like_storm, quiet_window_ending_soon
from infra.demo.ui import Ui
from infra.stackclient import StackClient

__all__ = ["run_demo", "DEFAULT_CAMPAIGN_SIZE"]

# 1M recipients take this 2-core machine several minutes to load, plan (~10k/s) and push
# (~3k/s); the default drains in well under a minute and still shows an OTP overtaking a real
# backlog. --campaign-size 1000000 runs the seed's figure where the machine has the time.
DEFAULT_CAMPAIGN_SIZE = 50_000
QUIET_TZ = "Asia/Tokyo"
UNSUBSCRIBERS = 3


def _start_stack(ui: Ui, run_dir: Path) -> None:
    ui.step(f"no stack running in {run_dir}: starting one (herald up --detach)")
    with ui.console.status("[cyan]starting Kafka, Redis, ClickHouse, simulators and jobs…[/]"):
        proc = subprocess.run(
            [sys.executable, "-m", "infra.cli", "up", "--detach", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    if proc.returncode != 0:
        _stop_stack(ui, run_dir)  # a start that timed out may have left a supervisor running
        tail = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-3:]
        raise StackNotRunningError(
            f"could not start the stack in {run_dir}: " + " / ".join(tail) + "\n"
            "start it yourself with `make run`, then run `herald demo` again"
        )


def _stop_stack(ui: Ui, run_dir: Path) -> None:
    with ui.console.status("[cyan]stopping the stack this demo started…[/]"):
        subprocess.run(
            [sys.executable, "-m", "infra.cli", "down", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    ui.step("stack stopped (use --keep to leave it running)")


def run_demo(
    run_dir: Path,
    campaign_size: int = DEFAULT_CAMPAIGN_SIZE,
    likes: int = 1200,
    keep: bool = False,
    ui: Ui | None = None,
    campaign_channel: str = "push",
) -> list[SceneResult]:
    """Run every scene on the stack of `run_dir` (started here if none runs); the results."""
    from infra.stack import is_locked

    ui = ui or Ui()
    started_here = False
    if not is_locked(run_dir):
        _start_stack(ui, run_dir)
        started_here = True
    try:
        with StackClient.from_run_dir(run_dir, timeout=30) as stack:
            ui.console.print(
                f"[bold]Herald demo[/] on the stack in {run_dir} (API {stack.api_url})"
            )
            return _scenes(stack, ui, campaign_size, likes, campaign_channel)
    finally:
        if started_here and not keep:
            _stop_stack(ui, run_dir)


def _scenes(
    stack: StackClient, ui: Ui, campaign_size: int, likes: int, channel: str
) -> list[SceneResult]:
    from dataflows._settings import PlanningSettings
    from dataflows.users import wait_copied
    from sinks.dispatch.settings import DispatchSettings

    run_id = f"demo{uuid.uuid4().hex[:6]}"
    ctx = context.Ctx(stack, ui, run_id, campaign_size, likes, channel)
    planning, dispatch = PlanningSettings(), DispatchSettings()
    # the bulk share of the provider's budget (what is left after the transactional reserve)
    rate = dispatch.rates[campaign.SIMULATOR[channel]]
    budget = rate.rate - rate.reserved
    storm = like_storm(
        ctx.user("poster"), f"{run_id}-post", likes, datetime.now(UTC), _like_window(), run_id
    )
    quiet = _setup_users(ctx)
    promo = scenes.quiet_hours_start(ctx, quiet, QUIET_TZ)
    segment = f"{run_id}-segment"
    ctx.facts["unsubscribers"] = [
        campaign_user(run_id, i)
        for i in range(max(0, campaign_size - UNSUBSCRIBERS), campaign_size)
    ]
    with ui.console.status(f"[cyan]loading the campaign audience ({campaign_size:,} users)…[/]"):
        load_audience(stack.settings(), stack.clickhouse(), run_id, segment, campaign_size, channel)
    ui.step(
        f"{campaign_size:,} campaign users' contact points published on herald.devices, "
        f"segment {segment} written to ClickHouse"
    )
    with ui.console.status("[cyan]waiting for the users job to copy the campaign audience…[/]"):
        # a bulk import reaches the plan jobs through the users job's Redis copies
        wait_copied(stack.settings(), timeout=600 + campaign_size / 1_000)

    runs = [
        lambda: scenes.like_storm(ctx, storm),
        lambda: campaign.otp_during_campaign(ctx, segment, budget),
        lambda: scenes.sms_failover(ctx),
        lambda: scenes.dead_token(ctx),
        lambda: campaign.unsubscribe_honoured(ctx),
        lambda: scenes.quiet_hours_end(
            ctx, promo, quiet, QUIET_TZ, planning.schedule_jitter_seconds
        ),
        lambda: engagement.engagement(ctx),
    ]
    titles = [
        "like storm",
        "OTP during a campaign",
        "SMS failover",
        "dead APNs token",
        "unsubscribe mid-campaign",
        "quiet hours",
        "opens, clicks, reads and escalation",
    ]
    results = []
    for number, (run, title) in enumerate(zip(runs, titles, strict=True), start=1):
        try:
            result = run()
        except (TimeoutError, InfraError, KeyError, httpx.HTTPError) as exc:
            result = SceneResult(number, title).fail(f"{type(exc).__name__}: {exc}")
        ui.verdict(result)
        results.append(result)
    results.sort(key=lambda r: r.number)
    ui.summary(results)
    return results


def _like_window() -> int:
    from herald.catalog import load_catalog

    digest = load_catalog().get("social_like").digest
    return int(digest.window_seconds) if digest else 600


def _setup_users(ctx: context.Ctx) -> QuietPlan:
    """Create this run's users through the API (contact points, devices, preferences)."""
    stack, ui = ctx.stack, ctx.ui
    ctx.facts["otp_phone"] = context.random_phone()
    stack.put_contact_points(ctx.user("otp"), phone=ctx.facts["otp_phone"])
    failover = [f"{ctx.run_id}-failover{i:02d}" for i in range(scenes.FAILOVER_USERS)]
    for user in failover:
        stack.put_contact_points(user, phone=context.random_phone())
    ctx.facts["failover_users"] = failover
    ctx.facts["poster_token"] = context.apns_token()
    stack.put_device(ctx.user("poster"), "apns", ctx.facts["poster_token"])
    dead, live = context.apns_token(), context.apns_token()
    stack.put_device(ctx.user("phones"), "apns", dead)
    ctx.facts["live_device"] = stack.put_device(ctx.user("phones"), "apns", live)
    ctx.facts["dead_token"], ctx.facts["live_token"] = dead, live
    engagement.setup_engagement(ctx)
    sleeper = ctx.user("sleeper")
    stack.put_device(sleeper, "apns", context.apns_token())
    quiet = quiet_window_ending_soon(datetime.now(UTC), QUIET_TZ)
    stack.put_preferences(
        sleeper, {"timezone": QUIET_TZ, "quiet_hours": {"start": quiet.start, "end": quiet.end}}
    )
    ui.step(
        f"users of run {ctx.run_id} created through the API: {', '.join(ctx.users.values())} "
        f"and {len(failover)} OTP users for the failover scene"
    )
    return quiet
