"""Late failures: a receipt failed a delivery its provider had accepted; its fallback follows.

    LateFallbackSink(settings, dispatch)   Bytewax sink; items are herald.delivery_fold.LateFailure

An SMS the carrier reports "undelivered", an email that bounces: the failure arrives as a
receipt seconds after dispatch recorded PROVIDER_ACCEPTED. Dispatch kept each accepted delivery
with a cross-channel step under `watch_key` (its Avro Delivery value, until its expiry:
sinks/dispatch/fallback.py); for each late failure this sink reads it and runs the same
`FallbackRouter` dispatch runs at send time, with the user's current preferences and contact
points: the next step of the type's fallback graph, under the same rules (opt-outs, quiet hours,
availability; never after the expiry). Its deliveries go to their deliveries topic, its events
(PLANNED / SCHEDULED, `fallback_cause` receipt:<reason>) to herald.delivery-events; then the
watch key is deleted.

Once: a delivery without a watch key (none kept, already fallen back, expired) changes nothing.
A batch written again after a crash between the produce and the delete produces the same
fallback deliveries (their ids come from the source's), which dispatch's send guard sends once.
A Redis or Kafka failure raises: the job stops and resumes from its snapshot.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from bytewax.outputs import DynamicSink

from herald.catalog import load_catalog
from herald.config import HeraldSettings
from herald.delivery_fold import LateFailure
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sinks.dispatch.contacts import ContactStore
from sinks.dispatch.fallback import FallbackRouter, watch_key
from sinks.dispatch.records import RecordEncoder
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.work import Outputs
from sinks.user_changes import UserChangePartition

__all__ = ["LateFallbackSink"]

log = logging.getLogger(__name__)


class LateFallbackSink(DynamicSink[LateFailure]):
    """Fall back after late failures; one Redis client and one producer per worker."""

    def __init__(self, settings: HeraldSettings, dispatch: DispatchSettings | None = None) -> None:
        self.settings = settings
        self.dispatch = dispatch

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _LatePartition:
        """Called once per worker."""
        return _LatePartition(self.settings, self.dispatch, f"{step_id}/w{worker_index}")


class _LatePartition(UserChangePartition[LateFailure]):
    def __init__(
        self, settings: HeraldSettings, dispatch: DispatchSettings | None, name: str
    ) -> None:
        super().__init__(settings, "late-fallback", name)
        cfg = dispatch if dispatch is not None else DispatchSettings()
        registry = make_registry(settings.registry)
        contacts = ContactStore(self.redis, cluster=settings.redis.cluster)
        catalog = load_catalog(cfg.catalog_path)
        self.router = FallbackRouter(catalog, contacts)
        self.decode = AvroDeserializer(registry)
        self.encoder = RecordEncoder(settings, registry, catalog.secret_types)

    def write_batch(self, items: list[LateFailure]) -> None:
        """Each late failure's fallback, acked by Kafka before its watch key goes."""
        now = datetime.now(UTC)
        done: list[str] = []
        out = Outputs()
        for item in items:
            raw = self.redis.get(watch_key(item.delivery_id))
            if not isinstance(raw, bytes):
                continue  # nothing to fall back to, or done already
            delivery = self.decode(raw)
            fb = self.router.route(delivery, f"receipt:{item.reason}", now)
            FallbackRouter.emit(fb, out)
            done.append(watch_key(item.delivery_id))
            log.info("receipts.late_fallback from=%s to=%s", delivery["channel"], fb.to)
        if not done:
            return
        self.producer.submit(self.encoder.encode(out))
        self.producer.flush()
        self.redis.delete(*done)
