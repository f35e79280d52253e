"""Provider simulator fixtures (real processes): one per module, restored before each test.

Shared by the simulator tests and the provider-client tests, whose conftest files import them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.simulators.launcher import RunningSimulator, start_simulator
from infra.simulators.recorder import CallbackRecorder


@pytest.fixture(scope="module")
def recorder() -> Iterator[CallbackRecorder]:
    """An HTTP endpoint that records the callbacks simulators post."""
    with CallbackRecorder() as rec:
        yield rec


def _sim(name: str, tmp: Path, callback_url: str | None = None) -> Iterator[RunningSimulator]:
    with start_simulator(name, tmp / name, callback_url=callback_url) as sim:
        yield sim


@pytest.fixture(scope="module")
def apns_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    yield from _sim("apns", tmp_path_factory.mktemp("sim"))


@pytest.fixture(scope="module")
def fcm_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    yield from _sim("fcm", tmp_path_factory.mktemp("sim"))


@pytest.fixture(scope="module")
def sms_a_proc(
    tmp_path_factory: pytest.TempPathFactory, recorder: CallbackRecorder
) -> Iterator[RunningSimulator]:
    yield from _sim("sms_a", tmp_path_factory.mktemp("sim"), recorder.url("/v1/callbacks/sms_a"))


@pytest.fixture(scope="module")
def sms_b_proc(
    tmp_path_factory: pytest.TempPathFactory, recorder: CallbackRecorder
) -> Iterator[RunningSimulator]:
    yield from _sim("sms_b", tmp_path_factory.mktemp("sim"), recorder.url("/v1/callbacks/sms_b"))


@pytest.fixture(scope="module")
def email_proc(
    tmp_path_factory: pytest.TempPathFactory, recorder: CallbackRecorder
) -> Iterator[RunningSimulator]:
    yield from _sim("email", tmp_path_factory.mktemp("sim"), recorder.url("/v1/callbacks/email"))


def _fresh(sim: RunningSimulator, recorder: CallbackRecorder | None = None) -> RunningSimulator:
    sim.reset(config=True)
    if recorder is not None:
        recorder.requests.clear()
    return sim


@pytest.fixture
def apns(apns_proc: RunningSimulator) -> RunningSimulator:
    return _fresh(apns_proc)


@pytest.fixture
def fcm(fcm_proc: RunningSimulator) -> RunningSimulator:
    return _fresh(fcm_proc)


@pytest.fixture
def sms_a(sms_a_proc: RunningSimulator, recorder: CallbackRecorder) -> RunningSimulator:
    return _fresh(sms_a_proc, recorder)


@pytest.fixture
def sms_b(sms_b_proc: RunningSimulator, recorder: CallbackRecorder) -> RunningSimulator:
    return _fresh(sms_b_proc, recorder)


@pytest.fixture
def email(email_proc: RunningSimulator, recorder: CallbackRecorder) -> RunningSimulator:
    return _fresh(email_proc, recorder)
