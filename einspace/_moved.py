"""Modules that moved in the 0.2 layout: the old import paths keep working for one release.

One table, old path -> new path, and one finder: importing an old path imports the new module,
warns once with a `DeprecationWarning` naming the new path, and binds the new module under the
old name (`einspace.compiler is einspace.network.compiler`), so classes, functions and
monkeypatches are shared. Nothing in the project imports an old path (a test checks it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

#: Old module path -> where it lives now.
MOVED = {
    "einspace.sampler": "einspace.sampling",
    "einspace.exact_sampler": "einspace.sampling.exact",
    "einspace.rejection_sampler": "einspace.sampling.rejection",
    "einspace.inside": "einspace.sampling.inside",
    "einspace.variation": "einspace.sampling.variation",
    "einspace.distribution": "einspace.testing.distribution",
    "einspace.compiler": "einspace.network.compiler",
    "einspace.lowering": "einspace.network.lowering",
    "einspace.export": "einspace.network.export",
    "einspace.fx_import": "einspace.network.importer",
    "einspace.fx_graph": "einspace.network.importer.graph",
    "einspace.trainable": "einspace.ops.trainable",
    "einspace.render": "einspace.pictures.dot",
    "einspace.architectures": "einspace.seeds.architectures",
}


class _MovedModuleLoader(importlib.abc.Loader):
    """Executes an old path by importing its new module and putting it in the old one's place."""

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # a placeholder module, replaced in exec_module

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new}; the old path will be removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system hands out whatever sys.modules holds under the name after this call.
        sys.modules[module.__name__] = importlib.import_module(new)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `MOVED`, and nothing else."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader())


def install() -> None:
    """Add the finder to the import system (once per process)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
