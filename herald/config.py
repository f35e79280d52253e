"""Configuration: one pydantic-settings class per external system.

Settings are loaded only in entry points (the `herald` CLI, `build_flow()` of each dataflow,
the API factory) and passed down; library code never reads the environment.

Every class reads environment variables with its own prefix. The embedded launcher
(`herald up`) exports the addresses of the services it started to every process it spawns,
so the defaults below only matter for a process started by hand.

| class              | prefix               | production example                                   |
|--------------------|----------------------|------------------------------------------------------|
| KafkaSettings      | HERALD_KAFKA_        | HERALD_KAFKA_BOOTSTRAP_SERVERS=b1:9093,b2:9093       |
| RegistrySettings   | HERALD_REGISTRY_     | HERALD_REGISTRY_URL=https://sr.example.com           |
| RedisSettings      | HERALD_REDIS_        | HERALD_REDIS_URL=rediss://redis.example.com:6380/0   |
| ClickHouseSettings | HERALD_CLICKHOUSE_   | HERALD_CLICKHOUSE_DSN=https://user:pw@ch:8443/herald |
| RunSettings        | HERALD_              | HERALD_RUN_DIR=/var/lib/herald                       |
| ScheduleSettings   | HERALD_SCHEDULE_     | HERALD_SCHEDULE_HORIZON_DAYS=30                      |
| LinksSettings      | HERALD_LINKS_        | HERALD_LINKS_BASE_URL=https://notify.example.com     |
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from herald.errors import ConfigError


class KafkaSettings(BaseSettings):
    """Kafka client settings shared by producers, sources and the admin client."""

    model_config = SettingsConfigDict(env_prefix="HERALD_KAFKA_")

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    # Prepended to every topic name; tests use it to give each test its own topics.
    topic_prefix: str = ""
    # How long the broker may hold a source's empty fetch (librdkafka fetch.wait.max.ms): the
    # latency of a record reaching an idle job on Tansu (sources.kafka.consumer_config).
    fetch_wait_ms: int = Field(default=500, ge=1, le=10_000)

    def client_config(self) -> dict[str, str]:
        """librdkafka settings common to every client (producer, consumer, admin)."""
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        return conf

    def topic(self, name: str) -> str:
        """The physical topic name for a logical topic name from herald/topics.toml."""
        return f"{self.topic_prefix}{name}"


class RegistrySettings(BaseSettings):
    """Schema registry: a Confluent-compatible URL, or the file-backed registry in `path`."""

    model_config = SettingsConfigDict(env_prefix="HERALD_REGISTRY_")

    url: str | None = None
    basic_auth_user_info: SecretStr | None = None
    path: Path = Path(".herald/run/registry")


class RedisSettings(BaseSettings):
    """Redis (or Redis Cluster) holding hot state: idempotency keys, guards, inbox, status."""

    model_config = SettingsConfigDict(env_prefix="HERALD_REDIS_")

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = False

    def client(self, socket_timeout: float | None = 10) -> Any:
        """A sync `redis.Redis`, or `redis.RedisCluster` when `cluster` (the one place both
        are made for the jobs and tools)."""
        import redis  # here: most users of these settings never open a connection

        if self.cluster:
            return redis.RedisCluster.from_url(self.url, socket_timeout=socket_timeout)
        return redis.Redis.from_url(self.url, socket_timeout=socket_timeout)


class ClickHouseSettings(BaseSettings):
    """ClickHouse reached over HTTP by every process.

    In the embedded stack the `clickhouse` service (infra/clickhouse_server.py) is the single
    process that owns the chDB data directory and serves ClickHouse's HTTP interface on a
    loopback port; in production the DSN points at a ClickHouse server or cluster.
    """

    model_config = SettingsConfigDict(env_prefix="HERALD_CLICKHOUSE_")

    dsn: str = "http://127.0.0.1:8123"
    database: str = "herald"


class RunSettings(BaseSettings):
    """Where the embedded stack keeps its data, logs and pid/state files, and how many
    processes each of its Bytewax jobs runs (HERALD_RUN_PROCESSES; `herald up --processes`)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_", populate_by_name=True)

    run_dir: Path = Path(".herald/run")
    host: str = "127.0.0.1"
    processes: int = Field(
        default=1,
        ge=1,
        le=16,
        validation_alias=AliasChoices("HERALD_RUN_PROCESSES", "processes"),
        description="Bytewax processes per job (a cluster joined with -i/-a on loopback).",
    )
    embedded: bool = Field(
        default=False,
        validation_alias=AliasChoices("HERALD_EMBEDDED", "embedded"),
        description="Set by `herald up` for its processes: development defaults (the bundled "
        "tenants file and its dev key, the simulators' credentials) are allowed; elsewhere "
        "processes refuse to start with them (`refuse_unsafe_defaults`).",
    )
    nice: bool = Field(
        default=True,
        validation_alias=AliasChoices("HERALD_RUN_NICE", "nice"),
        description="Start the jobs that record rather than send (infra/services.py `NICE`: the "
        "warehouse, and receipts a little) at a lower CPU priority, so a saturated machine "
        "sends first. False starts every component at normal priority: the test suite's "
        "end-to-end stack, which shares "
        "two cores with other test lanes that starved a niced warehouse for a minute.",
    )


def refuse_unsafe_defaults(process: str, run: RunSettings, unsafe: list[str]) -> None:
    """Fail closed: outside the embedded stack, raise ConfigError naming every development
    default in `unsafe` (each says what is used and which setting to provide)."""
    if unsafe and not run.embedded:
        lines = "\n".join(f"  - {item}" for item in unsafe)
        raise ConfigError(
            f"{process} refuses to start with development defaults outside the embedded stack "
            f"(`herald up` sets HERALD_EMBEDDED=1 for its own processes):\n{lines}"
        )


class ScheduleSettings(BaseSettings):
    """How far ahead a send may be scheduled: the API refuses a later `send_at` (422
    `send_at_too_far`) and the schedule job holds deliveries up to that far plus
    `HOLD_MARGIN` (a local send time or the end of quiet hours can fall up to a day after
    `send_at` each), so nothing the API accepted is dropped by the schedule job."""

    model_config = SettingsConfigDict(env_prefix="HERALD_SCHEDULE_")

    HOLD_MARGIN: ClassVar[timedelta] = timedelta(days=2)

    horizon_days: int = Field(default=30, ge=1, le=365)

    def hold_limit(self) -> timedelta:
        """The longest hold the schedule job accepts."""
        return timedelta(days=self.horizon_days) + self.HOLD_MARGIN


class SmsLimits(BaseSettings):
    """SMS-pumping controls every path into Herald shares: OTP sends per phone number (count,
    window seconds) and the E.164 prefixes SMS may go to (empty = every country; refused
    outside the embedded stack, api/settings.py). The API charges the requests it accepts (429
    `otp_rate_limited`, 422 `sms_prefix_not_allowed`); the plan job charges the OTPs that other
    producers put on the request topics (a dead letter with the same reason,
    dataflows/plan/otp_guard.py). Read from the API's variables (HERALD_API_OTP_PER_PHONE,
    HERALD_API_SMS_ALLOWED_PREFIXES) by every process."""

    model_config = SettingsConfigDict(env_prefix="HERALD_API_")

    otp_per_phone: tuple[int, int] = (5, 600)
    sms_allowed_prefixes: list[str] = Field(default_factory=list)

    def sms_allowed(self, e164: str) -> bool:
        """Whether SMS may go to `e164` (the allow-list is empty or has one of its prefixes)."""
        return not self.sms_allowed_prefixes or any(
            e164.startswith(p) for p in self.sms_allowed_prefixes
        )


# The bundled tenants file: one development tenant whose key is public (refused outside the
# embedded stack, api/settings.py).
DEFAULT_TENANTS_FILE = Path(__file__).resolve().parents[1] / "api" / "tenants.toml"


class TenantsFile(BaseSettings):
    """Where the tenants and their keys are (HERALD_API_TENANTS_FILE; the format: api/auth.py).
    The API authenticates keys with it; the plan job holds requests from other producers to
    what their tenant's keys may send (herald/tenants.py)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_API_")

    tenants_file: Path = DEFAULT_TENANTS_FILE


DEV_LINKS_SECRET = "herald-dev-links-secret-change-me"  # public: refused outside `herald up`
MIN_SECRET = 32


def _weak_secret(variable: str, value: SecretStr, development: str, risk: str) -> list[str]:
    """What is wrong with a secret setting for production: the public development value, or
    fewer than MIN_SECRET characters."""
    text = value.get_secret_value()
    if text == development:
        return [f"{variable} is the public development value ({risk}): set a long random one"]
    if len(text) < MIN_SECRET:
        return [f"{variable} is shorter than {MIN_SECRET} characters"]
    return []


class LinksSettings(BaseSettings):
    """The links Herald puts in emails (herald/links.py): the API's public base URL they point
    at, and the secret that signs them (the API verifies, dispatch signs). `herald up` sets
    both (a secret generated once per run directory); in production set a long random secret
    and the URL the recipients' mail clients reach. Without `base_url` no link is added (and no
    `List-Unsubscribe` header: set it for marketing mail)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_LINKS_")

    base_url: str | None = None
    secret: SecretStr = SecretStr(DEV_LINKS_SECRET)

    def secret_bytes(self) -> bytes:
        return self.secret.get_secret_value().encode()

    def unsafe_defaults(self) -> list[str]:
        """What `refuse_unsafe_defaults` refuses in these settings."""
        return _weak_secret("HERALD_LINKS_SECRET", self.secret, DEV_LINKS_SECRET,
                            "anyone could forge click redirects and opens")  # fmt: skip


DEV_PII_KEY = "herald-dev-pii-key-change-me"  # public: refused outside `herald up`


class PiiSettings(BaseSettings):
    """The key of the digests Herald keeps instead of phone numbers, email addresses and device
    ids (the OTP limit counters' Redis keys, the `address_tag` on delivery events): HMAC-SHA256
    under this key, so a copy of Redis or of the events does not give the numbers back by
    hashing every possible one. `herald up` makes one per run directory; in production set a
    long random key (changing it resets the OTP counters and unties old address tags)."""

    model_config = SettingsConfigDict(env_prefix="HERALD_PII_")

    key: SecretStr = SecretStr(DEV_PII_KEY)
    # How long a dead letter of a record without an expiry can be replayed: its value is sealed
    # under a key that Redis drops after that (herald/sealing.py); with an expiry, until then.
    dead_letter_replay_days: float = Field(default=7.0, gt=0, le=30)

    def key_bytes(self) -> bytes:
        return self.key.get_secret_value().encode()

    def unsafe_defaults(self) -> list[str]:
        """What `refuse_unsafe_defaults` refuses in these settings."""
        return _weak_secret("HERALD_PII_KEY", self.key, DEV_PII_KEY,
                            "phone numbers could be recovered from their digests")  # fmt: skip


def pii_digest(key: bytes, value: str, hex_chars: int) -> str:
    """The first `hex_chars` hex digits of HMAC-SHA256(key, value) (PiiSettings)."""
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:hex_chars]


class HeraldSettings(BaseSettings):
    """Everything an entry point may need, loaded once."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    links: LinksSettings = Field(default_factory=LinksSettings)
    pii: PiiSettings = Field(default_factory=PiiSettings)
