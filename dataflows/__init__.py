"""Herald's Bytewax jobs (one module per job; the plan stage is the package `dataflows.plan`).

Modules that moved keep their old import names, because Bytewax recovery snapshots pickle
classes by module path: a store written before a move must still load after it (production
keeps its recovery volumes across deploys). `MOVED` maps each old name to its module now.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MOVED = {
    # 2026-12-04: the plan stage became a package (its source's `Expansion` is in snapshots)
    "dataflows._requests": "dataflows.plan.request_source",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name in `MOVED` as the module it moved to (the same module object)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module it names ran when it was imported."""


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.append(_Alias())
