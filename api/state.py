"""Per-app state (clients, catalog, tenants, serializers) and the auth/rate-limit dependencies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from redis.asyncio import Redis
from redis.exceptions import LockError, RedisError

from api.auth import USER_TOKEN_PREFIX, Tenant, Tenants, user_token_claims
from api.inbox_hub import InboxHub
from api.kafka import AsyncProducer
from api.metrics import ApiMetrics
from api.problems import ProblemError
from api.segment_store import SegmentStore
from api.settings import ApiSettings, ProviderSecrets
from herald import keys
from herald.catalog import Catalog
from herald.config import HeraldSettings
from herald.errors import DeliveryError
from herald.topics import load_topics, physical_subject
from schemas.registry import SchemaRegistry
from schemas.serde import AvroSerializer

_RATE_SCRIPT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], 2) end
return n
"""


@dataclass
class AppState:
    """Everything a request handler needs; built by `create_app`, started in its lifespan."""

    settings: HeraldSettings
    api: ApiSettings
    providers: ProviderSecrets
    tenants: Tenants
    catalog: Catalog
    registry: SchemaRegistry
    redis: Redis
    producer: AsyncProducer
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    serializers: dict[str, tuple[str, AvroSerializer]] = field(default_factory=dict)
    scripts: dict[str, Any] = field(default_factory=dict)
    # Pipelining client for scripts (api/redis_pipeline.py); None on Redis Cluster or without
    # hiredis.
    fast: Any = None
    _hub: InboxHub | None = None
    _segments: SegmentStore | None = None

    @property
    def inbox_hub(self) -> InboxHub:
        """The process's live inbox subscriptions (made on first use: it needs the loop)."""
        if self._hub is None:
            self._hub = InboxHub(
                self.redis, self.api.inbox_ws_per_user, self.api.inbox_ws_per_tenant
            )
        return self._hub

    async def close_inbox_hub(self) -> None:
        """End the live inbox subscriptions (the app's shutdown)."""
        if self._hub is not None:
            await self._hub.close()

    @property
    def segments(self) -> SegmentStore:
        """The segments' ClickHouse side (made on first use; no I/O until a statement)."""
        if self._segments is None:
            self._segments = SegmentStore(self.settings.clickhouse, self.api.segment_ingest_workers)
        return self._segments

    async def close_segments(self) -> None:
        """Wait for running segment ingests and close the ClickHouse client (shutdown)."""
        if self._segments is not None:
            await asyncio.to_thread(self._segments.close)

    async def script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """Run a Lua script by SHA (EVALSHA; loaded on first use or after a Redis restart)."""
        if self.fast is not None:
            return await self.fast.evalsha(source, keys, args)
        runner = self.scripts.get(source)
        if runner is None:
            runner = self.scripts[source] = self.redis.register_script(source)
        return await runner(keys=keys, args=args)

    def build_serializers(self) -> None:
        """One serializer per logical topic (schema registered lazily on first use)."""
        kafka = self.settings.kafka
        for spec in load_topics().values():
            subject = physical_subject(spec, kafka)
            ser = AvroSerializer(self.registry, subject, spec.schema)
            self.serializers[spec.name] = (kafka.topic(spec.name), ser)

    async def publish(self, topic: str, key: str | None, record: dict[str, Any]) -> None:
        """Encode `record` for logical `topic` and wait for Kafka's ack; 503 problem on failure."""
        physical, serialize = self.serializers[topic]
        value = serialize(record)
        try:
            await self.producer.produce(physical, key, value, self.api.ack_timeout_seconds)
        except DeliveryError as exc:
            self.metrics.unavailable.labels("kafka").inc()
            raise ProblemError(
                503, "kafka_unavailable", f"not durable, retry later ({exc})",
                headers={"Retry-After": "1"},
            ) from exc  # fmt: skip


def state_of(request: Request) -> AppState:
    """The AppState of the app serving `request`."""
    return request.app.state.herald  # type: ignore[no-any-return]


def api_key_of(request: Request) -> str | None:
    """The key from `X-API-Key` or `Authorization: Bearer`."""
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return None


def authenticate(request: Request, scope: str) -> Tenant:
    """The calling tenant; 401 missing/unknown key, 403 key without `scope`."""
    return authenticate_key(state_of(request), api_key_of(request), scope)


def authenticate_key(st: AppState, key: str | None, scope: str) -> Tenant:
    """`authenticate` for a key already taken from the headers."""
    tenant = st.tenants.authenticate(key)
    if tenant is None:
        code = "missing_api_key" if not key else "unknown_api_key"
        st.metrics.rejected.labels(code).inc()
        raise ProblemError(
            401, code, "send a valid key in X-API-Key or Authorization: Bearer",
            headers={"WWW-Authenticate": 'Bearer realm="herald"'},
        )  # fmt: skip
    if scope not in tenant.scopes:
        st.metrics.rejected.labels("insufficient_scope").inc()
        raise ProblemError(403, "insufficient_scope", f"this key lacks scope {scope}", scope=scope)
    return tenant


def user_authority(st: AppState, credential: str | None, user_id: str, scope: str) -> Tenant:
    """Who may act on `user_id`'s inbox: that user's inbox token (api/auth.py; 401
    `invalid_user_token` when bad or expired, 403 `other_users_inbox` for another user), or a
    tenant key with `scope` (`authenticate_key`)."""
    if not credential or not credential.startswith(USER_TOKEN_PREFIX):
        return authenticate_key(st, credential, scope)
    found = user_token_claims(st.settings.links.secret_bytes(), credential, time.time())
    tenant = None if found is None else st.tenants.end_user(*found)
    if found is None or tenant is None:
        st.metrics.rejected.labels("invalid_user_token").inc()
        raise ProblemError(
            401, "invalid_user_token", "the inbox token is invalid or expired: the app's "
            "backend mints a new one", headers={"WWW-Authenticate": 'Bearer realm="herald"'},
        )  # fmt: skip
    if found[1] != user_id:
        st.metrics.rejected.labels("other_users_inbox").inc()
        raise ProblemError(403, "other_users_inbox", "this token is for another user's inbox")
    return tenant


async def guarded_user(request: Request, user_id: str, scope: str) -> tuple[AppState, Tenant]:
    """`guarded` for the end-user routes (the inbox): an inbox token of `user_id`, or a tenant
    key with `scope`, in the headers only (a query string is logged by proxies)."""
    st = state_of(request)
    tenant = user_authority(st, api_key_of(request), user_id, scope)
    await check_rate(st, tenant)
    return st, tenant


def check_authority(
    st: AppState, tenant: Tenant, notification_type: str, segment_id: str | None
) -> None:
    """403 `type_not_allowed` / `segment_not_allowed` beyond the key's allow-lists (api/auth.py)."""
    if not tenant.may_send(notification_type):
        st.metrics.rejected.labels("type_not_allowed").inc()
        raise ProblemError(
            403, "type_not_allowed", f"key {tenant.key_id} may not send {notification_type}",
            notification_type=notification_type,
        )  # fmt: skip
    if segment_id is not None:
        check_segment_allowed(st, tenant, segment_id)


def check_segment_allowed(st: AppState, tenant: Tenant, segment_id: str) -> None:
    """403 `segment_not_allowed` beyond the key's segments allow-list (sending to a segment,
    creating or reading it)."""
    if not tenant.may_target(segment_id):
        st.metrics.rejected.labels("segment_not_allowed").inc()
        raise ProblemError(
            403, "segment_not_allowed", f"key {tenant.key_id} may not use this segment",
            segment_id=segment_id,
        )  # fmt: skip


def rate_limited(st: AppState, tenant: Tenant, retry_after: int = 1) -> ProblemError:
    """The 429 problem of a tenant over its rate."""
    st.metrics.rejected.labels("rate_limited").inc()
    return ProblemError(
        429, "rate_limited",
        f"tenant {tenant.tenant_id} is over {tenant.rate_limit_per_second} requests/s",
        headers={"Retry-After": str(retry_after)}, retry_after=retry_after,
    )  # fmt: skip


async def check_rate(st: AppState, tenant: Tenant) -> None:
    """Per-tenant fixed 1-second window in Redis; 429 + Retry-After when over the limit."""
    second = int(time.time())
    try:
        n = await st.script(_RATE_SCRIPT, [keys.rate(tenant.tenant_id, second)], [])
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if int(n) > tenant.rate_limit_per_second:
        raise rate_limited(st, tenant)


def redis_unavailable(st: AppState, exc: Exception) -> ProblemError:
    """The 503 problem when Redis failed."""
    st.metrics.unavailable.labels("redis").inc()
    return ProblemError(
        503, "redis_unavailable", f"hot state unavailable, retry later ({type(exc).__name__})",
        headers={"Retry-After": "1"},
    )  # fmt: skip


async def guarded(request: Request, scope: str) -> tuple[AppState, Tenant]:
    """Authenticate with `scope` and apply the tenant's rate limit."""
    st = state_of(request)
    tenant = authenticate(request, scope)
    await check_rate(st, tenant)
    return st, tenant


def now_utc() -> datetime:
    """The current instant, tz-aware UTC."""
    return datetime.now(UTC)


def to_ms(value: datetime) -> int:
    """Epoch milliseconds of a tz-aware datetime."""
    return int(value.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    """Tz-aware UTC datetime of epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


RESTORE_POLL_S = 0.05


async def wait_restored(st: AppState) -> None:
    """Return once the users' Redis copies hold every user (`users:{<prefix>}:restored`, set by
    the users job); 503 `user_state_restoring` after `restore_wait_seconds`. A change that reads
    a user's copy and finds none must not start from an empty record while Redis is being
    refilled from the changelogs."""
    marker = keys.users_restored(st.settings.kafka.topic_prefix)
    deadline = time.monotonic() + st.api.restore_wait_seconds
    while not await st.redis.exists(marker):
        if time.monotonic() >= deadline:
            st.metrics.unavailable.labels("user_state").inc()
            raise ProblemError(
                503, "user_state_restoring",
                "this user's state is being restored from the changelog, retry later",
                headers={"Retry-After": "2"},
            )  # fmt: skip
        await asyncio.sleep(RESTORE_POLL_S)


@contextlib.asynccontextmanager
async def user_lock(st: AppState, key: str, busy: str) -> AsyncIterator[None]:
    """Hold one user's change lock (`keys.prefs_lock`, `keys.contact_points_lock`) for a
    read-modify-write; 503 `busy` (Retry-After 1) when another change holds it for 5 s, 503
    `redis_unavailable` when Redis fails."""
    lock = st.redis.lock(key, timeout=st.api.ack_timeout_seconds + 10, blocking_timeout=5)
    try:
        async with lock:
            yield
    except LockError as exc:
        raise ProblemError(
            503, busy, "another update of this user is in progress", headers={"Retry-After": "1"}
        ) from exc
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
