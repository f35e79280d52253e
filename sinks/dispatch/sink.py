"""The channel sink: decoded deliveries in, provider calls out, their outcomes to Kafka.

    DispatchSink(settings, dispatch, factories=None, hook=None)    Bytewax DynamicSink
        items: sources.kafka.Decoded (KafkaMessage + Delivery dict)

Each worker builds one partition that owns: an asyncio event loop in its own thread with the
provider clients on it (sinks/dispatch/loop.py, clients.py), one sync Redis client shared by the
send guard, rate shaper, circuit breaker and contact store, and one idempotent Kafka producer
(sinks.kafka). `write_batch` runs the batch through `sinks.dispatch.engine.Dispatcher` (guard →
re-checks → breaker → shaping → send → decide), then produces the delivery events, retry
records and dead letters and **returns only after Kafka acknowledged all of them**, so Bytewax
never commits an epoch whose outcomes are not durable; token cleanups and dead addresses are
published (acked) and written to the API's Redis copy in the same call.

Why a DynamicSink (one partition per worker, no routing): the records a worker reads are sent by
that worker, without an exchange between workers or processes; the price is one producer flush
per batch (a few ms per ~1000 deliveries).

Guarantees (SPEC §4): a batch re-read after a crash meets the send guards: transactional
deliveries are resent only if the crash fell between the provider's acceptance and the SENT
mark (at most one duplicate per crash, within the PENDING TTL) or before the call (resent after
the PENDING TTL, never lost); bulk ones are never resent (CLAIMED), lost only if the crash fell
between the claim and the provider call. Events are at-least-once with deterministic ids.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import redis
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from herald.breaker import CircuitBreaker
from herald.catalog import Catalog, load_catalog
from herald.config import HeraldSettings, RedisSettings
from herald.controls import DispatchControls, parked_entry
from herald.dispatching import instant
from herald.errors import DeliveryError
from herald.guard import SendGuard
from herald.kafka_records import Decoded
from herald.metrics import JobMetrics
from herald.sealing import Sealer, open_delivery
from herald.shaping import RateShaper
from schemas.registry import make_registry
from sinks.dispatch.clients import Factory, Providers, default_factories
from sinks.dispatch.contacts import ContactStore
from sinks.dispatch.engine import Batch, Dispatcher, Hook
from sinks.dispatch.escalation import EscalationCheck
from sinks.dispatch.fallback import watch_key, watch_ttl
from sinks.dispatch.loop import LoopThread
from sinks.dispatch.records import RecordEncoder, deliveries_topic
from sinks.dispatch.sending import ShapedSender
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.work import DeadLetterOut, Outputs
from sinks.kafka import KafkaProducerSink

__all__ = ["DispatchSink", "redis_client", "utc_now"]

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    """The dispatch clock (aware UTC)."""
    return datetime.now(UTC)


def redis_client(settings: RedisSettings) -> redis.Redis:
    """A sync client for Redis or Redis Cluster (guard, shaper and breaker keys are hash-tagged)."""
    return cast(redis.Redis, settings.client(socket_timeout=10))


class DispatchSink(DynamicSink[Decoded]):
    """Calls providers for every decoded delivery (see the module docstring)."""

    def __init__(
        self,
        settings: HeraldSettings,
        dispatch: DispatchSettings,
        *,
        factories: Mapping[str, Factory] | None = None,
        hook: Hook | None = None,
        catalog: Catalog | None = None,
        warm: bool = False,
    ) -> None:
        self.settings = settings
        self.dispatch = dispatch
        self.factories = dict(factories) if factories is not None else None
        self.hook = hook
        self.catalog = catalog
        # `warm` (a job process): the events' producer is made now. A fresh idempotent
        # producer's first record waits ~0.5 s for its producer id, which the first OTP after a
        # start would otherwise wait (sinks/kafka.py); Bytewax builds this sink's partition on
        # its first delivery.
        self.events = KafkaProducerSink(settings.kafka, warm=warm)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> DispatchPartition:
        """Called once per worker."""
        return DispatchPartition(self, f"{step_id}/w{worker_index}")


class DispatchPartition(StatelessSinkPartition[Decoded]):
    """One worker's clients, loop and producer."""

    def __init__(self, sink: DispatchSink, name: str) -> None:
        settings, cfg = sink.settings, sink.dispatch
        self.name = name
        self.redis = redis_client(settings.redis)
        catalog = sink.catalog or load_catalog(cfg.catalog_path)
        prefix = cfg.state_prefix
        self.guard = guard = SendGuard(
            self.redis, pending_ttl_s=cfg.pending_ttl_s, sent_ttl_s=cfg.sent_ttl_s,
            prefix=prefix, lease_ttl_s=cfg.lease_ttl_s,
            seat=f"{settings.kafka.topic_prefix}{name}",
        )  # fmt: skip
        default, overrides = cfg.breaker_config()
        self.breaker = CircuitBreaker(self.redis, default, overrides=overrides, prefix=prefix)
        shaper = RateShaper(self.redis, cfg.provider_rates(), prefix=prefix)
        self.loop = LoopThread(f"dispatch-{name}")
        factories = sink.factories or default_factories(settings.redis.url)
        self.providers = Providers(self.loop, factories)
        sender = ShapedSender(self.providers, shaper, frozenset(cfg.rates),
                              max_wait_s=cfg.shape_max_wait_s, clock=utc_now,
                              recheck_s=cfg.control_recheck_s)  # fmt: skip
        self.contacts = ContactStore(self.redis, cluster=settings.redis.cluster)
        seat = f"{settings.kafka.topic_prefix}{name}"
        self.controls = DispatchControls(self.redis, seat, cfg.control_lease_s)
        self.dispatcher = Dispatcher(
            cfg, catalog, guard, self.breaker, sender, self.contacts, clock=utc_now,
            metrics=JobMetrics("dispatch"), hook=sink.hook, pii_key=settings.pii.key_bytes(),
            controls=self.controls, escalations=EscalationCheck(self.redis, catalog),
        )  # fmt: skip
        registry = make_registry(settings.registry)
        self.encoder = RecordEncoder(settings, registry, catalog.secret_types)
        self.sealer = Sealer(self.redis)  # a secret type's content, opened just before the send
        self.producer = sink.events.build_writer(f"dispatch-{name}", "part-0")
        self.max_slice = cfg.max_slice
        self._closed = False

    def write_batch(self, items: list[Decoded]) -> None:
        """Dispatch the batch; return once every output is acknowledged by Kafka.

        Large batches are dispatched in slices of `max_slice`: a slice's own work (guard,
        re-checks, encoding) is the gap between two slices' token grants, and a short gap is
        absorbed by the bucket depth, so a saturated budget is used in full.
        """
        started = time.perf_counter()
        events = retries = 0
        for i in range(0, len(items), self.max_slice):
            batch, unreadable = self._opened(items[i : i + self.max_slice])
            out = self.dispatcher.dispatch(batch)
            out.dead_letters.extend(unreadable)
            self.producer.submit(self.encoder.encode(out))
            self._cleanups(out)
            self._watch(out.watched)
            self._park(out.parked)
            events, retries = events + len(out.events), retries + len(out.retries)
        self.producer.flush()
        ms = (time.perf_counter() - started) * 1000
        log.debug("dispatch.batch n=%d events=%d retries=%d ms=%.1f",
                  len(items), events, retries, ms)  # fmt: skip

    def _opened(self, part: list[Decoded]) -> tuple[Batch, list[DeadLetterOut]]:
        """The deliveries with a secret type's sealed content opened (herald/sealing.py). One
        whose content is gone goes on as it is when it has expired (the engine ends it
        EXPIRED, before any send), else becomes a dead letter with the reason."""
        batch: list[tuple[Any, dict[str, Any]]] = []
        unreadable: list[DeadLetterOut] = []
        now = utc_now()
        for d in part:
            value = d.value
            if value.get("sealed") is not None:
                opened, why = open_delivery(self.sealer, value)
                if opened is None:
                    expire_at = instant(value.get("expire_at"))
                    if expire_at is None or expire_at > now:
                        unreadable.append(DeadLetterOut(d.message, value, str(why)))
                        continue
                else:
                    value = opened
            batch.append((d.message, value))
        return batch, unreadable

    def _cleanups(self, out: Outputs) -> None:
        now = utc_now()
        for user_id, token in out.cleanups:
            result = self.contacts.remove_token(user_id, token, self._publish_devices, now)
            log.info("dispatch.token_cleanup result=%s", result)
        for user_id, channel, address in out.disables:
            result = self.contacts.disable_address(
                user_id, channel, address, self._publish_devices, now
            )
            log.info("dispatch.address_disable channel=%s result=%s", channel, result)

    def _watch(self, deliveries: list[dict[str, Any]]) -> None:
        """Keep accepted deliveries with a cross-channel step for a late failure (one
        pipelined round trip; sinks/dispatch/fallback.py)."""
        if not deliveries:
            return
        now = utc_now()
        pipe = self.redis.pipeline(transaction=False)
        for d in deliveries:
            value = self.encoder.serializer(deliveries_topic(d["channel"], d["traffic_class"]))(d)
            pipe.set(watch_key(d["delivery_id"]), value, ex=watch_ttl(d, now))
        pipe.execute()

    def _park(self, deliveries: list[dict[str, Any]]) -> None:
        """Park the deliveries of paused notifications (herald.controls); one whose
        notification was resumed or cancelled meanwhile goes back to its topic instead."""
        if not deliveries:
            return
        entries = []
        for d in deliveries:
            logical = deliveries_topic(d["channel"], d["traffic_class"])
            value = self.encoder.serializer(logical)(self.encoder.kept(d))
            entries.append((d["notification_id"], parked_entry(logical, d["delivery_id"], value)))
        parked = self.controls.park(entries)
        back = [d for d, ok in zip(deliveries, parked, strict=True) if not ok]
        if back:
            self.producer.submit(self.encoder.encode(Outputs(deliveries=back)))

    def _publish_devices(self, user_id: str, record: dict[str, Any]) -> None:
        """Produce the new contact points and wait for the ack (before the Redis copy)."""
        self.producer.submit([self.encoder.device_record(user_id, record)])
        self.producer.flush()

    def close(self) -> None:
        """Flush everything, close the clients, the loop, the producer and Redis."""
        if self._closed:
            return
        self._closed = True
        try:
            self.breaker.flush()
        except redis.RedisError as exc:
            log.warning("dispatch.breaker_flush_failed error=%s", type(exc).__name__)
        self.providers.close()
        self.loop.close()
        self.guard.close()
        try:
            self.producer.flush()
        except DeliveryError:
            log.error("dispatch.close_flush_failed partition=%s", self.name)
            raise
        finally:
            self.producer.release()
            self.redis.close()
