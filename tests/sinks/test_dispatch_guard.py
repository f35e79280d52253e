"""The send guard at each crash point (seed 000 §5.2), with a real APNs simulator and Redis.

A crash is injected by the engine's stage hook (it raises out of the batch, leaving Redis and the
simulator exactly as a killed process would); the "restarted" worker is a fresh dispatcher that
processes the same records again, as a Bytewax job resuming from its last epoch does. Records it
requeues are released when due, as the retry job does. tests/dataflows/test_dispatch.py kills a
real job process with SIGKILL for the transactional after-the-call case.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from infra.simulators.launcher import RunningSimulator, start_simulator
from sinks.dispatch.work import Item, Outputs
from tests.conftest import RunningStack
from tests.sinks.dispatch_helpers import (
    Harness,
    accepted_for,
    delivery,
    dispatch_settings,
    factories,
    now,
    states,
)

pytestmark = pytest.mark.integration

TTL = 3.0  # PENDING TTL of these tests


class Crash(Exception):
    """Stands for the process dying at a stage."""


def crash_at(stage: str):  # type: ignore[no-untyped-def]
    def hook(name: str, items: list[Item]) -> None:
        if name == stage:
            raise Crash(stage)

    return hook


@pytest.fixture(scope="module")
def apns_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    with start_simulator("apns", tmp_path_factory.mktemp("sims") / "apns") as sim:
        yield sim


@pytest.fixture
def apns(apns_proc: RunningSimulator) -> RunningSimulator:
    apns_proc.reset(config=True)
    return apns_proc


@pytest.fixture
def url(stack: RunningStack) -> str:
    return stack.settings.redis.url


def crash_then_restart(
    url: str, sim: RunningSimulator, batch: list[dict[str, Any]], stage: str
) -> tuple[datetime, list[Outputs]]:
    """Run `batch` until the crash at `stage`, then redeliver it (and its requeues when due)."""
    cfg = dispatch_settings(pending_ttl_s=TTL, shape_max_wait_s=0.5, call_timeout_s=0.5)
    first = Harness(url, factories({"apns": sim}, url), cfg, crash_at(stage))
    try:
        with pytest.raises(Crash):
            first.run(batch)
    finally:
        first.close()
    crashed_at = now()
    second = Harness(url, factories({"apns": sim}, url), cfg)
    outs: list[Outputs] = []
    try:
        pending = batch
        # the loop ends once nothing is pending; the bound only stops a stuck run (on a loaded
        # 2-core machine the requeued deliveries took longer than 3 x TTL to come due and go)
        deadline = time.monotonic() + 3 * TTL + 60
        while pending and time.monotonic() < deadline:
            out = second.run(pending)
            outs.append(out)
            pending = out.retries
            if pending:  # the retry job holds them until due
                due = min(r["next_attempt_at"] for r in pending)
                time.sleep(max(0.0, (due - now()).total_seconds()) + 0.05)
    finally:
        second.close()
    return crashed_at, outs


def sent_times(outs: list[Outputs]) -> list[datetime]:
    return [e["occurred_at"] for o in outs for e in o.events if e["state"] == "SENDING"]


def all_states(outs: list[Outputs], did: str) -> list[tuple[str, str | None]]:
    return [s for o in outs for s in states(o, did)]


def test_transactional_crash_before_the_call_is_resent_after_the_pending_ttl(
    apns: RunningSimulator, url: str
) -> None:
    batch = [delivery() for _ in range(3)]
    crashed_at, outs = crash_then_restart(url, apns, batch, "guarded")
    for d in batch:
        assert accepted_for(apns, d["address"]) == 1  # not lost, sent once
        assert all_states(outs, d["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)
    assert min(sent_times(outs)) >= crashed_at + timedelta(seconds=TTL - 0.5)


def test_transactional_crash_between_answer_and_sent_mark_sends_at_most_one_duplicate(
    apns: RunningSimulator, url: str
) -> None:
    """The only window left: the provider's answers arrived, their SENT marks not written."""
    batch = [delivery() for _ in range(3)]
    _, outs = crash_then_restart(url, apns, batch, "answered")
    for d in batch:
        assert accepted_for(apns, d["address"]) == 2  # the documented duplicate, no more
        assert all_states(outs, d["delivery_id"])[-1] == ("PROVIDER_ACCEPTED", None)


@pytest.mark.parametrize("stage", ["sent", "marked"])
def test_transactional_crash_after_the_answers_were_recorded_resends_nothing(
    apns: RunningSimulator, url: str, stage: str
) -> None:
    """SENT is written as each chunk's answers arrive, not at the end of the batch: a crash
    after the calls ("sent") or after the batch's other guards ("marked") repeats nothing."""
    batch = [delivery() for _ in range(3)]
    _, outs = crash_then_restart(url, apns, batch, stage)
    assert len(outs) == 1 and not outs[0].retries
    for d in batch:
        assert accepted_for(apns, d["address"]) == 1
        [(msg_id, _)] = apns.stats()["accepted_ids"][d["address"]]
        # The PROVIDER_ACCEPTED the crash lost, emitted again from the guard's SENT value.
        [event] = [e for e in outs[0].events if e["delivery_id"] == d["delivery_id"]]
        assert (event["state"], event["provider"], event["attempt"]) == (
            "PROVIDER_ACCEPTED", "apns", 1,
        )  # fmt: skip
        assert event["provider_msg_id"] == msg_id


@pytest.mark.parametrize(("stage", "sends"), [("guarded", 0), ("sent", 1)])
def test_bulk_is_at_most_once(apns: RunningSimulator, url: str, stage: str, sends: int) -> None:
    batch = [delivery(traffic_class="bulk", notification_type="marketing_campaign",
                      category="marketing") for _ in range(3)]  # fmt: skip
    _, outs = crash_then_restart(url, apns, batch, stage)
    assert outs[0].events == [] and outs[0].retries == []  # CLAIMED: skipped
    for d in batch:
        assert accepted_for(apns, d["address"]) == sends  # lost before the call, never twice
