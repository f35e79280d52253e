"""Scene 7 of `herald demo`: the truth loop. An email opened and a link clicked, an inbox item
read, an account notice escalated to push for the user who did not read it in time (and not
for the one who did), and the dashboard's funnel counting opened, read and clicked.

Like the other scenes it drives the stack as its users would: the API (the app reading its
inbox), the email as the mail client shows it (the SendGrid simulator keeps the last message
per address: its pixel is fetched, its link followed) and the dashboard's own funnel query.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from infra.demo.context import TENANT, Ctx, apns_token
from infra.demo.logic import SceneResult

__all__ = ["engagement", "setup_engagement"]

ENGAGED = ("READ", "OPENED", "CLICKED")


def setup_engagement(ctx: Ctx) -> None:
    """The scene's users, through the API: two with an iPhone, one with a verified email."""
    stack = ctx.stack
    for role in ("reader", "busy"):
        ctx.facts[f"{role}_token"] = apns_token()
        stack.put_device(ctx.user(role), "apns", ctx.facts[f"{role}_token"])
    ctx.facts["mail"] = f"{ctx.user('mailer')}@example.test"
    stack.put_contact_points(ctx.user("mailer"), email=ctx.facts["mail"])


def engagement(ctx: Ctx) -> SceneResult:
    """See the module docstring."""
    result = SceneResult(7, "opens, clicks, reads and escalation")
    ui, stack = ctx.ui, ctx.stack
    escalation = _escalation_after()
    ui.scene(
        7,
        result.title,
        "Email opens and clicks come back through a signed pixel and signed redirects, an "
        "in-app item read in the app is READ, and an account notice nobody read in the inbox "
        f"within {escalation:.0f} s goes out as a push — only to whoever did not read it.",
    )
    reader, busy = ctx.user("reader"), ctx.user("busy")
    sent_at = datetime.now(UTC)
    notice = stack.send({
        "request_id": f"{ctx.run_id}-notice", "notification_type": "account_notice",
        "recipients": {"user_ids": [reader, busy]},
        "params": {"title": "New sign-in", "body": "A new device signed in to your account"},
    })  # fmt: skip
    ui.step(f"account_notice {notice} in the inboxes of {reader} and {busy}")
    item = ui.wait(f"waiting for the notice in {reader}'s inbox",
                   lambda: (stack.inbox(reader)["items"] or [None])[0], timeout=60)  # fmt: skip
    stack.api.post(f"/v1/users/{reader}/inbox/{item['item_id']}/read").raise_for_status()
    ui.step(f"{reader}'s app fetched the item and marked it read; {busy} never opens the app")
    opened, clicked = _email_opened_and_clicked(ctx)

    def pushes() -> dict[str, dict[str, Any]] | None:
        entries = {d["user_id"]: d for d in stack.status(notice)["deliveries"]
                   if d["channel"] == "push"}  # fmt: skip
        done = entries.get(busy, {}).get("state") in ("PROVIDER_ACCEPTED", "DELIVERED")
        return entries if done and entries.get(reader, {}).get("state") == "SUPPRESSED" else None

    push = ui.wait(f"waiting for the escalation window ({escalation:.0f} s)", pushes,
                   timeout=escalation + 120, interval=1.0)  # fmt: skip
    got = stack.sim("apns").stats(ids=True)["accepted_ids"]
    to_busy, to_reader = (
        len(got.get(ctx.facts["busy_token"], [])),
        len(got.get(ctx.facts["reader_token"], [])),
    )
    waited = (datetime.now(UTC) - sent_at).total_seconds()
    ui.saw(f"{busy}: push sent ({to_busy} at APNs); {reader}: "
           f"{push[reader]['status_reason']} ({to_reader} at APNs)")  # fmt: skip
    funnel = ui.wait("waiting for the dashboard funnel to count them", _funnel_counts(ctx),
                     timeout=120, interval=1.0)  # fmt: skip
    ui.saw("dashboard funnel (last 15 min): "
           + ", ".join(f"{k} {funnel[k]}" for k in ("opened", "read", "clicked")))  # fmt: skip
    if (opened, clicked, to_busy, to_reader) == (True, True, 1, 0) and waited >= escalation:
        return result.ok(
            f"email opened + clicked, inbox item READ; the unread notice escalated to push "
            f"after {escalation:.0f} s for {busy} only; funnel opened {funnel['opened']}, "
            f"read {funnel['read']}, clicked {funnel['clicked']}"
        )
    return result.fail(
        f"opened={opened} clicked={clicked} pushes busy={to_busy} reader={to_reader} "
        f"funnel={funnel}"
    )


def _email_opened_and_clicked(ctx: Ctx) -> tuple[bool, bool]:
    """A weekly-picks email to the mailer; its pixel shown and its link followed."""
    ui, stack, mail = ctx.ui, ctx.stack, ctx.facts["mail"]
    target = f"https://example.test/picks?run={ctx.run_id}"
    stack.send({
        "request_id": f"{ctx.run_id}-picks", "notification_type": "promo_weekly",
        "recipients": {"user_ids": [ctx.user("mailer")]},
        "params": {"week": "W49", "highlights_url": target},
    })  # fmt: skip

    def page() -> str | None:
        message = stack.sim("email").stats(ids=True).get("messages", {}).get(mail)
        return str(message["content"][1]["value"]) if message else None

    html = ui.wait(f"waiting for the email to {mail}", page, timeout=60)
    click = html.split('href="')[1].split('"')[0].replace("&amp;", "&")
    pixel = html.split('<img src="')[1].split('"')[0].replace("&amp;", "&")
    with httpx.Client(timeout=30, follow_redirects=False) as http:
        shown = http.get(pixel)
        followed = http.get(click)
    opened = shown.status_code == 200
    clicked = followed.status_code == 302 and followed.headers.get("location") == target
    ui.step(f"{mail}'s mail client showed the images (pixel {shown.status_code}) and the "
            f"reader followed the link (redirect {followed.status_code} to {target})")  # fmt: skip
    return opened, clicked


def _funnel_counts(ctx: Ctx) -> Any:
    from dashboards.queries import run_panel, window

    def probe() -> dict[str, int] | None:
        params = window(15, TENANT, datetime.now(UTC) + timedelta(minutes=1))
        rows = {r["step"]: int(r["count"]) for r in run_panel(ctx.stack.clickhouse(), "funnel",
                                                                params)}  # fmt: skip
        return rows if all(rows.get(k, 0) > 0 for k in ("opened", "read", "clicked")) else None

    return probe


def _escalation_after() -> float:
    from herald.catalog import load_catalog

    rule = load_catalog().get("account_notice").escalation
    return rule.after.total_seconds() if rule else 0.0
