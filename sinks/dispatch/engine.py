"""The dispatch of one batch: control → guard → re-checks → breaker → shaping → send → decide →
effects.

    Dispatcher.dispatch(batch) -> Outputs     batch = [(KafkaMessage | None, delivery dict)]

Stages (herald.dispatching holds the pure rules, herald.retry the decisions):

1. due: a delivery due later (`next_attempt_at`/`not_before` beyond the tolerance) goes back to
   the retry topic unchanged, to be held by the retry job; then control: the notification
   cancelled → SUPPRESSED `cancelled`, paused → parked until resumed (SCHEDULED `paused`,
   herald.controls), both before the guard (nothing to release); one round trip per batch,
   which also takes the worker's send lease on each running notification, given back after
   the rounds; an escalation whose first message was read by now → SUPPRESSED
   `read_before_escalation` (sinks/dispatch/escalation.py);
2. guard (`SendGuard.acquire_many`, one round trip): SENT → its PROVIDER_ACCEPTED event is
   emitted again (same id) and nothing is sent; CLAIMED → skipped; UNKNOWN (an Unknown outcome
   come back for reconciliation) → its provider is asked (sinks/dispatch/reconcile.py): sent,
   sent again, or asked later; PENDING of another
   live worker → requeued for when that PENDING (or its worker's lease) expires (seed 000 §5.2
   "try again later"); PENDING of a dead worker (lease gone) → taken over and sent;
3. re-checks just before sending: expired → EXPIRED, opted out since planning → SUPPRESSED
   (the API's Redis copy of the preferences, one round trip), guard released; inside the
   user's quiet hours (a backlog drained late, a retry, a DLQ replay, a window set since
   planning; `herald.policy.quiet_end`) → held again: a SCHEDULED `quiet_hours` event and the
   delivery back to the retry topic, due when the window ends (the retry job holds it);
4. rounds: breaker admission per delivery (a refused one fails over or is requeued without
   counting an attempt), shaped sends (sinks/dispatch/sending.py; while they wait for rate
   tokens the control is checked again every `control_recheck_s`, and what a pause or cancel
   meets unsent is parked or suppressed as in stage 1, its guard released), `decide` per outcome,
   effects applied, each chunk's answers counted in the breaker together (at most one Redis
   sync per chunk); a failover (SMS A→B) goes into the next round at once, same guard;
5. guards: SENT for accepted (transactional) as each chunk's answers arrive (one pipelined
   round trip per chunk, before the next chunk's answers are settled), so a crash repeats at
   most the sends whose answers had arrived and were not recorded yet, not the whole batch's;
   released where the provider certainly did not send, UNKNOWN where it may have (at the end of
   the batch).

A delivery that ends on its channel (FAILED_PERMANENT, dead address, or no usable provider)
falls back to the next channel of its fallback steps (sinks/dispatch/fallback.py,
herald.fallback); a dead phone/email is disabled like a dead push token.

`hook(stage, items)` is called after stage 3 ("guarded": guards held, nothing sent), for each
chunk of answers before their SENT marks ("answered": the chunk's accepted items), after the
rounds ("sent": provider calls done, accepted ones marked SENT) and after stage 5 ("marked");
the sink adds nothing there — tests use it to crash a job at exactly those points.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from herald.breaker import Admission, CircuitBreaker
from herald.catalog import Catalog
from herald.controls import CANCELLED, DispatchControls
from herald.dispatching import (
    attempt_context,
    due_at,
    effects,
    event,
    instant,
    parse_sent_marker,
    provider_of,
    recheck,
    requeued,
    retry_policy,
    sent_marker,
)
from herald.fallback import has_cross_channel_step
from herald.guard import AlreadySent, GuardClass, InFlight, Proceed, SendGuard
from herald.kafka_records import KafkaMessage
from herald.metrics import JobMetrics
from herald.outcomes import Accepted, Outcome
from herald.policy import Preferences, quiet_end
from herald.retry import (
    Action,
    AttemptContext,
    Done,
    PausePlatform,
    RetryPolicy,
    decide,
    decide_refused,
)
from herald.states import State
from sinks.dispatch.contacts import ContactStore
from sinks.dispatch.escalation import READ_FIRST, EscalationCheck
from sinks.dispatch.fallback import FallbackRouter, ends, unusable
from sinks.dispatch.reconcile import Reconciler
from sinks.dispatch.sending import Recheck, ShapedSender
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.work import DeadLetterOut, Item, Outputs

__all__ = ["Dispatcher", "Hook"]

log = logging.getLogger(__name__)

Hook = Callable[[str, list[Item]], None]
Batch = Sequence[tuple[KafkaMessage | None, dict[str, Any]]]


class Dispatcher:
    """Runs batches of deliveries through one partition's guard, breaker, shaper and clients."""

    def __init__(
        self,
        settings: DispatchSettings,
        catalog: Catalog,
        guard: SendGuard,
        breaker: CircuitBreaker,
        sender: ShapedSender,
        contacts: ContactStore,
        *,
        clock: Callable[[], datetime],
        metrics: JobMetrics | None = None,
        hook: Hook | None = None,
        pii_key: bytes,
        controls: DispatchControls | None = None,
        escalations: EscalationCheck | None = None,
    ) -> None:
        self.settings = settings
        self.controls = controls  # cancel / pause checks and send leases (None: not checked)
        self.escalations = escalations  # escalations whose first message was read are dropped
        self.pii_key = pii_key  # the address tags of accepted SMS and email (herald.receipts)
        self.catalog = catalog
        self.guard = guard
        self.breaker = breaker
        self.sender = sender
        self.contacts = contacts
        self.clock = clock
        self.metrics = metrics or JobMetrics("dispatch")
        self.hook = hook
        self.fallbacks = FallbackRouter(catalog, contacts)
        self.reconciler = Reconciler(settings, sender.providers, guard, clock, self.metrics,
                                     pii_key)  # fmt: skip
        self._policies: dict[tuple[str, str], tuple[RetryPolicy, bool]] = {}
        self._rng = random.Random()
        self._releases: list[Proceed] = []  # released together at the end of the batch
        self._answered: list[Item] = []  # accepted in the chunk being settled (SENT next)
        self._results: list[tuple[Outcome, Admission]] = []  # its answers, for the breaker

    def dispatch(self, batch: Batch) -> Outputs:
        """Dispatch a batch (see the module docstring); never raises for provider trouble."""
        out = Outputs()
        items = self._due(batch, out)
        try:
            items = self._controlled(items, out)
            items = self._escalated(items, out)
            items = self._guarded(items, out)
            items = self._rechecked(items, out)
            self._stage("guarded", items)
            pending = items
            while pending:
                pending = self._round(pending, out)
        finally:
            if self.controls is not None:
                self.controls.release()
        self._stage("sent", items)
        self._mark(items)
        self._stage("marked", items)
        self._count(out)
        return out

    def _stage(self, name: str, items: list[Item]) -> None:
        if self.hook is not None:
            self.hook(name, items)

    # -- 1. due -------------------------------------------------------------------------------

    def _item(self, message: KafkaMessage | None, delivery: dict[str, Any]) -> Item:
        policy, bypass = self._policy(delivery["notification_type"], delivery["traffic_class"])
        provider = provider_of(delivery, self.settings.default_providers)
        if delivery["channel"] == "push" and not delivery.get("collapse_key"):
            delivery["collapse_key"] = delivery["notification_id"]  # duplicates merge on device
        attempt = int(delivery.get("attempt") or 0) + 1
        return Item(delivery, message, provider, policy, bypass, attempt,
                    instant(delivery.get("first_attempt_at")))  # fmt: skip

    def _policy(self, type_name: str, traffic_class: str) -> tuple[RetryPolicy, bool]:
        key = (type_name, traffic_class)
        found = self._policies.get(key)
        if found is None:
            nt = self.catalog.types.get(type_name)
            found = (
                retry_policy(
                    self.settings.backoff_for(traffic_class),
                    failover_on_unknown=bool(nt and nt.failover_on_unknown),
                    platform_pause_s=self.settings.platform_pause_s,
                ),
                bool(nt and nt.bypass_opt_out),
            )
            self._policies[key] = found
        return found

    def _due(self, batch: Batch, out: Outputs) -> list[Item]:
        now = self.clock()
        items: list[Item] = []
        for message, delivery in batch:
            at = due_at(delivery)
            if at is not None and (at - now).total_seconds() > self.settings.early_tolerance_s:
                out.retries.append(dict(delivery))  # held by the retry job until due
                continue
            items.append(self._item(message, dict(delivery)))
        return items

    # -- 2. guard ------------------------------------------------------------------------------

    def _guarded(self, items: list[Item], out: Outputs) -> list[Item]:
        if not items:
            return []
        keys = [(it.delivery_id, cast(GuardClass, it.traffic_class)) for it in items]
        results = self.guard.acquire_many(keys)
        now = self.clock()
        kept: list[Item] = []
        unknown: list[tuple[Item, AlreadySent]] = []
        for it, result in zip(items, results, strict=True):
            if isinstance(result, Proceed):
                it.guard = result
                kept.append(it)
                if result.taken_over:  # its worker died mid-send: sent again (crash window)
                    self.metrics.error("guard_taken_over")
            elif isinstance(result, InFlight):
                at = next_in(result.retry_after_s + self._rng.uniform(0.0, 1.0), now)
                out.retries.append(requeued(it.delivery, at))
                self.metrics.error("in_flight")
            elif result.state == "unknown":
                unknown.append((it, result))
            else:
                self._already(it, result, now, out)
        if unknown:  # an Unknown outcome met again: ask its provider (reconcile.py)
            kept.extend(self.reconciler.reconcile(unknown, out))
        return kept

    def _already(self, it: Item, result: AlreadySent, now: datetime, out: Outputs) -> None:
        self.metrics.error(f"duplicate_{result.state}")
        if result.state != "sent":
            return
        provider, attempt, msg_id = parse_sent_marker(result.provider_msg_id)
        again = Accepted(msg_id or "", provider=provider or it.provider)
        out.events.extend(
            effects(_done(again), it.delivery, None, provider=provider or it.provider,
                    attempt=attempt or it.attempt, now=now, first_attempt_at=None,
                    pii_key=self.pii_key).events
        )  # fmt: skip

    # -- 3. re-checks --------------------------------------------------------------------------

    def _controlled(self, items: list[Item], out: Outputs) -> list[Item]:
        """Items of running notifications; cancelled ones end SUPPRESSED `cancelled`, paused
        ones are parked (herald.controls). Leases are taken on the running ones."""
        if self.controls is None or not items:
            return items
        now = self.clock()
        found = self.controls.hold((it.delivery["notification_id"] for it in items), _ms(now))
        return self._withheld(items, found, now, out)

    def _recheck(self, out: Outputs) -> Recheck | None:
        """The sender's mid-batch check: the waiting items of notifications paused or cancelled
        since the batch began are withheld as `_controlled` does (their guards released)."""
        controls = self.controls
        if controls is None:
            return None

        def recheck(waiting: list[Item]) -> list[Item]:
            found = controls.check(it.delivery["notification_id"] for it in waiting)
            return self._withheld(waiting, found, self.clock(), out)

        return recheck

    def _withheld(
        self, items: list[Item], found: dict[str, str], now: datetime, out: Outputs
    ) -> list[Item]:
        """`items` whose notification is not in `found` (nid -> paused | cancelled); the
        others end SUPPRESSED `cancelled` or are parked, unsent, their guard released."""
        if not found:
            return items
        kept: list[Item] = []
        for it in items:
            control = found.get(it.delivery["notification_id"])
            if control is None:
                kept.append(it)
                continue
            state, reason = (
                (State.SUPPRESSED, "cancelled") if control == CANCELLED
                else (State.SCHEDULED, "paused")
            )  # fmt: skip
            out.events.append(event(it.delivery, state, attempt=it.attempt - 1, now=now,
                                    provider=it.provider, reason=reason))  # fmt: skip
            if control == CANCELLED:
                self.metrics.suppressed("cancelled")
            else:
                out.parked.append(it.delivery)
            it.guard_op = "release"
            self._release(it)
        return kept

    def _escalated(self, items: list[Item], out: Outputs) -> list[Item]:
        """Escalations whose first message was read by now end SUPPRESSED (escalation.py)."""
        if self.escalations is None or not items:
            return items
        read = self.escalations.read_first(items)
        if not read:
            return items
        now = self.clock()
        for it in items:
            if it.delivery_id in read:
                made = it.attempt - 1
                out.events.append(event(it.delivery, State.SUPPRESSED, attempt=made, now=now,
                                        provider=it.provider, reason=READ_FIRST))  # fmt: skip
                self.metrics.suppressed(READ_FIRST)
        return [it for it in items if it.delivery_id not in read]

    def _rechecked(self, items: list[Item], out: Outputs) -> list[Item]:
        if not items:
            return []
        self.contacts.resolve([it.delivery for it in items])
        prefs = self.contacts.preferences(it.delivery["user_id"] for it in items)
        now = self.clock()
        kept: list[Item] = []
        for it in items:
            user_prefs = prefs.get(it.delivery["user_id"])
            skip = recheck(it.delivery, now, user_prefs, it.bypass_opt_out)
            if skip is None:
                if user_prefs is not None and self._held_quiet(it, user_prefs, now, out):
                    continue
                kept.append(it)
                continue
            made = it.attempt - 1
            out.events.append(event(it.delivery, skip.state, attempt=made, now=now,
                                    provider=it.provider, reason=skip.reason))  # fmt: skip
            if skip.state is State.SUPPRESSED:
                self.metrics.suppressed(skip.reason)
            it.guard_op = "release"
            self._release(it)
        return kept

    def _held_quiet(self, it: Item, prefs: Preferences, now: datetime, out: Outputs) -> bool:
        """Hold `it` again when it reached dispatch inside the user's quiet hours."""
        nt = self.catalog.types.get(it.delivery["notification_type"])
        channel = it.delivery["channel"]
        until = None if nt is None else quiet_end(self.catalog, nt, prefs, channel, now)
        if until is None:
            return False
        out.events.append(event(it.delivery, State.SCHEDULED, attempt=it.attempt - 1, now=now,
                                provider=it.provider, reason="quiet_hours",
                                attributes={"held_until": until.isoformat()}))  # fmt: skip
        out.retries.append(requeued(it.delivery, until))
        it.guard_op = "release"
        self._release(it)
        return True

    # -- 4. rounds -----------------------------------------------------------------------------

    def _round(self, items: list[Item], out: Outputs) -> list[Item]:
        """One pass of breaker → shaping → sends → decisions; returns items failing over."""
        again: list[Item] = []
        ready: list[Item] = []
        now = self.clock()
        for it in items:
            admission = self.breaker.allow(it.provider)
            if admission.allowed:
                it.admission = admission
                ready.append(it)
                continue
            ctx = self._ctx(it, now, open_breakers=frozenset({it.provider}))
            action = decide_refused(ctx, it.policy, admission.retry_in_s)
            if self._apply(it, action, None, now, out):
                again.append(it)

        def settle(it: Item, outcome: Outcome) -> None:
            if it.admission is not None:
                self._results.append((outcome, it.admission))  # to the breaker per chunk
            at = self.clock()
            # an acceptance needs no attempt context: `decide` makes it Done whatever it says
            action = (
                _done(outcome)
                if isinstance(outcome, Accepted)
                else decide(outcome, self._ctx(it, at), it.policy)
            )
            if self._apply(it, action, outcome, at, out):
                again.append(it)
            elif it.guard_op == "sent":
                if has_cross_channel_step(it.delivery):
                    out.watched.append(it.delivery)  # a late failure may still fall back
                if it.guard is not None and it.guard.two_phase:
                    self._answered.append(it)

        deferred = self.sender.send(ready, out.events, settle, self._chunk_settled,
                                    self._recheck(out))  # fmt: skip
        now = self.clock()
        for it in deferred:
            self._defer(it, now, out)
        return again

    def _ctx(
        self, it: Item, now: datetime, open_breakers: frozenset[str] = frozenset()
    ) -> AttemptContext:
        return attempt_context(it.delivery, it.provider, it.attempt, now,
                               rejected_by=frozenset(it.rejected_by),
                               open_breakers=open_breakers,
                               first_attempt_at=it.first_attempt_at)  # fmt: skip

    def _defer(self, it: Item, now: datetime, out: Outputs) -> None:
        """Not granted tokens in time: back to the retry topic, no attempt counted."""
        at = next_in(self._rng.uniform(0.5, 1.5) * self.settings.shape_max_wait_s, now)
        out.retries.append(requeued(it.delivery, at))
        out.events.append(event(it.delivery, State.RETRY_SCHEDULED, attempt=it.attempt - 1,
                                now=now, provider=it.provider, reason="rate_shaped"))  # fmt: skip
        it.guard_op = "release"
        self._release(it)

    def _apply(
        self, it: Item, action: Action, outcome: Outcome | None, now: datetime, out: Outputs
    ) -> bool:
        """Carry out the effects of `action`; True when the item fails over (send again)."""
        why = unusable(action)
        if why is not None and self._fell_back(it, action, why, outcome, now, out):
            return False
        fx = effects(action, it.delivery, outcome, provider=it.provider, attempt=it.attempt,
                     now=now, first_attempt_at=it.first_attempt_at,
                     pii_key=self.pii_key)  # fmt: skip
        out.events.extend(fx.events)
        if ends(action) and fx.events:
            fb = self.fallbacks.route(it.delivery, getattr(action, "reason", ""), now)
            fx.events[-1]["attributes"].update(fb.source_attributes)
            self.fallbacks.emit(fb, out)
        if fx.pause is not None:
            provider, reason, pause_s = fx.pause
            log.error("dispatch.provider_paused provider=%s reason=%s pause_s=%.0f",
                      provider, reason, pause_s)  # fmt: skip
            self.breaker.trip(provider, reason, pause_s)
        address, channel = it.delivery.get("address"), it.delivery["channel"]
        if fx.cleanup_token and address and channel == "push":
            out.cleanups.append((it.delivery["user_id"], address))
        elif fx.cleanup_token and address and channel in ("sms", "email"):
            out.disables.append((it.delivery["user_id"], channel, address))
            fx.events[-1]["attributes"]["address_disabled"] = (
                "phone" if channel == "sms" else "email"
            )
        if fx.dead_letter is not None and fx.retry is not None:
            out.dead_letters.append(DeadLetterOut(it.message, fx.retry, fx.dead_letter))
        elif fx.retry is not None:
            out.retries.append(fx.retry)
        if fx.failover_to is not None:
            self._failover(it, fx.failover_to, counted=outcome is not None)
            return True
        it.guard_op = fx.guard
        if fx.guard == "unknown" and fx.retry is None:
            follow_up = self.reconciler.follow_up(it, now)  # ask the provider later
            if follow_up is not None:
                out.retries.append(follow_up)
        if fx.guard == "sent" and outcome is not None and isinstance(outcome, Accepted):
            it.sent_marker = sent_marker(it.provider, it.attempt, outcome.provider_msg_id)
        return False

    def _fell_back(
        self, it: Item, action: Action, why: str, outcome: Outcome | None, now: datetime,
        out: Outputs,
    ) -> bool:  # fmt: skip
        """No provider of the channel is usable: end it here if another channel takes over."""
        cause = f"no_usable_provider:{why}"
        fb = self.fallbacks.route(it.delivery, cause, now)
        if fb.to is None:
            return False  # keep waiting for a provider of this channel
        if isinstance(action, PausePlatform):
            log.error("dispatch.provider_paused provider=%s reason=%s pause_s=%.0f",
                      action.provider, action.reason, action.pause_s)  # fmt: skip
            self.breaker.trip(action.provider, action.reason, action.pause_s)
        made = it.attempt if outcome is not None else it.attempt - 1
        out.events.append(event(it.delivery, State.FAILED_PERMANENT, attempt=made, now=now,
                                provider=it.provider, reason=cause,
                                attributes=fb.source_attributes))  # fmt: skip
        self.fallbacks.emit(fb, out)
        it.guard_op = "release"
        return True

    def _failover(self, it: Item, to: str, *, counted: bool) -> None:
        it.rejected_by.add(it.provider)
        steps = list(it.delivery.get("fallback") or ())
        own = f"{it.delivery['channel']}:{to}"
        if own in steps:
            steps = steps[steps.index(own) + 1 :]
        it.delivery = {**it.delivery, "provider": to, "fallback": steps}
        it.provider = to
        if counted:
            it.attempt += 1
        log.info("dispatch.failover to=%s attempt=%d", to, it.attempt)

    # -- 5. guards -----------------------------------------------------------------------------

    def _chunk_settled(self) -> None:
        """The chunk's answers to the breaker (one local count, at most one sync), then SENT
        for its accepted sends (stage 5, as answers come)."""
        results, self._results = self._results, []
        if results:
            self.breaker.record_outcomes(results)
        answered, self._answered = self._answered, []
        if not answered:
            return
        self._stage("answered", answered)
        self.guard.mark_sent_many([(it.guard, it.sent_marker) for it in answered if it.guard])
        for it in answered:
            it.guard_op = "keep"  # recorded: nothing left to do with the guard

    def _mark(self, items: list[Item]) -> None:
        sent = [(it.guard, it.sent_marker) for it in items if it.guard_op == "sent" and it.guard]
        if sent:
            self.guard.mark_sent_many(sent)
        for it in items:
            if it.guard is None:
                continue
            if it.guard_op == "release":
                self._release(it)
            elif it.guard_op == "unknown":
                self.guard.mark_unknown(it.guard)
        releases, self._releases = self._releases, []
        self.guard.release_many(releases)

    def _release(self, it: Item) -> None:
        """Release `it`'s guard with the batch's other releases (before `dispatch` returns, so
        before its retry record is produced)."""
        if it.guard is not None:
            self._releases.append(it.guard)
            it.guard = None

    def _count(self, out: Outputs) -> None:
        """Metrics once per batch (prometheus label lookups are not free per event)."""
        states = Counter(ev["state"] for ev in out.events)
        for state, n in states.items():
            self.metrics.event(state, n)
        sent = Counter(
            (ev["provider"], ev["channel"])
            for ev in out.events
            if ev["state"] == "PROVIDER_ACCEPTED" and ev["provider"]
        )
        for (provider, channel), n in sent.items():
            self.metrics.sent(provider, channel, n)
        for letter in out.dead_letters:
            self.metrics.dead_letter(letter.reason.split(":", 1)[0])


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def next_in(seconds: float, now: datetime) -> datetime:
    """`now + seconds` (never in the past)."""
    return now + timedelta(seconds=max(seconds, 0.0))


def _done(outcome: Accepted) -> Action:
    return Done(outcome.provider_msg_id)
