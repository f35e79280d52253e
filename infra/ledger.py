"""A delivery ledger: what Herald promised (202-accepted requests) against what happened.

Fault tests and the recovery benchmark put load through a running stack, kill processes, and
then have to answer three questions per expected delivery (one user x channel of a request the
API answered 202):

    reached   did Herald record PROVIDER_ACCEPTED (or later), or a terminal state?
    copies    how many times did a provider accept a message for it (its simulator's view)?
    lost      neither: the delivery is stuck, or never existed downstream of the API.

Two views are reconciled, each from outside the process that could be lying:

- Herald's view: delivery events (ClickHouse `delivery_events`, or the status API), reduced to
  the set of states each delivery entered and the provider message ids it recorded;
- the providers' view: `GET /_admin/stats` of every simulator, which keeps, per address (phone,
  email, device token), the `[msg_id, ref]` of every accepted message. A simulator forgets its
  counters when it is killed, so `ProviderView` keeps the last snapshot of every simulator
  *incarnation* (keyed by pid) and unions them.

A duplicate is a second provider copy for one expected delivery: the same address (a unique
address per expected delivery makes this exact) and, where the provider echoes a reference
(Vonage `client-ref`, SendGrid `custom_args.delivery_id`, FCM/APNs collapse id), the same
reference. The module is pure logic (no I/O), unit-tested in tests/infra/test_ledger.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from herald.providers import providers_of

__all__ = [
    "DeliveryOutcome",
    "ExpectedDelivery",
    "HeraldEvent",
    "LedgerReport",
    "ProviderCopy",
    "ProviderView",
    "reconcile",
]

# States that prove the provider took the message (DELIVERY_UNKNOWN: accepted, no receipt).
PROVIDER_REACHED = frozenset(
    {"PROVIDER_ACCEPTED", "DELIVERED", "READ", "OPENED", "CLICKED", "DELIVERY_UNKNOWN"}
)
# Final side states: Herald decided, and said so (a suppression or an expiry is not a loss).
TERMINAL = frozenset({"SUPPRESSED", "EXPIRED", "FAILED_PERMANENT"})
# Which providers serve a channel: copies of one delivery at any of them count together
# (a failover from sms_a to sms_b after an unseen acceptance is a duplicate to the user).
CHANNEL_PROVIDERS: Mapping[str, tuple[str, ...]] = {
    channel: providers_of(channel) for channel in ("sms", "email", "push")
}


@dataclass(frozen=True)
class ExpectedDelivery:
    """One user x channel delivery Herald owes for a 202-accepted request.

    `address` is what the provider sees (E.164 phone, email address, device token); tests give
    every expected delivery its own address so provider copies map to exactly one delivery.
    """

    notification_id: str
    user_id: str
    channel: str
    address: str
    traffic_class: str = "transactional"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.notification_id, self.user_id, self.channel)


@dataclass(frozen=True)
class HeraldEvent:
    """One state a delivery entered, as Herald recorded it (a delivery_events row)."""

    notification_id: str
    user_id: str
    channel: str
    state: str
    delivery_id: str = ""
    provider: str | None = None
    provider_msg_id: str | None = None


@dataclass(frozen=True)
class ProviderCopy:
    """One message a provider accepted: where, under which id, with which echoed reference."""

    provider: str
    address: str
    msg_id: str
    ref: str | None = None
    incarnation: int = 0
    first_seen: float | None = None  # monotonic time of the first snapshot that showed it


class ProviderView:
    """The union of `/_admin/stats` snapshots across simulator restarts.

    Call `observe` with every snapshot (the accepted-id lists only grow within one process, so
    the latest snapshot of an incarnation holds all of its copies); a killed simulator's last
    snapshot stays in the union. Copies accepted between that snapshot and the kill are not
    visible to anyone: callers snapshot right before a kill to keep that gap small.
    """

    def __init__(self) -> None:
        # (provider, incarnation) -> address -> [[msg_id, ref], ...]
        self._latest: dict[tuple[str, int], dict[str, list[list[Any]]]] = {}
        self._first_seen: dict[tuple[str, int, str], float] = {}

    def observe(
        self, provider: str, incarnation: int, stats: Mapping[str, Any], at: float | None = None
    ) -> None:
        """Record one stats snapshot of `provider` (a process identified by `incarnation`)."""
        ids: Mapping[str, list[list[Any]]] = stats.get("accepted_ids") or {}
        self._latest[(provider, incarnation)] = {a: list(v) for a, v in ids.items()}
        if at is not None:
            for entries in ids.values():
                for msg_id, *_ in entries:
                    self._first_seen.setdefault((provider, incarnation, str(msg_id)), at)

    def incarnations(self, provider: str) -> int:
        """How many processes of `provider` were observed."""
        return sum(1 for p, _ in self._latest if p == provider)

    def copies(self) -> list[ProviderCopy]:
        """Every accepted message seen, across all incarnations of every provider."""
        out: list[ProviderCopy] = []
        for (provider, inc), by_address in self._latest.items():
            for address, entries in by_address.items():
                for entry in entries:
                    msg_id = str(entry[0])
                    ref = entry[1] if len(entry) > 1 and entry[1] else None
                    seen = self._first_seen.get((provider, inc, msg_id))
                    out.append(ProviderCopy(provider, address, msg_id, ref, inc, seen))
        return out


@dataclass
class DeliveryOutcome:
    """The ledger's verdict on one expected delivery."""

    expected: ExpectedDelivery
    states: frozenset[str]
    copies: list[ProviderCopy]
    recorded_msg_ids: frozenset[str]
    delivery_ids: frozenset[str] = frozenset()  # from Herald's events: matched to copies' refs

    @property
    def reached(self) -> str | None:
        """PROVIDER_ACCEPTED when the provider took it, a terminal state, UNKNOWN, or None."""
        if self.states & PROVIDER_REACHED:
            return "PROVIDER_ACCEPTED"
        terminal = sorted(self.states & TERMINAL)
        if terminal:
            return terminal[0]
        if "UNKNOWN" in self.states:
            return "UNKNOWN"
        return None

    @property
    def lost(self) -> bool:
        """Herald never recorded an end for it and no provider holds a copy."""
        return self.reached is None and not self.copies

    @property
    def duplicates(self) -> int:
        """Provider copies beyond the first."""
        return max(0, len(self.copies) - 1)

    @property
    def unseen(self) -> bool:
        """Herald recorded PROVIDER_ACCEPTED but no provider snapshot shows a copy."""
        return self.reached == "PROVIDER_ACCEPTED" and not self.copies

    @property
    def last_state(self) -> str:
        """A short description of how far the delivery got, for reports."""
        return self.reached or (",".join(sorted(self.states)) or "no events")


@dataclass
class LedgerReport:
    """Every expected delivery's outcome, plus copies no expected delivery explains."""

    outcomes: list[DeliveryOutcome]
    strays: list[ProviderCopy] = field(default_factory=list)

    def by_class(self, traffic_class: str) -> LedgerReport:
        """The part of the report about one traffic class (strays are left out)."""
        keep = [o for o in self.outcomes if o.expected.traffic_class == traffic_class]
        return LedgerReport(keep)

    @property
    def losses(self) -> list[DeliveryOutcome]:
        return [o for o in self.outcomes if o.lost]

    @property
    def duplicated(self) -> list[DeliveryOutcome]:
        return [o for o in self.outcomes if o.duplicates]

    @property
    def duplicates(self) -> int:
        """Extra provider copies in total (one delivery sent three times counts two)."""
        return sum(o.duplicates for o in self.outcomes)

    @property
    def unseen(self) -> list[DeliveryOutcome]:
        return [o for o in self.outcomes if o.unseen]

    @property
    def stuck_with_copy(self) -> list[DeliveryOutcome]:
        """No end recorded by Herald, yet a provider holds a copy (recording lagging or lost)."""
        return [o for o in self.outcomes if o.reached is None and o.copies]

    def reached_counts(self) -> Counter[str]:
        """How many deliveries ended in each way (None → "not reached")."""
        return Counter(o.reached or "not reached" for o in self.outcomes)

    def render(self, title: str = "ledger", limit: int = 20) -> str:
        """A readable summary: outcomes, losses and duplicates, each with up to `limit` rows."""
        lines = [f"== {title}: {len(self.outcomes)} expected deliveries =="]
        for reached, n in sorted(self.reached_counts().items()):
            lines.append(f"  {reached:<20} {n}")
        lines.append(f"  losses               {len(self.losses)}")
        lines.append(f"  duplicates           {self.duplicates} (in {len(self.duplicated)})")
        lines.append(f"  provider-unseen      {len(self.unseen)}")
        lines.append(f"  stuck, provider has  {len(self.stuck_with_copy)}")
        lines.append(f"  stray provider copies {len(self.strays)}")
        for o in self.losses[:limit]:
            e = o.expected
            lines.append(f"  LOST {e.notification_id} {e.user_id} {e.channel}: {o.last_state}")
        for o in self.duplicated[:limit]:
            e = o.expected
            where = ", ".join(_copy_text(c) for c in o.copies)
            lines.append(f"  DUP  {e.notification_id} {e.user_id} {e.channel} x{len(o.copies)}")
            lines.append(f"       recorded {sorted(o.recorded_msg_ids)}; provider copies {where}")
            lines.append(f"       states {sorted(o.states)}")
        return "\n".join(lines)


def _copy_text(c: ProviderCopy) -> str:
    """`provider#incarnation:msg_id@first_seen` (first_seen: the monotonic clock, 0.1 s)."""
    seen = "?" if c.first_seen is None else f"{c.first_seen:.1f}"
    return f"{c.provider}#{c.incarnation}:{c.msg_id}@{seen}"


def reconcile(
    expected: Iterable[ExpectedDelivery],
    events: Iterable[HeraldEvent],
    copies: Iterable[ProviderCopy],
) -> LedgerReport:
    """Match every expected delivery with Herald's events and the providers' copies.

    Events are matched on (notification_id, user_id, channel). Copies are found at the address
    (at any provider of the channel); when several expected deliveries share an address, each
    copy goes to the delivery that recorded its provider message id, else to a delivery still
    without a copy, else it is a duplicate (`_share`). Request-level events (empty channel) are
    ignored. Copies at an address that no expected delivery uses are strays.
    """
    states: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    msg_ids: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    delivery_ids: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for ev in events:
        if not ev.channel:
            continue
        key = (ev.notification_id, ev.user_id, ev.channel)
        states[key].add(ev.state)
        if ev.provider_msg_id:
            msg_ids[key].add(ev.provider_msg_id)
        if ev.delivery_id:
            delivery_ids[key].add(ev.delivery_id)
    at: dict[tuple[str, str], list[ProviderCopy]] = defaultdict(list)
    for copy in copies:
        at[(copy.provider, _norm(copy.address))].append(copy)
    outcomes: list[DeliveryOutcome] = []
    groups: dict[tuple[str, str], list[DeliveryOutcome]] = defaultdict(list)
    for exp in expected:
        key = exp.key
        outcome = DeliveryOutcome(
            exp, frozenset(states.get(key, ())), [], frozenset(msg_ids.get(key, ())),
            frozenset(delivery_ids.get(key, ())),
        )  # fmt: skip
        outcomes.append(outcome)
        groups[(exp.channel, _norm(exp.address))].append(outcome)
    used: set[tuple[str, str]] = set()
    for (channel, address), group in groups.items():
        found: list[ProviderCopy] = []
        for provider in CHANNEL_PROVIDERS.get(channel, ()):
            used.add((provider, address))
            found.extend(at.get((provider, address), []))
        _share(group, found)
    strays = [c for where, cs in at.items() if where not in used for c in cs]
    return LedgerReport(outcomes, strays)


def _norm(address: str) -> str:
    """One spelling per address: Vonage reports `to` without the E.164 "+", emails any case."""
    return address.removeprefix("+").lower()


def _share(group: list[DeliveryOutcome], found: list[ProviderCopy]) -> None:
    """Give each copy at one address to the delivery it most plausibly belongs to.

    1. the delivery that recorded the copy's provider message id;
    2. the delivery whose delivery_id the provider echoed with the copy (`ref`: FCM's data,
       Twilio's idempotency token, SendGrid's custom args, Vonage's client-ref);
    3. a delivery without a copy and without a recorded id (Herald never learned the result:
       crash after the provider accepted, UNKNOWN), then one whose recorded copy no snapshot saw;
    4. otherwise the copy is one too many: a duplicate of the first delivery that has a copy.

    Step 2 matters where many deliveries share an address (a pool of phones receiving OTP after
    OTP): without it, the unrecorded second copy of a late OTP would read as a duplicate of the
    address's first OTP, sent long before the crash that duplicated the late one.
    """
    owner = {mid: o for o in group for mid in o.recorded_msg_ids}
    by_delivery = {did: o for o in group for did in o.delivery_ids}
    rest: list[ProviderCopy] = []
    for c in found:
        if c.msg_id in owner:
            owner[c.msg_id].copies.append(c)
        elif c.ref is not None and c.ref in by_delivery:
            by_delivery[c.ref].copies.append(c)
        else:
            rest.append(c)
    for c in rest:
        empty = [o for o in group if not o.copies]
        empty.sort(key=lambda o: bool(o.recorded_msg_ids))
        (empty[0] if empty else group[0]).copies.append(c)
