"""One user's plan as records: Deliveries, delivery events and the frequency-cap charge. Pure.

    plan_user(catalog, request, view, now)         -> decisions (herald.policy.decide)
    cap_charge(catalog, request, view, decisions, now) -> the CapBucket to charge, or None
    refuse_capped(decisions)                       -> Send/Hold replaced by Suppress(frequency_cap)
    user_records(catalog, renderer, request, view, decisions, now) -> (outputs, rejections)

Frequency caps: `decide` runs with `cap_count=0` and the job charges the cap afterwards with one
atomic increment-if-below per user × notification (see dataflows/_redis.py); a refused charge
turns every Send/Hold of that user into `Suppress("frequency_cap")`. So the cap counts only
notifications that are actually emitted, once per user whatever the number of channels, on the
user's local day of the earliest emitted instant (now, or the end of a quiet-hours hold).

Outputs per decision:
- Send → one Delivery per address on `herald.deliveries.{channel}.{class}` + a PLANNED event;
- Hold → the same Delivery with `not_before` on `herald.scheduled` + a SCHEDULED event whose
  reason is `quiet_hours` or `scheduled`;
- Suppress → a SUPPRESSED (or EXPIRED) event with the policy's machine-readable reason.
Every id is deterministic (`herald.ids`): a replayed request yields the same records.
A per-user template failure is a `Rejected` (the job dead-letters it); nothing else is emitted
for that channel.

Cross-channel fallback: a Delivery whose fallback steps name other channels carries their
content too (`fallback_content`, rendered here because only the request holds the params), so
dispatch can fall back without the request (herald.fallback). A step whose template fails is
left out (dispatch then skips it as `not_rendered`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime
from math import ceil
from typing import Any, NamedTuple

from herald import ids
from herald.caps import CapBucket, cap_key, ttl_seconds
from herald.catalog import Catalog
from herald.errors import TemplateError
from herald.planning import PlanRequest, UserView
from herald.planning_ids import PlanIds
from herald.policy import Address, Decision, Hold, Send, Suppress, decide
from herald.quiet_hours import local_day
from herald.render import BoundTemplate, Rendered, compiled
from herald.scheduling import local_send_at
from herald.states import State
from herald.topics import DELIVERY_EVENTS, SCHEDULED

__all__ = [
    "EVENTS_TOPIC",
    "SCHEDULED_TOPIC",
    "Output",
    "Prototypes",
    "Rejected",
    "Renderer",
    "Shape",
    "CapDays",
    "cap_charge",
    "deliveries_topic",
    "event_record",
    "plan_user",
    "refuse_capped",
    "user_records",
]

EVENTS_TOPIC = DELIVERY_EVENTS
SCHEDULED_TOPIC = SCHEDULED


def deliveries_topic(channel: str, traffic_class: str) -> str:
    """The logical topic of planned deliveries of a channel and class."""
    return f"herald.deliveries.{channel}.{traffic_class}"


class Output(NamedTuple):
    """A record for logical `topic` with Kafka key `key` (a delivery_id).

    `shape`, when set, identifies every field of `value` except the per-record ids (delivery_id,
    user_id, address; event_id): records with the same shape differ only in those, which lets the
    encoder encode the rest once (dataflows/_avro_splice.py). None = no such promise.
    """

    topic: str
    key: str
    value: dict[str, Any]
    shape: Shape | None = None


class Shape:
    """`Output.shape` of the records made from one prototype (`Prototypes`). Equal only to
    itself, so the encoder finds a shape's encoded fields without hashing its content again."""

    __slots__ = ()


class Prototypes:
    """The records of one request planned at one instant, one prototype per shape.

    Records without per-user params differ only in their ids within a shape, so the first record
    of a shape is built in full and kept; the others are copies of it with their ids set. The
    keys (`records`: key -> (prototype, shape)) are what makes a shape beyond the request and
    the instant; a `Renderer` keeps the prototypes of the requests planned at the same instant
    (`Renderer.prototypes`).
    """

    __slots__ = ("request", "now", "records", "fallbacks")

    def __init__(self, request: PlanRequest, now: datetime) -> None:
        self.request, self.now = request, now
        self.records: dict[tuple[Any, ...], tuple[dict[str, Any], Shape]] = {}
        # (channel, fallback steps, requested locale) -> (FallbackContent records, their key)
        self.fallbacks: dict[tuple[Any, ...], tuple[list[dict[str, Any]], tuple[Any, ...]]] = {}

    def add(self, key: tuple[Any, ...], record: dict[str, Any]) -> Shape:
        """Keep `record` (built in full) as the prototype of shape `key`; its shape."""
        shape = Shape()
        self.records[key] = (record, shape)
        return shape


@dataclass(frozen=True, slots=True)
class Rejected:
    """A delivery that could not be built (template failure); `code` is the dead-letter reason."""

    user_id: str
    delivery_id: str
    code: str
    detail: str


def plan_user(
    catalog: Catalog, request: PlanRequest, view: UserView, now: datetime
) -> list[Decision]:
    """The policy's decisions for one user (a local send time becomes this user's send_at)."""
    policy = request.policy
    if request.send_local_time:
        tz = view.prefs.timezone or catalog.default_timezone
        policy = replace(
            policy, send_at=local_send_at(now, policy.send_at, request.send_local_time, tz)
        )
    return decide(catalog, policy, view.prefs, view.contacts, now, 0)


def cap_charge(
    catalog: Catalog,
    request: PlanRequest,
    view: UserView,
    decisions: list[Decision],
    now: datetime,
    days: CapDays | None = None,
) -> CapBucket | None:
    """The cap bucket this user's emitted decisions must be charged to; None = not capped.

    The TTL is counted from `now` (when the key is written) to the end of the charged day.
    `days` memoizes the calendar work per zone and instant (pass one per batch).
    """
    nt = catalog.get(request.notification_type)
    if nt.cap is None or nt.transactional:
        return None
    instants = [d.until if isinstance(d, Hold) else now for d in decisions if not _suppressed(d)]
    if not instants:
        return None
    at = min(instants)
    tz = view.prefs.timezone or catalog.default_timezone
    day, ttl = (days or CapDays(now)).day(tz, at)
    key = cap_key(view.user_id, nt.cap.bucket, day)
    return CapBucket(key, nt.cap.bucket, nt.cap.daily_limit, day, ttl)


class CapDays:
    """(user-local day, key TTL from `now`) per (zone, instant): the calendar part of a cap
    bucket (`herald.caps.cap_bucket`), computed once per zone and instant instead of per user."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self._memo: dict[tuple[str, datetime], tuple[date, int]] = {}

    def day(self, tz: str, at: datetime) -> tuple[date, int]:
        """The local day of `at` in `tz` and the TTL of its counter written at `now`."""
        found = self._memo.get((tz, at))
        if found is None:
            ttl = ttl_seconds(at, tz) + ceil((at - self.now).total_seconds())
            found = self._memo[(tz, at)] = (local_day(at, tz), ttl)
        return found


def _suppressed(decision: Decision) -> bool:
    return isinstance(decision, Suppress)


def refuse_capped(decisions: list[Decision]) -> list[Decision]:
    """The decisions after a refused cap charge: nothing is emitted, reason frequency_cap."""
    return [
        d if isinstance(d, Suppress) else Suppress(d.channel, "frequency_cap") for d in decisions
    ]


class Renderer:
    """Renders deliveries; a request's shared params are bound once per channel × locale.

    Campaigns render once per locale and fill per-user params (`herald.render.BoundTemplate`);
    a user without per-user params gets the very same `Rendered` as every other such user (a
    field with an optional per-user param, e.g. `{% if first_name is defined %}`, renders the
    same for all of them). Both are kept for the `max_entries` most recent
    (request, channel, locale).
    """

    def __init__(self, catalog: Catalog, max_entries: int = 1024) -> None:
        self.catalog = catalog
        self.max_entries = max_entries
        self.ids = PlanIds()  # the ids of the records rendered here (herald.planning_ids)
        self._bound: OrderedDict[tuple[str, str, str], tuple[BoundTemplate, Rendered | None]] = (
            OrderedDict()
        )
        self._now: datetime | None = None
        self._prototypes: dict[str, Prototypes] = {}

    def prototypes(self, request: PlanRequest, now: datetime) -> Prototypes:
        """The prototypes of `request` planned at `now`, kept for the requests planned at the
        same instant (the plan job's batch: the shards of a request come in several items)."""
        if now != self._now:
            self._now = now
            self._prototypes.clear()
        found = self._prototypes.get(request.notification_id)
        if found is None or found.request is not request:
            found = self._prototypes[request.notification_id] = Prototypes(request, now)
        return found

    def render(
        self, request: PlanRequest, channel: str, locale: str, user_params: Mapping[str, str] | None
    ) -> Rendered:
        """Render; raises `TemplateError` (code `missing_param:<name>`, `render_failed`...)."""
        key = (request.notification_id, channel, locale)
        entry = self._bound.get(key)
        if entry is None:
            template = compiled(
                self.catalog, request.notification_type, channel, locale, request.template_version
            )
            entry = (template.bind(request.params), None)
            self._remember(key, entry)
        bound, shared = entry
        if user_params:
            extra = {k: v for k, v in user_params.items() if k not in request.params}
            if extra:
                return bound.render(extra)
        if shared is None:
            shared = bound.render()
            self._remember(key, (bound, shared))
        return shared

    def _remember(
        self, key: tuple[str, str, str], entry: tuple[BoundTemplate, Rendered | None]
    ) -> None:
        self._bound[key] = entry
        if len(self._bound) > self.max_entries:
            self._bound.popitem(last=False)


def _trace(request: PlanRequest) -> str | None:
    """The request's traceparent; None for a request restored from a plan job snapshot taken
    before requests had one (a pending segment expansion, dataflows/plan/request_source.py)."""
    return getattr(request, "traceparent", None)


def event_record(
    request: PlanRequest,
    user_id: str,
    channel: str,
    delivery_id: str,
    state: State,
    reason: str | None,
    now: datetime,
    attributes: Mapping[str, str] | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """A `delivery_event` record; its event_id is deterministic (delivery, state, attempt 0),
    passed in when the caller made it already."""
    return {
        "event_id": event_id or ids.event_id(delivery_id, state.value, 0),
        "delivery_id": delivery_id,
        "notification_id": request.notification_id,
        "user_id": user_id,
        "tenant_id": request.tenant_id,
        "notification_type": request.notification_type,
        "channel": channel,
        "traffic_class": request.traffic_class,
        "state": state.value,
        "reason": reason,
        "provider": None,
        "provider_msg_id": None,
        "attempt": 0,
        "latency_ms": None,
        "occurred_at": now,
        "recorded_at": now,
        "attributes": dict(attributes) if attributes else {},
        "traceparent": _trace(request),
    }


def _event(
    protos: Prototypes,
    user_id: str,
    channel: str,
    delivery_id: str,
    event_id: str,
    state: State,
    reason: str | None,
    attributes: Mapping[str, str] | None,
    held_until: datetime | None = None,
    fallback_from: str | None = None,
) -> Output:
    """A planning event; its shape is the request, the instant and the rest of the key."""
    key = ("event", channel, state, reason, held_until, fallback_from)
    found = protos.records.get(key)
    if found is None:
        event = event_record(protos.request, user_id, channel, delivery_id, state, reason,
                             protos.now, attributes, event_id)  # fmt: skip
        return Output(EVENTS_TOPIC, delivery_id, event, protos.add(key, event))
    event = found[0].copy()
    event["event_id"], event["delivery_id"], event["user_id"] = event_id, delivery_id, user_id
    return Output(EVENTS_TOPIC, delivery_id, event, found[1])


def _delivery_id(
    made: PlanIds, request: PlanRequest, user_id: str, channel: str, address: Address
) -> str:
    device = address.device_id if channel == "push" else None
    return made.delivery(request.notification_id, user_id, channel, device)


def _delivery(
    request: PlanRequest,
    user_id: str,
    send: Send,
    address: Address,
    delivery_id: str,
    rendered: Rendered,
    now: datetime,
    fallback_content: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "delivery_id": delivery_id,
        "notification_id": request.notification_id,
        "request_id": request.request_id,
        "tenant_id": request.tenant_id,
        "user_id": user_id,
        "notification_type": request.notification_type,
        "category": request.category,
        "traffic_class": request.traffic_class,
        "channel": send.channel,
        "provider": address.provider or send.provider,
        "address": address.value,
        "platform": address.platform,
        "rendered": rendered.as_record(),
        "locale": rendered.locale,
        "template_version": rendered.version,
        "collapse_key": request.notification_id if send.channel == "push" else None,
        "attempt": 0,
        "not_before": send.not_before,
        "next_attempt_at": None,
        "expire_at": send.expire_at,
        "first_attempt_at": None,
        "fallback": list(send.fallback),
        "created_at": now,
        "fallback_content": fallback_content,
        "traceparent": _trace(request),
    }


def _emitted(
    made: PlanIds,
    protos: Prototypes,
    view: UserView,
    decision: Send | Hold,
    rendered: Rendered,
    personal: bool,
    fallback: tuple[list[dict[str, Any]], tuple[Any, ...]],
) -> list[Output]:
    """A Delivery and its event per address. Without per-user content (`personal` False) the
    Delivery's shape is the request, the instant, the topic and everything here but the ids:
    content locale and version, provider, platform, timing, fallback steps and their content."""
    request, now = protos.request, protos.now
    send = decision if isinstance(decision, Send) else decision.planned
    held_until = None
    if isinstance(decision, Hold):
        topic, state, reason = SCHEDULED_TOPIC, State.SCHEDULED, decision.reason
        held_until = decision.until
        attributes = {"not_before": decision.until.isoformat()}
    else:
        topic, state, reason = (
            deliveries_topic(send.channel, request.traffic_class),
            State.PLANNED,
            None,
        )
        attributes = {}
    if send.fallback_from:
        attributes["fallback_from"] = send.fallback_from
    content, content_key = fallback
    user_id = view.user_id
    out: list[Output] = []
    for address in send.addresses:
        did = _delivery_id(made, request, user_id, send.channel, address)
        key = None if personal else (
            topic, send.channel, rendered.locale, rendered.version,
            address.provider or send.provider, address.platform, send.not_before,
            send.expire_at, send.fallback, content_key,
        )  # fmt: skip
        found = None if key is None else protos.records.get(key)
        if found is None:
            delivery = _delivery(request, user_id, send, address, did, rendered, now, content)
            shape = None if key is None else protos.add(key, delivery)
        else:
            delivery, shape = found[0].copy(), found[1]
            delivery["delivery_id"], delivery["user_id"] = did, user_id
            delivery["address"] = address.value
        out.append(Output(topic, did, delivery, shape))
        event_id = made.event(did, state.value)
        out.append(_event(protos, user_id, send.channel, did, event_id, state, reason,
                          attributes, held_until, send.fallback_from))  # fmt: skip
    return out


def user_records(
    renderer: Renderer,
    request: PlanRequest,
    view: UserView,
    decisions: list[Decision],
    now: datetime,
) -> tuple[list[Output], list[Rejected]]:
    """Records for one user's decisions (see the module docstring)."""
    out: list[Output] = []
    rejected: list[Rejected] = []
    made = renderer.ids
    protos = renderer.prototypes(request, now)
    personal = view.params is not None and not request.params.keys() >= view.params.keys()
    for decision in decisions:
        if isinstance(decision, Suppress):
            did = made.delivery(request.notification_id, view.user_id, decision.channel)
            state = decision.state
            event_id = made.event(did, state.value)
            out.append(_event(protos, view.user_id, decision.channel, did, event_id, state,
                              decision.reason, None))  # fmt: skip
            continue
        send = decision if isinstance(decision, Send) else decision.planned
        try:
            rendered = renderer.render(request, send.channel, send.locale, view.params)
        except TemplateError as exc:
            did = ids.delivery_id(request.notification_id, view.user_id, send.channel)
            rejected.append(Rejected(view.user_id, did, exc.code, exc.detail))
            continue
        fallback = _fallback_content(renderer, protos, view, send, personal)
        out.extend(_emitted(made, protos, view, decision, rendered, personal, fallback))
    return out, rejected


_NO_FALLBACK: tuple[list[dict[str, Any]], tuple[Any, ...]] = ([], ())


def _fallback_content(
    renderer: Renderer, protos: Prototypes, view: UserView, send: Send, personal: bool
) -> tuple[list[dict[str, Any]], tuple[Any, ...]]:
    """The `FallbackContent` records of the other channels `send.fallback` names, and their
    (channel, locale, version) as a key; made once per request for users without their own
    params."""
    if not send.fallback:
        return _NO_FALLBACK
    request = protos.request
    requested = request.policy.locale or view.prefs.locale
    key = (send.channel, send.fallback, requested)
    found = None if personal else protos.fallbacks.get(key)
    if found is None:
        found = _render_fallbacks(renderer, request, view, send, requested)
        if not personal:
            protos.fallbacks[key] = found
    return found


def _render_fallbacks(
    renderer: Renderer, request: PlanRequest, view: UserView, send: Send, requested: str | None
) -> tuple[list[dict[str, Any]], tuple[Any, ...]]:
    steps = dict.fromkeys(step.partition(":")[0] for step in send.fallback)
    channels = [c for c in steps if c != send.channel]
    if not channels:
        return _NO_FALLBACK
    catalog = renderer.catalog
    nt = catalog.get(request.notification_type)
    out: list[dict[str, Any]] = []
    for channel in channels:
        try:
            locale = catalog.resolve_locale(nt, channel, requested, request.template_version)
            r = renderer.render(request, channel, locale, view.params)
        except TemplateError:
            continue
        out.append({"channel": channel, "locale": r.locale, "template_version": r.version,
                    "rendered": r.as_record()})  # fmt: skip
    return out, tuple((c["channel"], c["locale"], c["template_version"]) for c in out)
