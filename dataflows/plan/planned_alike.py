"""Users planned alike: a class of users' records made from one user's by substitution.

For the plan job, most users of a campaign differ only in their ids and addresses. The policy
reads their preferences and which contact points they have (`Preferences.policy_key`,
`ContactPoints.policy_key`); the renderer reads the request and the locale. So two users of one
request with equal keys, planned at the same instant, get records that differ only in
delivery_id, event_id, user_id and address (the shapes of herald.plan_records.Prototypes). The
planner (dataflows/plan/planner.py) counts the users of each class in a batch, plans the first user
of a class of `MIN_CLASS_USERS` or more in full, derives a `Template` from its records, and
makes the other users' records from it, encoded:

    classes = Classes(encoder, ids, batch)      one per planned batch (one instant)
    template = classes.get(request, view)       Template, or None: plan this user in full
    classes.learn(request, view, bucket, records)  after planning a user in full
    template.records(views)                     the users' KafkaRecords
    template.charges(views)                     the users' frequency-cap charges, or None

Users of smaller classes are planned in full and cost one more lookup each: a derivation costs
about as much as planning one more user, so an audience whose users share little is not slowed
down by derivations that would not pay off.

Per record of the user it was derived from, a template holds the encoded constant fields of its
shape (dataflows/_encode.py `Splice`), its channel, which of the user's endpoints it is for (the
index among the channel's endpoints: push has one per valid device, the other channels one), or
for an event the delivery it follows or the channel's device-less id (a suppressed channel), and
its event state. A derivation that cannot map a record exactly gives up, and that class stays
on the full path: users with their own params, dead letters, records without a shape, ids that
do not come from exactly one endpoint. tests/dataflows/test_planned_alike.py holds the records to be
byte for byte those of the full path.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

from dataflows._encode import SPLICED, Encoder
from dataflows._redis import CapCharge
from herald.caps import CapBucket, user_tag
from herald.plan_records import EVENTS_TOPIC, Output
from herald.planning import Planned, PlanRequest, UserView
from herald.planning_ids import (
    PlanIds,
    delivery_id_of,
    delivery_prefix,
    event_id_of,
    event_tail,
    part,
)
from herald.policy import ContactPoints
from schemas.avro_writer import Writer
from sinks.kafka import KafkaRecord

__all__ = ["Classes", "Template", "endpoints"]

# The fields a record of a shape varies in, in schema order (dataflows/_encode.py)
DELIVERY_VARYING, EVENT_VARYING = SPLICED["delivery"], SPLICED["delivery_event"]
log = logging.getLogger(__name__)


def endpoints(contacts: ContactPoints, channel: str) -> list[tuple[str, str | None]]:
    """(address value, device id) of each endpoint of `channel`, in the order `decide` gives
    them as addresses (herald.policy._usable): push has one per valid device."""
    if channel == "push":
        return [(d.token, d.device_id) for d in contacts.devices if d.valid]
    if channel == "sms":
        return [(contacts.phone, None)] if contacts.phone else []
    if channel == "email":
        return [(contacts.email, None)] if contacts.email else []
    return [(contacts.user_id, None)]  # inapp


Endpoint = Callable[[ContactPoints], tuple[str, str | None]]


def _endpoint(channel: str, index: int) -> Endpoint:
    """`endpoints(contacts, channel)[index]`, as a function of the contacts."""
    if channel == "push":

        def device(contacts: ContactPoints) -> tuple[str, str | None]:
            d = [d for d in contacts.devices if d.valid][index]
            return d.token, d.device_id

        return device
    if channel == "sms":
        return lambda contacts: (cast(str, contacts.phone), None)
    if channel == "email":
        return lambda contacts: (cast(str, contacts.email), None)
    return lambda contacts: (contacts.user_id, None)


# Slot kinds. A slot: (kind, physical topic, s0, s1, s2, s3, x, channel part, address writer);
# x is the endpoint (a Delivery) or the event's `event_tail` (an event).
_DELIVERY, _EVENT, _OWN_EVENT = "delivery", "event", "own_event"
# _EVENT follows its Delivery (same delivery id); _OWN_EVENT has the channel's device-less id
# (a suppressed channel).
_Slot = tuple[str, str, bytes, bytes, bytes, bytes, Any, str, Writer | None]


class Template:
    """The records and cap charge of every user of one class (see the module docstring).

    A Delivery is `s0 + delivery_id + s1 + user_id + s2 + address + s3`, an event
    `s0 + event_id + s1 + delivery_id + s2 + user_id + s3` (each field Avro-encoded; the ids
    always have 36 characters, so their length prefixes are constant and end s0 and s1)."""

    __slots__ = ("slots", "events", "_charge", "_prefix", "_user")

    def __init__(
        self,
        notification_id: str,
        slots: tuple[_Slot, ...],
        events: Counter[tuple[str, str | None]],
        bucket: CapBucket | None,
        user: Writer,
    ) -> None:
        self.slots = slots
        self.events = events  # (state, reason) -> events a user of the class gets
        # the counter's and the marker's keys after the user's hash tag, limit, TTL (the
        # formats of herald.caps.cap_key and dataflows._redis.marker_key: _derive checks them)
        self._charge = None if bucket is None else (
            f":{bucket.bucket}:{bucket.local_date.isoformat()}",
            f":{bucket.bucket}:{bucket.local_date}:{notification_id}",
            bucket.daily_limit, bucket.ttl_seconds,
        )  # fmt: skip
        self._prefix = delivery_prefix(notification_id)
        self._user = user  # the user_id writer

    def charges(self, views: Sequence[UserView]) -> list[CapCharge] | None:
        """The frequency-cap charges of the users' records, in order; None = not capped."""
        if self._charge is None:
            return None
        key, marker, limit, ttl = self._charge
        new = tuple.__new__
        out: list[CapCharge] = []
        for view in views:
            tag = user_tag(view.user_id)
            out.append(new(CapCharge, ("cap:" + tag + key, "capm:" + tag + marker, limit, ttl)))
        return out

    def records(self, views: Sequence[UserView]) -> list[KafkaRecord]:
        """The users' records, encoded: those the full path gives them, user by user."""
        prefix, slots, write_user = self._prefix, self.slots, self._user
        join, new = b"".join, tuple.__new__
        out: list[KafkaRecord] = []
        append = out.append
        for view in views:
            uid, contacts = view.user_id, view.contacts
            user = f"{len(uid)}:{uid}"  # the user's part of the delivery ids
            u = write_user(uid)
            did, d = "", b""
            for kind, topic, s0, s1, s2, s3, x, channel, address in slots:
                if kind is _DELIVERY:
                    value, device = x(contacts)
                    if device is not None:  # push: the device's part
                        did = delivery_id_of(prefix, f"{user}{channel}{len(device)}:{device}")
                    else:
                        did = delivery_id_of(prefix, user + channel)
                    d = did.encode()
                    data = join((s0, d, s1, u, s2, address(value), s3))  # type: ignore[misc]
                else:
                    if kind is _OWN_EVENT:
                        did = delivery_id_of(prefix, user + channel)
                        d = did.encode()
                    data = join((s0, event_id_of(d, x).encode(), s1, d, s2, u, s3))
                append(new(KafkaRecord, (topic, did, data, None)))  # every field: no headers
        return out


# A template is derived for a class with at least this many users in the batch: a derivation
# costs about as much as planning one more user in full, and saves ~2/3 of every later user's.
MIN_CLASS_USERS = 3


class Classes:
    """The templates of one planned batch, by request and class (see the module docstring)."""

    def __init__(self, encoder: Encoder, ids: PlanIds, batch: Sequence[Planned] = ()) -> None:
        self.encoder = encoder
        self.ids = ids
        self._found: dict[tuple[int, int, int], Template | None] = {}
        key = self._key
        self._sizes = Counter(
            key(planned.request, view)
            for planned in batch
            for view in planned.users
            if view.params is None
        )  # users of each class in the batch

    @staticmethod
    def _key(request: PlanRequest, view: UserView) -> tuple[int, int, int]:
        # By identity: the batch holds every request and view, so no id is reused while this
        # lives, and equal policy keys are one object (herald.policy.interned). Keys equal but
        # not interned (past MAX_INTERNED) only make separate classes.
        return (id(request), id(view.prefs.policy_key), id(view.contacts.policy_key))

    def get(self, request: PlanRequest, view: UserView) -> Template | None:
        """The template of `view`'s class; None when the user must be planned in full."""
        if view.params is not None:
            return None
        return self._found.get(self._key(request, view))

    def learn(
        self,
        request: PlanRequest,
        view: UserView,
        bucket: CapBucket | None,
        records: Callable[[], list[Any]],
    ) -> list[Any] | None:
        """After `view` was planned in full (cap `bucket`): the first user of a class with
        `MIN_CLASS_USERS` users in the batch gives it a template from its records (made here
        with `records()` and returned), or marks it as planned in full for good. None when
        `records` was not called."""
        if view.params is not None:
            return None
        key = self._key(request, view)
        if key in self._found or self._sizes[key] < MIN_CLASS_USERS:
            return None
        outputs = records()
        self._found[key] = _derive(self.encoder, self.ids, request, view, outputs, bucket)
        return outputs


def _derive(
    encoder: Encoder,
    made: PlanIds,
    request: PlanRequest,
    view: UserView,
    outputs: list[Any],
    bucket: CapBucket | None,
) -> Template | None:
    """The template of `view`'s records, or None if one of them does not map exactly. A
    template is kept only if it gives `view` the very records and cap charge the full path
    gave it."""
    nid, uid = request.notification_id, view.user_id
    slots: list[_Slot] = []
    events: Counter[tuple[str, str | None]] = Counter()
    user: Writer | None = None
    previous: str | None = None
    for item in outputs:
        if type(item) is not Output or item.value.get("user_id") != uid:
            return None
        splice = encoder.splice_parts(item)
        if splice is None or len(splice.segments) != 4:
            return None
        value, (s0, s1, s2, s3) = item.value, splice.segments
        channel = value["channel"]
        if item.topic == EVENTS_TOPIC:
            if splice.varying != EVENT_VARYING:
                return None
            (eid, did, user), state = splice.writers, value["state"]
            if item.key == previous:
                kind = _EVENT
            elif item.key == made.delivery(nid, uid, channel):
                kind = _OWN_EVENT
            else:
                return None
            lengths = _id_prefix(eid), _id_prefix(did)
            if lengths[0] is None or lengths[1] is None:
                return None
            slots.append((kind, splice.topic, s0 + lengths[0], s1 + lengths[1], s2, s3,
                          event_tail(state), part(channel), None))  # fmt: skip
            events[(state, value["reason"])] += 1
        else:
            if splice.varying != DELIVERY_VARYING:
                return None
            did, user, address = splice.writers
            ends = endpoints(view.contacts, channel)
            index = [i for i, (_v, dev) in enumerate(ends) if made.delivery(nid, uid, channel, dev)
                     == item.key]  # fmt: skip
            length = _id_prefix(did)
            if len(index) != 1 or length is None:
                return None
            slots.append((_DELIVERY, splice.topic, s0 + length, s1, s2, s3,
                          _endpoint(channel, index[0]), part(channel), address))  # fmt: skip
        previous = item.key
    template = Template(nid, tuple(slots), events, bucket, user or _no_user)
    charge = None if bucket is None else [CapCharge.of(bucket, uid, nid)]
    if template.records([view]) != encoder(outputs) or template.charges([view]) != charge:
        log.error("plan.template_mismatch notification_id=%s", nid)
        return None
    return template


def _id_prefix(writer: Writer) -> bytes | None:
    """What `writer` puts before the characters of a 36-character id (its length, and its
    union branch if any), or None if that is not the same for every such id."""
    a, b = writer("0" * 36), writer("f" * 36)
    prefix = a[:-36]
    return prefix if a == prefix + b"0" * 36 and b == prefix + b"f" * 36 else None


def _no_user(_user_id: str) -> bytes:
    return b""  # a template without records (a user with nothing to send) writes no user_id
