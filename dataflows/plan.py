"""plan: notification requests of one traffic class -> Deliveries, held deliveries and events.

    herald.requests.{class}           --requests_in--> audience batches of <= 1,000 users
    herald.preferences, herald.devices --users_in----> the user table (keyed by user shard)
        -> per user x channel: catalog, opt-outs, availability, quiet hours, caps, expiry,
           rendering, fallback (herald.policy via herald.plan_records)
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
  (dataflows/_requests.py); audiences: ClickHouse `segment_members` (dataflows/_audience.py);
- the user table: rebuilt from the compacted topics on start, planning waits until they are
  caught up (dataflows/_users.py); keyed by crc32(user_id) shard, so correct across processes;
- request dedup and frequency caps: Redis, replay-safe by origin and per-notification markers
  (dataflows/_redis.py); a replayed request yields the same delivery_ids and event_ids, which
  the dispatch send guard and the ClickHouse table deduplicate.
A preference change applies to every user planned after it; deliveries already planned or held
are re-checked by dispatch just before sending.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, TypeGuard, cast

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream

from dataflows._audience import ClickHouseAudience
from dataflows._changelog import ChangelogSource
from dataflows._common import produce_with_dead_letters
from dataflows._encode import Encoder
from dataflows._metrics import CountOutputs
from dataflows._planner import Admission, Planner
from dataflows._requests import RequestSource
from dataflows._settings import PlanningSettings
from dataflows._users import ChangelogDecoder, UserShardLogic, to_shards
from herald.catalog import TRAFFIC_CLASSES, load_catalog
from herald.config import HeraldSettings
from herald.metrics import MetricsSettings, serve_metrics
from herald.planning import AudienceBatch, CaughtUp, TableUpdate, split_by_shard
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.kafka import KafkaProducerSink, KafkaRecord

__all__ = ["build_flow"]

JOB = "plan"
DeadLetter = dict[str, Any]
PREFERENCES_TOPIC = "herald.preferences"
DEVICES_TOPIC = "herald.devices"


def _is_batch(item: Any) -> TypeGuard[AudienceBatch]:
    return isinstance(item, AudienceBatch)


def _is_table_item(item: Any) -> TypeGuard[TableUpdate | CaughtUp]:
    return isinstance(item, TableUpdate | CaughtUp)


def _is_record(item: Any) -> TypeGuard[KafkaRecord]:
    return isinstance(item, KafkaRecord)


def build_flow(
    settings: HeraldSettings | None = None,
    *,
    traffic_class: str = "normal",
    planning: PlanningSettings | None = None,
    bounded: bool = False,
) -> Dataflow:
    """The plan job of one traffic class. Without `settings` (entry point) it reads the
    environment and configures logging. `bounded=True` stops at the current end of every input
    (tests, benchmarks)."""
    if traffic_class not in TRAFFIC_CLASSES:
        raise ValueError(f"traffic_class must be one of {TRAFFIC_CLASSES}, got {traffic_class!r}")
    if settings is None:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        settings = HeraldSettings()
        serve_metrics(MetricsSettings())
    planning = planning if planning is not None else PlanningSettings()
    catalog = load_catalog(planning.catalog_path)
    clock = planning.clock()
    registry = make_registry(settings.registry)
    kafka = settings.kafka
    flow = Dataflow(f"plan_{traffic_class}")

    source = RequestSource(
        kafka, kafka.topic(f"herald.requests.{traffic_class}"),
        deserializer=AvroDeserializer(registry, "notification_request"),
        admit=Admission(catalog, settings, planning.request_dedup_ttl_seconds, clock),
        audience=partial(ClickHouseAudience, settings.clickhouse),
        batch_size=planning.audience_batch_size,
        fanout_batches_per_second=planning.fanout_batches_per_second, bounded=bounded,
    )  # fmt: skip
    requests = op.input("requests_in", flow, source)
    # AudienceBatch | dead_letter dict
    split = op.branch("split_requests", requests, _is_batch)
    tasks = op.flat_map(
        "fan_out", split.trues, partial(split_by_shard, shards=planning.user_shards)
    )
    # (shard, UserTasks)

    changelog = ChangelogSource(
        kafka, [kafka.topic(PREFERENCES_TOPIC), kafka.topic(DEVICES_TOPIC)], bounded=bounded
    )
    changes = op.input("users_in", flow, changelog)
    # KafkaMessage | CaughtUp
    decoded = op.map(
        "decode_users",
        changes,
        ChangelogDecoder(AvroDeserializer(registry), kafka.topic(PREFERENCES_TOPIC)),
    )
    # TableUpdate | CaughtUp | dead_letter dict
    updates = op.branch("split_users", decoded, _is_table_item)
    routed = op.flat_map(
        "route_users", updates.trues, partial(to_shards, shards=planning.user_shards)
    )
    # (shard, TableUpdate | CaughtUp)

    merged = op.merge("to_users", tasks, routed)
    # (shard, UserTasks | TableUpdate | CaughtUp)
    parts = frozenset(changelog.list_parts())
    planned = op.stateful_batch("users", merged, partial(UserShardLogic, parts))
    # (shard, Planned)
    outputs = op.flat_map_batch("plan", planned, Planner(catalog, settings, clock))
    # Output(topic, delivery_id, Delivery | delivery_event dict) | dead_letter dict
    counted = op.flat_map_batch("count_events", outputs, CountOutputs(JOB, dead_letters=False))
    # the same items
    records = op.flat_map_batch("encode", counted, Encoder(settings, registry, JOB))
    # KafkaRecord | dead_letter dict
    encoded = op.branch("split_records", records, _is_record)
    dead_letters = op.merge(
        "dead_letters", *(cast(Stream[DeadLetter], s.falses) for s in (split, updates, encoded))
    )
    # dead_letter dict
    letters = op.flat_map_batch("count_dead_letters", dead_letters, CountOutputs(JOB))
    # the same dead_letter dicts
    sink = KafkaProducerSink(kafka, parts=4)
    produce_with_dead_letters(
        "kafka_out", encoded.trues, letters, kafka=kafka, registry=registry, sink=sink
    )
    return flow
