"""What every provider client shares: one AsyncClient, bounded concurrency, error mapping.

`ProviderClient.send(delivery) -> Outcome` never raises for provider or network trouble:

    connect error / connect timeout / pool timeout   → Retryable(reason="connect_error")
                                                        (nothing was sent: failover is safe)
    read/write timeout, reset, protocol error        → Unknown (the request may have arrived)
    an HTTP response                                  → the subclass's mapping (PROVIDERS.md §6)

Logs carry event names, provider, outcome kind, status and a masked address (last 4 chars);
never message bodies, full tokens, phone numbers or email addresses.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, ClassVar

import httpx
from httpx_aiohttp import AiohttpTransport  # the HTTP/1.1 default: loaded with the clients

from herald.config import LinksSettings
from herald.links import push_opened_url
from herald.outcomes import CONNECT_ERROR, Lookup, Outcome, PlatformError, Retryable, Unknown
from herald.pii import mask_address
from sinks.providers.config import HttpConfig
from sinks.providers.h2transport import H2Response, H2Transport

__all__ = ["ProviderClient", "epoch_seconds", "parse_retry_after"]

log = logging.getLogger(__name__)

Delivery = Mapping[str, Any]

_BEFORE_SEND = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


def opened_link(links: LinksSettings | None) -> Callable[[Mapping[str, Any]], str] | None:
    """For push clients: the delivery's signed "opened" URL the app POSTs when the user opens
    the push (herald/links.py `push_opened_url`, sent as `herald_opened` in the payload's
    data); None without a links base URL."""
    if links is None or not links.base_url:
        return None
    base, secret = links.base_url, links.secret_bytes()
    return lambda delivery: push_opened_url(base, secret, delivery)


def epoch_seconds(value: Any) -> float | None:
    """An instant from a delivery field (epoch ms int, or datetime from fastavro) as epoch s."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value) / 1000.0


def ssl_context(config: HttpConfig) -> ssl.SSLContext | bool:
    """Default verification, plus the configured extra CA (simulator) if any."""
    if config.ca_path is None:
        return True
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cafile=str(config.ca_path))
    return ctx


def _pyreqwest(config: HttpConfig, http2: bool) -> httpx.AsyncBaseTransport:
    """pyreqwest (Rust reqwest) under httpx; HTTP/2 by ALPN when the client speaks it."""
    from datetime import timedelta

    from pyreqwest.client import ClientBuilder
    from pyreqwest.compatibility.httpx import HttpxTransport

    builder = (
        ClientBuilder()
        .http2(http2)
        .connect_timeout(timedelta(seconds=config.connect_timeout_s))
        .timeout(timedelta(seconds=config.timeout_s))
    )
    if config.ca_path is not None:
        builder = builder.add_root_certificate_pem(config.ca_path.read_bytes())
    return HttpxTransport(builder.build())


def _aiohttp(config: HttpConfig, http2: bool) -> httpx.AsyncBaseTransport:
    """aiohttp under httpx (httpx-aiohttp): HTTP/1.1 only."""
    if http2:
        raise ValueError("the aiohttp transport speaks HTTP/1.1 only: not for this provider")
    limits = httpx.Limits(
        max_connections=config.max_connections, max_keepalive_connections=config.max_connections
    )
    return AiohttpTransport(verify=ssl_context(config), limits=limits)


# Maintained HTTP clients a provider client can run on instead of Herald's own transports
# (HttpConfig.transport). aiohttp is the default for HTTP/1.1 providers: it sent faster than
# Herald's own HTTP/1.1 transport for less CPU (bench/results/transports.md), which was then
# deleted; pyreqwest comes with the `bench` extra.
MAINTAINED: dict[str, Callable[[HttpConfig, bool], httpx.AsyncBaseTransport]] = {
    "pyreqwest": _pyreqwest,
    "aiohttp": _aiohttp,
}


class ProviderClient(ABC):
    """Base of the provider clients: a shared httpx.AsyncClient and a concurrency bound.

    Use one instance per provider per process (it owns the connection pool), as an async
    context manager or with an explicit `aclose()`.
    """

    provider: ClassVar[str]
    http2: ClassVar[bool] = False

    def __init__(
        self, config: HttpConfig, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        http2 = self.http2 or bool(getattr(config, "http2", False))
        # HTTP/1.1 carries one request at a time per connection: more in flight than there are
        # connections would only queue inside httpx's pool, where a slow provider turns the wait
        # into PoolTimeout, a false "connect error" that reschedules the message and feeds the
        # breaker (a campaign then crawls, or stalls behind an open breaker). Queue here instead.
        in_flight = config.max_concurrency
        if not http2:
            in_flight = min(in_flight, config.max_connections)
        self.in_flight = in_flight  # sends at once (the dispatch sink runs as many workers)
        self._sem = asyncio.Semaphore(in_flight)
        self.timeouts = {
            "connect": config.connect_timeout_s,
            "read": config.timeout_s,
            "write": config.timeout_s,
            "pool": config.pool_timeout_s,
        }
        # By default (`auto`) Herald's own HTTP/2 transport, called without httpx's client layer
        # on the hot path (`_post`), and aiohttp for HTTP/1.1; `lean` names Herald's own
        # (HTTP/2 only), `httpcore` httpx's own; MAINTAINED's clients go under httpx.
        self._h2: H2Transport | None = None
        kind = config.transport
        if kind == "auto":
            kind = "lean" if http2 else "aiohttp"
        if transport is None and kind in MAINTAINED:
            transport = MAINTAINED[kind](config, http2)
        if transport is None and kind == "lean":
            if not http2:
                raise ValueError(
                    f"{self.provider}: transport 'lean' is Herald's own HTTP/2 transport and this "
                    "provider speaks HTTP/1.1 (auto picks aiohttp)"
                )
            transport = self._h2 = H2Transport(
                verify=ssl_context(config),
                max_connections=config.max_connections,
                max_streams=config.max_concurrency,
            )
        self._url = httpx.URL(config.base_url)
        self._prefix = self._url.raw_path.rstrip(b"/")  # a base_url path, as httpx would merge it
        self.http = httpx.AsyncClient(
            transport=transport,
            base_url=config.base_url,
            http2=http2,
            http1=not self.http2,
            verify=ssl_context(config),
            limits=httpx.Limits(
                max_connections=config.max_connections,
                max_keepalive_connections=config.max_connections,
            ),
            timeout=httpx.Timeout(
                config.timeout_s, connect=config.connect_timeout_s, pool=config.pool_timeout_s
            ),
        )

    async def _post(
        self,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        unique: frozenset[str] = frozenset(),
        index_path: bool = True,
    ) -> httpx.Response | H2Response:
        """POST `body` to `path` (relative to base_url): on the lean HTTP/2 transport directly
        when the client has one, else through httpx. Header names are lower-case; `unique`
        names per-request headers kept out of the HPACK table, as is a per-request path
        (`index_path=False`), so that they don't evict the values that repeat (the token)."""
        if self._h2 is None:
            return await self.http.post(path, headers=headers, content=body)
        raw = [(k.encode(), v.encode(), k in unique) for k, v in headers.items()]
        return await self._h2.request(
            self._url,
            b"POST",
            self._prefix + path.encode(),
            raw,
            body,
            self.timeouts,
            index_path=index_path,
        )

    async def send(self, delivery: Delivery) -> Outcome:
        """Submit one delivery; return its typed outcome (never raises for network trouble)."""
        async with self._sem:
            start = time.perf_counter()
            try:
                outcome = await self._send(delivery, start)
            except _BEFORE_SEND as exc:
                outcome = Retryable(
                    CONNECT_ERROR, provider=self.provider, latency_ms=self._ms(start)
                )
                log.debug(
                    "provider.connect_failed provider=%s error=%s",
                    self.provider,
                    type(exc).__name__,
                )
            except httpx.TimeoutException:
                outcome = Unknown("timeout", provider=self.provider, latency_ms=self._ms(start))
            except httpx.TransportError as exc:
                outcome = Unknown(
                    type(exc).__name__, provider=self.provider, latency_ms=self._ms(start)
                )
        self._log(outcome, delivery)
        return outcome

    # Whether `lookup` can tell: the provider has an API that finds one of our messages; and
    # how long after a send its answer "not found" is to be believed (its records' lag).
    lookups: ClassVar[bool] = False
    lookup_lag_s: float = 0.0

    async def lookup(self, delivery: Delivery) -> Lookup:
        """What the provider's records say of `delivery` after an Unknown outcome
        (reconciliation, sinks/dispatch/reconcile.py); never raises: trouble is `found=None`."""
        if not self.lookups:
            return Lookup(None)
        try:
            async with self._sem:
                return await self._lookup(delivery)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("provider.lookup_failed provider=%s error=%s", self.provider,
                        type(exc).__name__)  # fmt: skip
            return Lookup(None)

    async def _lookup(self, delivery: Delivery) -> Lookup:
        """The provider's own lookup (clients with `lookups = True` implement it)."""
        return Lookup(None)

    @abstractmethod
    async def _send(self, delivery: Delivery, start: float) -> Outcome:
        """Build and send the request, map the response (httpx errors propagate to `send`)."""

    @staticmethod
    def _ms(start: float) -> float:
        return (time.perf_counter() - start) * 1000.0

    def _log(self, outcome: Outcome, delivery: Delivery) -> None:
        if isinstance(outcome, PlatformError):
            level = logging.WARNING
        elif log.isEnabledFor(logging.DEBUG):
            level = logging.DEBUG
        else:
            return
        log.log(
            level,
            "provider.outcome provider=%s kind=%s status=%s ms=%.1f delivery=%s address=%s "
            "detail=%s",
            self.provider,
            outcome.kind,
            outcome.status_code,
            outcome.latency_ms,
            delivery.get("delivery_id"),
            mask_address(delivery.get("address")),
            getattr(outcome, "reason", ""),
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def __aenter__(self) -> ProviderClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
