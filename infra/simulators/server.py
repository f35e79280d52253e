"""The HTTP side of every simulator: a minimal RSGI app served by Granian.

Granian (Rust, hyper) serves HTTP/1.1 and HTTP/2 (with TLS and ALPN) and calls the Python handler
only for the application logic, so one simulator process answers tens of thousands of requests
per second and holds hundreds of concurrent HTTP/2 streams on one connection (hypercorn + h2 4.3
did not). Handlers are plain coroutines `handle(Request) -> Response | HANG`; no framework.

Routes common to all simulators:

    GET  /healthz          {"ok": true, "simulator": name}
    GET  /_admin/stats     counters + accepted ids per address (`?ids=0` omits the ids;
                           `?log=1` adds [unix time, address, outcome] per provider request)
    GET  /_admin/config    the current fault config
    POST /_admin/config    patch the fault config (whole top-level fields), returns it
    POST /_admin/reset     zero the counters (`?config=1`: also restore the start config)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl

import orjson
from pydantic import ValidationError

from herald.errors import InfraError
from infra.simulators.config import SimConfig
from infra.simulators.faults import Faults, Stats

__all__ = ["HANG", "Request", "Response", "Simulator", "json_response", "serve"]

log = logging.getLogger(__name__)

JSON = "application/json"


@dataclass(slots=True)
class Request:
    """One HTTP request as the handlers see it (header names lower-case)."""

    method: str
    path: str
    query: str
    headers: Any  # granian RSGIHeaders: .get(name), .items()
    body: bytes
    client: str  # "ip:port" of the TCP connection (HTTP/2 streams share it)
    http_version: str

    def header(self, name: str) -> str | None:
        """A header value or None."""
        value: str | None = self.headers.get(name)
        return value

    def form(self) -> dict[str, str]:
        """The body as application/x-www-form-urlencoded (last value wins)."""
        return dict(parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True))

    def query_params(self) -> dict[str, str]:
        """The query string as a dict (last value wins)."""
        return dict(parse_qsl(self.query, keep_blank_values=True))


@dataclass(slots=True)
class Response:
    """A complete response."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


class _Hang:
    """Sentinel: keep the stream open and never answer (the "timeout after accept" case)."""


HANG = _Hang()


def json_response(
    status: int, payload: Any, headers: list[tuple[str, str]] | None = None
) -> Response:
    """A JSON response (orjson)."""
    return Response(status, orjson.dumps(payload), [("content-type", JSON), *(headers or [])])


class Simulator(ABC):
    """One provider simulator: its config model, credentials and request handler."""

    name: ClassVar[str]
    config_model: ClassVar[type[SimConfig]] = SimConfig
    error_kinds: ClassVar[frozenset[str]] = frozenset()
    tls: ClassVar[bool] = False

    def __init__(
        self,
        config: SimConfig,
        *,
        state_dir: Path,
        host: str,
        port: int,
        callback_url: str | None = None,
    ) -> None:
        self._check_kinds(config)
        self.config = config
        self.state_dir = state_dir
        self.host = host
        self.port = port
        self.callback_url = callback_url
        self.faults = Faults(config)
        self.stats = Stats()
        self.stats.record_log = config.record_ids

    @property
    def base_url(self) -> str:
        """Where this simulator is reachable."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def _check_kinds(self, config: SimConfig) -> None:
        unknown = set(config.errors) - self.error_kinds
        if unknown:
            raise ValueError(
                f"unknown error kinds for {self.name}: {sorted(unknown)}; "
                f"known: {sorted(self.error_kinds)}"
            )

    def reconfigure(self, patch: dict[str, Any]) -> SimConfig:
        """Validate and install a config patch (raises ValueError/ValidationError)."""
        new = self.config.patched(patch)
        self._check_kinds(new)
        self.config = new
        self.faults.update(new)
        self.stats.record_log = new.record_ids
        self.on_config(new)
        log.info("simulator.reconfigured name=%s fields=%s", self.name, sorted(patch))
        return new

    def on_config(self, config: SimConfig) -> None:
        """Hook: the config changed (recompute caches)."""
        return

    async def startup(self) -> None:
        """Hook: called once in the serving event loop before the first request."""
        return

    async def shutdown(self) -> None:
        """Hook: called once when the server stops."""
        return

    def credentials(self) -> dict[str, Any]:
        """What a client needs to talk to this simulator (written to credentials.json)."""
        return {}

    def ssl_files(self) -> tuple[Path, Path] | None:
        """(cert, key) PEM paths when the simulator serves TLS."""
        return None

    @abstractmethod
    async def handle(self, req: Request) -> Response | _Hang:
        """Answer one provider request (everything but /healthz and /_admin)."""


class RsgiApp:
    """The RSGI application: admin routes, then the simulator's handler."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.initial = sim.config  # restored by POST /_admin/reset?config=1

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        body = await proto()
        req = Request(
            scope.method,
            scope.path,
            scope.query_string,
            scope.headers,
            body,
            scope.client,
            scope.http_version,
        )
        try:
            if req.path == "/healthz" or req.path.startswith("/_admin/"):
                resp: Response | _Hang = self._admin(req)
            else:
                self.sim.stats.requests += 1
                resp = await self.sim.handle(req)
        except Exception:
            log.exception("simulator.handler_failed name=%s", self.sim.name)
            resp = json_response(500, {"error": "simulator handler failed"})
        if isinstance(resp, _Hang):
            self.sim.stats.hung += 1
            try:
                await proto.client_disconnect()
            except Exception:  # the client went away some other way
                return
            return
        proto.response_bytes(resp.status, resp.headers, resp.body)

    def _admin(self, req: Request) -> Response:
        sim = self.sim
        if req.path == "/healthz":
            return json_response(200, {"ok": True, "simulator": sim.name})
        if req.path == "/_admin/stats":
            query = req.query_params()
            ids = query.get("ids", "1") not in ("0", "false")
            log_ = query.get("log", "0") in ("1", "true")
            return json_response(200, sim.stats.snapshot(include_ids=ids, include_log=log_))
        if req.path == "/_admin/reset" and req.method == "POST":
            sim.stats.reset()
            if req.query_params().get("config") in ("1", "true"):
                sim.reconfigure(self.initial.model_dump())
            return json_response(200, {"ok": True})
        if req.path == "/_admin/config":
            if req.method == "POST":
                try:
                    patch = orjson.loads(req.body or b"{}")
                    if not isinstance(patch, dict):
                        raise ValueError("config patch must be a JSON object")
                    sim.reconfigure(patch)
                except (ValueError, ValidationError) as exc:
                    return json_response(400, {"error": str(exc)})
            return json_response(200, sim.config.model_dump())
        return json_response(404, {"error": "no such admin route"})


async def serve(sim: Simulator, *, max_concurrent_streams: int = 1000) -> None:
    """Serve `sim` until SIGTERM/SIGINT (Granian embedded in this process's event loop)."""
    try:
        from granian.constants import HTTPModes, Interfaces, SSLProtocols
        from granian.http import HTTP2Settings
        from granian.server.embed import Server
    except ImportError as exc:
        raise InfraError(
            "granian is not installed: run `make install`, or pip install 'herald[embedded]'"
        ) from exc

    ssl = sim.ssl_files()
    server = Server(
        RsgiApp(sim),
        address=sim.host,
        port=sim.port,
        interface=Interfaces.RSGI,
        http=HTTPModes.auto,
        http2_settings=HTTP2Settings(max_concurrent_streams=max_concurrent_streams),
        backlog=2048,
        backpressure=100_000,
        websockets=False,
        log_access=False,
        ssl_cert=ssl[0] if ssl else None,
        ssl_key=ssl[1] if ssl else None,
        ssl_protocol_min=SSLProtocols.tls12,
    )
    loop = asyncio.get_running_loop()

    def stop() -> None:
        server.stop()
        # Streams held open on purpose (timeout after accept) would delay a graceful stop.
        loop.call_later(1.0, os._exit, 0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    await sim.startup()
    log.info("simulator.serving name=%s url=%s", sim.name, sim.base_url)
    try:
        await server.serve()
    finally:
        await sim.shutdown()
        log.info("simulator.stopped name=%s", sim.name)
