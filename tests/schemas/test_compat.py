"""Schema evolution: every current .avsc must read every published version of itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import schemas
from herald.errors import IncompatibleSchemaError
from schemas.compat import check_all, check_compatible, history, main, publish

FIXTURES = Path(__file__).parent / "fixtures"
SCHEMA_DIR = Path(schemas.__file__).parent


def _fixture(name: str) -> str:
    return (FIXTURES / f"{name}.avsc").read_text()


def test_every_current_schema_reads_its_published_history() -> None:
    """The CI gate: fails when someone edits an .avsc incompatibly (or deletes its history)."""
    report = check_all()
    assert set(report) == set(schemas.schema_names())
    assert {name: problems for name, problems in report.items() if problems} == {}


@pytest.mark.parametrize("name", schemas.schema_names())
def test_history_ends_with_the_current_text(name: str) -> None:
    """Published == current: an edited .avsc must be published (`python -m schemas.compat
    publish NAME`) in the same change, so the next edit is checked against it."""
    assert json.loads(history(name)[-1]) == json.loads(schemas.schema_text(name))


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("social_event_new_required_field", "reader_field_missing_default_value"),
        ("social_event_type_change", "type_mismatch"),
        ("social_event_nullable_made_required", "type_mismatch"),
    ],
)
def test_incompatible_changes_are_reported(fixture: str, kind: str) -> None:
    problems = check_compatible(_fixture(fixture), history("social_event"))
    assert len(problems) == 1
    assert kind in problems[0]


def test_removed_enum_symbol_is_reported() -> None:
    problems = check_compatible(_fixture("enum_v2_removed_symbol"), [_fixture("enum_v1")])
    assert problems and "missing_enum_symbols" in problems[0] and "inapp" in problems[0]


def test_compatible_changes_pass() -> None:
    added_optional = _fixture("social_event_new_optional_field")
    assert check_compatible(added_optional, history("social_event")) == []
    # adding an enum symbol is backward compatible (the new reader knows all old symbols)
    assert check_compatible(_fixture("enum_v1"), [_fixture("enum_v2_removed_symbol")]) == []


def test_every_published_version_is_checked_not_only_the_last() -> None:
    v1, v2 = _fixture("enum_v1"), _fixture("enum_v2_removed_symbol")
    problems = check_compatible(v2, [v1, v2])
    assert len(problems) == 1 and problems[0].startswith("cannot read version 1")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the real schemas and their history, safe to edit."""
    for path in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copytree(SCHEMA_DIR / "history", tmp_path / "history")
    return tmp_path


def test_an_incompatible_edit_of_a_real_schema_fails_check_all(workdir: Path) -> None:
    shutil.copy(FIXTURES / "social_event_type_change.avsc", workdir / "social_event.avsc")
    report = check_all(workdir)
    assert report["social_event"] and "type_mismatch" in report["social_event"][0]
    assert all(not p for name, p in report.items() if name != "social_event")
    with pytest.raises(IncompatibleSchemaError):
        publish("social_event", workdir)
    assert len(history("social_event", workdir / "history")) == 1  # history untouched


def test_publish_appends_compatible_changes_once(workdir: Path) -> None:
    assert publish("social_event", workdir) is False  # unchanged
    shutil.copy(FIXTURES / "social_event_new_optional_field.avsc", workdir / "social_event.avsc")
    assert publish("social_event", workdir) is True
    assert publish("social_event", workdir) is False
    published = history("social_event", workdir / "history")
    assert len(published) == 2
    assert check_all(workdir)["social_event"] == []


def test_a_schema_without_history_is_a_problem(workdir: Path) -> None:
    (workdir / "history" / "delivery.json").unlink()
    assert "never published" in check_all(workdir)["delivery"][0]


def test_cli_check_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    assert capsys.readouterr().out == ""
