"""Tenant API keys: hashed at rest, scoped, with a per-tenant request rate.

The tenants file (TOML, `ApiSettings.tenants_file`, default `api/tenants.toml`):

    [tenants.login]
    rate_limit_per_second = 500          # all authenticated endpoints together
    [[tenants.login.keys]]
    id = "login-2026-11"                 # shown in logs instead of the key
    sha256 = "<hex sha256 of the key>"   # `python -m api.auth hash <key>` prints it
    scopes = ["notifications:write", "notifications:read"]
    types = ["otp_login", "password_reset"]  # optional: the only types this key may send
    segments = []                        # optional: the only segments it may target

A key without `types` may send every type of the catalog, without `segments` target every
segment; with them, anything else is 403 `type_not_allowed` / `segment_not_allowed` (so the
orders service's key cannot send `otp_login`); the segments list also bounds which segments the
key may create, read and delete (api/segments.py). `scopes` name what a key may call at all.
Requests produced to Kafka without the API are held to what the tenant's keys may send
together (herald/tenants.py): a service that only produces is declared here with a key too.

Keys are random high-entropy strings (`python -m api.auth new <tenant>`), so one SHA-256 is
enough to make a stolen file useless (no password stretching needed, and lookups stay O(1)).
Clients send `X-API-Key: <key>` or `Authorization: Bearer <key>`. Missing or unknown key → 401,
known key without the endpoint's scope → 403.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from herald import links
from herald.errors import ConfigError
from herald.tenants import read_tenants_file

SCOPES = frozenset(
    {
        "notifications:write",
        "notifications:read",
        "preferences:write",
        "preferences:read",
        "devices:write",
        "devices:read",
        "inbox:read",
        "inbox:write",
        "otp:verify",
        "contact_points:verify",  # set a phone or email as `verified` (else 403)
        "pii:read",  # whole phone numbers and email addresses in responses (else masked)
        "inbox:token",  # mint end users' inbox tokens (POST /v1/users/{id}/inbox/tokens)
        "segments:write",  # upload and delete segments (PUT/DELETE /v1/segments/{id})
        "segments:read",  # list and show segments
        "segments:query",  # make a segment from a read-only ClickHouse query (POST /v1/segments)
    }
)


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant and the key it authenticated with."""

    tenant_id: str
    key_id: str
    scopes: frozenset[str]
    rate_limit_per_second: int
    types: frozenset[str] | None = None  # None: every type of the catalog
    segments: frozenset[str] | None = None  # None: every segment

    def may_send(self, notification_type: str) -> bool:
        """Whether this key may send `notification_type`."""
        return self.types is None or notification_type in self.types

    def may_target(self, segment_id: str) -> bool:
        """Whether this key may send to segment `segment_id`."""
        return self.segments is None or segment_id in self.segments


USER_TOKEN_PREFIX = "hu_"  # end-user inbox tokens; tenant keys never start with it
USER_TOKEN_SCOPES = frozenset({"inbox:read", "inbox:write"})


def mint_user_token(secret: bytes, tenant_id: str, user_id: str, expires: int) -> str:
    """An end user's inbox token: `user_id`'s inbox only, for the tenant, until `expires`
    (epoch seconds). Signed like Herald's links (herald/links.py, kind "i")."""
    claims = {"t": tenant_id, "u": user_id, "e": str(expires)}
    return USER_TOKEN_PREFIX + links.sign(secret, "i", claims)


def user_token_claims(secret: bytes, token: str, now: float) -> tuple[str, str] | None:
    """(tenant_id, user_id) of a valid, unexpired inbox token; None otherwise."""
    try:
        claims = links.verify(secret, "i", token.removeprefix(USER_TOKEN_PREFIX))
        expires = int(claims["e"])
    except (links.BadToken, ValueError):
        return None
    return (claims["t"], claims["u"]) if now < expires else None


def hash_key(key: str) -> str:
    """Hex SHA-256 of an API key (what the tenants file stores)."""
    return hashlib.sha256(key.encode()).hexdigest()


class Tenants:
    """Key hash -> Tenant, loaded from the tenants file."""

    def __init__(self, by_hash: dict[str, Tenant]) -> None:
        self._by_hash = by_hash
        self._rates = {t.tenant_id: t.rate_limit_per_second for t in by_hash.values()}

    def end_user(self, tenant_id: str, user_id: str) -> Tenant | None:
        """The authority of an end user's inbox token of `tenant_id` (its rate, the inbox
        scopes); None when the tenant no longer has a key (its tokens die with it)."""
        rate = self._rates.get(tenant_id)
        if rate is None:
            return None
        return Tenant(tenant_id, f"user:{user_id}", USER_TOKEN_SCOPES, rate)

    def authenticate(self, key: str | None) -> Tenant | None:
        """The tenant of `key`, or None when it is missing or unknown."""
        if not key or len(key) > 256:
            return None
        return self._by_hash.get(hash_key(key))

    @classmethod
    def load(cls, path: Path) -> Tenants:
        """Parse and validate a tenants file; raises ConfigError naming the bad entry."""
        return cls.from_dict(read_tenants_file(path), str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "<memory>") -> Tenants:  # type: ignore[type-arg]
        """Build from a decoded tenants table."""
        by_hash: dict[str, Tenant] = {}
        for tenant_id, entry in (raw.get("tenants") or {}).items():
            where = f"tenants file {source}: tenants.{tenant_id}"
            rate = entry.get("rate_limit_per_second", 100)
            if not isinstance(rate, int) or rate < 1:
                raise ConfigError(f"{where}.rate_limit_per_second must be a positive integer")
            for i, key in enumerate(entry.get("keys") or []):
                digest = str(key.get("sha256", "")).lower()
                scopes = frozenset(key.get("scopes") or [])
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise ConfigError(f"{where}.keys[{i}].sha256 must be 64 hex digits")
                if not scopes or not scopes <= SCOPES:
                    unknown = sorted(scopes - SCOPES) or ["<none>"]
                    raise ConfigError(f"{where}.keys[{i}].scopes: unknown {unknown}")
                if digest in by_hash:
                    raise ConfigError(f"{where}.keys[{i}]: key used twice")
                key_id = str(key.get("id") or f"{tenant_id}-{i}")
                types = _names(key, "types", f"{where}.keys[{i}]")
                segments = _names(key, "segments", f"{where}.keys[{i}]")
                by_hash[digest] = Tenant(tenant_id, key_id, scopes, rate, types, segments)
        if not by_hash:
            raise ConfigError(f"tenants file {source}: no tenant has a key")
        return cls(by_hash)


def _names(key: dict, field: str, where: str) -> frozenset[str] | None:  # type: ignore[type-arg]
    """A key's optional allow-list (`types`, `segments`): None when absent."""
    if field not in key:
        return None
    names = key[field]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}.{field} must be a list of names")
    return frozenset(names)


def main(argv: list[str]) -> int:
    """`python -m api.auth new <tenant>` prints a fresh key and its hash; `hash <key>` hashes."""
    if len(argv) == 2 and argv[0] == "new":
        key = f"hk_{argv[1]}_{secrets.token_urlsafe(24)}"
        print(f"key    = {key}\nsha256 = {hash_key(key)}")
        return 0
    if len(argv) == 2 and argv[0] == "hash":
        print(hash_key(argv[1]))
        return 0
    print("usage: python -m api.auth new <tenant> | hash <key>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
