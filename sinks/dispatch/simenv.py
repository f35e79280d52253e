"""The environment that points the provider clients at the simulators (embedded stack, tests).

    client_env(name, credentials, callback_base=None) -> {"HERALD_APNS_BASE_URL": ..., ...}

`credentials` is the simulator's `<state-dir>/credentials.json` (written at its start;
`RunningSimulator.credentials()`), so the same clients that talk to the real providers talk to
the simulators. `callback_base` (Herald's API URL) sets the status-callback URLs the clients of
providers with receipts send with each message (`<api>/v1/callbacks/<provider>`). Each
provider's module says how (its `SPEC.client_env`, sinks/provider_registry.py). No secret is
ever logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.provider_registry import MODULES, spec

__all__ = ["client_env"]


def client_env(
    name: str, credentials: Mapping[str, Any], callback_base: str | None = None
) -> dict[str, str]:
    """HERALD_* variables for the client of provider `name`, pointed at its simulator."""
    if name not in MODULES:
        raise ValueError(f"unknown simulator {name!r}")
    c = {k: str(v) for k, v in credentials.items() if v is not None}
    return spec(name).client_env(c, callback_base)
