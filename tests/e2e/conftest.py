"""The full embedded stack, started once for the end-to-end tests with `herald up --detach`.

`e2e` yields an `E2EStack`: the run directory and a `StackClient` (infra/stackclient.py) on
the running stack. The stack is started as a user would (the CLI, in its own run directory,
24 processes) and stopped with `herald down`, which must leave no process and no listening port
behind (checked at teardown); whatever is still alive afterwards is killed by pid from
state.json all the same, so nothing outlives the session even when a test or the start fails.

The stack gets a few knobs through the environment (`E2E_ENV`), each to make a scenario
observable within seconds instead of minutes; none changes what is being checked:

- schedule jitter 2 s (default 120 s): a held delivery is released within seconds of send_at;
- provider call timeout 3 s (default 10 s): an accepted-then-silent provider call becomes
  UNKNOWN quickly, and its provider is asked about it 3 s later (default 15 s);
- transactional backoff base 0.5 s, cap 4 s, 4 attempts: a retry wave and a dead letter within
  seconds (full jitter and Retry-After as a floor are unchanged);
- the FCM budget 800/s: the bulk flood is shaped to a rate the test can check at the simulator;
- circuit breakers need 100k calls in their window: injected error rates test retries and
  spread, not the breaker (tested in tests/sinks).

Its catalog is herald/catalog.toml with two types added (`catalog_extra.toml`): routes from and
to the third SMS provider, which no default type uses.

`pool` hands out users onboarded once through the API (tests/e2e/_helpers.py `UserPool`).
Modules run in name order; the load scenarios (test_acceptance_under_load.py) come late, so a
flood still draining cannot delay another test's bulk send. Each scenario prints its figures
(`pytest -s`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.process import pid_alive, port_open
from infra.stackclient import StackClient
from tests.e2e._helpers import QuietSend, UserPool, send_into_quiet_hours
from tests.e2e._stack import (
    E2EStack,
    herald_cli,
    kill_leftovers,
    leftovers,
    stack_pids,
    start_stack,
)

POOL_SIZE = 160
# A file touched once the stack is up and its users onboarded, for whoever waits on that
# (`make test` starts its lane of whole stacks then, so that two stacks do not start at once)
READY_FILE_ENV = "HERALD_TEST_E2E_READY_FILE"


@pytest.fixture(scope="package")
def e2e() -> Iterator[E2EStack]:
    """The full stack for the tests of this package; stopped (and every process gone) after the
    last of them, so its 24 idle processes don't load the rest of the suite.

    Its run directory is made with tempfile, not pytest's tmp_path_factory: other pytest
    sessions on this machine prune pytest's numbered temp directories while this one runs."""
    run_dir = Path(tempfile.mkdtemp(prefix="herald-e2e-"))
    seen: set[int] = set()
    ports: set[int] = set()

    def remember() -> None:
        pids, known_ports = stack_pids(run_dir)
        seen.update(pids)
        ports.update(known_ports)

    try:
        start_stack(run_dir)
        # 30 s per request, not 10: this stack shares two cores with the lane of stacks of
        # their own, and a request right after the start once waited longer than 10 s (tests
        # that judge latency measure it themselves)
        client = StackClient.from_run_dir(run_dir, timeout=30.0)
        try:
            yield E2EStack(run_dir, client)
        finally:
            remember()
            client.close()
    finally:
        remember()
        down = herald_cli("down", run_dir=run_dir, timeout=180)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = leftovers(list(seen), list(ports), run_dir)
        kill_leftovers(list(seen), list(ports), run_dir)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not left, f"herald down left {len(left)} of the stack's processes running: {left}"
        assert not any(port_open("127.0.0.1", port) for port in ports), "a port still listens"
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="package")
def pool(e2e: E2EStack) -> UserPool:
    """Users with a verified phone and email, known to the plan jobs (see UserPool)."""
    return UserPool(e2e.client, POOL_SIZE)


@pytest.fixture(scope="package", autouse=True)
def quiet_send(e2e: E2EStack, pool: UserPool) -> QuietSend:
    """A send into a user's quiet hours, made before the package's first test: the window ends
    a minute or two later, and test_acceptance_time_consent (named to run after the modules that
    cover that window, none of which resets the email simulator whose log it reads) checks the
    release without waiting for the window on its own."""
    (user,) = pool.take(1)
    sent = send_into_quiet_hours(e2e.client, user)
    ready = os.environ.get(READY_FILE_ENV)
    if ready:  # `make test`: the lane of stacks of their own starts now (see the Makefile)
        Path(ready).touch()
    return sent
