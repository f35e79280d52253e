"""The topic catalog (herald/topics.toml): every topic's name, partitions, key, schema and policy.

One home for topic names and their registry subjects; creating them is infra/topics.py's.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from herald.config import KafkaSettings
from herald.errors import ConfigError

CleanupPolicy = Literal["delete", "compact"]

# The logical topics the code names (each declared in herald/topics.toml: a test checks).
DELIVERY_EVENTS = "herald.delivery-events"
DEAD_LETTERS = "herald.dead-letters"
DEVICES = "herald.devices"
PREFERENCES = "herald.preferences"
SOCIAL_EVENTS = "herald.social-events"
SCHEDULED = "herald.scheduled"
RECEIPTS_RAW = "herald.receipts.raw"


@dataclass(frozen=True)
class TopicSpec:
    """One topic as declared in herald/topics.toml (logical name, without prefix)."""

    name: str
    partitions: int
    replication_factor: int
    key: str
    schema: str
    subject: str
    cleanup_policy: CleanupPolicy
    retention_ms: int | None
    doc: str

    def config(self) -> dict[str, str]:
        """Topic-level broker config for creation."""
        conf: dict[str, str] = {"cleanup.policy": self.cleanup_policy}
        if self.cleanup_policy == "delete" and self.retention_ms is not None:
            conf["retention.ms"] = str(self.retention_ms)
        return conf


def _default_path() -> Path:
    return Path(str(resources.files("herald").joinpath("topics.toml")))


def load_topics(path: Path | None = None) -> dict[str, TopicSpec]:
    """Parse and validate the topic catalog; keyed by logical topic name."""
    path = path or _default_path()
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read topic catalog {path}: {exc}") from exc
    defaults = raw.get("defaults", {})
    topics: dict[str, TopicSpec] = {}
    for entry in raw.get("topic", []):
        merged = {**defaults, **entry}
        name = merged.get("name")
        if not name or name in topics:
            raise ConfigError(f"{path}: topic without a name or declared twice: {name!r}")
        policy = merged.get("cleanup_policy", "delete")
        if policy not in ("delete", "compact"):
            raise ConfigError(f"{path}: topic {name}: cleanup_policy must be delete or compact")
        partitions = int(merged.get("partitions", 1))
        if partitions < 1:
            raise ConfigError(f"{path}: topic {name}: partitions must be >= 1")
        for field in ("key", "schema"):
            if not merged.get(field):
                raise ConfigError(f"{path}: topic {name}: missing {field!r}")
        topics[name] = TopicSpec(
            name=name,
            partitions=partitions,
            replication_factor=int(merged.get("replication_factor", 1)),
            key=merged["key"],
            schema=merged["schema"],
            subject=merged.get("subject", f"{name}-value"),
            cleanup_policy=policy,
            retention_ms=merged.get("retention_ms"),
            doc=merged.get("doc", ""),
        )
    return topics


def physical_subject(spec: TopicSpec, kafka: KafkaSettings) -> str:
    """The registry subject for a topic once the run's prefix is applied."""
    if spec.subject == f"{spec.name}-value":
        return f"{kafka.topic(spec.name)}-value"
    return spec.subject
