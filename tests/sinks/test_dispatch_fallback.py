"""Cross-channel fallback and dead addresses, against real SMS, APNs and email simulators.

The dispatcher is the production one on real Redis; the fallback deliveries it outputs are run
through it again (the job does the same by reading them back from their deliveries topic, see
tests/dataflows/test_dispatch.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from herald import ids, keys
from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.dispatch.fallback import watch_ttl
from tests.conftest import RunningStack
from tests.sinks.dispatch_helpers import (
    accepted_for,
    delivery,
    factories,
    harness,
    now,
    put_devices,
    put_prefs,
    states,
    token,
)

pytestmark = pytest.mark.integration

PUSH_CONTENT = {"channel": "push", "locale": "en", "template_version": 2,
                "rendered": {"title": "Login code", "body": "Your login code is 424242",
                             "subject": None, "data": {"kind": "otp"}}}  # fmt: skip


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningSimulator]]:
    tmp = tmp_path_factory.mktemp("sims")
    started = {n: start_simulator(n, tmp / n) for n in ("sms_a", "sms_b", "apns", "email")}
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


def otp(phone: str, **changes: Any) -> dict[str, Any]:
    """An OTP on SMS whose plan left sms_b and push as fallback steps (with push content)."""
    return delivery("sms", address=phone, fallback=["sms:sms_b", "push"],
                    fallback_content=[PUSH_CONTENT], **changes)  # fmt: skip


def test_sms_rejected_by_both_providers_reaches_the_user_on_push(fresh: dict, url: str) -> None:
    fresh["sms_a"].configure(errors={"21408": 1.0})  # A refuses (region disabled)
    fresh["sms_b"].configure(errors={"15": 1.0})  # B refuses too (invalid sender)
    d = otp("+15005550121")
    device = token(uuid.uuid4())
    put_devices(redis.Redis.from_url(url), d["user_id"], [device])
    with harness(url, factories(fresh, url)) as h:
        out = h.run([d])
        assert states(out, d["delivery_id"])[-1] == ("FAILED_PERMANENT", "status_15")
        assert out.events[-2]["attributes"]["fallback_to"] == "push"
        [push] = out.deliveries
        assert push["channel"] == "push" and push["address"] == device
        assert push["delivery_id"] == ids.delivery_id(
            d["notification_id"], d["user_id"], "push", f"dev-{device[:8]}"
        )
        assert states(out, push["delivery_id"]) == [("PLANNED", "fallback")]
        assert out.events[-1]["attributes"]["fallback_from"] == "sms"
        sent = h.run(out.deliveries)
        again = h.run(out.deliveries)  # the fallback replayed: the guard stops it
    assert states(sent)[-1] == ("PROVIDER_ACCEPTED", None)
    assert states(again) == [("PROVIDER_ACCEPTED", None)]  # re-emitted, not re-sent
    assert accepted_for(fresh["apns"], device) == 1
    assert fresh["sms_b"].stats()["requests"] == 1


def test_accepted_deliveries_with_a_fallback_are_kept_for_a_late_failure(
    fresh: dict, url: str
) -> None:
    """An OTP the SMS provider accepted may still fail (a DLR): dispatch hands it over to be
    kept (sinks/dispatch/sink.py keeps `out.watched` until its expiry); one without a cross-channel
    step is not kept."""
    d, plain = otp("+15005550125"), delivery("sms", address="+15005550126", fallback=["sms:sms_b"])
    with harness(url, factories(fresh, url)) as h:
        out = h.run([d, plain])
    assert states(out, d["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert states(out, plain["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert [w["delivery_id"] for w in out.watched] == [d["delivery_id"]]
    assert watch_ttl(out.watched[0], now()) <= 3600  # until the OTP's expiry


def test_unknown_outcome_never_falls_back(fresh: dict, url: str) -> None:
    fresh["sms_a"].configure(timeout_after_accept=1.0)
    d = otp("+15005550122")
    device = token(uuid.uuid4())
    put_devices(redis.Redis.from_url(url), d["user_id"], [device])
    with harness(url, factories(fresh, url, sms_a={"timeout_s": 0.5})) as h:
        out = h.run([d])
    assert states(out) == [("SENDING", None), ("UNKNOWN", "timeout")]
    assert out.deliveries == []  # no fallback; only sms_a is asked later (reconciliation)
    assert [(r["delivery_id"], r["provider"]) for r in out.retries] == [(d["delivery_id"], "sms_a")]
    assert fresh["apns"].stats()["requests"] == 0


def test_no_usable_sms_provider_falls_back_at_once(fresh: dict, url: str) -> None:
    d = otp("+15005550123")
    device = token(uuid.uuid4())
    put_devices(redis.Redis.from_url(url), d["user_id"], [device])
    with harness(url, factories(fresh, url)) as h:
        h.breaker.trip("sms_a", "test", 30.0)
        h.breaker.trip("sms_b", "test", 30.0)
        out = h.run([d])
        assert states(out, d["delivery_id"])[-1] == (
            "FAILED_PERMANENT", "no_usable_provider:breaker_open",
        )  # fmt: skip
        assert out.retries == []  # not waiting for the SMS breakers
        h.run(out.deliveries)
    assert accepted_for(fresh["apns"], device) == 1
    assert fresh["sms_a"].stats()["requests"] == fresh["sms_b"].stats()["requests"] == 0


def test_opted_out_fallback_channel_is_skipped_with_its_reason(fresh: dict, url: str) -> None:
    fresh["email"].configure(errors={"400": 1.0})
    client = redis.Redis.from_url(url)
    content = {**PUSH_CONTENT, "rendered": {**PUSH_CONTENT["rendered"], "data": {}}}
    d = delivery(notification_type="order_shipped", fallback=["push"],
                 fallback_content=[content], channel="email", address="u@example.com",
                 category="marketing", provider="email", traffic_class="normal")  # fmt: skip
    put_devices(client, d["user_id"], [token(uuid.uuid4())])
    put_prefs(client, d["user_id"], channel_opt_out=["push"])
    with harness(url, factories(fresh, url)) as h:
        out = h.run([d])
    assert states(out)[-1][0] == "FAILED_PERMANENT"
    assert out.events[-1]["attributes"]["fallback_skipped"] == "push:channel_opt_out"
    assert out.deliveries == [] and fresh["apns"].stats()["requests"] == 0


def test_invalid_number_disables_the_phone_and_push_still_serves(fresh: dict, url: str) -> None:
    phone = "+15005550124"
    fresh["sms_a"].configure(invalid=[phone])  # Twilio 21211: not a valid phone number
    client = redis.Redis.from_url(url)
    d = otp(phone)
    device = token(uuid.uuid4())
    put_devices(client, d["user_id"], [device])
    copy = orjson.loads(client.get(keys.contact_points(d["user_id"])))
    client.set(keys.contact_points(d["user_id"]),
               orjson.dumps({**copy, "phone": {"e164": phone, "verified": True}}))  # fmt: skip
    published: list[dict[str, Any]] = []
    with harness(url, factories(fresh, url)) as h:
        out = h.run([d])
        assert states(out, d["delivery_id"])[-1] == ("FAILED_PERMANENT", "21211")
        assert out.disables == [(d["user_id"], "sms", phone)]
        assert out.events[-2]["attributes"]["address_disabled"] == "phone"
        assert fresh["sms_b"].stats()["requests"] == 0  # B would refuse the number too
        result = h.contacts.disable_address(
            d["user_id"], "sms", phone, lambda _u, rec: published.append(rec), now()
        )
        again = h.contacts.disable_address(
            d["user_id"], "sms", phone, lambda _u, rec: published.append(rec), now()
        )
        h.run(out.deliveries)
    assert (result, again) == ("removed", "absent")  # a replay changes nothing
    [record] = published
    assert record["phone"] is None and record["version"] > copy["version"]
    assert record["disabled"] == ["phone"]  # later plans say address_disabled
    assert [dev["token"] for dev in record["devices"]] == [device]  # other channels stay
    assert orjson.loads(client.get(keys.contact_points(d["user_id"])))["phone"] is None
    assert accepted_for(fresh["apns"], device) == 1  # the user is still reached on push
