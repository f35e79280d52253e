"""The third SMS vendor (MessageBird-style, `sms_c`), added as a folder and two registration
lines: its client against its simulator, failover to it and from it in the production
dispatcher on real Redis, and its signed status reports through the API's callback route into
the receipt parser the receipts job registers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from api.app import create_app
from api.settings import ProviderSecrets
from herald.config import HeraldSettings
from herald.outcomes import Accepted, Outcome, PlatformError, RateLimited, Retryable, TokenDead
from herald.providers import CallbackCredentials, CallbackRequest
from herald.receipts import kills_address, normalize
from infra.simulators.launcher import RunningSimulator, start_simulator
from infra.simulators.recorder import CallbackRecorder
from sinks.dispatch.simenv import client_env
from sinks.provider_registry import register_receipt_formats, spec
from sinks.providers.messagebird.client import MessageBirdClient
from sinks.providers.messagebird.config import MessageBirdConfig
from sinks.providers.messagebird.signature import signature
from tests.api.conftest import RunningApi, make_api_settings, make_tenants, serve
from tests.conftest import RunningStack, mark_users_restored
from tests.sinks.dispatch_helpers import accepted_for, delivery, factories, harness
from tests.sinks.providers.helpers import delivery as provider_delivery
from tests.sinks.providers.helpers import send_one

pytestmark = pytest.mark.integration

PHONE = "+15005550123"


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningSimulator]]:
    tmp = tmp_path_factory.mktemp("sims")
    started = {name: start_simulator(name, tmp / name) for name in ("sms_a", "sms_c")}
    yield started
    for sim in started.values():
        sim.stop()


@pytest.fixture
def fresh(sims: dict[str, RunningSimulator]) -> dict[str, RunningSimulator]:
    for sim in sims.values():
        sim.reset(config=True)
    return sims


def config(sim: RunningSimulator, **kw: Any) -> MessageBirdConfig:
    """The client's settings as the embedded stack sets them (its SPEC's simulator env)."""
    env = client_env("sms_c", sim.credentials())
    return MessageBirdConfig(base_url=env["HERALD_MESSAGEBIRD_BASE_URL"],
                             access_key=env["HERALD_MESSAGEBIRD_ACCESS_KEY"], **kw)  # fmt: skip


def send(sim: RunningSimulator, address: str = PHONE) -> Outcome:
    record = provider_delivery(address, channel="sms")
    return send_one(lambda: MessageBirdClient(config(sim)), record)


def test_the_client_maps_the_simulator_s_answers(fresh: dict[str, RunningSimulator]) -> None:
    sim = fresh["sms_c"]
    accepted = send(sim)
    assert isinstance(accepted, Accepted) and len(accepted.provider_msg_id) == 32
    assert accepted_for(sim, PHONE.lstrip("+")) == 1
    bad_number = send(sim, "+1")
    assert isinstance(bad_number, TokenDead) and bad_number.reason == "invalid_number"
    for kind, expected, reason in (("25", PlatformError, "mb_25"), ("99", Retryable, "mb_99"),
                                   ("500", Retryable, "http_500")):  # fmt: skip
        sim.configure(errors={kind: 1.0})
        outcome = send(sim)
        assert isinstance(outcome, expected) and outcome.reason == reason, (kind, outcome)
    sim.configure(errors={}, rate_limit=0.01, rate_burst=1)
    send(sim)
    assert isinstance(send(sim), RateLimited)


def test_sms_a_s_refusal_fails_over_to_messagebird(
    fresh: dict[str, RunningSimulator], stack: RunningStack
) -> None:
    fresh["sms_a"].configure(errors={"21408": 1.0})  # region disabled: sms_a's own refusal
    url = stack.settings.redis.url
    fac = {**factories({"sms_a": fresh["sms_a"]}, url),
           "sms_c": lambda: MessageBirdClient(config(fresh["sms_c"]))}  # fmt: skip
    d = delivery("sms", address=PHONE, fallback=["sms:sms_c", "push"])
    with harness(url, fac) as h:
        out = h.run([d])
    assert [(e["state"], e["provider"], e["attempt"]) for e in out.events] == [
        ("SENDING", "sms_a", 1), ("RETRY_SCHEDULED", "sms_a", 1),
        ("SENDING", "sms_c", 2), ("PROVIDER_ACCEPTED", "sms_c", 2),
    ]  # fmt: skip
    assert out.events[1]["reason"] == "failover:rejected:21408"
    assert accepted_for(fresh["sms_c"], PHONE.lstrip("+")) == 1


def test_messagebird_s_refusal_fails_over_to_sms_a(
    fresh: dict[str, RunningSimulator], stack: RunningStack
) -> None:
    fresh["sms_c"].configure(errors={"10": 1.0})  # originator refused: its own rejection
    url = stack.settings.redis.url
    fac = {**factories({"sms_a": fresh["sms_a"]}, url),
           "sms_c": lambda: MessageBirdClient(config(fresh["sms_c"]))}  # fmt: skip
    d = delivery("sms", address=PHONE, provider="sms_c", fallback=["sms:sms_a", "push"])
    with harness(url, fac) as h:
        out = h.run([d])
    assert [(e["state"], e["provider"], e["attempt"]) for e in out.events] == [
        ("SENDING", "sms_c", 1), ("RETRY_SCHEDULED", "sms_c", 1),
        ("SENDING", "sms_a", 2), ("PROVIDER_ACCEPTED", "sms_a", 2),
    ]  # fmt: skip
    assert out.events[1]["reason"] == "failover:rejected:mb_10"
    assert accepted_for(fresh["sms_a"], PHONE) == 1


def test_signed_status_reports_pass_the_api_and_parse(
    tmp_path_factory: pytest.TempPathFactory, settings: HeraldSettings
) -> None:
    """The simulator's reports (signed independently of Herald's check) reach the API's
    callback route, which verifies them with the folder's check and keeps them raw; the
    folder's parser, registered as the receipts job does, reads them."""
    with CallbackRecorder() as rec:
        sim = start_simulator(
            "sms_c", tmp_path_factory.mktemp("mb"), callback_url=rec.url("/v1/callbacks/sms_c"),
            config={"receipts": {"outcomes": {"delivery_failed:1": 1.0}}},
        )  # fmt: skip
        try:
            reference = "d-report-1"
            record = provider_delivery(PHONE, channel="sms", delivery_id=reference)
            accepted = send_one(lambda: MessageBirdClient(config(sim)), record)
            assert isinstance(accepted, Accepted)
            rec.wait_for(2)
            key = sim.credentials()["signing_key"]
        finally:
            sim.stop()
    keep = ("content-type", "messagebird-signature", "messagebird-request-timestamp")
    reports = [({k: r.headers[k] for k in keep}, r.body) for r in rec.requests]
    check = spec("sms_c").callback
    assert check is not None and check.secret == "signing_key"
    for headers, body in reports:
        call = CallbackRequest("http://x/v1/callbacks/sms_c", headers, {}, body)
        assert check.verify(call, CallbackCredentials(key), 600) is None
        assert check.verify(call, CallbackCredentials("another-key"), 600) == "invalid_signature"

    providers = ProviderSecrets(secrets={"sms_c": SecretStr(key)})
    mark_users_restored(settings.redis.url, settings.kafka.topic_prefix)
    app = create_app(settings, api=make_api_settings(), providers=providers, tenants=make_tenants())
    for url in serve(app):
        api = RunningApi(url, settings, app)
        with api.client(key=None) as http:
            codes = [http.post("/v1/callbacks/sms_c", content=body, headers=headers).status_code
                     for headers, body in reports]  # fmt: skip
            # the failure report, forged into a delivery (reports may arrive in either order)
            headers, body = next((h, b) for h, b in reports if b'"delivery_failed"' in b)
            forged = body.replace(b'"delivery_failed"', b'"delivered"')
            assert forged != body
            assert (
                http.post("/v1/callbacks/sms_c", content=forged, headers=headers).status_code == 403
            )
            unsigned = {"content-type": "application/json"}
            assert (
                http.post("/v1/callbacks/sms_c", content=body, headers=unsigned).status_code == 401
            )
            stamp = str(int(time.time()) - 3600)
            stale = {**unsigned, "messagebird-request-timestamp": stamp,
                     "messagebird-signature": signature(key, stamp, body)}  # fmt: skip
            assert http.post("/v1/callbacks/sms_c", content=body, headers=stale).status_code == 403
        raws = [receipt for _, receipt in api.read_topic("herald.receipts.raw", len(reports))]
    assert codes == [204] * len(reports)

    register_receipt_formats()
    events = [ev for raw in raws for ev in normalize(raw)]
    by_status = {ev.status: ev for ev in events}
    assert set(by_status) == {"sent", "delivery_failed"}
    assert by_status["sent"].state == "PROVIDER_ACCEPTED"
    failed = by_status["delivery_failed"]
    assert (failed.state, failed.reason, failed.delivery_hint) == (
        "FAILED_PERMANENT",
        "mb_err_1",
        reference,
    )
    assert failed.provider_msg_id == accepted.provider_msg_id and kills_address(failed)
    assert orjson.loads(failed.payload)["recipient"] == int(PHONE.lstrip("+"))
