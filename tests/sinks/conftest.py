"""Fixtures the dispatch sink tests share: the session stack's Redis URL and an APNs
simulator process per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.simulators.launcher import RunningSimulator, start_simulator
from tests.conftest import RunningStack


@pytest.fixture
def url(stack: RunningStack) -> str:
    return stack.settings.redis.url


@pytest.fixture(scope="module")
def apns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    sim = start_simulator("apns", tmp_path_factory.mktemp("sims") / "apns")
    yield sim
    sim.stop()
