"""Start a provider simulator as a managed subprocess (tests, benchmarks, the embedded stack).

    with start_simulator("apns", tmp_path) as sim:
        sim.configure(errors={"Unregistered": 0.5})
        ... ApnsConfig(base_url=sim.base_url, ca_path=sim.ca_path, **sim.credentials()) ...
        sim.stats()["accepted"]

Reuses `infra.process` (ManagedProcess, free_port, wait_until): the simulator runs in its own
process group and is stopped for good by `stop()`.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import orjson

from herald.errors import InfraError
from infra.process import ManagedProcess, free_port, wait_until

__all__ = ["RunningSimulator", "simulator_argv", "start_simulator"]


def simulator_argv(
    name: str,
    port: int,
    state_dir: Path,
    *,
    host: str = "127.0.0.1",
    config: Mapping[str, Any] | None = None,
    callback_url: str | None = None,
) -> list[str]:
    """The command line that runs simulator `name` (for ManagedProcess or a stack Component)."""
    argv = [sys.executable, "-m", "infra.simulators", name, "--port", str(port)]
    argv += ["--host", host, "--state-dir", str(state_dir)]
    if config:
        argv += ["--config", orjson.dumps(dict(config)).decode()]
    if callback_url:
        argv += ["--callback-url", callback_url]
    return argv


@dataclass
class RunningSimulator:
    """A simulator subprocess and the way to reach, reconfigure and inspect it."""

    name: str
    host: str
    port: int
    state_dir: Path
    process: ManagedProcess
    tls: bool
    _admin: httpx.Client | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        """Root URL of the provider API (https for APNs)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ca_path(self) -> Path | None:
        """The CA certificate that signs the simulator's TLS certificate (APNs only)."""
        return self.state_dir / "tls" / "ca.pem" if self.tls else None

    def credentials(self) -> dict[str, Any]:
        """The simulator's credentials.json (keys, secrets, ids a client needs)."""
        data: dict[str, Any] = orjson.loads((self.state_dir / "credentials.json").read_bytes())
        return data

    def _client(self) -> httpx.Client:
        """The admin HTTP client (created once: building TLS contexts is slow)."""
        if self._admin is None:
            verify: Any = True
            if self.ca_path is not None:
                verify = ssl.create_default_context(cafile=str(self.ca_path))
            self._admin = httpx.Client(base_url=self.base_url, verify=verify, timeout=10.0)
        return self._admin

    def healthy(self) -> bool:
        """GET /healthz answered 200."""
        if self.ca_path is not None and not self.ca_path.exists():
            return False
        return self._client().get("/healthz").status_code == 200

    def configure(self, **patch: Any) -> dict[str, Any]:
        """Patch the fault config at run time (whole top-level fields); returns the new one."""
        resp = self._client().post("/_admin/config", content=orjson.dumps(patch))
        if resp.status_code != 200:
            raise ValueError(f"{self.name}: config rejected: {resp.text}")
        result: dict[str, Any] = resp.json()
        return result

    def stats(self, ids: bool = True) -> dict[str, Any]:
        """GET /_admin/stats."""
        params = {"ids": "1" if ids else "0"}
        result: dict[str, Any] = self._client().get("/_admin/stats", params=params).json()
        return result

    def reset(self, config: bool = False) -> None:
        """Zero the simulator's counters; `config=True` also restores the start config."""
        self._client().post("/_admin/reset", params={"config": "1" if config else "0"})

    def stop(self) -> None:
        """Stop the process (idempotent)."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        self.process.stop(timeout=5.0)

    def __enter__(self) -> RunningSimulator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_simulator(
    name: str,
    state_dir: Path,
    *,
    config: Mapping[str, Any] | None = None,
    callback_url: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout: float = 20.0,
) -> RunningSimulator:
    """Start simulator `name` on a free port, wait until it is healthy, return its handle."""
    from infra.simulators import simulator_class

    tls = simulator_class(name).tls
    port = port or free_port(host)
    state_dir.mkdir(parents=True, exist_ok=True)
    for stale in (state_dir / "tls" / "ca.pem", state_dir / "credentials.json"):
        stale.unlink(missing_ok=True)  # rewritten by this start; never trust an old one
    argv = simulator_argv(
        name, port, state_dir, host=host, config=config, callback_url=callback_url
    )
    proc = ManagedProcess(name=f"sim-{name}", argv=argv, log_path=state_dir / "simulator.log")
    proc.start()
    sim = RunningSimulator(name, host, port, state_dir, proc, tls)
    try:
        # Stops early when the process dies (bad config): checked again right after.
        wait_until(lambda: not proc.alive() or sim.healthy(), timeout, 0.05, what=name)
        if not proc.alive():
            raise TimeoutError(f"exited with code {proc.returncode()}")
    except TimeoutError as exc:
        tail = proc.tail()
        proc.stop()
        raise InfraError(f"simulator {name} did not start: {exc}\n{tail}") from exc
    return sim
