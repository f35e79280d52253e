"""The base of the sinks that change users' state from the receipts job.

    UserChangePartition(settings, job, name)   .redis, .producer; flushed and closed together

sinks/addresses.py (dead addresses), sinks/consent.py (opt-outs) and sinks/late_fallback.py
(fallbacks after a late failure) each read and write Redis and produce records they wait for.
"""

from __future__ import annotations

from abc import ABC
from typing import Generic, TypeVar

from bytewax.outputs import StatelessSinkPartition

from herald.config import HeraldSettings
from sinks.dispatch.sink import redis_client
from sinks.kafka import KafkaProducerSink

__all__ = ["UserChangePartition"]

X = TypeVar("X")


class UserChangePartition(StatelessSinkPartition[X], ABC, Generic[X]):
    """A sink partition with a Redis client and a Kafka producer, both flushed and closed with
    the partition."""

    def __init__(self, settings: HeraldSettings, job: str, name: str) -> None:
        self.redis = redis_client(settings.redis)
        self.producer = KafkaProducerSink(settings.kafka).build_writer(job, name)

    def close(self) -> None:
        """Flush the producer, then release it and the Redis client."""
        try:
            self.producer.flush()
        finally:
            self.producer.release()
            self.redis.close()
