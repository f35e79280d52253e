"""The FastAPI app: `create_app(settings)` builds it; nothing happens at import time.

    create_app(settings, api=..., providers=..., tenants=..., catalog=...)  -> FastAPI

Its lifespan connects Redis and starts the Kafka producer (poll thread); shutdown flushes the
producer and closes the segments' ClickHouse client (made on first use). `python -m api --host H
--port P` loads settings from the environment and serves it.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.types import ASGIApp

from api.auth import Tenants
from api.kafka import AsyncProducer
from api.limits import BodyLimitMiddleware
from api.otp import refresh_otp_gauges
from api.problems import install_problem_handlers
from api.settings import ApiSettings, ProviderSecrets
from api.state import AppState, now_utc, state_of
from herald.catalog import Catalog, load_catalog
from herald.config import HeraldSettings, refuse_unsafe_defaults
from schemas.registry import make_registry

log = logging.getLogger(__name__)


def create_app(
    settings: HeraldSettings,
    *,
    api: ApiSettings | None = None,
    providers: ProviderSecrets | None = None,
    tenants: Tenants | None = None,
    catalog: Catalog | None = None,
) -> FastAPI:
    """Build the API app for `settings`; clients are created in the lifespan."""
    api = api or ApiSettings()
    redis = Redis.from_url(
        settings.redis.url, decode_responses=True, socket_timeout=2.0, socket_connect_timeout=2.0,
        max_connections=256,
    )  # fmt: skip
    st = AppState(
        settings=settings,
        api=api,
        providers=providers or ProviderSecrets(),
        tenants=tenants or Tenants.load(api.tenants_file),
        catalog=catalog or load_catalog(api.catalog_file),
        registry=make_registry(settings.registry),
        redis=redis,
        producer=AsyncProducer(settings.kafka),
    )
    st.build_serializers()
    st.fast = _pipelined_client(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        st.producer.start()
        for _, ser in st.serializers.values():
            _ = ser.schema_id  # register schemas before the first request
        gc.freeze()  # startup objects (catalog, schemas, app) out of every future GC pass
        log.info("api.started topic_prefix=%s", settings.kafka.topic_prefix or "-")
        try:
            yield
        finally:
            await st.close_inbox_hub()
            await st.close_segments()
            st.producer.close()
            if st.fast is not None:
                await st.fast.close()
            await st.redis.aclose()
            log.info("api.stopped")

    app = FastAPI(
        title="Herald intake API",
        version="1.0.0",
        summary="Notification intake, preferences, devices, callbacks, inbox and tracking.",
        lifespan=lifespan,
    )
    app.state.herald = st
    install_problem_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware, limit=api.max_body_bytes, callback_limit=api.max_callback_body_bytes,
        upload_limit=api.segment_upload_max_bytes,
    )  # fmt: skip
    from api.fastpath import NotificationsFastPath

    app.add_middleware(NotificationsFastPath, state=st)  # outermost: the hot path skips the rest
    _include_routers(app)
    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["ops"], summary="Liveness")
    app.add_api_route(
        "/metrics", metrics, methods=["GET"], tags=["ops"], summary="Prometheus metrics",
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )  # fmt: skip
    return app


def _pipelined_client(settings: HeraldSettings) -> object | None:
    """The hot-path Redis client (api/redis_pipeline.py), unless on a cluster or without hiredis."""
    if settings.redis.cluster:
        return None
    try:
        from api.redis_pipeline import PipelinedRedis
    except ImportError:  # hiredis not installed: redis-py serves the scripts too
        return None
    return PipelinedRedis(settings.redis.url)


def _include_routers(app: FastAPI) -> None:
    from api.routes import (
        callbacks,
        devices,
        inbox,
        notifications,
        otp,
        preferences,
        segments,
        tracking,
        unsubscribe,
    )

    routers = (
        notifications, preferences, devices, callbacks, inbox, tracking, unsubscribe, otp, segments,
    )  # fmt: skip
    for module in routers:
        app.include_router(module.router)


async def healthz(request: Request) -> Response:
    """200 when Redis answers and the producer runs; 503 otherwise."""
    st = state_of(request)
    try:
        await st.redis.ping()
    except RedisError:
        return Response(b'{"status":"redis_unavailable"}', 503, media_type="application/json")
    return Response(b'{"status":"ok"}', media_type="application/json")


async def metrics(request: Request) -> Response:
    """Prometheus exposition (OTP unverified ratio refreshed from Redis on each scrape)."""
    st = state_of(request)
    try:
        await refresh_otp_gauges(st, now_utc())
    except RedisError:
        log.warning("api.metrics_otp_refresh_failed")
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app_from_env() -> ASGIApp:
    """The app with every setting read from the environment (uvicorn factory of `python -m api`).

    In the embedded stack (HERALD_EMBEDDED), callback secrets default to the simulators'
    credentials under `<run_dir>/simulators` unless HERALD_PROVIDERS_* are set
    (api/settings.py); elsewhere the process refuses to start with any development default
    (herald.config.refuse_unsafe_defaults). The hot path
    (POST /v1/notifications) is wrapped around the FastAPI app, outside its middleware stack.
    """
    from api.fastpath import NotificationsFastPath

    # The Kafka poll thread resolves the requests' futures: let it take the GIL quickly
    # (default switch interval 5 ms would add up to 5 ms to an ack under load).
    sys.setswitchinterval(0.001)
    settings, api, providers = HeraldSettings(), ApiSettings(), ProviderSecrets()
    unsafe = [
        *api.unsafe_defaults(),
        *providers.unsafe_defaults(),
        *settings.links.unsafe_defaults(),
        *settings.pii.unsafe_defaults(),
    ]
    refuse_unsafe_defaults("the API", settings.run, unsafe)
    if providers.simulator_dir is None and settings.run.embedded:
        providers.simulator_dir = settings.run.run_dir / "simulators"
    app = create_app(settings, api=api, providers=providers)
    return NotificationsFastPath(app, app.state.herald)
