"""Backward compatibility of schema changes (Confluent BACKWARD_TRANSITIVE).

Every published version of `schemas/<name>.avsc` is kept, oldest first, in
`schemas/history/<name>.json` (a JSON list of schema texts). A change is compatible when the new
schema, as reader, can read data written with *every* published version, so a consumer upgraded
first keeps reading whatever is still in the topics. Consequence for producers and consumers:
upgrade consumers before producers; add fields only with a default; never change a field's type
or remove an enum symbol.

    check_compatible(new_text, old_texts) -> problems ([] when compatible)
    check_all()                           -> {name: problems} for every current schema
    publish(name)                         appends the current text to the history if it changed

CI runs `check_all()` through tests/schemas/test_compat.py, so an incompatible edit of an .avsc
fails the suite. Command line: `python -m schemas.compat [check | publish NAME...]`.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from herald.errors import IncompatibleSchemaError, SchemaError

__all__ = ["check_all", "check_compatible", "history", "publish"]

_SUFFIX = ".avsc"


def _schema_dir() -> Path:
    return Path(str(resources.files("schemas")))


def _parse(text: str, label: str) -> avro.schema.Schema:
    try:
        return avro.schema.parse(text)
    except Exception as exc:  # avro raises SchemaParseException, JSON errors, ...
        raise SchemaError(f"{label} is not a valid Avro schema: {exc}") from exc


def _same(a: str, b: str) -> bool:
    """Same schema JSON, ignoring formatting and key order."""
    return bool(json.loads(a) == json.loads(b))


def check_compatible(new_text: str, old_texts: list[str]) -> list[str]:
    """Problems reading data written with each of `old_texts` using `new_text`; [] when fine."""
    reader = _parse(new_text, "new schema")
    problems: list[str] = []
    for version, old_text in enumerate(old_texts, start=1):
        writer = _parse(old_text, f"version {version}")
        result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
        if result.compatibility is SchemaCompatibilityType.compatible:
            continue
        kinds = ", ".join(sorted(i.value for i in result.incompatibilities))
        messages = "; ".join(sorted(str(m) for m in result.messages))
        where = ", ".join(sorted(loc for loc in result.locations if loc != "/")) or "/"
        problems.append(f"cannot read version {version}: {kinds}: {messages} (at {where})")
    return problems


def history(name: str, history_dir: Path | None = None) -> list[str]:
    """Published texts of schema `name`, oldest first ([] when never published)."""
    path = (history_dir or _schema_dir() / "history") / f"{name}.json"
    if not path.is_file():
        return []
    try:
        texts = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise SchemaError(f"{path} must be a JSON list of schema texts")
    return texts


def _current(name: str, schema_dir: Path) -> str:
    path = schema_dir / f"{name}{_SUFFIX}"
    try:
        text = path.read_text(encoding="utf-8")
        return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"cannot read {path}: {exc}") from exc


def check_all(
    schema_dir: Path | None = None, history_dir: Path | None = None
) -> dict[str, list[str]]:
    """Problems of every `.avsc` in `schema_dir` against its history (default: this package).

    A schema that was never published is a problem too, so deleting a history file cannot
    silently switch the check off.
    """
    schema_dir = schema_dir or _schema_dir()
    history_dir = history_dir or schema_dir / "history"
    report: dict[str, list[str]] = {}
    for path in sorted(schema_dir.glob(f"*{_SUFFIX}")):
        name = path.name[: -len(_SUFFIX)]
        old = history(name, history_dir)
        if not old:
            report[name] = [f"never published: run `python -m schemas.compat publish {name}`"]
            continue
        report[name] = check_compatible(_current(name, schema_dir), old)
    return report


def publish(name: str, schema_dir: Path | None = None, history_dir: Path | None = None) -> bool:
    """Append the current text of `name` to its history; False when unchanged since the last.

    Raises `IncompatibleSchemaError` (history untouched) when the current text cannot read
    every published version.
    """
    schema_dir = schema_dir or _schema_dir()
    history_dir = history_dir or schema_dir / "history"
    current = _current(name, schema_dir)
    old = history(name, history_dir)
    if old and _same(old[-1], current):
        return False
    problems = check_compatible(current, old)
    if problems:
        raise IncompatibleSchemaError(f"{name}: " + " | ".join(problems))
    history_dir.mkdir(parents=True, exist_ok=True)
    path = history_dir / f"{name}.json"
    path.write_text(json.dumps([*old, current], indent=1, ensure_ascii=False) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    """`check` (default): print problems, exit 1 if any. `publish NAME...`: publish those."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["publish"]:
        for name in args[1:]:
            changed = publish(name)
            print(f"{name}: {'published' if changed else 'unchanged'}")
        return 0
    failed = {name: probs for name, probs in check_all().items() if probs}
    for name, probs in failed.items():
        for problem in probs:
            print(f"{name}: {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
