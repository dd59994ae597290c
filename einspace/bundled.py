"""Find grammar files by path or by the name of a bundled one (`einspace` = the paper's space)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar


def bundled_files(folder: str, suffix: str) -> dict[str, Path]:
    """Name -> path of the files with `suffix` shipped in `einspace.grammars/<folder>`."""
    root = resources.files("einspace.grammars")
    if folder:
        root = root.joinpath(folder)
    if not root.is_dir():
        return {}
    return {Path(str(f)).stem: Path(str(f)) for f in root.iterdir() if str(f).endswith(suffix)}


def resolve(name_or_path: str | Path, bundled: dict[str, Path], what: str, plural: str) -> Path:
    """The path itself when it is a file, else the bundled file of that name; an error lists them."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    names = ", ".join(sorted(bundled)) or "none"
    raise EinspaceError(f"no {what} file {str(name_or_path)!r} (bundled {plural}: {names})")


def bundled_grammars() -> dict[str, Path]:
    """Name -> path of the grammar files shipped with the package."""
    return bundled_files("", ".pcfg")


def grammar_path(name_or_path: str | Path) -> Path:
    """A grammar file: the path itself when it exists, else the bundled grammar of that name."""
    return resolve(name_or_path, bundled_grammars(), "grammar", "grammars")


def load(name_or_path: str | Path = "einspace") -> Grammar:
    """Load and validate a grammar by path or bundled name."""
    from einspace.grammar.parser import load_grammar

    return load_grammar(grammar_path(name_or_path))
