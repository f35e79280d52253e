"""plan: notification requests of one traffic class -> Deliveries, held deliveries and events.

    herald.requests.{class} --requests_in--> audience batches of <= 1,000 users
        -> spread over the job's workers
        -> each user with their preferences and contact points: the Redis copies the users job
           and the API keep (dataflows/_user_copies.py; one MGET per chunk of users)
        -> per user x channel: catalog, cancel (herald.controls), opt-outs, availability,
           quiet hours, caps, expiry, rendering, fallback (herald.policy via
           herald.plan_records); users planned alike (same preferences and kinds of contact
           points) get their records from a template made from one of them
           (dataflows/plan/planned_alike.py)
        -> Delivery on herald.deliveries.{channel}.{class} (PLANNED), or on herald.scheduled
           with not_before (SCHEDULED), or nothing (SUPPRESSED / EXPIRED with the reason);
           every decision is a delivery_event on herald.delivery-events
    bad records (undecodable, unknown type, missing params, bad time zone...) -> herald.dead-letters

Run one process per class, so a bulk backlog never delays transactional planning:

    python -m bytewax.run "dataflows.plan:build_flow(traffic_class='transactional')"
    python -m bytewax.run "dataflows.plan:build_flow(traffic_class='normal')"
    python -m bytewax.run "dataflows.plan:build_flow(traffic_class='bulk')"

(settings from HERALD_* and HERALD_PLANNING_* env vars; add `-r DIR -s 1` for recovery,
`-i/-a` for several processes.)

Where state lives and why it is safe to replay (every output is at-least-once):
- request offsets and segment expansions (batch number + keyset cursor): source snapshots
  (dataflows/plan/request_source.py); audiences: ClickHouse `segment_members`
  (dataflows/plan/audience.py);
- users' state: the Redis copies, kept equal to the compacted herald.preferences /
  herald.devices changelogs by the users job (dataflows/users.py) and written by the API before
  it answers. The job holds no user table: a (re)started process plans at once whatever the
  number of users, and its memory does not grow with them. While the copies are being restored
  (Redis lost its data) planning waits for them (`users:{prefix}:restored`);
- request dedup and frequency caps: Redis, replay-safe by origin and per-notification markers
  (dataflows/_redis.py); a replayed request yields the same delivery_ids and event_ids, which
  the dispatch send guard and the ClickHouse table deduplicate.
A preference change applies to every user planned after the API answered it (read-your-writes:
the copy is written before the answer); deliveries already planned or held are re-checked by
dispatch just before sending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeGuard, cast

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from bytewax.operators import BranchOut

from dataflows._common import produce_with_dead_letters
from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._redis import redis_client
from dataflows._settings import Clock, PlanningSettings, entry_settings
from dataflows.plan.audience import ClickHouseAudience
from dataflows.plan.planner import Admission, Planner
from dataflows.plan.request_source import RequestSource
from herald.catalog import TRAFFIC_CLASSES, Catalog, load_catalog
from herald.config import HeraldSettings, TenantsFile
from herald.controls import PlanControls
from herald.planning import AudienceBatch
from herald.tenants import TenantTypes
from schemas.registry import SchemaRegistry, make_registry
from schemas.serde import AvroDeserializer
from sinks.kafka import KafkaProducerSink, RecordBatch, batch_records

__all__ = ["build_flow"]

JOB = "plan"
DeadLetter = dict[str, Any]
# The transactional job's records leave at once: its epoch flush comes later, so the producer's
# default linger (5 ms, for campaigns' batches) would be added to every OTP's path to dispatch.
NO_LINGER = {"linger.ms": 0}


def _is_batch(item: Any) -> TypeGuard[AudienceBatch]:
    return isinstance(item, AudienceBatch)


def _is_records(item: Any) -> TypeGuard[RecordBatch]:
    return isinstance(item, RecordBatch)


CHUNK_USERS = 2000


def _chain(
    planner: Planner,
    steps: tuple[Callable[[list[Any]], list[Any]], ...],
    batch: list[Any],
) -> list[Any]:
    """The planner and then batch `steps` applied in order within one Bytewax step: the items
    of a campaign cross the Python/Rust boundary once instead of once per step (about half the
    plan job's per-record dataflow overhead).

    A batch can hold a whole campaign burst (100k users in the benchmark); the steps run on
    chunks of about `CHUNK_USERS` users, so each chunk's intermediate objects (decisions, cap
    charges, records) are freed before the next chunk instead of being scanned by the garbage
    collector again and again (it took 15% of the job's time on that burst). A chunk takes the
    audience batches request by request, so the users of a request are planned together and
    share their records' prototypes (herald.plan_records.Prototypes) and templates
    (dataflows/plan/planned_alike.py).

    Redis answers while this process plans: the next chunk's users' state is fetched while a
    chunk is planned, and a chunk is finished (its cap charges' answers
    awaited) after the next one is planned. Waiting for them took 15% of a campaign's time."""
    out: list[Any] = []
    chunks = iter(_chunks(batch))
    first = next(chunks, None)
    fetched = None if first is None else planner.fetch(first)
    pending: Callable[[], list[Any]] | None = None
    while fetched is not None:
        current = fetched
        following = next(chunks, None)
        fetched = None if following is None else planner.fetch(following)
        started = planner.start(current)
        if pending is not None:
            out.extend(_steps(steps, pending()))
        pending = started
    if pending is not None:
        out.extend(_steps(steps, pending()))
    return out


def _steps(steps: tuple[Callable[[list[Any]], list[Any]], ...], items: list[Any]) -> list[Any]:
    for step in steps:
        items = step(items)
    return items


def _chunks(batch: list[AudienceBatch]) -> Iterator[list[AudienceBatch]]:
    """The audience batches request by request (first come first), in chunks of >=
    CHUNK_USERS users."""
    by_request: dict[str, list[AudienceBatch]] = {}
    for item in batch:
        by_request.setdefault(item.request.notification_id, []).append(item)
    chunk: list[AudienceBatch] = []
    users = 0
    for items in by_request.values():
        for item in items:
            chunk.append(item)
            users += len(item.users)
            if users >= CHUNK_USERS:
                yield chunk
                chunk, users = [], 0
    if chunk:
        yield chunk


@dataclass(frozen=True)
class _Parts:
    """What the input halves of the flow need (built once in `build_flow`)."""

    settings: HeraldSettings
    planning: PlanningSettings
    catalog: Catalog
    clock: Clock
    registry: SchemaRegistry


def _tasks(flow: Dataflow, p: _Parts, traffic_class: str, bounded: bool) -> BranchOut[Any, Any]:
    """Requests -> `.trues` audience batches, `.falses` dead letters."""
    kafka = p.settings.kafka
    source = RequestSource(
        kafka, kafka.topic(f"herald.requests.{traffic_class}"),
        deserializer=AvroDeserializer(p.registry, "notification_request"),
        admit=Admission(p.catalog, p.settings, p.planning.request_dedup_ttl_seconds, p.clock,
                        TenantTypes.load(TenantsFile().tenants_file)),
        audience=partial(ClickHouseAudience, p.settings.clickhouse),
        controls=lambda: PlanControls(redis_client(p.settings.redis)),
        batch_size=p.planning.audience_batch_size,
        fanout_batches_per_second=p.planning.fanout_batches_per_second, bounded=bounded,
    )  # fmt: skip
    requests = op.input("requests_in", flow, source)
    # AudienceBatch | dead_letter dict
    return op.branch("split_requests", requests, _is_batch)


def build_flow(
    settings: HeraldSettings | None = None,
    *,
    traffic_class: str = "normal",
    planning: PlanningSettings | None = None,
    bounded: bool = False,
) -> Dataflow:
    """The plan job of one traffic class. Without `settings` (entry point) it reads the
    environment, configures logging and serves /metrics. `bounded=True` stops at the current end
    of every input (tests, benchmarks)."""
    if traffic_class not in TRAFFIC_CLASSES:
        raise ValueError(f"traffic_class must be one of {TRAFFIC_CLASSES}, got {traffic_class!r}")
    job_process = settings is None  # the producers are made at start in a job process only
    settings = entry_settings(settings)
    planning = planning if planning is not None else PlanningSettings()
    p = _Parts(
        settings, planning, load_catalog(planning.catalog_path), planning.clock(),
        make_registry(settings.registry),
    )  # fmt: skip
    flow = Dataflow(f"plan_{traffic_class}")
    split = _tasks(flow, p, traffic_class, bounded)
    # a campaign's audience batches over every worker (of every process)
    batches = op.redistribute("spread", split.trues)
    encoder = Encoder(settings, p.registry, JOB, p.catalog.secret_types)
    count = CountOutputs(JOB, dead_letters=False)
    planner = Planner(p.catalog, settings, p.clock, encoder, count, planning.state_cache_users)
    # -> Output | KafkaRecord | dead_letter dict
    steps = (
        encoder,  # -> KafkaRecord | dead_letter dict
        batch_records,  # -> one RecordBatch (the chunk's records) | dead_letter dict
    )
    records = op.flat_map_batch("plan", batches, partial(_chain, planner, steps))
    # RecordBatch | dead_letter dict
    encoded = op.branch("split_records", records, _is_records)
    falses = (cast(Stream[DeadLetter], s.falses) for s in (split, encoded))
    dead_letters = op.merge("dead_letters", *falses)
    # dead_letter dict
    letters = op.flat_map_batch("count_dead_letters", dead_letters, CountOutputs(JOB))
    # the same dead_letter dicts
    produce_with_dead_letters(
        "kafka_out", encoded.trues, letters, settings=settings, registry=p.registry,
        sink=KafkaProducerSink(
            settings.kafka, parts=4, warm=job_process,
            producer_config=NO_LINGER if traffic_class == "transactional" else None,
        ),
    )  # fmt: skip
    return flow
