"""Session fixtures: the real embedded services, started by the same launcher as `herald up`.

- `stack`: Kafka (Tansu), Redis and the ClickHouse server on free ports, migrations applied,
  for the whole session (no simulators, no jobs: tests start the processes they exercise).
- `settings`: HeraldSettings for one test: its own topic prefix (every topic of
  herald/topics.toml created under it) and its own file-backed schema registry.
- `mark_users_restored`: what the users job (dataflows/users.py) says once the Redis copies hold
  every user, for tests that run the API without that job (every user they have is written
  through the API, so its copies do hold them).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from herald.config import (
    ClickHouseSettings,
    HeraldSettings,
    KafkaSettings,
    RedisSettings,
    RegistrySettings,
    RunSettings,
)
from infra.services import CORE_SERVICES, Ctx
from infra.stack import Stack


class RunningStack:
    """The embedded services of a test session and the settings that reach them."""

    def __init__(self, stack: Stack, ctx: Ctx) -> None:
        self.stack = stack
        self.ctx = ctx
        env = ctx.child_env()
        self.env = env
        self.settings = HeraldSettings(
            kafka=KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"]),
            redis=RedisSettings(url=env["HERALD_REDIS_URL"]),
            clickhouse=ClickHouseSettings(dsn=env["HERALD_CLICKHOUSE_DSN"]),
            registry=RegistrySettings(
                url=env.get("HERALD_REGISTRY_URL") or None,
                path=Path(env["HERALD_REGISTRY_PATH"]),
            ),
            run=RunSettings(run_dir=ctx.run_dir),
        )


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C stops every lane of `make test`: the lane the Makefile starts in the background
    inherits SIGINT ignored (a non-interactive shell's rule for background commands), so it
    would run on, whole stacks included, after the others stopped. Python's own handler turns
    SIGINT into KeyboardInterrupt again, and pytest then tears the stacks down."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    run_dir = tmp_path_factory.mktemp("herald-run")
    launcher = Stack(run_dir, services=CORE_SERVICES, jobs=[])
    ctx = launcher.start()
    try:
        yield RunningStack(launcher, ctx)
    finally:
        launcher.stop()


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


def mark_users_restored(redis_url: str, topic_prefix: str) -> None:
    """The marker the users job sets once the Redis copies hold every user (herald/keys.py)."""
    import redis

    from herald import keys

    client = redis.Redis.from_url(redis_url)
    try:
        client.set(keys.users_restored(topic_prefix), 0)
    finally:
        client.close()


@pytest.fixture
def settings(stack: RunningStack, tmp_path: Path) -> HeraldSettings:
    """Settings for one test: unique topic prefix with every topic created, own registry."""
    from infra.topics import create_topics

    kafka = stack.settings.kafka.model_copy(update={"topic_prefix": unique_prefix()})
    create_topics(kafka)
    return stack.settings.model_copy(
        update={"kafka": kafka, "registry": RegistrySettings(path=tmp_path / "registry")}
    )


def child_env(settings: HeraldSettings) -> dict[str, str]:
    """Environment for a subprocess (a Bytewax job, the API) that should use `settings`, as
    `herald up` gives its own processes (embedded: development defaults allowed)."""
    env = {
        "HERALD_EMBEDDED": "1",
        "HERALD_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "HERALD_KAFKA_TOPIC_PREFIX": settings.kafka.topic_prefix,
        "HERALD_REDIS_URL": settings.redis.url,
        "HERALD_CLICKHOUSE_DSN": settings.clickhouse.dsn,
        "HERALD_CLICKHOUSE_DATABASE": settings.clickhouse.database,
        "HERALD_REGISTRY_PATH": str(settings.registry.path),
        "HERALD_RUN_DIR": str(settings.run.run_dir),
    }
    return env


@pytest.fixture
def subprocess_env(settings: HeraldSettings) -> dict[str, str]:
    """os.environ plus `child_env(settings)`: pass as `env=` to a job started by a test."""
    import os

    return {**os.environ, **child_env(settings)}


# Provider simulators as real processes, started only by the tests that ask for them.
from tests.simulator_fixtures import (  # noqa: E402, F401 - pytest finds fixtures by name
    apns,
    apns_proc,
    email,
    email_proc,
    fcm,
    fcm_proc,
    recorder,
    sms_a,
    sms_a_proc,
    sms_b,
    sms_b_proc,
)

_SERVICE_FIXTURES = frozenset({"stack", "settings", "e2e", "api", "subprocess_env"})


# The tests that run whole stacks (`herald up`, 30 processes). `make test` runs them after the
# parallel lane: those with a stack of their own (fault injection; two processes per job with
# the demo) one at a time, beside the end-to-end package on its shared stack. Their waits are
# bounded generously and their timing checks have margins for a busy machine (OTP p99 under
# 2 s during a flood). All three lanes at once failed six fresh-clone runs of eight: tests that
# hold a wall-clock bound or a rate (README "Tests").
_WHOLE_STACK = (
    "tests/e2e/",  # the shared end-to-end stack (tests/e2e/conftest.py)
    "tests/e2e_faults/",
    # two processes per job, with the demo on them: the demo needs a stack of the default
    # settings (on the end-to-end stack, whose circuit breakers never open, its failover scene
    # cannot pass)
    "tests/infra/test_scaleout.py::test_two_processes_per_job_pass_every_demo_scene",
)


# The modules that take longest (seconds of test time on a fresh clone, 2026-12-04), started
# first: pytest-xdist hands a worker one module at a time in collection order (`make test`
# passes --no-loadscope-reorder), so the slowest start first and the workers finish together
# instead of one worker running a long module alone at the end (the digest storm waits 90 s).
_SLOWEST_FIRST = (
    "tests/dataflows/test_digest.py",  # 108
    "tests/dataflows/test_plan_jobs.py",  # 59
    "tests/dataflows/test_plan.py",  # 35
    "tests/dataflows/test_users.py",  # 35
    "tests/dataflows/test_receipts.py",  # 34
    "tests/dataflows/test_acceptance_dst.py",  # 32 (on the end-to-end stack until 2026-12-04)
    "tests/dataflows/test_schedule.py",  # 26
    "tests/infra/test_replay.py",  # 25
    "tests/dataflows/test_dispatch.py",  # 21
    "tests/bench/test_report.py",  # 19
    "tests/infra/test_dlq.py",  # 18
    "tests/api/test_schemathesis.py",  # 18
    "tests/herald/test_shaping.py",  # 18
    "tests/api/test_security.py",  # 17
    "tests/sinks/test_kafka_sink.py",  # 16
    "tests/api/test_bad_input.py",  # 15
)


def _slowest_first(item: pytest.Item) -> int:
    module = item.nodeid.split("::", 1)[0]
    return _SLOWEST_FIRST.index(module) if module in _SLOWEST_FIRST else len(_SLOWEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that reaches the embedded services (a session fixture among its fixtures,
    or a test under tests/e2e*) is `integration`; `make test-fast` runs the others. The tests
    that run whole stacks are also `whole_stack` (above). The slowest modules go first
    (`_SLOWEST_FIRST`; the others keep their order)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _SERVICE_FIXTURES or "/tests/e2e" in str(item.path):
            item.add_marker(pytest.mark.integration)
        if item.nodeid.startswith(_WHOLE_STACK):
            item.add_marker(pytest.mark.whole_stack)
    items.sort(key=_slowest_first)  # stable: within a module and among the rest, as collected
