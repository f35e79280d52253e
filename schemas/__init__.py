"""Avro contracts of every Kafka topic: one `<name>.avsc` file per schema name.

The `.avsc` files in this package are the source of truth (namespace `herald`); the schema name
of each topic is declared in `herald/topics.toml`. This module only finds and reads them:

    schema_names()          -> ["contact_points", "dead_letter", ...]
    schema_text(name)       -> canonical JSON text (compact, key order kept, docs kept)
    load_schema(name)       -> the fastavro-parsed schema (cached; parse once, use on hot paths)

Wire format, registry and compatibility checks live in `schemas.serde`, `schemas.registry` and
`schemas.compat`.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from fastavro import parse_schema

from herald.errors import SchemaError

__all__ = ["canonical_json", "load_schema", "schema_names", "schema_text"]

_SUFFIX = ".avsc"


def canonical_json(text: str) -> str:
    """Compact, deterministic JSON for a schema text (whitespace removed, key order kept)."""
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)


def schema_names() -> list[str]:
    """Names (file stems) of every schema shipped in this package, sorted."""
    return list(_names())


@cache
def _names() -> tuple[str, ...]:
    root = resources.files(__name__)
    stems = (p.name[: -len(_SUFFIX)] for p in root.iterdir() if p.name.endswith(_SUFFIX))
    return tuple(sorted(stems))


@cache
def _raw_text(name: str) -> str:
    path = resources.files(__name__).joinpath(f"{name}{_SUFFIX}")
    if not path.is_file():
        raise SchemaError(f"unknown schema {name!r}; known: {', '.join(schema_names())}")
    return path.read_text(encoding="utf-8")


@cache
def schema_text(name: str) -> str:
    """Canonical JSON text of `schemas/<name>.avsc`; this exact text is what gets registered."""
    try:
        return canonical_json(_raw_text(name))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"schemas/{name}{_SUFFIX} is not valid JSON: {exc}") from exc


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The fastavro-parsed schema `name` (parsed once per process; treat it as read-only)."""
    try:
        parsed = parse_schema(json.loads(schema_text(name)), named_schemas={})
    except Exception as exc:  # fastavro raises several types for invalid schemas
        raise SchemaError(f"schemas/{name}{_SUFFIX} is not a valid Avro schema: {exc}") from exc
    if not isinstance(parsed, dict):
        raise SchemaError(f"schemas/{name}{_SUFFIX} must define a record")
    return parsed
