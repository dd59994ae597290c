"""Find grammar files by path or by the name of a bundled one (`einspace` = the paper's space)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar


def bundled_grammars() -> dict[str, Path]:
    """Name -> path of the grammar files shipped with the package."""
    folder = resources.files("einspace.grammars")
    return {Path(str(f)).stem: Path(str(f)) for f in folder.iterdir() if str(f).endswith(".pcfg")}


def grammar_path(name_or_path: str | Path) -> Path:
    """A grammar file: the path itself when it exists, else the bundled grammar of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = bundled_grammars()
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    names = ", ".join(sorted(bundled))
    raise EinspaceError(f"no grammar file {str(name_or_path)!r} (bundled grammars: {names})")


def load(name_or_path: str | Path = "einspace") -> Grammar:
    """Load and validate a grammar by path or bundled name."""
    from einspace.grammar.parser import load_grammar

    return load_grammar(grammar_path(name_or_path))
