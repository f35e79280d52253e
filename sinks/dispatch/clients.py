"""The provider clients of one sink partition, built lazily on its event loop.

    Providers(loop, factories)     provider name -> client, built on first use
    default_factories(redis_url)   every registered provider, settings from its env (HERALD_APNS_*)

A factory that fails (e.g. no APNs key configured) does not kill the job: that provider answers
every send with `PlatformError("client_config")`, which pauses it (breaker) and requeues its
messages, and the error is logged once. Clients are closed by `Providers.close()`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from herald.outcomes import Lookup, Outcome, PlatformError
from sinks.dispatch.inbox import InboxClient
from sinks.dispatch.loop import LoopThread
from sinks.provider_registry import load_clients, specs

__all__ = ["Factory", "Providers", "Sender", "default_factories"]

log = logging.getLogger(__name__)


class Sender(Protocol):
    """What the sink needs from a provider client (sinks.providers.ProviderClient, InboxClient).

    `in_flight`: how many sends it takes at once (the dispatch sink runs that many workers)."""

    in_flight: int

    async def send(self, delivery: Mapping[str, Any]) -> Outcome: ...

    async def aclose(self) -> None: ...


Factory = Callable[[], Sender]


def default_factories(redis_url: str) -> dict[str, Factory]:
    """Every registered provider's client, configured from its environment (its module's
    `SPEC.client`, sinks/provider_registry.py), and the in-app inbox on `redis_url`."""
    load_clients()  # now, not on the first send
    factories: dict[str, Factory] = {s.name: s.client for s in specs()}
    return {**factories, "inbox": lambda: InboxClient(redis_url)}


class _Unusable:
    """Stands in for a client that could not be built."""

    in_flight = 1  # answers at once, without a call

    def __init__(self, provider: str, reason: str) -> None:
        self.provider = provider
        self.reason = reason

    async def send(self, delivery: Mapping[str, Any]) -> Outcome:
        return PlatformError(self.reason, provider=self.provider)

    async def aclose(self) -> None:
        return None


class Providers:
    """Provider name → client, each created on `loop` the first time it is needed."""

    def __init__(self, loop: LoopThread, factories: Mapping[str, Factory]) -> None:
        self.loop = loop
        self.factories = dict(factories)
        self._clients: dict[str, Sender] = {}

    def ensure(self, names: Sequence[str]) -> None:
        """Build the clients of `names` not built yet (on the loop thread)."""
        missing = [n for n in dict.fromkeys(names) if n not in self._clients]
        if missing:
            self.loop.run(self._build(missing))

    async def _build(self, names: list[str]) -> None:
        for name in names:
            factory = self.factories.get(name)
            if factory is None:
                log.error("dispatch.unknown_provider provider=%s", name)
                self._clients[name] = _Unusable(name, "unknown_provider")
                continue
            try:
                self._clients[name] = factory()
            except Exception as exc:  # misconfiguration: pause the provider, keep the job
                log.error("dispatch.client_config_failed provider=%s error=%s: %s",
                          name, type(exc).__name__, exc)  # fmt: skip
                self._clients[name] = _Unusable(name, "client_config")

    def client(self, name: str) -> Sender:
        """The built client of `name` (call `ensure` first)."""
        return self._clients[name]

    def lookup_all(self, asks: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Lookup]:
        """(provider, delivery) pairs looked up at their providers, concurrently (the clients'
        `lookup`, sinks/dispatch/reconcile.py); built clients only."""

        async def _all() -> list[Lookup]:
            return list(await asyncio.gather(
                *(self._clients[p].lookup(d) for p, d in asks)  # type: ignore[attr-defined]
            ))  # fmt: skip

        return self.loop.run(_all(), timeout=60.0)

    def close(self) -> None:
        """Close every client, then the loop."""

        async def _close() -> None:
            await asyncio.gather(
                *(c.aclose() for c in self._clients.values()), return_exceptions=True
            )

        if self._clients:
            try:
                self.loop.run(_close(), timeout=10.0)
            except Exception as exc:
                log.warning("dispatch.client_close_failed error=%s", type(exc).__name__)
        self._clients.clear()
