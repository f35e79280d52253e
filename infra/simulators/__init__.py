"""Provider simulators: real HTTP servers speaking the providers' wire formats (PROVIDERS.md).

    python -m infra.simulators <name> --port N [--config JSON|FILE] [--callback-url URL]
                                      [--state-dir DIR] [--host H]

One simulator per provider, registered with it (sinks/provider_registry.py); each module's
docstring says what it speaks. The first five:

| name  | provider shape                                  | transport                  |
|-------|-------------------------------------------------|----------------------------|
| apns  | APNs token auth, `POST /3/device/{token}`        | HTTP/2 over TLS (self CA)  |
| fcm   | FCM HTTP v1 `messages:send` + OAuth `POST /token` | HTTP/1.1 or h2c            |
| sms_a | Twilio Messages API + signed status callbacks    | HTTP/1.1                   |
| sms_b | Vonage SMS API + signed DLRs                     | HTTP/1.1                   |
| email | SendGrid v3 mail/send + signed Event Webhook     | HTTP/1.1                   |

Each injects latency, an error mix, a rate limit, timeouts after accept, always-invalid and
always-dead addresses, and (SMS, email) delayed/duplicated/out-of-order signed receipts; all of it
configurable at start and at run time (`POST /_admin/config`). Credentials a client needs are
written to `<state-dir>/credentials.json`. `infra.simulators.launcher` starts one as a managed
subprocess for tests and the embedded stack; `infra.simulators.recorder` records callbacks in
tests; `python -m infra.simulators.loadtest` measures ApnsClient sends/s against one simulator.

Server: Granian (Rust/hyper, HTTP/1.1 + HTTP/2 + TLS) embedded in the simulator's event loop,
with a bare RSGI handler. Measured here (2 cores, shared): one APNs simulator answers
~12-18k req/s over HTTP/2+TLS with JWT checks (~45-55 µs CPU per request); the HTTP/1.1
simulators ~5-8k req/s (60-95 µs per request).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from sinks.provider_registry import MODULES

if TYPE_CHECKING:
    from infra.simulators.server import Simulator

__all__ = ["SIMULATORS", "simulator_class"]

# provider -> "module:Class", as registered with the provider (sinks/provider_registry.py)
SIMULATORS: dict[str, str] = {name: simulator for name, (_, simulator) in MODULES.items()}


def simulator_class(name: str) -> type[Simulator]:
    """The Simulator subclass registered under `name` (KeyError if unknown)."""
    module, _, attr = SIMULATORS[name].partition(":")
    cls: type[Simulator] = getattr(import_module(module), attr)
    return cls
