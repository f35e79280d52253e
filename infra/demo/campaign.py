"""Scenes 2 and 5 of `herald demo`, which share one bulk campaign.

Scene 2 starts the campaign and, once it drains, sends an OTP and times it; scene 5's
unsubscribe happens right after the campaign was accepted (mid-campaign, before its sends) and
is checked after the drain reached the users who unsubscribed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from herald.providers import providers_of
from infra.demo.context import SENT, Ctx, first_event, state_counts
from infra.demo.loader import campaign_address
from infra.demo.logic import SceneResult, rate_per_second

SIMULATOR = {"push": "apns", "email": "email"}
TARGET_MS = 2000  # SPEC: OTP accept→provider p99 < 2 s during a campaign


def otp_during_campaign(ctx: Ctx, segment_id: str, budget: float) -> SceneResult:
    """An OTP reaches the SMS provider fast while a bulk campaign drains at its budget."""
    n = ctx.campaign_size
    result = SceneResult(2, f"OTP during a {n:,}-recipient campaign")
    ui, stack = ctx.ui, ctx.stack
    ui.scene(
        2,
        result.title,
        "Transactional traffic has its own topics, planning and dispatch "
        "jobs and a reserved provider budget, so a campaign backlog never delays an OTP.",
    )
    channel = ctx.campaign_channel
    provider = stack.sim(SIMULATOR[channel])
    base = int(provider.stats(ids=False)["accepted"])
    nid = stack.send(
        {
            "request_id": f"{ctx.run_id}-campaign",
            "notification_type": "marketing_campaign",
            "channels": [channel],
            "recipients": {"segment_id": segment_id},
            "params": {"headline": "Spring sale", "offer": "20% off", "cta_url": "https://x.test"},
        }
    )
    ctx.facts["campaign_nid"], ctx.facts["campaign_base"] = nid, base
    ui.step(f"campaign {nid} accepted for segment {segment_id} ({n:,} users, {channel})")
    samples: list[tuple[float, int]] = []

    def draining() -> int | None:
        sent = int(provider.stats(ids=False)["accepted"]) - base
        samples.append((time.monotonic(), sent))
        return sent if sent > 0 else None

    # Right after the 202, while the campaign is being planned: at thousands of sends a second a
    # later unsubscribe could lose the race with the users' own sends, which proves nothing.
    unsubscribe_tail(ctx)
    ui.wait("waiting for the campaign to start draining", draining, timeout=180)
    phone, user = ctx.facts["otp_phone"], ctx.user("otp")
    sms_stats = {p: stack.sim(p) for p in providers_of("sms")}
    t0 = time.monotonic()
    otp = stack.send(
        {
            "request_id": f"{ctx.run_id}-otp",
            "notification_type": "otp_login",
            "recipients": {"user_ids": [user]},
            "params": {"code": "482913"},
        }
    )
    ui.step(f"OTP {otp} accepted for {user} while the campaign drains")

    def at_provider() -> float | None:
        draining()
        for sim in sms_stats.values():
            ids = sim.stats(ids=True)["accepted_ids"]
            if any(a.endswith(phone.lstrip("+")) for a in ids):
                return time.monotonic() - t0
        return None

    seen = ui.wait(
        "waiting for the OTP at the SMS provider", at_provider, timeout=60, interval=0.02
    )
    sent_before_otp = samples[-1][1]  # campaign messages at the provider when the OTP got there
    event = ui.wait(
        "reading the OTP's PROVIDER_ACCEPTED event from ClickHouse",
        lambda: first_event(stack, otp, ("PROVIDER_ACCEPTED",)),
        timeout=60,
    )
    end = time.monotonic() + 3
    while time.monotonic() < end:
        draining()
        time.sleep(0.5)
    rate, sent = rate_per_second(samples), samples[-1][1]
    herald_ms = int(event["latency_ms"] or 0)
    ui.saw(
        f"OTP accept→provider: {herald_ms} ms as Herald recorded it (latency_ms), "
        f"{seen * 1000:.0f} ms as seen from here (API call → simulator)"
    )
    ui.saw(
        f"campaign meanwhile: {sent:,} of {n:,} {channel} messages sent, {rate:,.0f}/s "
        f"(bulk budget of {SIMULATOR[channel]}: {budget:,.0f}/s)"
    )
    result.figures = {
        "otp_ms": herald_ms,
        "otp_seen_ms": round(seen * 1000),
        "drain_per_s": round(rate),
        "budget_per_s": budget,
    }
    # The promise (SPEC §4): a campaign never delays an OTP. Shown two ways: the OTP met the
    # latency target, or, on a machine too loaded for any target, it still overtook the
    # campaign's backlog (reached the provider while campaign messages were still queued).
    deliverable = n - len(ctx.facts["unsubscribers"])
    overtook = sent_before_otp < deliverable
    target = "met" if herald_ms < TARGET_MS else f"MISSED ({_load()})"
    ui.saw(
        f"when the OTP reached the provider, {sent_before_otp:,} of the campaign's "
        f"{deliverable:,} messages had: the OTP {'overtook' if overtook else 'did not overtake'} "
        f"the backlog; latency target p99 < {TARGET_MS / 1000:.0f} s: {target}"
    )
    result.figures |= {"sent_before_otp": sent_before_otp, "overtook": overtook}
    ok = (herald_ms < TARGET_MS or overtook) and 0 < rate <= budget * 1.05
    text = (
        f"OTP {herald_ms:,} ms accept→provider (target < 2 s: {target}), "
        f"{'ahead of' if overtook else 'behind'} {deliverable - sent_before_otp:,} queued "
        f"campaign messages; campaign at {rate:,.0f}/s (budget {budget:,.0f}/s)"
    )
    return result.ok(text) if ok else result.fail(text)


def _load() -> str:
    """The machine's load, to read a missed latency target by."""
    one, _, _ = os.getloadavg()
    return f"load average {one:.0f} on {os.cpu_count()} cores"


def unsubscribe_tail(ctx: Ctx) -> None:
    """Scene 5's action: the last campaign users unsubscribe from marketing mid-campaign."""
    users = ctx.facts["unsubscribers"]
    for user in users:
        ctx.stack.put_preferences(user, {"category_opt_out": ["marketing"]})
    ctx.ui.step(
        f"scene 5 starts here: {len(users)} campaign users unsubscribe from marketing "
        f"now, mid-campaign ({', '.join(users)})"
    )


def unsubscribe_honoured(ctx: Ctx) -> SceneResult:
    """The users who unsubscribed mid-campaign get nothing; the rest of the campaign goes on."""
    result = SceneResult(5, "unsubscribe honoured mid-campaign")
    ui, stack = ctx.ui, ctx.stack
    ui.scene(
        5,
        result.title,
        "Dispatch re-checks preferences just before each send (plan "
        "checks them too), so an unsubscribe wins over a campaign already in flight.",
    )
    nid, users = ctx.facts["campaign_nid"], ctx.facts["unsubscribers"]

    def outcomes() -> dict[str, dict[str, Any]] | None:
        found = {}
        for user in users:
            event = first_event(stack, nid, ("SUPPRESSED", *SENT), user_id=user)
            if event is None:
                return None
            found[user] = event
        return found

    found = ui.wait(
        "waiting until the campaign reaches the unsubscribed users",
        outcomes,
        timeout=max(120.0, ctx.campaign_size / 100),
        interval=1.0,
    )
    provider = stack.sim(SIMULATOR[ctx.campaign_channel])
    addresses = provider.stats(ids=True)["accepted_ids"]
    mailed = [u for u in users if campaign_address(u, ctx.campaign_channel) in addresses]
    for user, event in found.items():
        ui.saw(f"{user}: {event['state']} ({event['reason']})")
    sent, overall = drain_rate(stack, nid)
    ui.saw(
        f"messages to them at the provider: {len(mailed)}; campaign sent so far: {sent:,} "
        f"of {ctx.campaign_size:,} (provider acceptances ran at {overall:,.0f}/s)"
    )
    ui.saw(f"campaign deliveries by current state: {state_counts(stack, nid)}")
    suppressed = all(e["state"] == "SUPPRESSED" for e in found.values())
    reasons = sorted({str(e["reason"]) for e in found.values()})
    if suppressed and not mailed:
        return result.ok(
            f"{len(users)} users unsubscribed mid-campaign: all SUPPRESSED "
            f"({', '.join(reasons)}), 0 messages to them; {sent:,} others sent"
        )
    return result.fail(f"outcomes {[e['state'] for e in found.values()]}, {len(mailed)} mailed")


def drain_rate(stack: Any, notification_id: str) -> tuple[int, float]:
    """Provider acceptances of a campaign so far, and their rate first to last (ClickHouse)."""
    n, first, last = (
        stack.clickhouse()
        .query(
            "SELECT count(), min(occurred_at), max(occurred_at) FROM delivery_events FINAL "
            "WHERE notification_id = {n:String} AND state = 'PROVIDER_ACCEPTED'",
            parameters={"n": notification_id},
        )
        .result_rows[0]
    )
    span = (last - first).total_seconds() if n > 1 else 0.0
    return int(n), (n / span if span > 0 else 0.0)
