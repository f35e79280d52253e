"""dataflows._user_copies against the real Redis: the plan job's users come with their copies'
state."""

from __future__ import annotations

import threading
import uuid

import orjson
import pytest
import redis

from dataflows._user_copies import BadCopy, CopyCache, UserState, _ContactsShapes, _PrefsShapes
from herald import keys
from herald.planning import AudienceBatch
from herald.policy import ContactPoints, Preferences
from tests.conftest import RunningStack
from tests.dataflows.test_redis import plan_request

pytestmark = pytest.mark.integration


def contacts_copy(user: str, version: int, email: str) -> bytes:
    """The layout the API writes (api/routes/devices.py: contact_points record, ms times)."""
    return orjson.dumps(
        {"user_id": user, "devices": [], "phone": None, "updated_at": 0, "version": version,
         "email": {"address": email, "verified": True}}
    )  # fmt: skip


def test_users_get_their_copies_state_defaults_without_one_and_bad_copies_are_reported(
    stack: RunningStack,
) -> None:
    client = redis.Redis.from_url(stack.settings.redis.url)
    run = uuid.uuid4().hex[:8]
    prefix = f"copies-{run}"
    client.set(keys.users_restored(prefix), "1")
    fresh, bad, plain, zone = (f"{run}-{n}" for n in range(4))
    client.set(keys.contact_points(fresh), contacts_copy(fresh, 7, "new@x"))
    client.set(keys.contact_points(bad), b"{not json")
    prefs = {"user_id": fresh, "locale": "de", "version": 4, "timezone": "Europe/Zurich"}
    client.set(keys.prefs(fresh), orjson.dumps(prefs))
    client.set(keys.prefs(zone), orjson.dumps({"user_id": zone, "timezone": "Mars/Base"}))
    request = plan_request(f"n-{run}", "t:0:1")
    batches = [
        AudienceBatch(request, 0, ((fresh, None), (bad, None)), False),
        AudienceBatch(request, 1, ((plain, {"first_name": "P"}), (zone, None)), True),
    ]

    planned, bad_copies = UserState(client, prefix, cache_users=10).views(batches)

    assert [(p.request, p.batch_no) for p in planned] == [(request, 0), (request, 1)]
    views = {v.user_id: v for p in planned for v in p.users}
    assert views[fresh].contacts == ContactPoints(fresh, email="new@x", email_verified=True,
                                                  version=7)  # fmt: skip
    expected = Preferences("", timezone="Europe/Zurich", locale="de")  # the shared choices
    assert views[fresh].prefs == expected
    assert views[fresh].prefs.policy_key is expected.policy_key  # interned: one class
    assert views[plain].prefs == Preferences("")
    assert views[plain].contacts == ContactPoints(plain)
    assert views[plain].params == {"first_name": "P"}
    assert set(views) == {fresh, plain}  # the bad ones left out, and reported
    assert [(b.request, b.user_id) for b in bad_copies] == [(request, bad), (request, zone)]
    assert all(isinstance(b, BadCopy) and b.detail for b in bad_copies)


def test_planning_waits_while_the_copies_are_being_restored(stack: RunningStack) -> None:
    """Without `users:{prefix}:restored` a missing copy may be a user not restored yet: the
    chunk waits, and is read once the marker is set."""
    client = redis.Redis.from_url(stack.settings.redis.url)
    run = uuid.uuid4().hex[:8]
    prefix = f"restoring-{run}"
    user = f"{run}-u"
    request = plan_request(f"n-{run}", "t:0:1")
    state = UserState(client, prefix, cache_users=10, wait_s=0.02)
    result: list[object] = []
    batches = [AudienceBatch(request, 0, ((user, None),), True)]
    reader = threading.Thread(target=lambda: result.append(state.views(batches)))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and not result  # still waiting: nothing planned with defaults
    client.set(keys.contact_points(user), contacts_copy(user, 3, "restored@x"))
    client.set(keys.users_restored(prefix), "1")
    reader.join(10)
    [(planned, bad)] = result  # type: ignore[misc]
    assert planned[0].users[0].contacts.email == "restored@x" and bad == []


def test_copy_cache_keeps_two_generations() -> None:
    parsed: list[bytes] = []

    def parse(raw: bytes) -> ContactPoints:
        parsed.append(raw)
        return ContactPoints(raw.decode())

    cache = CopyCache(parse, size=2)
    for raw in (b"a", b"b", b"a", b"c", b"a", b"d", b"e"):
        assert cache.get(raw).user_id == raw.decode()
    # b"a" is found again (moved up from the older generation); b"b" was dropped with it
    assert parsed == [b"a", b"b", b"c", b"d", b"e"]
    assert len(cache.newer) + len(cache.older) <= 4
    cache.get(b"b")
    assert parsed[-1] == b"b"


CONTACTS = [
    {"user_id": "a", "devices": [{"device_id": "d1", "platform": "fcm", "token": "t1"}],
     "phone": {"e164": "+41790000001", "verified": True}, "email": None, "version": 3},
    {"user_id": "b", "devices": [{"device_id": "d2", "platform": "fcm", "token": "t2"}],
     "phone": {"e164": "+41790000002", "verified": True}, "email": None, "version": 4},
    {"user_id": "c", "devices": [], "phone": {"e164": "", "verified": False}, "version": 1},
    {"user_id": "d", "devices": [], "phone": {"e164": "+41790000004", "verified": False}},
    {"user_id": "e", "devices": [{"device_id": "d5", "platform": "apns", "token": "t5",
                                  "app_id": "x", "valid": False}],
     "email": {"address": "e@x", "verified": True}, "disabled": ["email"], "version": 9},
]  # fmt: skip
PREFS = [
    {"user_id": "a", "category_opt_out": ["marketing"], "timezone": "Asia/Tokyo", "version": 2},
    {"user_id": "b", "category_opt_out": ["marketing"], "timezone": "Asia/Tokyo", "version": 5},
    {"user_id": "c", "quiet_hours": {"start": "22:00", "end": "07:00"}, "locale": "pt_br"},
]


def test_copies_parsed_by_shape_equal_the_records_parsed_in_full() -> None:
    """Users of one shape share a validation; each still gets their own ids, addresses and
    version, and the same policy key object as a full parse. Users with the same choices share
    one Preferences (nobody's: user_id "", version 0)."""
    contacts, prefs = _ContactsShapes(), _PrefsShapes()
    for rec in CONTACTS:
        made, full = contacts(orjson.dumps(rec)), ContactPoints.from_record(rec)
        assert made == full and made.devices == full.devices, rec
        assert made.policy_key is full.policy_key
        assert [d.address for d in made.devices] == [d.address for d in full.devices]
    for rec in PREFS:
        made_p, full_p = prefs(orjson.dumps(rec)), Preferences.from_record(rec)
        assert made_p == full_p.for_user("", 0) and made_p.policy_key is full_p.policy_key, rec
    a, b = (prefs(orjson.dumps(rec)) for rec in PREFS[:2])  # same choices, other users
    assert a is b
