"""What a tenant may send when its request did not come through the API.

    TenantTypes.load(path)              from the tenants file (format: api/auth.py)
    types.refusal(tenant_id, type)      None, or the InvalidRequest that dead-letters the request

The API holds each request to what its key may send (403 `type_not_allowed`). A request that
another producer put on `herald.requests.*` carries no key, only a `tenant_id`, so the plan job
holds it to what the tenant's keys may send together: the tenant must have a key in the tenants
file (else `unknown_tenant`), and a key of it without a `types` list, or one whose list names
the type (else `type_not_allowed`). A service that produces to Kafka is therefore declared like
one that calls the API, with a key that says what it may send (the key itself is not needed).
Requests the API accepted were checked there, and the digest job's were made by Herald from the
catalog's digest rules (herald/planning.py `admit_request` skips both).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from herald.errors import ConfigError, InvalidRequest

__all__ = ["TenantTypes", "read_tenants_file"]


def read_tenants_file(path: Path) -> dict[str, Any]:
    """The tenants file as TOML tables (api/auth.py validates its keys); raises ConfigError
    when it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"tenants file {path}: {exc}") from exc


class TenantTypes:
    """Tenant id -> the types its keys may send together (None: every type)."""

    def __init__(self, types: Mapping[str, frozenset[str] | None]) -> None:
        self._types = dict(types)

    @classmethod
    def load(cls, path: Path) -> TenantTypes:
        """Read the tenants file; raises ConfigError when it cannot be read."""
        raw = read_tenants_file(path)
        types: dict[str, frozenset[str] | None] = {}
        for tenant_id, tenant in (raw.get("tenants") or {}).items():
            keys = tenant.get("keys") or []
            if not keys:
                continue
            if any(key.get("types") is None for key in keys):
                types[tenant_id] = None  # a key that may send every type
            else:
                types[tenant_id] = frozenset(t for key in keys for t in key["types"])
        return cls(types)

    def refusal(self, tenant_id: str, notification_type: str) -> InvalidRequest | None:
        """Why `tenant_id` may not send `notification_type`; None when it may."""
        if tenant_id not in self._types:
            return InvalidRequest(
                "unknown_tenant", f"tenant {tenant_id!r} has no key in the tenants file"
            )
        allowed = self._types[tenant_id]
        if allowed is not None and notification_type not in allowed:
            return InvalidRequest(
                "type_not_allowed", f"tenant {tenant_id!r} may not send {notification_type}"
            )
        return None
