"""Users planned alike: a class of users' records made from one user's by substitution.

For the plan job, most users of a campaign differ only in their ids and addresses. The policy
reads their preferences and which contact points they have (`Preferences.policy_key`,
`ContactPoints.policy_key`); the renderer reads the request and the locale. So two users of one
request with equal keys, planned at the same instant, get records that differ only in
delivery_id, event_id, user_id and address (the shapes of herald.plan_records.Prototypes). The
planner (dataflows/_planner.py) plans users in full until a class has a second user, derives a
`Template` from that user's records, and makes every further user's records from it, encoded:

    classes = Classes(encoder, ids)             one per planned batch (one instant)
    template = classes.get(request, view)       Template, or None: plan this user in full
    classes.learn(request, view, bucket, records)  after planning a user in full
    template.records(view)                      the user's KafkaRecords
    template.bucket(view)                       the user's frequency-cap bucket, or None

A class seen once costs a lookup: users that share nothing with others are not slowed down by
derivations that would never pay off.

Per record of the user it was derived from, a template holds the encoded constant fields of its
shape (dataflows/_encode.py `Splice`), its channel, which of the user's endpoints it is for (the
index among the channel's endpoints: push has one per valid device, the other channels one), or
for an event the delivery it follows or the channel's device-less id (a suppressed channel), and
its event state. A derivation that cannot map a record exactly gives up, and that class stays
on the full path: users with their own params, dead letters, records without a shape, ids that
do not come from exactly one endpoint. tests/dataflows/test_classes.py holds the records to be
byte for byte those of the full path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from dataflows._encode import Encoder
from herald.caps import CapBucket, cap_key
from herald.plan_records import EVENTS_TOPIC, Output
from herald.planning import PlanRequest, UserView
from herald.planning_ids import PlanIds
from herald.policy import ContactPoints
from schemas.avro_writer import Writer
from sinks.kafka import KafkaRecord

__all__ = ["Classes", "Template", "endpoints"]

DELIVERY_VARYING = ("delivery_id", "user_id", "address")
EVENT_VARYING = ("event_id", "delivery_id", "user_id")
_PREVIOUS = -1  # an event's delivery id: the record before it (its Delivery)
_DEVICELESS = -2  # an event's delivery id: the channel's id without a device (suppressed)


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


class _Slot(NamedTuple):
    topic: str  # physical
    segments: tuple[bytes, ...]
    writers: tuple[Writer, ...]
    channel: str
    source: int  # delivery: endpoint index; event: _PREVIOUS, _DEVICELESS or an endpoint index
    state: str | None  # an event's state; None = a Delivery


class Template:
    """The records and cap bucket of every user of one class (see the module docstring)."""

    __slots__ = ("notification_id", "slots", "events", "_bucket", "_ids")

    def __init__(
        self,
        notification_id: str,
        slots: tuple[_Slot, ...],
        events: Counter[tuple[str, str | None]],
        bucket: CapBucket | None,
        ids: PlanIds,
    ) -> None:
        self.notification_id = notification_id
        self.slots = slots
        self.events = events  # (state, reason) -> events a user of the class gets
        self._bucket = bucket
        self._ids = ids

    def bucket(self, view: UserView) -> CapBucket | None:
        """The frequency-cap bucket `view`'s records are charged to; None = not capped."""
        b = self._bucket
        if b is None:
            return None
        key = cap_key(view.user_id, b.bucket, b.local_date)
        return CapBucket(key, b.bucket, b.daily_limit, b.local_date, b.ttl_seconds)

    def records(self, view: UserView) -> list[KafkaRecord]:
        """`view`'s records, encoded: those the full path gives this user."""
        nid, uid, contacts, made = self.notification_id, view.user_id, view.contacts, self._ids
        out: list[KafkaRecord] = []
        did = ""
        for topic, (s0, s1, s2, s3), (w0, w1, w2), channel, source, state in self.slots:
            if state is None:
                value, device = endpoints(contacts, channel)[source]
                did = made.delivery(nid, uid, channel, device)
                data = b"".join((s0, w0(did), s1, w1(uid), s2, w2(value), s3))
            else:
                if source == _DEVICELESS:
                    did = made.delivery(nid, uid, channel)
                elif source != _PREVIOUS:
                    did = made.delivery(nid, uid, channel, endpoints(contacts, channel)[source][1])
                data = b"".join((s0, w0(made.event(did, state)), s1, w1(did), s2, w2(uid), s3))
            out.append(KafkaRecord(topic, did, data))
        return out


_SEEN: Any = object()  # a class with one user so far


class Classes:
    """The templates of one planned batch, by request and class (see the module docstring)."""

    def __init__(self, encoder: Encoder, ids: PlanIds) -> None:
        self.encoder = encoder
        self.ids = ids
        self._found: dict[tuple[int, tuple[Any, ...], tuple[Any, ...]], Any] = {}

    @staticmethod
    def _key(request: PlanRequest, view: UserView) -> tuple[int, tuple[Any, ...], tuple[Any, ...]]:
        # id(request): the batch holds every request, so no id is reused while this lives
        return (id(request), view.prefs.policy_key, view.contacts.policy_key)

    def get(self, request: PlanRequest, view: UserView) -> Template | None:
        """The template of `view`'s class; None when the user must be planned in full."""
        if view.params is not None:
            return None
        found = self._found.get(self._key(request, view))
        return found if type(found) is Template else None

    def learn(
        self,
        request: PlanRequest,
        view: UserView,
        bucket: CapBucket | None,
        records: Callable[[], list[Any]],
    ) -> list[Any] | None:
        """After `view` was planned in full (cap `bucket`): the second user of a class gives
        it a template from its records (made here with `records()` and returned), or marks it
        as planned in full for good. None when `records` was not called."""
        if view.params is not None:
            return None
        key = self._key(request, view)
        found = self._found.get(key)
        if found is None:
            self._found[key] = _SEEN
        elif found is _SEEN:
            outputs = records()
            self._found[key] = _derive(self.encoder, self.ids, request, view, outputs, bucket)
            return outputs
        return None


def _derive(
    encoder: Encoder,
    made: PlanIds,
    request: PlanRequest,
    view: UserView,
    outputs: list[Any],
    bucket: CapBucket | None,
) -> Template | None:
    """The template of `view`'s records, or None if one of them does not map exactly."""
    nid, uid = request.notification_id, view.user_id
    if bucket is not None and bucket.key != cap_key(uid, bucket.bucket, bucket.local_date):
        return None
    slots: list[_Slot] = []
    events: Counter[tuple[str, str | None]] = Counter()
    previous: str | None = None
    for item in outputs:
        if type(item) is not Output or item.value.get("user_id") != uid:
            return None
        splice = encoder.splice_parts(item)
        if splice is None:
            return None
        value = item.value
        channel = value["channel"]
        ends = endpoints(view.contacts, channel)
        ids = {made.delivery(nid, uid, channel, device): i for i, (_v, device) in enumerate(ends)}
        if len(ids) != len(ends):
            return None  # two endpoints with one id
        state: str | None = None
        if item.topic == EVENTS_TOPIC:
            if splice.varying != EVENT_VARYING:
                return None
            state = value["state"]
            if value["delivery_id"] != item.key or value["event_id"] != made.event(item.key, state):
                return None
            if item.key == previous:
                source = _PREVIOUS
            elif item.key == made.delivery(nid, uid, channel):
                source = _DEVICELESS
            elif item.key in ids:
                source = ids[item.key]
            else:
                return None
            events[(state, value["reason"])] += 1
        else:
            found = ids.get(item.key)
            if splice.varying != DELIVERY_VARYING or found is None:
                return None
            if value["delivery_id"] != item.key or value["address"] != ends[found][0]:
                return None
            source = found
        if len(splice.segments) != 4:
            return None
        slots.append(_Slot(splice.topic, splice.segments, splice.writers, channel, source, state))
        previous = item.key
    return Template(nid, tuple(slots), events, bucket, made)
