"""The dependency direction between Herald's packages: one way, from the tooling down to the core.

`MAY_IMPORT` is the rule, in one place: each package and the project packages it may import.
Every import statement counts, at module level or inside a function (a function-level import
is no way around a layer). The README's import matrix is rendered from the same table, and a
test keeps the two equal.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# From the bottom up. herald/ is the domain core with the records the stages share; the stages
# (sources, sinks, the API) import the core and the contracts (schemas), never each other; a
# dataflow is built from sources and sinks; infra/ (launcher, CLI, demo, stack client, ledger,
# replay, simulators) and bench/ are the tooling on top, which nothing else imports.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "herald": (),
    "schemas": ("herald",),
    "sources": ("herald", "schemas"),
    "sinks": ("herald", "schemas"),
    "api": ("herald", "schemas"),
    "dataflows": ("herald", "schemas", "sources", "sinks"),
    "dashboards": ("herald", "schemas", "sources"),
    "infra": ("herald", "schemas", "sources", "sinks", "api", "dataflows", "dashboards"),
    "bench": ("herald", "schemas", "sources", "sinks", "api", "dataflows", "dashboards", "infra"),
}
# Narrower grants: a package may import only these modules of another one. The API finds the
# callback checks of the providers whose check lives in their folder through the registry.
ONLY: dict[tuple[str, str], tuple[str, ...]] = {("api", "sinks"): ("sinks.provider_registry",)}
MATRIX_START = "<!-- import matrix: tests/test_layers.py -->"
MATRIX_END = "<!-- end of import matrix -->"


def imports_of(package: str, root: Path = REPO) -> Iterator[tuple[str, int, str, str]]:
    """(file, line, imported project package, module) for every import in `package` of
    another package."""
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in MAY_IMPORT and top != package:
                    yield str(path.relative_to(root)), node.lineno, top, name


def render_matrix() -> str:
    """The README's table: a row per package, ✓ where it may import the column's package
    (or the modules it may import of it)."""
    names = list(MAY_IMPORT)
    lines = [
        "| imports → | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in names:
        cells = [_cell(row, col) for col in names]
        lines.append(f"| `{row}/` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: str, col: str) -> str:
    if col in MAY_IMPORT[row]:
        return "✓"
    if (row, col) in ONLY:
        return "only " + ", ".join(f"`{m}`" for m in ONLY[row, col])
    return "—" if col == row else ""


def forbidden_imports(root: Path = REPO) -> list[str]:
    """Every import that breaks MAY_IMPORT, as "file:line imports X (what is allowed)"."""
    return [
        f"{where}:{line} imports {module} ({package}/ may import: "
        f"{', '.join(MAY_IMPORT[package]) or 'no project package'}"
        f"{''.join(f'; {t}: only {m}' for (p, t), m in ONLY.items() if p == package)})"
        for package in MAY_IMPORT
        for where, line, target, module in imports_of(package, root)
        if not _allowed(package, target, module)
    ]


def _allowed(package: str, target: str, module: str) -> bool:
    if target in MAY_IMPORT[package]:
        return True
    only = ONLY.get((package, target), ())
    return any(module == m or module.startswith(m + ".") for m in only)


def test_no_package_imports_one_above_it() -> None:
    forbidden = forbidden_imports()
    assert not forbidden, "\n".join(forbidden)


def test_the_rules_leave_no_cycle_and_cover_every_package() -> None:
    """Each package may import only packages listed before it, so no cycle can form; every
    top-level Python package of the repository is placed (tests and examples are users of
    them, not layers)."""
    order = list(MAY_IMPORT)
    for package, allowed in MAY_IMPORT.items():
        assert all(order.index(dep) < order.index(package) for dep in allowed), package
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "examples"}
    assert packages == set(MAY_IMPORT)


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """A function-level import is no way around a layer; a relative import stays inside."""
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "x.py").write_text(
        "from herald.config import HeraldSettings\nfrom . import base\n\n\n"
        "def f():\n    from infra.stack import read_state\n    import dataflows.plan\n"
    )
    assert forbidden_imports(tmp_path) == [
        "sinks/x.py:6 imports infra.stack (sinks/ may import: herald, schemas)",
        "sinks/x.py:7 imports dataflows.plan (sinks/ may import: herald, schemas)",
    ]


def test_the_readme_shows_these_rules() -> None:
    readme = (REPO / "README.md").read_text()
    assert MATRIX_START in readme and MATRIX_END in readme, "README lacks the import matrix"
    shown = readme.split(MATRIX_START, 1)[1].split(MATRIX_END, 1)[0].strip()
    assert shown == render_matrix(), "README's import matrix is stale:\n" + render_matrix()


def test_every_exception_class_lives_in_herald_errors() -> None:
    """One exception tree in one module (STYLE 16): no class elsewhere derives from its classes."""
    tree = ast.parse((REPO / "herald" / "errors.py").read_text())
    ours = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    elsewhere = [
        f"{path.relative_to(REPO)}:{node.lineno} class {node.name}"
        for package in MAY_IMPORT
        for path in sorted((REPO / package).rglob("*.py"))
        if path != REPO / "herald" / "errors.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(b, ast.Name | ast.Attribute) and ast.unparse(b).split(".")[-1] in ours
            for b in node.bases
        )  # fmt: skip
    ]
    assert "HeraldError" in ours and not elsewhere, "\n".join(elsewhere)
