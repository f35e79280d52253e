"""The plan job's batch steps: admission, then the policy with caps and rendering.

    Admission(...)(decoded)   requests -> PlanRequest | dead letter | None (a duplicate)
    Planner(...)(batch)       audience batches -> Output | KafkaRecord | dead letter: one Redis
                              trip a batch for the users' state (the copies,
                              dataflows/_user_copies.py), one for the frequency caps; users
                              planned alike get encoded records from a template
                              (dataflows/plan/planned_alike.py)

They are callables over whole batches (`flat_map_batch`), so the per-item cost of the dataflow is
paid once per batch for Redis round trips and clock reads. Redis clients are created on first use
in the worker process that runs the step.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._redis import CapCharge, CapCounter, RequestGate, redis_client
from dataflows._settings import Clock
from dataflows._user_copies import BadCopy, UserState
from dataflows.plan.otp_guard import OtpGuard
from dataflows.plan.planned_alike import Classes, Template
from herald import tracing
from herald.catalog import Catalog
from herald.config import HeraldSettings, SmsLimits
from herald.controls import PlanControls
from herald.dead_letters import dead_letter
from herald.errors import CatalogLookupError, HeraldError, InvalidRequest
from herald.kafka_records import KafkaMessage
from herald.plan_records import (
    CapDays,
    Output,
    Rejected,
    Renderer,
    cap_charge,
    plan_user,
    refuse_capped,
    user_records,
)
from herald.planning import AudienceBatch, PlanRequest, UserView, admit_request
from herald.policy import Decision
from herald.states import State
from herald.tenants import TenantTypes

__all__ = ["Admission", "Planner"]

log = logging.getLogger(__name__)

JOB = "plan"
DeadLetter = dict[str, Any]


class Admission:
    """Validate decoded requests against the catalog, then drop duplicates (RequestGate)."""

    def __init__(
        self,
        catalog: Catalog,
        settings: HeraldSettings,
        dedup_ttl_seconds: int,
        clock: Clock,
        tenants: TenantTypes | None = None,
    ) -> None:
        self.catalog = catalog
        self.settings = settings
        self.ttl = dedup_ttl_seconds
        self.clock = clock
        self.tenants = tenants  # what other producers' tenants may send (herald/tenants.py)
        self._gate: RequestGate | None = None

    def __call__(
        self, decoded: Sequence[tuple[KafkaMessage, dict[str, Any]]]
    ) -> list[PlanRequest | DeadLetter | None]:
        """One result per input, in order."""
        results: list[PlanRequest | DeadLetter | None] = []
        for msg, rec in decoded:
            origin = f"{msg.topic}:{msg.partition}:{msg.offset}"
            if msg.headers:  # a producer's trace context may be a header (herald/tracing.py)
                rec = {**rec, "traceparent": tracing.of_request(rec, msg.headers)}
            try:
                results.append(admit_request(rec, self.catalog, origin, self.tenants))
            except (CatalogLookupError, InvalidRequest) as exc:
                log.warning("plan.bad_request offset=%d reason=%s", msg.offset, exc.code)
                results.append(msg.dead_letter(exc.code, exc.detail, JOB))
        admitted = [r for r in results if isinstance(r, PlanRequest)]
        if not admitted:
            return results
        if self._gate is None:
            self._gate = RequestGate(redis_client(self.settings.redis), self.ttl)
        expiring = [(r, self._expiry(r)) for r in admitted]
        verdicts = iter(self._gate.admit(expiring, self.clock.now()))
        return [r if not isinstance(r, PlanRequest) or next(verdicts) else None for r in results]

    def _expiry(self, request: PlanRequest) -> datetime:
        expires = request.policy.expires(self.catalog.get(request.notification_type))
        return expires if expires is not None else self.clock.now() + timedelta(seconds=self.ttl)


class Planner:
    """Policy, frequency caps, rendering and records for joined user tasks.

    The cap charges of a batch run in Redis while the records are built: every user's records
    are built as if the charge is allowed, and those of a user whose charge is refused are built
    again from the refused decisions (`refuse_capped`) once the answer is in. The Redis round
    trip, ~12% of the job's time when it waited, overlaps with the job's own work (the calling
    thread blocks on the socket without the GIL).

    Users planned alike get their records from a template (dataflows/plan/planned_alike.py), already
    encoded: those come out as `KafkaRecord`s beside the `Output`s of users planned in full.
    The step counts the events it emits (`count`).
    """

    def __init__(
        self,
        catalog: Catalog,
        settings: HeraldSettings,
        clock: Clock,
        encoder: Encoder,
        count: CountOutputs,
        cache_users: int = 50_000,
    ) -> None:
        self.catalog = catalog
        self.settings = settings
        self.clock = clock
        self.encoder = encoder
        self.count = count
        self.cache_users = cache_users  # UserState's parsed copies per generation
        self.renderer = Renderer(catalog)
        self._caps: CapCounter | None = None
        self._state: UserState | None = None
        self._controls: PlanControls | None = None
        self._otp: OtpGuard | None = None
        self._redis_thread: ThreadPoolExecutor | None = None

    def __call__(self, batch: list[AudienceBatch]) -> list[Any]:
        """Outputs (or KafkaRecords) of every user of every audience batch."""
        return self.start(self.fetch(batch))()

    def fetch(self, batch: list[AudienceBatch]) -> Fetched:
        """The batches and their users' copies, read on the helper thread while the caller goes
        on (dataflows/plan/flow.py `_chain` fetches the next chunk's while it plans this one). The
        batches of a cancelled notification come back with a cancelled request."""
        if self._state is None:
            client = redis_client(self.settings.redis)
            self._state = UserState(client, self.settings.kafka.topic_prefix, self.cache_users)
            self._controls = PlanControls(client)
        batch = self._cancelled(batch)
        return Fetched(batch, self._helper().submit(self._state.read, batch))

    def _cancelled(self, batch: list[AudienceBatch]) -> list[AudienceBatch]:
        """`batch` with the requests of cancelled notifications marked (one round trip): the
        policy suppresses every channel of their users (`cancelled`)."""
        assert self._controls is not None
        cancelled = self._controls.cancelled(b.request.notification_id for b in batch)
        if not cancelled:
            return batch
        marked: dict[str, PlanRequest] = {}
        out: list[AudienceBatch] = []
        for item in batch:
            nid = item.request.notification_id
            if nid in cancelled:
                request = marked.get(nid)
                if request is None:
                    policy = replace(item.request.policy, cancelled=True)
                    request = marked[nid] = replace(item.request, policy=policy)
                item = replace(item, request=request)
            out.append(item)
        return out

    def start(self, fetched: Fetched) -> Callable[[], list[Any]]:
        """Plan a fetched batch; the returned call waits for the cap charges' answers and gives
        the records. The plan job starts the next chunk before it finishes this one, so Redis
        answers while this process works. Users planned from a template are grouped by it and
        their records made together once the answers are in."""
        assert self._state is not None  # made by fetch
        batch, bad = self._state.parse(fetched.batches, fetched.copies.result())
        now = self.clock.now()
        letters: list[Any] = [_bad_copy_letter(b) for b in bad]
        refused = self._otp_guard().refusals(batch)  # OTPs the API did not charge
        plans: list[_Plan] = []  # users planned in full
        charged: list[tuple[int, CapCharge]] = []  # (index in plans, charge)
        groups: dict[Template, _Group] = {}  # users planned from a template
        days = CapDays(now)
        classes = Classes(self.encoder, self.renderer.ids, batch)
        for planned in batch:
            request = planned.request
            nid = request.notification_id
            for view in planned.users:
                if refused:
                    refusal = refused.get((id(request), view.user_id))
                    if refusal is not None:
                        letters.append(_user_letter(request, view.user_id, None, *refusal))
                        continue
                template = classes.get(request, view)
                if template is not None:
                    group = groups.get(template)
                    if group is None:
                        group = groups[template] = _Group(request, [])
                    group.views.append(view)
                    continue
                try:
                    decisions = plan_user(self.catalog, request, view, now)
                except HeraldError as exc:  # a bad value in this user's state
                    code = _code(exc)
                    letters.append(_user_letter(request, view.user_id, None, code, str(exc)))
                    continue
                bucket = cap_charge(self.catalog, request, view, decisions, now, days)
                plan = _Plan(request, view, decisions)
                plan.records = classes.learn(
                    request, view, bucket, partial(self._records, plan, now)
                )
                if bucket is not None:
                    charged.append((len(plans), CapCharge.of(bucket, view.user_id, nid)))
                plans.append(plan)
        group_charges = [(t, g, t.charges(g.views)) for t, g in groups.items()]
        charges = [c for _i, c in charged]
        for _t, _g, more in group_charges:
            charges += more or ()
        allowed = self._charge(charges)
        per_user = [self._records(plan, now) if plan.records is None else plan.records
                    for plan in plans]  # fmt: skip

        def finish() -> list[Any]:
            results = allowed.result()  # those of `charged`, then of each group's charges
            answers = iter(results[len(charged) :])
            for (index, _charge), ok in zip(charged, results[: len(charged)], strict=True):
                if not ok:
                    per_user[index] = self._refused(plans[index], now)
            out = letters
            users: Counter[Template] = Counter()
            for template, group, more in group_charges:
                views = group.views
                if more is not None:
                    oks = [next(answers) for _ in more]
                    if not all(oks):
                        for view, ok in zip(group.views, oks, strict=True):
                            if not ok:
                                per_user.append(self._refused(_Plan(group.request, view), now))
                        views = [v for v, ok in zip(group.views, oks, strict=True) if ok]
                out.extend(template.records(views))
                users[template] += len(views)
            self._count(users, per_user)
            for records in per_user:
                out.extend(records)
            return out

        return finish

    def _otp_guard(self) -> OtpGuard:
        if self._otp is None:
            client = redis_client(self.settings.redis)
            pii = self.settings.pii.key_bytes()
            self._otp = OtpGuard(client, SmsLimits(), self.catalog, pii)
        return self._otp

    def _refused(self, plan: _Plan, now: datetime) -> list[Any]:
        """The records of a user whose cap charge was refused."""
        decisions = plan.decisions
        if decisions is None:  # a user of a template: planned again
            try:
                decisions = plan_user(self.catalog, plan.request, plan.view, now)
            except HeraldError as exc:  # not seen from the same class, but kept safe
                letter = _user_letter(plan.request, plan.view.user_id, None, _code(exc), str(exc))
                return [letter]
        plan.decisions = refuse_capped(decisions)
        return self._records(plan, now)

    def _records(self, plan: _Plan, now: datetime) -> list[Output | DeadLetter]:
        request, view, decisions = plan.request, plan.view, plan.decisions
        assert decisions is not None
        records, rejected = user_records(self.renderer, request, view, decisions, now)
        return [*records, *(_rejection_letter(request, r) for r in rejected)]

    def _count(self, users: Counter[Template], planned_in_full: list[list[Any]]) -> None:
        """Count the batch's events: a template's per user of it, the rest from the Outputs."""
        states: Counter[str] = Counter()
        suppressed: Counter[str] = Counter()
        for template, n in users.items():
            for (state, reason), k in template.events.items():
                states[state] += n * k
                if state == State.SUPPRESSED.value and reason is not None:
                    suppressed[reason] += n * k
        self.count.add(states, suppressed)
        self.count([record for records in planned_in_full for record in records])

    def _charge(self, charges: list[CapCharge]) -> Future[list[bool]]:
        """The charges' answers, computed in Redis while the caller goes on."""
        if not charges:
            done: Future[list[bool]] = Future()
            done.set_result([])
            return done
        if self._caps is None:
            self._caps = CapCounter(redis_client(self.settings.redis))
        return self._helper().submit(self._caps.charge, charges)

    def _helper(self) -> ThreadPoolExecutor:
        """The thread that talks to Redis for the batches (in their order)."""
        if self._redis_thread is None:
            self._redis_thread = ThreadPoolExecutor(1, thread_name_prefix="plan-redis")
        return self._redis_thread


class Fetched(NamedTuple):
    """Audience batches and their users' copies, on their way from Redis (`Planner.fetch`)."""

    batches: list[AudienceBatch]
    copies: Future[list[Any]]


@dataclass(slots=True)
class _Plan:
    """One user of a batch planned in full: its `decisions`, and its `records` when they were
    built early (to learn a template from them)."""

    request: PlanRequest
    view: UserView
    decisions: list[Decision] | None = None
    records: list[Any] | None = None


class _Group(NamedTuple):
    """The users of a batch planned from one template."""

    request: PlanRequest
    views: list[UserView]


def _code(exc: HeraldError) -> str:
    return str(getattr(exc, "code", type(exc).__name__))


def _user_letter(
    request: PlanRequest, user_id: str, delivery_id: str | None, reason: str, detail: str
) -> DeadLetter:
    topic = request.origin.rsplit(":", 2)[0]
    log.warning("plan.user_rejected notification_id=%s reason=%s", request.notification_id, reason)
    return dead_letter(
        source_topic=topic, reason=reason, job=JOB, key=request.notification_id,
        detail=f"{detail} (origin {request.origin})", delivery_id=delivery_id,
        expire_at=request.policy.expire_at,
    )  # fmt: skip


def _bad_copy_letter(bad: BadCopy) -> DeadLetter:
    return _user_letter(bad.request, bad.user_id, None, "bad_user_state", bad.detail)


def _rejection_letter(request: PlanRequest, rejected: Rejected) -> DeadLetter:
    return _user_letter(
        request, rejected.user_id, rejected.delivery_id, rejected.code, rejected.detail
    )
