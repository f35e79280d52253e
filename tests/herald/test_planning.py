"""herald.planning: request admission, audience batches, shards and the user table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from herald.catalog import CatalogLookupError, load_catalog
from herald.planning import (
    AudienceBatch,
    InvalidRequest,
    TableUpdate,
    UserTable,
    UserTasks,
    admit_request,
    chunk_users,
    shard_of,
    split_by_shard,
)
from herald.policy import ContactPoints, Preferences

CATALOG = load_catalog()
NOW = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)
CAMPAIGN = {"headline": "Sale", "offer": "20% off", "cta_url": "https://x.test"}


def record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "notification_id": "n-1",
        "request_id": "r-1",
        "tenant_id": "acme",
        "notification_type": "marketing_campaign",
        "traffic_class": "bulk",
        "recipients": {"user_ids": ["u-1"], "segment_id": None},
        "template_version": None,
        "params": CAMPAIGN,
        "channels": None,
        "locale": None,
        "send_at": None,
        "send_local_time": None,
        "expire_at": None,
        "accepted_at": NOW,
        "source": "api",
    }
    return {**base, **changes}


def test_admitted_request_takes_class_and_category_from_the_catalog() -> None:
    req = admit_request(record(traffic_class="transactional"), CATALOG, "t:1:42")
    assert (req.traffic_class, req.category, req.origin) == ("bulk", "marketing", "t:1:42")
    assert req.policy.accepted_at == NOW and req.segment_id is None


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"notification_type": "nope"}, "unknown_notification_type"),
        ({"template_version": 9}, "unknown_template_version"),
        ({"params": {"headline": "h", "offer": "o"}}, "missing_param:cta_url"),
        ({"locale": "not a locale!"}, "invalid_locale"),
        ({"recipients": {"user_ids": [], "segment_id": None}}, "no_recipients"),
        ({"recipients": {"user_ids": ["u"], "segment_id": "s"}}, "ambiguous_recipients"),
    ],
)
def test_bad_requests_carry_a_code(changes: dict[str, Any], code: str) -> None:
    with pytest.raises((CatalogLookupError, InvalidRequest)) as info:
        admit_request(record(**changes), CATALOG, "t:0:0")
    assert info.value.code == code  # type: ignore[union-attr]


def test_inline_users_are_chunked_and_deduplicated() -> None:
    req = admit_request(record(), CATALOG, "t:0:0")
    users = [f"u{i}" for i in range(2500)] + ["u1"]
    batches = list(chunk_users(req, users, 1000))
    assert [len(b.users) for b in batches] == [1000, 1000, 500]
    assert [b.batch_no for b in batches] == [0, 1, 2]
    assert [b.last for b in batches] == [False, False, True]
    assert [u for b in batches for u, _p in b.users] == [f"u{i}" for i in range(2500)]


def test_split_by_shard_keeps_every_user_on_its_shard() -> None:
    req = admit_request(record(), CATALOG, "t:0:0")
    batch = AudienceBatch(req, 3, tuple((f"u{i}", None) for i in range(500)), False)
    parts = split_by_shard(batch, 16)
    assert sorted(u for _k, t in parts for u, _p in t.users) == sorted(f"u{i}" for i in range(500))
    assert all(shard_of(u, 16) == k for k, t in parts for u, _p in t.users)
    assert {t.batch_no for _k, t in parts} == {3}
    assert shard_of("u1", 16) == shard_of("u1", 16) == str(int(shard_of("u1", 16)) % 16)


def test_user_table_keeps_the_newest_version_and_forgets_on_tombstones() -> None:
    table = UserTable()
    assert table.apply(
        TableUpdate("preferences", "u", Preferences("u", global_opt_out=True, version=5))
    )
    assert not table.apply(TableUpdate("preferences", "u", Preferences("u", version=4)))
    assert table.prefs["u"].global_opt_out
    assert table.apply(TableUpdate("contacts", "u", ContactPoints("u", email="e", version=1)))
    req = admit_request(record(), CATALOG, "t:0:0")
    planned = table.join(UserTasks(req, 0, (("u", None), ("v", {"first_name": "V"}))))
    assert planned.users[0].prefs.global_opt_out and planned.users[0].contacts.email == "e"
    assert planned.users[1].prefs == Preferences("v") and planned.users[1].params == {
        "first_name": "V"
    }
    assert table.apply(TableUpdate("preferences", "u", None))
    assert "u" not in table.prefs and "u" in table.contacts
