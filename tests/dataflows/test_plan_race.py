"""Read-your-writes between the API and the plan job: a request accepted right after a 200 from
PUT /v1/users/{id}/contact-points (or /preferences) is planned with that write, never before it.

The API is served over real HTTP (uvicorn, as in tests/api), the plan job is a real
`python -m bytewax.run` process; no sleep between the PUT and the POST.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.app import create_app
from api.settings import ProviderSecrets
from herald.config import HeraldSettings
from tests.api.conftest import FULL_KEY, make_api_settings, make_tenants, serve
from tests.conftest import mark_users_restored
from tests.dataflows.jobs import EVENTS, Job, assert_no_job_errors, read, wait_for

pytestmark = pytest.mark.integration

IMPORT = "dataflows.plan:build_flow(traffic_class='transactional')"
EMAILS = "herald.deliveries.email.transactional"
ROUNDS = 12


@pytest.fixture
def api_url(settings: HeraldSettings) -> Iterator[str]:
    mark_users_restored(settings.redis.url, settings.kafka.topic_prefix)  # users come by the API
    app = create_app(
        settings, api=make_api_settings(), providers=ProviderSecrets(), tenants=make_tenants()
    )
    yield from serve(app)


def reset(user: str, n: int) -> dict[str, Any]:
    """A password reset (transactional, email only, bypasses opt-outs)."""
    return {
        "request_id": f"race-{user}-{n}",
        "notification_type": "password_reset",
        "recipients": {"user_ids": [user]},
        "params": {"reset_url": "https://example.com/r"},
    }


def events_of(events: list[dict[str, Any]], nids: set[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in nids}
    for e in events:
        if e["notification_id"] in out:
            out[e["notification_id"]].append(e)
    return out


def test_request_after_contact_point_put_is_planned_with_it(
    settings: HeraldSettings, subprocess_env: dict[str, str], api_url: str, tmp_path: Path
) -> None:
    """Each round: PUT an email for a new user, POST a reset at once: planned, every time."""
    p = settings.kafka.topic_prefix
    job = Job(subprocess_env, tmp_path / "plan.log", IMPORT)
    try:
        with httpx.Client(base_url=api_url, headers={"X-API-Key": FULL_KEY}, timeout=10) as c:
            warm = c.post("/v1/notifications", json=reset(f"{p}nobody", 0))
            assert warm.status_code == 202, warm.text
            warm_nid = warm.json()["notification_id"]
            # the job is up once the first request (no contact point yet) is decided
            wait_for(settings, EVENTS, lambda r: bool(events_of(r, {warm_nid})[warm_nid]), job=job)
            nids: dict[str, str] = {}
            for n in range(ROUNDS):
                user = f"{p}race{n}"
                email = {"email": {"address": f"race{n}@example.com", "verified": True}}
                put = c.put(f"/v1/users/{user}/contact-points", json=email)
                assert put.status_code == 200, put.text
                posted = c.post("/v1/notifications", json=reset(user, n))
                assert posted.status_code == 202, posted.text
                nids[posted.json()["notification_id"]] = user
            # a preference change is read likewise: a locale set just before the request
            user = f"{p}race{ROUNDS}"
            email = {"email": {"address": "racep@example.com", "verified": True}}
            assert c.put(f"/v1/users/{user}/contact-points", json=email).status_code == 200
            put = c.put(f"/v1/users/{user}/preferences", json={"locale": "de"})
            assert put.status_code == 200, put.text
            posted = c.post("/v1/notifications", json=reset(user, ROUNDS))
            assert posted.status_code == 202, posted.text
            german_nid = posted.json()["notification_id"]
            nids[german_nid] = user
        events = wait_for(
            settings, EVENTS, lambda r: all(events_of(r, set(nids)).values()), job=job
        )
    finally:
        output = job.stop()
    assert_no_job_errors(output)
    decided = events_of(events, set(nids))
    outcomes = {nid: [(e["state"], e["reason"]) for e in evs] for nid, evs in decided.items()}
    assert all(o == [("PLANNED", None)] for o in outcomes.values()), outcomes
    assert {e["user_id"] for evs in decided.values() for e in evs} == set(nids.values())
    german = [d for d in read(settings, EMAILS) if d["notification_id"] == german_nid]
    assert [d["locale"] for d in german] == ["de"]
