"""Scenes 1, 3, 4 and 6 of `herald demo` (2 and 5 share a campaign, see campaign.py; 7 is
engagement.py).

Each drives the running stack the way its users would.

Every scene talks to the stack only through `infra.stackclient.StackClient`: the HTTP API,
the provider simulators' `/_admin` routes, ClickHouse over HTTP, and (for inputs that come from
other systems) Kafka through infra.demo.loader. A scene restores every simulator setting it
changed, so a second run, or the user's own traffic, finds the stack as it was.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from infra.demo.context import SENT, TENANT, Ctx, events_of, first_event
from infra.demo.logic import QuietPlan, SceneResult

__all__ = ["dead_token", "like_storm", "quiet_hours_end", "quiet_hours_start", "sms_failover"]

FAILOVER_USERS = 30  # the breaker opens after 20 calls in 30 s with >= 50 % errors


# -- scene 1 -------------------------------------------------------------------------------


def like_storm(ctx: Ctx, events: list[dict[str, Any]]) -> SceneResult:
    """Many likes on one post become one push and one inbox item with a summary line."""
    from herald.catalog import load_catalog
    from herald.render import digest_line
    from infra.demo.loader import publish_events

    result = SceneResult(1, f"like storm ({ctx.likes:,} likes) → one notification")
    ui, stack, user = ctx.ui, ctx.stack, ctx.user("poster")
    ui.scene(
        1,
        result.title,
        "Upstream services publish a like per click; the digest job "
        "windows them per (recipient, post) and sends one notification.",
    )
    ui.step(f"publishing {len(events):,} like events on herald.social-events for {user}")
    publish_events(stack.settings(), TENANT, events)
    expected = digest_line(
        load_catalog(), "social_like", "en", ("user1", "user2", "user3"), ctx.likes
    )

    def inbox_item() -> dict[str, Any] | None:
        items = stack.inbox(user)["items"]
        return items[0] if items else None

    item = ui.wait(
        "waiting for the digest window to close and the notification to arrive",
        inbox_item,
        timeout=120,
    )
    nid = item["notification_id"]
    push = ui.wait(
        "waiting for the push at APNs",
        lambda: first_event(stack, nid, SENT, user, channel="push"),
        timeout=60,
    )
    # A storm split in two would need a like the first window did not count: its text names
    # every distinct actor of its window (`expected` names all of them), so one item with that
    # text is the whole storm, nothing left to wait for.
    items = stack.inbox(user)["items"]
    token = ctx.facts["poster_token"]
    pushes = len(stack.sim("apns").stats(ids=True)["accepted_ids"].get(token, []))
    ui.saw(f"inbox of {user}: {len(items)} item(s): “{item['body']}”")
    ui.saw(f"push {push['state']} via {push['provider']}; APNs received {pushes} push(es)")
    result.figures = {"inbox_items": len(items), "pushes": pushes, "text": item["body"]}
    if len(items) == 1 and item["body"] == expected and pushes == 1:
        return result.ok(f"{ctx.likes:,} likes → 1 push + 1 inbox item: “{item['body']}”")
    return result.fail(
        f"{len(items)} inbox items, {pushes} pushes, text “{item['body']}” (expected “{expected}”)"
    )


# -- scene 3 -------------------------------------------------------------------------------


def sms_failover(ctx: Ctx) -> SceneResult:
    """SMS provider A answers 500 to everything; the breaker opens and B takes the traffic."""
    result = SceneResult(3, "SMS provider A failing, B takes over")
    ui, stack = ctx.ui, ctx.stack
    ui.scene(
        3,
        result.title,
        "A 5xx is retried with backoff; once most calls to a provider fail, its circuit "
        "breaker opens and every retry fails over to the channel's next provider (same "
        "delivery_id: a failover is never a second message).",
    )
    sim_a = stack.sim("sms_a")
    saved = sim_a.config()["errors"]
    errors_before = int(sim_a.stats(ids=False)["errors"].get("500", 0))
    sim_a.configure({"errors": {"500": 1.0}})
    ui.step("sms_a simulator: every request now answers HTTP 500 (fault injection via /_admin)")
    users = ctx.facts["failover_users"]
    try:
        nid = stack.send(
            {
                "request_id": f"{ctx.run_id}-failover",
                "notification_type": "otp_login",
                "recipients": {"user_ids": users},
                "params": {"code": "119922"},
            }
        )
        ui.step(f"OTP {nid} accepted for {len(users)} users (one request)")

        def settled() -> dict[str, str] | None:
            # ClickHouse, not the hot status: the receipts job that folds the hot status can
            # lag minutes behind on a loaded machine; the warehouse rows arrive in seconds
            done = {
                e["user_id"]: f"{e['state']} via {e['provider']}"
                for e in events_of(stack, nid, states=(*SENT, "FAILED_PERMANENT"))
            }
            return done if len(done) == len(users) else None

        outcomes = ui.wait("waiting for every OTP to reach a provider", settled, timeout=120)
        errors = int(sim_a.stats(ids=False)["errors"].get("500", 0)) - errors_before
    finally:
        sim_a.configure({"errors": saved})
        ui.step("sms_a simulator restored (its breaker closes again after its cooldown)")
    via = dict(Counter(outcomes.values()))
    ui.saw(f"sms_a answered {errors} × HTTP 500; first outcome per user: {via}")
    result.figures = {"outcomes": via, "sms_a_errors": errors}
    all_b = all(v.endswith("via sms_b") and not v.startswith("FAILED") for v in outcomes.values())
    if all_b and errors >= 1:
        return result.ok(f"sms_a failed ({errors} × 500); all {len(users)} OTPs went out via sms_b")
    return result.fail(f"outcomes {via}, sms_a errors {errors}")


# -- scene 4 -------------------------------------------------------------------------------


def dead_token(ctx: Ctx) -> SceneResult:
    """APNs says 410 Unregistered for one device: that token is removed, the other gets it."""
    result = SceneResult(4, "invalid APNs token removed, other device still served")
    ui, stack = ctx.ui, ctx.stack
    ui.scene(
        4,
        result.title,
        "APNs 410 Unregistered means the app was uninstalled: Herald drops "
        "that token from the user's devices and never sends to it again.",
    )
    user, dead, alive = ctx.user("phones"), ctx.facts["dead_token"], ctx.facts["live_token"]
    apns = stack.sim("apns")
    saved = apns.config()["unregistered"]
    apns.configure({"unregistered": [*saved, dead]})
    ui.step(f"apns simulator: token {dead[:8]}… is now Unregistered (410)")
    try:
        nid = stack.send(
            {
                "request_id": f"{ctx.run_id}-shipped",
                "notification_type": "order_shipped",
                "recipients": {"user_ids": [user]},
                "params": {"order_id": "D-1001"},
            }
        )
        ui.step(f"order_shipped {nid} accepted for {user} (2 iPhones)")

        def devices_left() -> list[dict[str, Any]] | None:
            devices = stack.contact_points(user)["devices"]
            return devices if len(devices) == 1 else None

        def live_served() -> bool | None:
            return True if apns.stats(ids=True)["accepted_ids"].get(alive) else None

        devices = ui.wait("waiting for the dead token to be removed", devices_left, timeout=120)
        ui.wait("waiting for the other iPhone's push at APNs", live_served, timeout=120)
        dead_event = first_event(stack, nid, ("FAILED_PERMANENT",), user, "push")
    finally:
        apns.configure({"unregistered": saved})
    ids = apns.stats(ids=True)["accepted_ids"]
    got_live, got_dead = len(ids.get(alive, [])), len(ids.get(dead, []))
    left = devices[0]["device_id"]
    if dead_event is not None:
        ui.saw(f"the dead token's delivery: FAILED_PERMANENT ({dead_event['reason']})")
    ui.saw(
        f"devices of {user} now: 1 ({left}); APNs accepted {got_live} for the live token, "
        f"{got_dead} for the dead one"
    )
    if left == ctx.facts["live_device"] and got_live >= 1 and got_dead == 0:
        return result.ok(
            "410 Unregistered → token removed from the user's devices; the "
            "other iPhone got the push"
        )
    return result.fail(f"device left {left}, live pushes {got_live}, dead pushes {got_dead}")


# -- scene 6 -------------------------------------------------------------------------------


def quiet_hours_start(ctx: Ctx, plan: QuietPlan, tz: str) -> str:
    """Send the marketing message while the user's quiet hours are on; returns its id."""
    user = ctx.user("sleeper")
    nid = ctx.stack.send(
        {
            "request_id": f"{ctx.run_id}-promo",
            "notification_type": "marketing_campaign",
            "recipients": {"user_ids": [user]},
            "params": {"headline": "Good morning", "offer": "20% off", "cta_url": "https://x.test"},
        }
    )
    ctx.ui.step(
        f"scene 6 starts here: marketing_campaign {nid} (push) sent to {user}, whose quiet hours "
        f"{plan.start}-{plan.end} ({tz}) end at {plan.ends_at:%H:%M:%S} UTC"
    )
    return nid


def quiet_hours_end(ctx: Ctx, nid: str, plan: QuietPlan, tz: str, jitter_s: float) -> SceneResult:
    """The held message goes out only after the quiet window ended in the user's zone."""
    result = SceneResult(6, "marketing held by quiet hours until morning")
    ui, stack = ctx.ui, ctx.stack
    ui.scene(
        6,
        result.title,
        f"The user sleeps {plan.start}-{plan.end} in {tz}: a marketing "
        "push is held (not dropped) and released when the window ends, spread by up to "
        f"{jitter_s:.0f} s of jitter so a million mornings don't hit the provider at once.",
    )
    user = ctx.user("sleeper")
    wait_s = (plan.ends_at - datetime.now(UTC)).total_seconds() + jitter_s + 60
    sent = ui.wait(
        f"waiting for the window to end ({plan.end} local) and the release",
        lambda: first_event(stack, nid, ("PROVIDER_ACCEPTED",), user, "push"),
        timeout=max(wait_s, 60),
        interval=1.0,
    )
    held = first_event(stack, nid, ("SCHEDULED",), user, "push")
    at = sent["occurred_at"].replace(tzinfo=UTC)
    if held is not None:
        ui.saw(f"held at {held['occurred_at']:%H:%M:%S} UTC ({held['reason']})")
    ui.saw(
        f"sent at {at:%H:%M:%S} UTC, {(at - plan.ends_at).total_seconds():.0f} s after the "
        f"window ended ({at.astimezone(_zone(tz)):%H:%M:%S} local)"
    )
    if held is not None and held["reason"] == "quiet_hours" and at >= plan.ends_at:
        return result.ok(
            f"held (quiet_hours) until {plan.end} {tz}, sent "
            f"{(at - plan.ends_at).total_seconds():.0f} s after the window ended"
        )
    return result.fail(f"held={held}, sent at {at:%H:%M:%S} vs window end {plan.ends_at:%H:%M:%S}")


def _zone(tz: str) -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo(tz)
