"""dataflows._copies against the real Redis: the API's newer copies overlay the user table."""

from __future__ import annotations

import uuid

import orjson
import pytest
import redis

from api import keys
from dataflows._copies import ApiCopies
from herald.planning import Planned, TableUpdate, UserTable, UserTasks
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


def test_newer_copies_replace_table_state_older_and_bad_ones_do_not(stack: RunningStack) -> None:
    client = redis.Redis.from_url(stack.settings.redis.url)
    run = uuid.uuid4().hex[:8]
    fresh, stale, bad, deleted, plain = (f"{run}-{n}" for n in range(5))
    table = UserTable()
    for user in (stale, deleted):
        table.apply(TableUpdate("contacts", user, ContactPoints(user, email="t@x", version=3)))
    table.apply(TableUpdate("contacts", deleted, None))  # tombstone: floor at version 3
    client.set(keys.contact_points(fresh), contacts_copy(fresh, 1, "new@x"))
    client.set(keys.contact_points(stale), contacts_copy(stale, 2, "old@x"))
    client.set(keys.contact_points(deleted), contacts_copy(deleted, 3, "gone@x"))
    client.set(keys.contact_points(bad), b"{not json")
    prefs = {"user_id": fresh, "locale": "de", "version": 4, "timezone": "Europe/Zurich"}
    client.set(keys.prefs(fresh), orjson.dumps(prefs))
    users = tuple((u, None) for u in (fresh, stale, bad, deleted, plain))
    request = plan_request(f"n-{run}", "t:0:1")
    batch = [("0", table.join(UserTasks(request, 0, users[:2]))),
             ("1", table.join(UserTasks(request, 0, users[2:])))]  # fmt: skip

    out = ApiCopies(client).fresh(batch)

    views = {v.user_id: v for _s, p in out for v in p.users}
    assert views[fresh].contacts.email == "new@x" and views[fresh].contacts.version == 1
    expected = Preferences(fresh, timezone="Europe/Zurich", locale="de", version=4)
    assert views[fresh].prefs == expected
    assert views[stale].contacts.email == "t@x"  # the table's version 3 beats the copy's 2
    assert views[deleted].contacts == ContactPoints(deleted, version=3)  # not resurrected
    assert views[bad].contacts == ContactPoints(bad) and views[plain].prefs == Preferences(plain)
    assert [s for s, _p in out] == ["0", "1"] and all(isinstance(p, Planned) for _s, p in out)
    assert out[1][1] is batch[1][1]  # nothing newer in that item: passed through as it was
