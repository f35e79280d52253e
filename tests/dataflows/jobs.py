"""Helpers for the planning job tests: records, a job subprocess with a log file, topic readers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bytewax.testing import run_main
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from dataflows import users
from herald.config import HeraldSettings
from infra.process import reset_sigint
from tests.dataflows.helpers import consume, decoder, encoder, produce

REPO = Path(__file__).resolve().parents[2]
DEAD_LETTERS = "herald.dead-letters"
EVENTS = "herald.delivery-events"
USERS = "dataflows.users:build_flow()"  # the users job, as a process (Job)
JOB_ERRORS = ("DeliveryError", "InfraError", "RegistryError", "KafkaException", "SerdeError")


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def request(nid: str, notification_type: str, **changes: Any) -> dict[str, Any]:
    """A notification_request accepted now; `users=[...]` or `segment=...` set the recipients."""
    users = changes.pop("users", [])
    segment = changes.pop("segment", None)
    base: dict[str, Any] = {
        "notification_id": nid,
        "request_id": f"r-{nid}",
        "tenant_id": "acme",
        "notification_type": notification_type,
        "traffic_class": "bulk",
        "recipients": {"user_ids": users, "segment_id": segment},
        "template_version": None,
        "params": {},
        "channels": None,
        "locale": None,
        "send_at": None,
        "send_local_time": None,
        "expire_at": None,
        "accepted_at": now(),
        "source": "api",
    }
    return {**base, **changes}


CAMPAIGN = {"headline": "Sale", "offer": "20% off", "cta_url": "https://example.com/s"}


def prefs(user: str, version: int = 1, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "user_id": user,
        "global_opt_out": False,
        "category_opt_out": [],
        "channel_opt_out": [],
        "category_channel_opt_out": [],
        "quiet_hours": None,
        "timezone": None,
        "locale": None,
        "updated_at": now(),
        "version": version,
    }
    return {**base, **changes}


def contacts(user: str, *, push: int = 1, email: bool = True, version: int = 1) -> dict[str, Any]:
    devices = [
        {
            "device_id": f"{user}-d{i}",
            "platform": "fcm",
            "token": f"tok-{user}-{i}",
            "app_id": None,
            "registered_at": now(),
            "valid": True,
        }
        for i in range(push)
    ]
    address = {"address": f"{user}@example.com", "verified": True} if email else None
    return {
        "user_id": user,
        "devices": devices,
        "phone": None,
        "email": address,
        "updated_at": now(),
        "version": version,
    }


def send(settings: HeraldSettings, topic: str, records: list[dict[str, Any]], key: str) -> None:
    """Encode and produce `records` to a logical topic, keyed by the field `key`."""
    encode = encoder(settings, topic)
    produce(settings, topic, [(str(r[key]).encode(), encode(r)) for r in records])


def load_users(settings: HeraldSettings) -> None:
    """What the users job does on the stack, once: the changelogs (as far as they are now) into
    the Redis copies the plan job reads, and the marker that they hold every user."""
    run_main(users.build_flow(settings, bounded=True), epoch_interval=timedelta(milliseconds=200))


def read(settings: HeraldSettings, topic: str) -> list[dict[str, Any]]:
    """Every record currently on a logical topic, decoded."""
    decode = decoder(settings)
    return [decode(value) for _key, value in consume(settings, topic)]


def read_timed(settings: HeraldSettings, topic: str) -> list[tuple[datetime, dict[str, Any]]]:
    """(record timestamp, decoded value) of every record currently on a logical topic."""
    decode = decoder(settings)
    physical = settings.kafka.topic(topic)
    conf = {**settings.kafka.client_config(), "group.id": "t", "enable.partition.eof": True}
    consumer = Consumer(conf)
    parts = consumer.list_topics(physical, timeout=10).topics[physical].partitions
    consumer.assign([TopicPartition(physical, p, OFFSET_BEGINNING) for p in parts])
    out: list[tuple[datetime, dict[str, Any]]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 20
    try:
        while len(ended) < len(parts) and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                if msg.error() is None:
                    stamp = datetime.fromtimestamp(msg.timestamp()[1] / 1000, UTC)
                    out.append((stamp, decode(msg.value())))
                else:
                    ended.add(msg.partition() or 0)
    finally:
        consumer.close()
    return out


def wait_for(
    settings: HeraldSettings,
    topic: str,
    done: Callable[[list[dict[str, Any]]], bool],
    timeout: float = 40.0,
    job: Job | None = None,
) -> list[dict[str, Any]]:
    """Poll a topic until `done(records)`; returns the records seen last (caller asserts)."""
    deadline = time.monotonic() + timeout
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        records = read(settings, topic)
        if done(records):
            break
        if job is not None and not job.running():
            raise AssertionError(f"job exited early:\n{job.output()[-4000:]}")
        time.sleep(0.3)
    return records


class Job:
    """`python -m bytewax.run IMPORT ARGS...` as a real process; output goes to a log file."""

    def __init__(self, env: dict[str, str], log: Path, import_str: str, *args: str) -> None:
        self.log = log
        argv = [sys.executable, "-m", "bytewax.run", import_str, *args]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**env, "PYTHONPATH": str(REPO)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=reset_sigint,  # SIGINT is the clean stop, even from a background shell
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def send_signal(self, sig: signal.Signals = signal.SIGINT) -> None:
        """Signal the process group (SIGINT: Bytewax's clean stop, SIGKILL: a crash)."""
        if self.running():
            os.killpg(self.proc.pid, sig)

    def stop(self, sig: signal.Signals = signal.SIGINT) -> str:
        """Signal the process group (SIGINT: clean stop, SIGKILL: crash); return the log."""
        self.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return self.output()


def stop_all(jobs: list[Job]) -> list[str]:
    """Stop the processes of one cluster together (one alone waits for its peers); the logs."""
    for job in jobs:
        job.send_signal()
    return [job.stop() for job in jobs]


def assert_no_job_errors(output: str) -> None:
    for error in JOB_ERRORS:
        assert error not in output, output[-4000:]
