"""Imports from a source checkout: `einspace.search`, `.evaluators`, `.grammars` from the top-level folders.

pyproject.toml maps the top-level folders search/, evaluators/ and grammars/ into the package
(setuptools `package-dir`), so an installed einspace (a wheel, `pip install .`) holds them as
subpackages. The source folder einspace/ does not, and it is the one imported wherever sys.path
starts in the repository root (`python -c`, `python -m`, Ray workers of a driver started there),
shadowing the installed package. There a finder serves exactly those three names from the folders
beside einspace/, ahead of other finders, so every module comes from the one tree that was
imported (an editable install's finder maps the same names to the folders of its own checkout).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

#: Subpackages of einspace kept in top-level folders of the same name (pyproject.toml, `package-dir`).
TOP_LEVEL_SUBPACKAGES = ("search", "evaluators", "grammars")


class SourceCheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds `einspace.<name>` for the names above in `root/<name>/`, and nothing else."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != "einspace" or name not in TOP_LEVEL_SUBPACKAGES:
            return None
        folder = self.root / name
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def install_if_source_checkout(package_dir: Path) -> None:
    """Add the finder when `package_dir` is einspace/ of a source checkout (once per process)."""
    root = package_dir.parent
    if (package_dir / "search" / "__init__.py").is_file() or not (root / "search" / "__init__.py").is_file():
        return  # an installed package, which holds its subpackages
    if not any(isinstance(finder, SourceCheckoutFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceCheckoutFinder(root))
