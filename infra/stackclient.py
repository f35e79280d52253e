"""A small typed client for a RUNNING Herald stack: API, provider simulators, ClickHouse, pids.

Used by `herald demo` and by end-to-end tests, so both drive the platform the way an operator
would: through the HTTP API (with the embedded stack's dev key), the simulators' `/_admin`
routes (infra/simulators/server.py) and ClickHouse over HTTP (herald/clickhouse.py). Nothing in
here reaches into a process; `kill` only sends a signal, and the supervisor (infra/stack.py)
restarts what died.

    with StackClient.from_run_dir(Path(".herald/run")) as stack:
        stack.put_contact_points("u1", phone="+14155550100")
        nid = stack.send({"request_id": "r1", "notification_type": "otp_login", ...})
        stack.wait_for(nid, "sms", {"DELIVERED"}, timeout=30)
"""

from __future__ import annotations

import os
import signal as signals
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx

from herald.errors import ApiError, InfraError, StackNotRunningError
from herald.providers import EXTERNAL

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client as ClickHouseClient

    from herald.config import HeraldSettings

__all__ = [
    "DEV_API_KEY",
    "SIMULATORS",
    "SimulatorAdmin",
    "StackClient",
]

# The embedded stack's dev key (api/tenants.toml); never valid in production.
DEV_API_KEY = "hk_dev_local_do_not_use_in_production"
SIMULATORS = EXTERNAL


def _expect(response: httpx.Response, status: int | tuple[int, ...], what: str) -> Any:
    wanted = (status,) if isinstance(status, int) else status
    if response.status_code not in wanted:
        raise ApiError(what, response)
    return response.json() if response.content else None


class SimulatorAdmin:
    """The `/_admin` routes of one provider simulator (fault config, counters, accepted ids)."""

    def __init__(self, name: str, base_url: str, timeout: float = 10.0) -> None:
        self.name = name
        self.base_url = base_url
        # the APNs simulator serves TLS with its own self-signed certificate
        self._http = httpx.Client(base_url=base_url, timeout=timeout, verify=False)

    def stats(self, ids: bool = True) -> dict[str, Any]:
        """Counters since the last reset; with `ids`, accepted `[msg_id, ref]` per address."""
        resp = self._http.get("/_admin/stats", params={"ids": "1" if ids else "0"})
        return dict(_expect(resp, 200, f"{self.name} stats"))

    def config(self) -> dict[str, Any]:
        """The current fault config (infra/simulators/config.py)."""
        return dict(_expect(self._http.get("/_admin/config"), 200, f"{self.name} config"))

    def configure(self, patch: dict[str, Any]) -> dict[str, Any]:
        """Replace whole top-level config fields (e.g. `{"errors": {"500": 1.0}}`); returns it."""
        resp = self._http.post("/_admin/config", json=patch)
        return dict(_expect(resp, 200, f"{self.name} configure"))

    def reset(self, config: bool = False) -> None:
        """Zero the counters; with `config`, also restore the config the simulator started with."""
        resp = self._http.post("/_admin/reset", params={"config": "1"} if config else None)
        _expect(resp, 200, f"{self.name} reset")

    def close(self) -> None:
        self._http.close()


class StackClient:
    """Talks to a running stack; a context manager that closes every client it opened."""

    def __init__(
        self,
        api_url: str,
        *,
        api_key: str = DEV_API_KEY,
        simulator_urls: dict[str, str] | None = None,
        clickhouse_dsn: str | None = None,
        state: dict[str, Any] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.api_url = api_url
        self.api = httpx.Client(base_url=api_url, headers={"X-API-Key": api_key}, timeout=timeout)
        self.simulator_urls = dict(simulator_urls or {})
        self.clickhouse_dsn = clickhouse_dsn
        self.state = state
        self._timeout = timeout
        self._sims: dict[str, SimulatorAdmin] = {}
        self._ch: ClickHouseClient | None = None

    @classmethod
    def from_run_dir(cls, run_dir: Path, **kwargs: Any) -> StackClient:
        """The stack whose supervisor owns `run_dir`; StackNotRunningError if none is ready."""
        from infra.stack import is_locked, read_state

        run_dir = Path(run_dir).resolve()
        state = read_state(run_dir)
        if state is None or not is_locked(run_dir) or not state.get("ready"):
            raise StackNotRunningError(
                f"no running Herald stack in {run_dir}: run `make run` (or `herald up --detach "
                f"--run-dir {run_dir}`) first"
            )
        api_url = state.get("urls", {}).get("api")
        if not api_url:
            raise StackNotRunningError(f"the stack in {run_dir} has no API component")
        components = state.get("components", {})
        sims = {
            name: components[f"sim-{name}"]["address"]
            for name in SIMULATORS
            if f"sim-{name}" in components
        }
        dsn = state.get("env", {}).get("HERALD_CLICKHOUSE_DSN")
        return cls(api_url, simulator_urls=sims, clickhouse_dsn=dsn, state=state, **kwargs)

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.api.close()
        for sim in self._sims.values():
            sim.close()
        self._sims.clear()
        if self._ch is not None:
            self._ch.close()
            self._ch = None

    # -- users, preferences, devices (api/routes/devices.py, preferences.py) ---------------

    def put_contact_points(
        self,
        user_id: str,
        *,
        phone: str | None = None,
        email: str | None = None,
        verified: bool = True,
    ) -> dict[str, Any]:
        """PUT /v1/users/{id}/contact-points with the given phone and/or email (others kept)."""
        body: dict[str, Any] = {}
        if phone is not None:
            body["phone"] = {"e164": phone, "verified": verified}
        if email is not None:
            body["email"] = {"address": email, "verified": verified}
        resp = self.api.put(f"/v1/users/{user_id}/contact-points", json=body)
        return dict(_expect(resp, 200, f"contact points of {user_id}"))

    def put_preferences(self, user_id: str, preferences: dict[str, Any]) -> dict[str, Any]:
        """PUT /v1/users/{id}/preferences: replaces the user's preferences entirely."""
        resp = self.api.put(f"/v1/users/{user_id}/preferences", json=preferences)
        return dict(_expect(resp, 200, f"preferences of {user_id}"))

    def preferences(self, user_id: str) -> dict[str, Any]:
        """GET /v1/users/{id}/preferences: the user's current preferences."""
        resp = self.api.get(f"/v1/users/{user_id}/preferences")
        return dict(_expect(resp, 200, f"preferences of {user_id}"))

    def put_device(
        self,
        user_id: str,
        platform: str,
        token: str,
        app_id: str | None = None,
        *,
        verified: bool = False,
    ) -> str:
        """POST /v1/devices (register or refresh a push token); returns the device_id.
        `verified` (the user's own device: OTP codes may go to it) needs contact_points:verify."""
        body: dict[str, Any] = {"user_id": user_id, "platform": platform, "token": token}
        if verified:
            body["verified"] = True
        if app_id is not None:
            body["app_id"] = app_id
        resp = self.api.post("/v1/devices", json=body)
        return str(_expect(resp, 201, f"device of {user_id}")["device_id"])

    def contact_points(self, user_id: str) -> dict[str, Any]:
        """GET /v1/users/{id}/contact-points (device tokens as hints only)."""
        resp = self.api.get(f"/v1/users/{user_id}/contact-points")
        return dict(_expect(resp, 200, f"contact points of {user_id}"))

    def inbox(self, user_id: str, limit: int = 20) -> dict[str, Any]:
        """GET /v1/users/{id}/inbox: newest in-app items first, with the unread count."""
        resp = self.api.get(f"/v1/users/{user_id}/inbox", params={"limit": limit})
        return dict(_expect(resp, 200, f"inbox of {user_id}"))

    # -- notifications (api/routes/notifications.py) ---------------------------------------

    def send(self, body: dict[str, Any]) -> str:
        """POST /v1/notifications; the notification_id once the request is durable (202)."""
        resp = self.api.post("/v1/notifications", json=body)
        return str(_expect(resp, 202, "send")["notification_id"])

    def status(self, notification_id: str, limit: int = 1000) -> dict[str, Any]:
        """GET /v1/notifications/{id}: the request state and one entry per known delivery."""
        resp = self.api.get(f"/v1/notifications/{notification_id}", params={"limit": limit})
        return dict(_expect(resp, 200, f"status of {notification_id}"))

    def control(self, notification_id: str, action: str) -> dict[str, Any]:
        """POST /v1/notifications/{id}/{cancel|pause|resume}: the answer (api/controls.py)."""
        # a resume or cancel puts parked deliveries back first: minutes for a large pause
        resp = self.api.post(f"/v1/notifications/{notification_id}/{action}", timeout=900)
        return dict(_expect(resp, 200, f"{action} {notification_id}"))

    def wait_for(
        self,
        notification_id: str,
        channel: str,
        states: set[str] | frozenset[str] | tuple[str, ...],
        timeout: float = 60.0,
        poll: float = 0.2,
    ) -> dict[str, Any]:
        """Poll until a delivery on `channel` is in one of `states`; returns that delivery.

        Raises TimeoutError with the last status seen. A notification not yet known to the
        status API (404 right after accept) counts as "not yet".
        """
        wanted = set(states)
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while True:
            resp = self.api.get(f"/v1/notifications/{notification_id}", params={"limit": 1000})
            if resp.status_code == 200:
                last = resp.json()
                for delivery in last.get("deliveries", []):
                    if delivery.get("channel") == channel and delivery.get("state") in wanted:
                        return dict(delivery)
            elif resp.status_code != 404:
                raise ApiError(f"status of {notification_id}", resp)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{notification_id}: no {channel} delivery in {sorted(wanted)} after "
                    f"{timeout:.0f}s; last status: {last}"
                )
            time.sleep(poll)

    def wait_consumed(self, job: str, topics: list[str], timeout: float = 60.0) -> None:
        """Wait until `job` has committed every record now in `topics` (logical names): the
        barrier for "what was written so far went through this job".

        The job's position is its last recovery snapshot (dashboards/lag.py), so the wait
        lasts at least until its next epoch ends (`-s`, 5 s by default). Raises TimeoutError
        with the partitions still behind.
        """
        from dashboards.lag import behind, topic_ends

        if self.state is None:
            raise InfraError("this client was not made from a run directory")
        root = Path(self.state["run_dir"]) / "recovery"
        kafka = self.settings().kafka
        ends = topic_ends(kafka, [kafka.topic(t) for t in topics])  # later records: not waited for
        deadline = time.monotonic() + timeout
        while short := behind(root, job, ends):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{job} not past {short} ((position, end)) after {timeout}s")
            time.sleep(0.5)

    # -- simulators, ClickHouse, processes -------------------------------------------------

    def sim(self, name: str) -> SimulatorAdmin:
        """The admin client of simulator `name` (apns, fcm, sms_a, sms_b, email)."""
        if name not in self._sims:
            url = self.simulator_urls.get(name)
            if url is None:
                raise KeyError(f"no simulator {name!r} (known: {sorted(self.simulator_urls)})")
            self._sims[name] = SimulatorAdmin(name, url, timeout=self._timeout)
        return self._sims[name]

    def clickhouse(self) -> ClickHouseClient:
        """A clickhouse-connect client on the stack's ClickHouse (database `herald`), shared."""
        if self._ch is None:
            from herald.clickhouse import herald_client
            from herald.config import ClickHouseSettings

            if self.clickhouse_dsn is None:
                raise InfraError("no ClickHouse DSN known for this stack")
            self._ch = herald_client(ClickHouseSettings(dsn=self.clickhouse_dsn))
        return self._ch

    def settings(self) -> HeraldSettings:
        """HeraldSettings reaching this stack's Kafka, registry, Redis and ClickHouse, for
        clients that talk to them directly (producers of social events, bulk loaders)."""
        from herald.config import (
            ClickHouseSettings,
            HeraldSettings,
            KafkaSettings,
            RedisSettings,
            RegistrySettings,
            RunSettings,
        )

        if self.state is None:
            raise InfraError("this client was not made from a run directory")
        env = self.state["env"]
        return HeraldSettings(
            kafka=KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"]),
            redis=RedisSettings(url=env["HERALD_REDIS_URL"]),
            clickhouse=ClickHouseSettings(dsn=env["HERALD_CLICKHOUSE_DSN"]),
            registry=RegistrySettings(
                url=env.get("HERALD_REGISTRY_URL") or None,
                path=Path(env["HERALD_REGISTRY_PATH"]),
            ),
            run=RunSettings(run_dir=Path(self.state["run_dir"])),
        )

    def refresh_state(self) -> dict[str, Any]:
        """Re-read state.json (the supervisor rewrites it with new pids after a restart)."""
        from infra.stack import read_state

        if self.state is None:
            raise InfraError("this client was not made from a run directory")
        fresh = read_state(Path(self.state["run_dir"]))
        if fresh is None:
            raise StackNotRunningError(f"state.json of {self.state['run_dir']} is gone")
        self.state = fresh
        return fresh

    def pid(self, component: str) -> int:
        """The current pid of `component` (re-reads state.json: restarts change it)."""
        components = self.refresh_state()["components"]
        if component not in components:
            raise KeyError(f"no component {component!r} (known: {sorted(components)})")
        return int(components[component]["pid"])

    def kill(self, component: str, sig: int = signals.SIGKILL) -> int:
        """Send `sig` to the component's process group; returns the pid signalled.

        The supervisor notices a dead component within 0.1 s and restarts it, with a backoff
        of 2, 4, ... 30 s between successive restarts of the same component (infra/stack.py).
        """
        pid = self.pid(component)
        try:
            os.killpg(pid, sig)  # ManagedProcess starts each component in its own group
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)
        return pid

    def wait_restarted(self, component: str, old_pid: int, timeout: float = 60.0) -> int:
        """Wait until state.json shows `component` with a new pid; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.pid(component)
            if pid != old_pid:
                return pid
            time.sleep(0.2)
        raise TimeoutError(f"{component} was not restarted within {timeout:.0f}s")
