"""Reconciliation of UNKNOWN outcomes: ask the provider, then sent, send again, or wait.

A provider call that timed out after the request left (or whose connection broke) is Unknown:
the provider may have the message or not. The send guard stays UNKNOWN (no blind resend) and,
for a provider that can look a message up (`ProviderClient.lookups`: Twilio's message list,
SendGrid's Email Activity), the delivery goes to the retry topic, due `reconcile_after_s` later
(`follow_up`). The retry job holds it like any retry; when dispatch meets it again its guard
answers UNKNOWN and `reconcile` asks the provider, one concurrent lookup per delivery of the
batch:

    the provider has it          guard UNKNOWN → SENT, PROVIDER_ACCEPTED (reason `reconciled`):
                                 no second message
    the provider never got it    transactional and normal: the guard is taken back (UNKNOWN →
                                 this worker's PENDING/CLAIMED, compare-and-set) and the delivery
                                 is sent again under the same delivery_id, as the next attempt;
                                 bulk (at most once): FAILED_PERMANENT `lost_before_provider`
    past its expiry              EXPIRED
    cannot tell (a failed        asked again `2 x reconcile_after_s` later, until
    lookup, or "not found"       `reconcile_window_s` after its first attempt; then it stays
    younger than the provider's  UNKNOWN (an operator's call)
    record lag, `lookup_lag_s`)

Providers without a lookup (APNs, FCM, Vonage) keep UNKNOWN, as before. Why no job of its own:
the retry job already holds deliveries until a due time and dispatch already owns the clients
and the guards; a reconciliation is one more answer of the guard stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from herald.dispatching import effects, event, instant, retried, sent_marker
from herald.guard import AlreadySent, GuardClass, SendGuard
from herald.metrics import JobMetrics
from herald.outcomes import Accepted
from herald.retry import Done
from herald.states import State
from sinks.dispatch.clients import Providers
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.work import Item, Outputs

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)

RESENT_CLASSES = frozenset({"transactional", "normal"})


class Reconciler:
    """See the module docstring; one per dispatch partition."""

    def __init__(
        self,
        settings: DispatchSettings,
        providers: Providers,
        guard: SendGuard,
        clock: Callable[[], datetime],
        metrics: JobMetrics,
        pii_key: bytes,
    ) -> None:
        self.after = timedelta(seconds=settings.reconcile_after_s)
        self.window = timedelta(seconds=settings.reconcile_window_s)
        self.providers = providers
        self.guard = guard
        self.clock = clock
        self.metrics = metrics
        self.pii_key = pii_key

    def can_lookup(self, provider: str) -> bool:
        """Whether `provider`'s client can look a message up."""
        self.providers.ensure([provider])
        return bool(getattr(self.providers.client(provider), "lookups", False))

    def follow_up(self, it: Item, now: datetime) -> dict[str, Any] | None:
        """After an Unknown: the delivery to ask its provider about later (retry topic), or
        None when the provider cannot be asked."""
        if not self.can_lookup(it.provider):
            return None
        first = it.first_attempt_at or now
        return retried(it.delivery, at=now + self.after, provider=it.provider,
                       attempts_made=it.attempt, first_attempt_at=first)  # fmt: skip

    def reconcile(self, found: list[tuple[Item, AlreadySent]], out: Outputs) -> list[Item]:
        """Decide the UNKNOWN deliveries met again; returns those to send again (guard held)."""
        now = self.clock()
        asking: list[tuple[Item, AlreadySent]] = []
        for it, held in found:
            expire_at = instant(it.delivery.get("expire_at"))
            if expire_at is not None and now >= expire_at:
                out.events.append(self._event(it, State.EXPIRED, "expired", now))
            elif self.can_lookup(it.provider):
                asking.append((it, held))
            else:
                self.metrics.error("duplicate_unknown")
        if not asking:
            return []
        answers = self.providers.lookup_all([(it.provider, it.delivery) for it, _ in asking])
        again: list[Item] = []
        for (it, held), answer in zip(asking, answers, strict=True):
            if answer.found is True:
                self._sent(it, held, answer.provider_msg_id, now, out)
            elif answer.found is False and self._settled(it, now):
                if self._resend(it, held, now, out):
                    again.append(it)
            else:
                self._later(it, now, out)
        return again

    def _sent(self, it: Item, held: AlreadySent, msg_id: str, now: datetime, out: Outputs) -> None:
        made = it.attempt - 1
        if not self.guard.resolve_sent(held, sent_marker(it.provider, made, msg_id)):
            return  # another worker resolved it first
        accepted = Accepted(msg_id, provider=it.provider)
        fx = effects(Done(msg_id), it.delivery, accepted, provider=it.provider, attempt=made,
                     now=now, first_attempt_at=None, pii_key=self.pii_key)  # fmt: skip
        for ev in fx.events:
            if ev["state"] == State.PROVIDER_ACCEPTED.value:
                ev["reason"] = "reconciled"
        out.events.extend(fx.events)
        self.metrics.error("reconciled_sent")
        log.info("dispatch.reconciled delivery_id=%s found=sent", it.delivery_id)

    def _settled(self, it: Item, now: datetime) -> bool:
        """Whether the provider's "not found" is old enough to believe (its records' lag)."""
        lag = float(getattr(self.providers.client(it.provider), "lookup_lag_s", 0.0))
        first = instant(it.delivery.get("first_attempt_at")) or now
        return (now - first).total_seconds() >= lag

    def _resend(self, it: Item, held: AlreadySent, now: datetime, out: Outputs) -> bool:
        if it.traffic_class not in RESENT_CLASSES:  # bulk: at most once
            out.events.append(self._event(it, State.FAILED_PERMANENT, "lost_before_provider", now))
            self.metrics.error("reconciled_lost")
            return False
        guard = self.guard.reclaim(held, cast(GuardClass, it.traffic_class))
        if guard is None:
            return False  # another worker resolved it first
        it.guard = guard
        self.metrics.error("reconciled_resent")
        log.info("dispatch.reconciled delivery_id=%s found=not_sent resending", it.delivery_id)
        return True

    def _later(self, it: Item, now: datetime, out: Outputs) -> None:
        first = instant(it.delivery.get("first_attempt_at")) or now
        if now - first >= self.window:
            log.warning("dispatch.reconcile_gave_up delivery_id=%s", it.delivery_id)
            return
        record = retried(it.delivery, at=now + 2 * self.after, provider=it.provider,
                         attempts_made=it.attempt - 1, first_attempt_at=first)  # fmt: skip
        out.retries.append(record)

    @staticmethod
    def _event(it: Item, state: State, reason: str, now: datetime) -> dict[str, Any]:
        return event(it.delivery, state, attempt=it.attempt - 1, now=now, provider=it.provider,
                     reason=reason)  # fmt: skip
