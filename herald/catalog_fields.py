"""Reading the catalog file: typed, path-aware field access and locale tags.

    Fields(raw, "types.x.", source)   getters that record what was read; close() rejects the rest
    ParseContext                      catalog-wide settings the section parsers need
    normalize_locale("pt_br")         "pt-BR"; locale_parents("zh-Hant-TW") → its parents

The lowest of the catalog modules: the section parsers (herald.templates, herald.digest_config)
and the catalog itself (herald.catalog) read their tables with these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from herald.errors import ConfigError, InvalidLocale

__all__ = ["Fields", "ParseContext", "locale_parents", "normalize_locale"]

_LOCALE = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*$")


def normalize_locale(tag: str) -> str:
    """`pt_br` → `pt-BR`, `zh-hans-cn` → `zh-Hans-CN`; raises `InvalidLocale` when malformed."""
    if not isinstance(tag, str) or not _LOCALE.match(tag):
        raise InvalidLocale(tag)
    parts = tag.replace("_", "-").split("-")
    out = [parts[0].lower()]
    for part in parts[1:]:
        if len(part) == 4 and part.isalpha():
            out.append(part.title())
        elif (len(part) == 2 and part.isalpha()) or (len(part) == 3 and part.isdigit()):
            out.append(part.upper())
        else:
            out.append(part.lower())
    return "-".join(out)


def locale_parents(tag: str) -> tuple[str, ...]:
    """`zh-Hant-TW` → (`zh-Hant-TW`, `zh-Hant`, `zh`)."""
    parts = tag.split("-")
    return tuple("-".join(parts[:n]) for n in range(len(parts), 0, -1))


_MISSING: Any = object()


class Fields:
    """Typed, path-aware reader of one TOML table for the catalog parsers.

    Every getter records the key; `close()` rejects keys nobody read (typos). Errors are
    `ConfigError("catalog <file>: types.x.field: message")`.
    """

    def __init__(self, raw: Any, where: str, source: str) -> None:
        self.where, self.source = where, source
        if not isinstance(raw, dict):
            raise ConfigError(f"catalog {source}: {where.rstrip('.')}: must be a table")
        self.raw: dict[str, Any] = raw
        self.seen: set[str] = set()

    def error(self, key: str, msg: str) -> ConfigError:
        path = f"{self.where}{key}" if key else self.where.rstrip(".")
        return ConfigError(f"catalog {self.source}: {path}: {msg}")

    def sub(self, key: str) -> Fields:
        return Fields(self.get(key, dict), f"{self.where}{key}.", self.source)

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        self.seen.add(key)
        if key not in self.raw:
            if default is _MISSING:
                raise self.error(key, "is required")
            return default
        value = self.raw[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(key, f"must be of type {kind.__name__}, got {value!r}")
        return value

    def integer(self, key: str, minimum: int, default: Any = _MISSING) -> int:
        value: int = self.get(key, int, default)
        if value < minimum:
            raise self.error(key, f"must be an integer >= {minimum}, got {value}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = _MISSING) -> str:
        value: str = self.get(key, str, default)
        if value not in options:
            raise self.error(key, f"must be one of {', '.join(options)}; got {value!r}")
        return value

    def strings(self, key: str, default: Any = _MISSING) -> list[str]:
        value: list[Any] = self.get(key, list, default)
        if not all(isinstance(v, str) and v for v in value) or len(set(value)) != len(value):
            raise self.error(key, "must be a list of distinct non-empty strings")
        return value

    def locale(self, key: str, value: Any = _MISSING) -> str:
        """Normalize `value` (default: the string at `key`) as a locale tag."""
        tag = self.get(key, str) if value is _MISSING else value
        try:
            return normalize_locale(tag)
        except InvalidLocale:
            raise self.error(key, f"{tag!r} is not a BCP 47 locale") from None

    def close(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            raise self.error(unknown[0], "unknown field")


@dataclass(frozen=True, slots=True)
class ParseContext:
    """Catalog-wide settings the per-type parsers need."""

    source: str
    default_locale: str
    default_expiry: int
    caps: Mapping[str, Any]  # herald.catalog.CapConfig by bucket
