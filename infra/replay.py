"""Replay / backfill: re-drive the records of a topic written in a time range.

    replay(settings, topic, from_ts, to_ts, into=None, progress=None) -> ReplayResult
    replay_cli(settings, topic, from_text, to_text, into=None) -> int    (`herald replay`)

What a replay does depends on the (logical) topic:

    herald.delivery-events, into=None   load the events into ClickHouse delivery_events (rebuild
                                        or backfill the analytics; the views follow)
    herald.dead-letters                 re-drive each dead letter's key/value, unchanged, into
                                        its source topic (or `into`): delivery_id and expire_at
                                        travel inside the value untouched; letters whose
                                        expire_at passed are dropped, letters that are not
                                        replayable (encode_failed, record_too_large, no value)
                                        are skipped, and so are those whose sealed value can
                                        no longer be opened (herald/sealing.py: `shredded`)
    anything else (or into=T2)          copy key, value and headers into `into` (default: the
                                        same topic) for its consumers to process again

Idempotent: ClickHouse deduplicates events by event_id and its views count distinct ids, so a
range loaded twice changes no count; a re-driven dead letter is marked in Redis
(`herald:replayed:{dead_letter_id}`, 30 days) and not re-driven again unless `force`; copied
records reach consumers that deduplicate by their ids (at-least-once everywhere).

Range: record timestamps in [from_ts, to_ts), read from every partition up to the end it had
when the replay started (records produced meanwhile, copies included, are not re-read).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from herald.errors import DeliveryError, HeraldError, SerdeError
from herald.sealing import Sealer
from herald.topics import DEAD_LETTERS, DELIVERY_EVENTS
from schemas.registry import make_registry
from schemas.serde import AvroDeserializer
from sources.kafka import partition_ends

__all__ = ["ReplayResult", "parse_time", "replay", "replay_cli"]

EVENTS_TOPIC = DELIVERY_EVENTS
UNREPLAYABLE = frozenset({"encode_failed", "record_too_large"})
MARK_TTL_S = 30 * 24 * 3600
_BATCH = 5000

Progress = Callable[[int, int], None]


@dataclass
class ReplayResult:
    """What one replay did (`scanned` records read, of which `in_range` in the time range)."""

    mode: str
    scanned: int = 0
    in_range: int = 0
    written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _ms(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("replay times must be timezone-aware")
    return int(value.timestamp() * 1000)


class _Reader:
    """Assigned partitions of one topic, each read from `from_ts` up to its end at the start."""

    def __init__(self, settings: HeraldSettings, topic: str, from_ms: int) -> None:
        conf: dict[str, Any] = {
            **settings.kafka.client_config(), "group.id": "herald-replay",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50,
        }  # fmt: skip
        self.consumer = Consumer(conf)
        meta = self.consumer.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            raise HeraldError(f"topic {topic!r} not found")
        self.topic = topic
        self.ends = self._ends(sorted(meta.partitions))
        wanted = [TopicPartition(topic, p, from_ms) for p in self.ends]
        starts = self.consumer.offsets_for_times(wanted, timeout=30)
        self.starts = {tp.partition: tp.offset if tp.offset >= 0 else self.ends[tp.partition]
                       for tp in starts}  # fmt: skip
        self.total = sum(max(0, self.ends[p] - self.starts[p]) for p in self.ends)

    def _ends(self, partitions: list[int]) -> dict[int, int]:
        ends = partition_ends(self.consumer, self.topic, partitions)
        missing = sorted(p for p in partitions if p not in ends)
        if missing:
            raise HeraldError(f"replay: no end of partitions {missing} of {self.topic}")
        return ends

    def __iter__(self) -> Iterator[Message]:
        todo = {p for p in self.ends if self.starts[p] < self.ends[p]}
        self.consumer.assign([TopicPartition(self.topic, p, self.starts[p]) for p in todo])
        while todo:
            for msg in self.consumer.consume(500, 1.0):
                err, partition, offset = msg.error(), msg.partition() or 0, msg.offset() or 0
                if partition not in todo:
                    continue
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(partition)
                    continue
                if offset >= self.ends[partition]:
                    todo.discard(partition)
                    continue
                yield msg
                if offset + 1 >= self.ends[partition]:
                    todo.discard(partition)

    def close(self) -> None:
        self.consumer.close()


class _Writer:
    """An acks=all producer that raises DeliveryError when any record was not delivered."""

    def __init__(self, settings: HeraldSettings) -> None:
        conf = {**settings.kafka.client_config(), "acks": "all", "enable.idempotence": True}
        self.producer = Producer(conf)
        self.failed: list[str] = []

    def _done(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failed.append(err.name())

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        while True:
            try:
                self.producer.produce(topic, value, key, headers=headers, on_delivery=self._done)
                break
            except BufferError:
                self.producer.poll(0.1)
        self.producer.poll(0)

    def flush(self) -> None:
        if self.producer.flush(120) > 0 or self.failed:
            raise DeliveryError(f"replay: records not delivered: {self.failed[:5]}")


def replay(
    settings: HeraldSettings,
    topic: str,
    from_ts: datetime,
    to_ts: datetime,
    into: str | None = None,
    progress: Progress | None = None,
    *,
    force: bool = False,
    exclude_jobs: Collection[str] = (),
) -> ReplayResult:
    """Re-drive the records of logical `topic` with timestamps in [from_ts, to_ts).

    See the module docstring for what happens per topic. `progress(done, total)` is called
    as records are read (total = records between the range start and the partitions' ends).
    `force` re-drives dead letters already re-driven; `exclude_jobs` leaves the dead letters of
    those jobs alone (e.g. "dispatch", whose letters infra.dlq replays with a fresh retry
    budget). Raises DeliveryError if Kafka refused a record, HeraldError for an unknown topic.
    """
    from_ms, to_ms = _ms(from_ts), _ms(to_ts)
    kafka = settings.kafka
    reader = _Reader(settings, kafka.topic(topic), from_ms)
    report = progress or (lambda _done, _total: None)
    if topic == EVENTS_TOPIC and into is None:
        sink: _Sink = _ClickHouseSink(settings)
    elif topic == DEAD_LETTERS:
        sink = _RedriveSink(settings, kafka.topic(into) if into else None, force, exclude_jobs)
    else:
        sink = _CopySink(settings, kafka.topic(into or topic))
    result = ReplayResult(sink.mode)
    try:
        report(0, reader.total)
        for msg in reader:
            result.scanned += 1
            _kind, ts = msg.timestamp()
            if from_ms <= ts < to_ms:
                result.in_range += 1
                sink.add(msg, result)
            if result.scanned % 500 == 0:
                report(result.scanned, reader.total)
        sink.finish(result)
        report(result.scanned, max(reader.total, result.scanned))
    finally:
        reader.close()
        sink.close()
    return result


class _Sink:
    mode = ""

    def add(self, msg: Message, result: ReplayResult) -> None: ...

    def finish(self, result: ReplayResult) -> None: ...

    def close(self) -> None: ...


class _ClickHouseSink(_Sink):
    """Delivery events -> ClickHouse delivery_events, in batches."""

    mode = "clickhouse"

    def __init__(self, settings: HeraldSettings) -> None:
        from dataflows.accepted import event_columns

        self.client = herald_client(settings.clickhouse)
        self.columns = event_columns()
        self.decode = AvroDeserializer(make_registry(settings.registry), "delivery_event")
        self.rows: list[list[Any]] = []

    def add(self, msg: Message, result: ReplayResult) -> None:
        try:
            event = self.decode(msg.value())
        except SerdeError as exc:
            result.skip(exc.reason)
            return
        self.rows.append([event[c] for c in self.columns])
        if len(self.rows) >= _BATCH:
            self.finish(result)

    def finish(self, result: ReplayResult) -> None:
        if self.rows:
            self.client.insert("delivery_events", self.rows, self.columns)
            result.written += len(self.rows)
            self.rows = []

    def close(self) -> None:
        self.client.close()


class _RedriveSink(_Sink):
    """Dead letters -> their source topic (or `into`), unchanged; marked once re-driven."""

    mode = "redrive"

    def __init__(
        self, settings: HeraldSettings, into: str | None, force: bool, exclude: Collection[str]
    ) -> None:
        self.exclude = frozenset(exclude)
        self.writer = _Writer(settings)
        self.decode = AvroDeserializer(make_registry(settings.registry), "dead_letter")
        self.redis = redis.Redis.from_url(settings.redis.url)
        self.sealer = Sealer(self.redis)
        self.into, self.force = into, force
        self.pending: list[str] = []
        self.seen: set[str] = set()

    def add(self, msg: Message, result: ReplayResult) -> None:
        try:
            letter = self.decode(msg.value())
        except SerdeError as exc:
            result.skip(exc.reason)
            return
        letter_id = letter["dead_letter_id"]
        expire_at: datetime | None = letter.get("expire_at")
        if letter["job"] in self.exclude:
            result.skip("excluded_job")
        elif letter_id in self.seen:
            result.skip("duplicate")
        elif expire_at is not None and expire_at <= datetime.now(UTC):
            result.skip("expired")  # (its value may be gone already: herald/sealing.py)
        elif letter["value"] is None or letter["reason"] in UNREPLAYABLE:
            result.skip("not_replayable")
        elif not self.force and self.redis.exists(_mark(letter_id)):
            result.skip("already_replayed")
        else:
            self._send(letter, result)
        self.seen.add(letter_id)
        if len(self.pending) >= _BATCH:
            self.finish(result)

    def _send(self, letter: dict[str, Any], result: ReplayResult) -> None:
        value, why = self.sealer.readable(letter["value"])  # herald/sealing.py
        if why is not None:
            result.skip(why)
            return
        self.writer.send(self.into or letter["source_topic"], letter["key"], value, None)
        self.pending.append(letter["dead_letter_id"])
        result.written += 1

    def finish(self, result: ReplayResult) -> None:
        self.writer.flush()  # marked only once Kafka acknowledged them
        pipe = self.redis.pipeline(transaction=False)
        for letter_id in self.pending:
            pipe.set(_mark(letter_id), "1", ex=MARK_TTL_S)
        pipe.execute()
        self.pending = []

    def close(self) -> None:
        self.redis.close()


def _mark(dead_letter_id: str) -> str:
    return f"herald:replayed:{{{dead_letter_id}}}"


class _CopySink(_Sink):
    """Records -> `into`, key/value/headers unchanged."""

    mode = "copy"

    def __init__(self, settings: HeraldSettings, into: str) -> None:
        self.writer = _Writer(settings)
        self.into = into

    def add(self, msg: Message, result: ReplayResult) -> None:
        self.writer.send(self.into, msg.key(), msg.value(), msg.headers())
        result.written += 1

    def finish(self, result: ReplayResult) -> None:
        self.writer.flush()


# -- CLI -----------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"-(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """ISO 8601 (naive = UTC), `now`, or relative like `-2h`, `-30m`, `-7d`."""
    now = now or datetime.now(UTC)
    text = text.strip()
    if text == "now":
        return now
    match = _RELATIVE.fullmatch(text)
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@contextlib.contextmanager
def _rich_bar(description: str) -> Iterator[Progress]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import (
        Progress as Bar,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())  # fmt: skip
    with Bar(*columns, transient=False) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total or None)


def replay_cli(
    settings: HeraldSettings, topic: str, from_text: str, to_text: str, into: str | None = None,
    *, force: bool = False, exclude_jobs: Collection[str] = (),
) -> int:  # fmt: skip
    """`herald replay --topic T --from TIME --to TIME [--into T2] [--force]`: rich progress
    bar, summary, exit code 0 (2 for bad arguments). TIME: ISO 8601, `now` or `-2h`."""
    from rich.console import Console

    console = Console()
    try:
        from_ts, to_ts = parse_time(from_text), parse_time(to_text)
    except ValueError as exc:
        console.print(f"[red]bad time: {exc}[/red]")
        return 2
    if from_ts >= to_ts:
        console.print("[red]--from must be before --to[/red]")
        return 2
    with _rich_bar(f"replay {topic}") as bar:
        result = replay(
            settings, topic, from_ts, to_ts, into, bar, force=force, exclude_jobs=exclude_jobs
        )
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(result.skipped.items())) or "none"
    console.print(
        f"{result.mode}: {result.in_range} record(s) in range of {result.scanned} read, "
        f"{result.written} written, skipped: {skipped}"
    )
    return 0
