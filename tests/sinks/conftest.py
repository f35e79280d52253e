"""What the dispatch sink tests share: the session stack's Redis URL (a fresh APNs simulator per
test is tests/simulator_fixtures.py's `apns`)."""

from __future__ import annotations

import pytest

from tests.conftest import RunningStack


@pytest.fixture
def url(stack: RunningStack) -> str:
    return stack.settings.redis.url
