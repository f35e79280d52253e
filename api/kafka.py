"""An asyncio-friendly Kafka producer: `await produce(...)` returns once the broker acked.

One `confluent_kafka.Producer` (acks=all, idempotence on) is polled by a daemon thread. Its
delivery callbacks run in that thread; they are collected per poll and handed to the event loop
in one `call_soon_threadsafe`, which resolves each request's future with the (partition, offset)
or a `DeliveryError`. So a coroutine awaiting `produce()` resumes only after the delivery report
confirmed the write: this is what lets the API answer 202 only for durable requests.

Failure modes, all raised as `DeliveryError` (the API answers 503): the broker refused the record,
`message.timeout.ms` expired (broker down), the local queue is full, or no report came within
`timeout` seconds of the call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from herald.config import KafkaSettings
from herald.errors import DeliveryError

log = logging.getLogger(__name__)

API_PRODUCER_CONFIG: dict[str, str | int | bool] = {
    "acks": "all",
    "enable.idempotence": True,
    # No linger: a lone request goes out at once (p50 ack ~0.6 ms instead of ~1.8 ms with 1 ms);
    # under load records still batch while earlier requests are in flight.
    "linger.ms": 0,
    "batch.num.messages": 1000,
    "queue.buffering.max.messages": 100_000,
    "message.timeout.ms": 5000,
    "request.timeout.ms": 4000,
    "allow.auto.create.topics": False,
    "socket.keepalive.enable": True,
}

_Pending = tuple[asyncio.Future[tuple[int, int]], KafkaError | None, int, int]


class AsyncProducer:
    """Idempotent producer for coroutines; `start()` in the app's loop, `close()` on shutdown."""

    def __init__(
        self, kafka: KafkaSettings, overrides: Mapping[str, str | int | bool] | None = None
    ) -> None:
        self.config: dict[str, Any] = {
            **kafka.client_config(),
            **API_PRODUCER_CONFIG,
            "client.id": "herald-api",
            **(overrides or {}),
        }
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._batch: list[_Pending] = []
        self._fatal: KafkaError | None = None
        self.default_timeout = int(self.config["message.timeout.ms"]) / 1000 + 1.0

    def start(self) -> None:
        """Create the client and its poll thread (call from the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._producer = Producer({**self.config, "error_cb": self._on_error})
        self._thread = threading.Thread(target=self._poll, name="herald-api-kafka", daemon=True)
        self._thread.start()

    def _on_error(self, err: KafkaError) -> None:
        # Runs in the poll thread. A fatal error (e.g. PRODUCER_FENCED after a request timed out
        # on a starved broker) leaves an idempotent producer refusing every later record.
        if err.fatal():
            self._fatal = err

    def _replace_if_fatal(self) -> None:
        """librdkafka's remedy for a fatal error: fail what is queued, make a new producer."""
        old, err = self._producer, self._fatal
        if old is None or err is None:
            return
        log.error("api.producer_fatal error=%s; replacing the producer", err.name())
        self._fatal = None
        self._producer = Producer({**self.config, "error_cb": self._on_error})
        old.purge()  # in-flight records fail now (503, the caller retries); none is lost
        old.poll(0)

    def _poll(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._stop.is_set():
            self._replace_if_fatal()
            producer = self._producer
            if producer is None:
                return
            producer.poll(0.05)
            if self._batch:
                batch, self._batch = self._batch, []
                try:
                    loop.call_soon_threadsafe(_resolve_all, batch)
                except RuntimeError:  # loop closed during shutdown
                    return

    def _on_delivery(
        self, fut: asyncio.Future[tuple[int, int]], err: KafkaError | None, msg: Message
    ) -> None:
        # Runs in the poll thread; only collect, the loop resolves.
        self._batch.append((fut, err, msg.partition() or 0, msg.offset() or 0))

    async def produce(
        self, topic: str, key: str | None, value: bytes, timeout: float | None = None
    ) -> tuple[int, int]:
        """Produce and wait for the delivery report; returns (partition, offset)."""
        producer, loop = self._producer, self._loop
        if producer is None or loop is None:
            raise DeliveryError("producer is not started")
        fut: asyncio.Future[tuple[int, int]] = loop.create_future()
        try:
            producer.produce(
                topic, value, key, on_delivery=lambda e, m: self._on_delivery(fut, e, m)
            )
        except BufferError as exc:
            raise DeliveryError("local producer queue is full") from exc
        except KafkaException as exc:
            raise DeliveryError(f"produce refused: {exc.args[0]}") from exc
        try:
            return await asyncio.wait_for(fut, timeout or self.default_timeout)
        except TimeoutError as exc:
            raise DeliveryError(
                f"no delivery report within {timeout or self.default_timeout}s"
            ) from exc

    def produce_nowait(self, topic: str, key: str | None, value: bytes) -> bool:
        """Fire-and-forget (tracking events); False when the local queue refused it."""
        if self._producer is None:
            return False
        try:
            self._producer.produce(topic, value, key, on_delivery=_log_failure)
        except (BufferError, KafkaException):
            return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Flush outstanding records (bounded) and stop the poll thread."""
        if self._producer is not None:
            remaining = self._producer.flush(timeout)
            if remaining:
                log.warning("api.producer_close_unflushed n=%d", remaining)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._producer = None


def _resolve_all(batch: list[_Pending]) -> None:
    for fut, err, partition, offset in batch:
        if fut.done():  # the awaiting request timed out already
            continue
        if err is None:
            fut.set_result((partition, offset))
        else:
            fut.set_exception(DeliveryError(f"delivery failed: {err.name()}"))


def _log_failure(err: KafkaError | None, _msg: Message) -> None:
    if err is not None:
        log.warning("api.fire_and_forget_failed error=%s", err.name())
