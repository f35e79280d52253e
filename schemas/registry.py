"""Schema registries: subject -> schema id, schema id -> schema text.

Two implementations of one `SchemaRegistry` protocol:

* `FileRegistry` — the embedded default: a JSON file in a directory, shared by every process of
  a run through `fcntl.flock`, so concurrent registrations resolve to the same ids.
* `ConfluentRegistry` — any Confluent-compatible registry (Confluent SR, Karapace, Redpanda,
  Apicurio ccompat) through `confluent_kafka.schema_registry`.

Both follow Confluent's id semantics: ids are global, registering the same schema under the same
subject again returns the same id, and an identical schema under another subject gets the same
id too. Both cache in memory; ids never change once assigned.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from herald.config import RegistrySettings
from herald.errors import IncompatibleSchemaError, RegistryError, SchemaNotFoundError

__all__ = [
    "ConfluentRegistry",
    "FileRegistry",
    "SchemaNotFoundError",
    "SchemaRegistry",
    "make_registry",
]


@runtime_checkable
class SchemaRegistry(Protocol):
    """What producers and consumers need from a schema registry."""

    def register(self, subject: str, schema_text: str) -> int:
        """Register `schema_text` (Avro JSON) under `subject`; return its global id (idempotent)."""
        ...

    def get_schema(self, schema_id: int) -> str:
        """The schema text of `schema_id`; raises `SchemaNotFoundError` when it does not exist."""
        ...


def _normalize(schema_text: str) -> str:
    """Identity key of a schema text: JSON re-serialized with sorted keys and no whitespace."""
    try:
        return json.dumps(json.loads(schema_text), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError as exc:
        raise RegistryError(f"schema is not valid JSON: {exc}") from exc


class FileRegistry:
    """File-backed registry in directory `path` (state in `registry.json`, lock in `.lock`).

    Every mutation happens under an exclusive `flock` and re-reads the file first, so separate
    processes that register concurrently agree on ids. Ids are sequential from 1. The file is
    replaced atomically (write + rename), so readers never see a half-written state.
    """

    STATE_FILE = "registry.json"
    LOCK_FILE = ".lock"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._state_path = self.path / self.STATE_FILE
        self._lock_path = self.path / self.LOCK_FILE
        self._mutex = threading.Lock()
        self._ids: dict[tuple[str, str], int] = {}  # (subject, normalized) -> id
        self._texts: dict[int, str] = {}  # id -> schema text

    def __repr__(self) -> str:
        return f"FileRegistry({str(self.path)!r})"

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RegistryError(f"cannot open registry at {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> dict[str, Any]:
        try:
            raw = self._state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"schemas": [], "subjects": {}}
        except OSError as exc:
            raise RegistryError(f"cannot read {self._state_path}: {exc}") from exc
        try:
            state: dict[str, Any] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RegistryError(f"corrupt registry file {self._state_path}: {exc}") from exc
        return state

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self._state_path.with_name(f"{self.STATE_FILE}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(state, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._state_path)
        except OSError as exc:
            raise RegistryError(f"cannot write {self._state_path}: {exc}") from exc

    def _absorb(self, state: dict[str, Any]) -> None:
        """Copy the file's id -> text table into the in-memory cache."""
        for entry in state["schemas"]:
            self._texts.setdefault(int(entry["id"]), entry["schema"])

    def register(self, subject: str, schema_text: str) -> int:
        """Register under `subject`; same (normalized) text anywhere -> same id."""
        key = (subject, _normalize(schema_text))
        with self._mutex:
            cached = self._ids.get(key)
            if cached is not None:
                return cached
            with self._locked(exclusive=True):
                state = self._read()
                schema_id = self._assign(state, subject, key[1], schema_text)
            self._absorb(state)
            self._ids[key] = schema_id
            return schema_id

    def _assign(self, state: dict[str, Any], subject: str, norm: str, text: str) -> int:
        """Find or add the schema and the subject version in `state`; persist if changed."""
        changed = False
        schema_id = next(
            (int(e["id"]) for e in state["schemas"] if _normalize(e["schema"]) == norm), None
        )
        if schema_id is None:
            schema_id = len(state["schemas"]) + 1
            state["schemas"].append({"id": schema_id, "schema": text})
            changed = True
        versions: list[int] = state["subjects"].setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
            changed = True
        if changed:
            self._write(state)
        return schema_id

    def get_schema(self, schema_id: int) -> str:
        """Schema text of `schema_id`; re-reads the file once before `SchemaNotFoundError`."""
        text = self._texts.get(schema_id)
        if text is not None:
            return text
        with self._mutex:
            with self._locked(exclusive=False):
                state = self._read()
            self._absorb(state)
        text = self._texts.get(schema_id)
        if text is None:
            raise SchemaNotFoundError(f"schema id {schema_id} not found in {self._state_path}")
        return text

    def subject_versions(self, subject: str) -> list[int]:
        """Schema ids registered under `subject`, oldest first ([] when unknown)."""
        return self.subjects().get(subject, [])

    def subjects(self) -> dict[str, list[int]]:
        """Every subject with its schema ids, oldest first (version n is the n-th)."""
        with self._locked(exclusive=False):
            state = self._read()
        self._absorb(state)
        return {name: [int(i) for i in ids] for name, ids in state["subjects"].items()}

    def register_compatible(self, subject: str, schema_text: str) -> int:
        """`register`, unless the schema is new to `subject` and cannot read data written with
        every version before it (BACKWARD_TRANSITIVE): then IncompatibleSchemaError naming what
        breaks. What the HTTP registry (schemas/registry_server.py) answers a client."""
        from schemas.compat import check_compatible

        norm = _normalize(schema_text)
        with self._mutex, self._locked(exclusive=True):
            state = self._read()
            self._absorb(state)
            ids = [int(i) for i in state["subjects"].get(subject, [])]
            if not any(_normalize(self._texts[i]) == norm for i in ids):
                problems = check_compatible(schema_text, [self._texts[i] for i in ids])
                if problems:
                    raise IncompatibleSchemaError("; ".join(problems))
            schema_id = self._assign(state, subject, norm, schema_text)
            self._absorb(state)
            self._ids[(subject, norm)] = schema_id
            return schema_id


class ConfluentRegistry:
    """A Confluent-compatible registry at `url`, via `confluent_kafka.schema_registry`.

    `basic_auth_user_info` is "user:password"; `client_conf` adds SchemaRegistryClient settings
    (e.g. `max.retries`, `ssl.ca.location`). Every client error is raised as `RegistryError`
    (`SchemaNotFoundError` for an unknown id).
    """

    def __init__(
        self,
        url: str,
        basic_auth_user_info: str | None = None,
        client_conf: Mapping[str, Any] | None = None,
    ) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf: dict[str, Any] = {"url": url, **(client_conf or {})}
        if basic_auth_user_info:
            conf["basic.auth.user.info"] = basic_auth_user_info
        self.url = url
        self._client = SchemaRegistryClient(conf)
        self._mutex = threading.Lock()
        self._ids: dict[tuple[str, str], int] = {}
        self._texts: dict[int, str] = {}

    def __repr__(self) -> str:
        return f"ConfluentRegistry({self.url!r})"

    def register(self, subject: str, schema_text: str) -> int:
        """POST the schema to `/subjects/<subject>/versions`; the registry dedups by content."""
        from confluent_kafka.schema_registry import Schema

        key = (subject, _normalize(schema_text))
        cached = self._ids.get(key)
        if cached is not None:
            return cached
        try:
            schema_id = int(self._client.register_schema(subject, Schema(schema_text, "AVRO")))
        except Exception as exc:  # SchemaRegistryError, httpx errors, ...
            raise _registry_error(f"register {subject!r} at {self.url}", exc) from exc
        with self._mutex:
            self._ids[key] = schema_id
            self._texts.setdefault(schema_id, schema_text)
        return schema_id

    def get_schema(self, schema_id: int) -> str:
        """GET `/schemas/ids/<id>`; cached after the first success."""
        text = self._texts.get(schema_id)
        if text is not None:
            return text
        try:
            text = str(self._client.get_schema(schema_id).schema_str)
        except Exception as exc:
            raise _registry_error(f"get schema id {schema_id} at {self.url}", exc) from exc
        with self._mutex:
            self._texts[schema_id] = text
        return text


def _registry_error(what: str, exc: Exception) -> RegistryError:
    """Map a client exception: 404 / 40403 -> SchemaNotFoundError, anything else RegistryError."""
    status = getattr(exc, "http_status_code", None)
    code = getattr(exc, "error_code", None)
    if status == 404 or code == 40403:
        return SchemaNotFoundError(f"{what}: {exc}")
    return RegistryError(f"{what}: {exc}")


def make_registry(settings: RegistrySettings) -> SchemaRegistry:
    """The registry selected by settings: `url` set -> Confluent, else `FileRegistry(path)`."""
    if settings.url:
        auth = settings.basic_auth_user_info
        return ConfluentRegistry(settings.url, auth.get_secret_value() if auth else None)
    return FileRegistry(settings.path)
