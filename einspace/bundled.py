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


def names_bundled(name_or_path: str | Path, bundled: dict[str, Path]) -> bool:
    """Whether `name_or_path` means a bundled file: a bundled name given as a plain string with no
    folder and no suffix (a file of that name in the working directory, such as the `einspace`
    console script in a virtualenv's bin/, is reached as ./einspace)."""
    plain = isinstance(name_or_path, str) and Path(name_or_path).name == name_or_path
    return plain and name_or_path in bundled


def resolve(name_or_path: str | Path, bundled: dict[str, Path], what: str, plural: str) -> Path:
    """The bundled file a bundled name means, else the path itself when it is a file; an error
    lists the bundled names."""
    if names_bundled(name_or_path, bundled):
        return bundled[str(name_or_path)]
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        raise EinspaceError(f"{str(name_or_path)!r} is a folder; give a {what} file")
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
