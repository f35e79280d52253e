"""herald.planning: request admission and audience batches."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from herald.catalog import load_catalog
from herald.errors import CatalogLookupError, InvalidRequest
from herald.planning import admit_request, chunk_users

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
