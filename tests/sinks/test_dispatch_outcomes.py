"""Dispatch against real simulator processes and Redis: every outcome class and its effects."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import orjson
import pytest
import redis

from herald import keys
from herald.guard import AlreadySent, Proceed
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.dispatch.contacts import ContactStore
from tests.conftest import RunningStack
from tests.sinks.dispatch_helpers import (
    accepted_for,
    delivery,
    dispatch_settings,
    factories,
    harness,
    now,
    put_devices,
    put_prefs,
    states,
    token,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningSimulator]]:
    tmp = tmp_path_factory.mktemp("sims")
    started = {name: start_simulator(name, tmp / name) for name in ("apns", "fcm", "email")}
    yield started
    for sim in started.values():
        sim.stop()


@pytest.fixture
def fresh(sims: dict[str, RunningSimulator]) -> dict[str, RunningSimulator]:
    for sim in sims.values():
        sim.reset(config=True)
    return sims


@pytest.fixture
def url(stack: RunningStack) -> str:
    return stack.settings.redis.url


def test_accepted_events_collapse_id_and_redelivery(fresh: dict, url: str) -> None:
    apns = fresh["apns"]
    batch = [delivery() for _ in range(5)]
    with harness(url, factories(fresh, url)) as h:
        out = h.run(batch)
        again = h.run(batch)  # the same records redelivered (crash/replay)
    for d in batch:
        assert states(out, d["delivery_id"]) == [("SENDING", None), ("PROVIDER_ACCEPTED", None)]
        assert accepted_for(apns, d["address"]) == 1
        [(msg_id, collapse)] = apns.stats()["accepted_ids"][d["address"]]
        assert collapse == d["notification_id"]  # duplicates merge on the device
    accepted = [e for e in out.events if e["state"] == "PROVIDER_ACCEPTED"]
    assert all(e["provider"] == "apns" and e["provider_msg_id"] and e["attempt"] == 1
               for e in accepted)  # fmt: skip
    assert all(e["latency_ms"] is not None and e["latency_ms"] >= 0 for e in accepted)
    # Redelivered: nothing sent, the same PROVIDER_ACCEPTED event (same id) emitted again.
    assert {e["event_id"] for e in again.events} == {e["event_id"] for e in accepted}
    assert apns.stats()["accepted"] == 5


def test_5xx_schedules_a_jittered_retry_and_frees_the_guard(fresh: dict, url: str) -> None:
    fresh["apns"].configure(errors={"ServiceUnavailable": 1.0}, retry_after_s=0)
    d = delivery()
    before = now()
    with harness(url, factories(fresh, url)) as h:
        out = h.run([d])
        assert isinstance(h.guard.acquire(d["delivery_id"], "transactional"), Proceed)
    assert states(out) == [("SENDING", None), ("RETRY_SCHEDULED", "ServiceUnavailable")]
    [retry] = out.retries
    assert retry["attempt"] == 1 and retry["provider"] == "apns"
    assert retry["first_attempt_at"] >= before
    assert before <= retry["next_attempt_at"] <= now() + timedelta(seconds=0.6)  # base 0.5 s


def test_429_honours_retry_after_as_a_floor(fresh: dict, url: str) -> None:
    fresh["apns"].configure(errors={"TooManyRequests": 1.0}, retry_after_s=3)
    batch = [delivery() for _ in range(20)]
    with harness(url, factories(fresh, url)) as h:
        out = h.run(batch)
    sent_at = now()
    times = sorted((r["next_attempt_at"] - sent_at).total_seconds() for r in out.retries)
    assert len(times) == 20
    assert times[0] >= 2.5 and times[-1] <= 6.5  # [3 s, 3 s + spread], never all at once
    assert times[-1] - times[0] > 0.5


def test_permanent_and_token_dead(fresh: dict, url: str) -> None:
    apns = fresh["apns"]
    dead, alive = token("dead"), token("alive")
    apns.configure(unregistered=[dead])
    bad = delivery(address="not-a-hex-token")
    gone = delivery(address=dead)
    ok = delivery(address=alive)
    with harness(url, factories(fresh, url)) as h:
        out = h.run([bad, gone, ok])
    assert states(out, bad["delivery_id"])[-1] == ("FAILED_PERMANENT", "BadDeviceToken")
    assert states(out, gone["delivery_id"])[-1] == ("FAILED_PERMANENT", "Unregistered")
    assert states(out, ok["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert not out.retries and not out.dead_letters
    # BadDeviceToken and 410 are both "token dead": those devices are cleaned up.
    assert sorted(out.cleanups) == sorted([(bad["user_id"], bad["address"]),
                                           (gone["user_id"], dead)])  # fmt: skip


def test_token_cleanup_removes_only_that_device(url: str) -> None:
    client = redis.Redis.from_url(url)
    user = f"u-{token('cleanup')[:10]}"
    dead, other = token("d1"), token("d2")
    put_devices(client, user, [dead, other])
    published: list[tuple[str, dict]] = []
    store = ContactStore(client)
    assert store.remove_token(user, dead, lambda u, r: published.append((u, r)), now()) == "removed"
    assert store.remove_token(user, dead, lambda u, r: published.append((u, r)), now()) == "absent"
    copy = orjson.loads(client.get(keys.contact_points(user)))
    assert [d["token"] for d in copy["devices"]] == [other]
    assert copy["version"] > 3 and isinstance(copy["updated_at"], int)  # put_devices wrote 3
    assert published == [(user, copy)]


def test_platform_error_pauses_the_provider(fresh: dict, url: str) -> None:
    apns = fresh["apns"]
    apns.configure(errors={"InvalidProviderToken": 1.0})
    first, later = delivery(), delivery()
    with harness(url, factories(fresh, url)) as h:
        out = h.run([first])
        calls = apns.stats()["requests"]
        blocked = h.run([later])
        assert h.breaker.state("apns") == "open"
    assert states(out)[-1] == ("RETRY_SCHEDULED", "platform:InvalidProviderToken")
    assert out.retries[0]["attempt"] == 0  # the provider's config failed, not the message
    assert states(blocked) == [("RETRY_SCHEDULED", "breaker_open")]
    assert apns.stats()["requests"] == calls  # nothing reached the paused provider


def test_unknown_outcome_is_recorded_and_never_resent(fresh: dict, url: str) -> None:
    apns = fresh["apns"]
    apns.configure(timeout_after_accept=1.0)
    d = delivery()
    fac = factories(fresh, url, apns={"timeout_s": 0.5})
    with harness(url, fac) as h:
        out = h.run([d])
        again = h.run([d])
        guard = h.guard.acquire(d["delivery_id"], "transactional")
    assert states(out) == [("SENDING", None), ("UNKNOWN", "timeout")]
    assert not out.retries and again.events == []
    assert isinstance(guard, AlreadySent) and guard.state == "unknown"
    assert accepted_for(apns, d["address"]) == 1


def test_expired_and_opted_out_are_not_sent(fresh: dict, url: str) -> None:
    client = redis.Redis.from_url(url)
    expired = delivery(expire_at=now() - timedelta(seconds=1))
    marketing = delivery(notification_type="marketing_campaign", category="marketing",
                         traffic_class="bulk")  # fmt: skip
    otp = delivery(notification_type="payment_result")  # approved: bypasses opt-outs
    put_prefs(client, marketing["user_id"], category_opt_out=["marketing"])
    put_prefs(client, otp["user_id"], global_opt_out=True)
    with harness(url, factories(fresh, url)) as h:
        out = h.run([expired, marketing, otp])
    assert states(out, expired["delivery_id"]) == [("EXPIRED", "expired")]
    assert states(out, marketing["delivery_id"]) == [("SUPPRESSED", "category_opt_out")]
    assert states(out, otp["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert fresh["apns"].stats()["requests"] == 1


def test_fcm_outcomes(fresh: dict, url: str) -> None:
    fcm = fresh["fcm"]
    fcm.configure(unregistered=["fcm-dead"])
    ok = delivery(platform="fcm", provider="fcm", address="fcm-ok")
    dead = delivery(platform="fcm", provider="fcm", address="fcm-dead")
    with harness(url, factories(fresh, url)) as h:
        out = h.run([ok, dead])
        fcm.configure(errors={"QUOTA_EXCEEDED": 1.0}, retry_after_s=2)
        throttled = h.run([delivery(platform="fcm", provider="fcm", address="fcm-2")])
    assert states(out, ok["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert states(out, dead["delivery_id"])[-1] == ("FAILED_PERMANENT", "UNREGISTERED")
    assert out.cleanups == [(dead["user_id"], "fcm-dead")]
    assert states(throttled)[-1] == ("RETRY_SCHEDULED", "rate_limited")
    assert throttled.retries[0]["next_attempt_at"] >= now() + timedelta(seconds=1.5)


def test_email_and_inbox(fresh: dict, url: str) -> None:
    client = redis.Redis.from_url(url)
    mail = delivery("email")
    item = delivery("inapp")
    pubsub = client.pubsub()
    pubsub.subscribe(keys.inbox_channel(item["user_id"]))
    pubsub.get_message(timeout=1.0)  # subscribe confirmation
    with harness(url, factories(fresh, url)) as h:
        out = h.run([mail, item])
        again = h.run([item])
    assert states(out, mail["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert states(out, item["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert accepted_for(fresh["email"], mail["address"]) == 1
    assert client.scard(keys.inbox_unread(item["user_id"])) == 1
    stored = orjson.loads(client.hget(keys.inbox_data(item["user_id"]), item["delivery_id"]))
    assert stored["title"] == "Paid"
    pushed = pubsub.get_message(timeout=2.0)
    assert pushed is not None and orjson.loads(pushed["data"])["unread"] == 1
    assert states(again)[-1] == ("PROVIDER_ACCEPTED", None)  # guard: re-emitted, not stored
    assert client.zcard(keys.inbox_items(item["user_id"])) == 1
    pubsub.close()


def test_retries_exhausted_are_dead_lettered(fresh: dict, url: str) -> None:
    fresh["apns"].configure(errors={"InternalServerError": 1.0})
    last = delivery(attempt=5, first_attempt_at=now() - timedelta(seconds=30))  # max 6
    with harness(url, factories(fresh, url)) as h:
        out = h.run([last])
    assert states(out)[-1] == ("FAILED_PERMANENT", "retries_exhausted:InternalServerError")
    [letter] = out.dead_letters
    assert letter.record["delivery_id"] == last["delivery_id"]
    assert letter.record["attempt"] == 6 and letter.record["expire_at"] == last["expire_at"]
    assert not out.retries


def test_concurrent_workers_send_once(fresh: dict, url: str) -> None:
    """Two partitions racing on the same records: each delivery reaches APNs once."""
    batch = [delivery() for _ in range(30)]
    cfg = dispatch_settings()
    results: list = []
    with (
        harness(url, factories(fresh, url), cfg) as a,
        harness(url, factories(fresh, url), cfg) as b,
    ):
        threads = [
            threading.Thread(target=lambda h=h: results.append(h.run(batch))) for h in (a, b)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(accepted_for(fresh["apns"], d["address"]) == 1 for d in batch)


def test_a_delivery_that_reaches_dispatch_in_quiet_hours_is_held_again(
    fresh: dict, url: str
) -> None:
    # a marketing push planned outside the window but dispatched inside it (a backlog drained
    # late, a retry, a replay): held until the window ends, not sent; an OTP-like type that
    # bypasses quiet hours is sent
    client = redis.Redis.from_url(url)
    local = now().astimezone(ZoneInfo("Asia/Tokyo"))
    start, end = local - timedelta(minutes=30), local + timedelta(minutes=30)
    window = {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M")}
    marketing = delivery(notification_type="marketing_campaign", category="marketing",
                         traffic_class="bulk")  # fmt: skip
    alert = delivery(notification_type="security_alert")  # bypasses quiet hours
    for d in (marketing, alert):
        put_prefs(client, d["user_id"], quiet_hours=window, timezone="Asia/Tokyo")
    with harness(url, factories(fresh, url)) as h:
        out = h.run([marketing, alert])
        guard = h.guard.acquire(marketing["delivery_id"], "bulk")
    assert states(out, marketing["delivery_id"]) == [("SCHEDULED", "quiet_hours")]
    (held,) = out.retries
    until = end.replace(second=0, microsecond=0).astimezone(UTC)
    assert held["delivery_id"] == marketing["delivery_id"] and held["next_attempt_at"] == until
    assert isinstance(guard, Proceed)  # released: the delivery is sent when it comes back
    assert states(out, alert["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert fresh["apns"].stats()["requests"] == 1
