"""What the scenes of `herald demo` share: the run's context and ClickHouse read helpers."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from infra.demo.ui import Ui
from infra.stackclient import StackClient

__all__ = [
    "SENT",
    "TENANT",
    "Ctx",
    "apns_token",
    "events_of",
    "first_event",
    "random_phone",
    "state_counts",
]

SENT = ("PROVIDER_ACCEPTED", "DELIVERED")
TENANT = "dev"  # the tenant of the dev API key (api/tenants.toml)


@dataclass
class Ctx:
    """What the scenes share: the stack, the console and the names of this run's users."""

    stack: StackClient
    ui: Ui
    run_id: str
    campaign_size: int
    likes: int
    campaign_channel: str = "push"
    users: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def user(self, role: str) -> str:
        """This run's user for `role` (unique per run, so runs never see each other's state)."""
        return self.users.setdefault(role, f"{self.run_id}-{role}")


def random_phone() -> str:
    """A US number in the 555 range; unique per run (the API rate-limits OTPs per phone)."""
    return f"+1415555{secrets.randbelow(10_000):04d}"


def apns_token() -> str:
    """A well-formed APNs device token (64 hex characters)."""
    return secrets.token_hex(32)


def events_of(
    stack: StackClient,
    notification_id: str,
    user_id: str | None = None,
    states: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """Delivery events of a notification in ClickHouse (of one user, in `states`), oldest
    first, copies collapsed."""
    where = "notification_id = {n:String}"
    if user_id is not None:
        where += " AND user_id = {u:String}"
    if states is not None:
        where += " AND state IN {s:Array(String)}"
    result = stack.clickhouse().query(
        "SELECT user_id, channel, state, reason, provider, latency_ms, occurred_at "
        f"FROM delivery_events FINAL WHERE {where} ORDER BY occurred_at",
        parameters={"n": notification_id, "u": user_id or "", "s": list(states or ())},
    )
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def first_event(
    stack: StackClient,
    notification_id: str,
    states: tuple[str, ...],
    user_id: str | None = None,
    channel: str | None = None,
) -> dict[str, Any] | None:
    """The first event of the notification in one of `states` (for `user_id`, on `channel`)."""
    for event in events_of(stack, notification_id, user_id, states):
        if channel is None or event["channel"] == channel:
            return event
    return None


def state_counts(stack: StackClient, notification_id: str) -> dict[str, int]:
    """Deliveries of a notification per current state (latest event of each delivery)."""
    result = stack.clickhouse().query(
        "SELECT state, reason, count() FROM (SELECT delivery_id, "
        "argMax(state, occurred_at) AS state, argMax(reason, occurred_at) AS reason "
        "FROM delivery_events FINAL WHERE notification_id = {n:String} AND channel != '' "
        "GROUP BY delivery_id) GROUP BY state, reason ORDER BY count() DESC",
        parameters={"n": notification_id},
    )
    return {f"{s}({r})" if r else s: int(c) for s, r, c in result.result_rows}
