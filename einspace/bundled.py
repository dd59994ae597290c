"""Files shipped with einspace (grammars, seed trees) and the one rule that tells a bundled name from
a path, which grammars, seeds, datasets and experiment files all follow (`names_bundled`)."""

from __future__ import annotations

from collections.abc import Collection
from importlib import resources
from pathlib import Path

from einspace.errors import EinspaceError

__all__ = ["bundled_files", "bundled_grammars", "grammar_path", "names_bundled", "resolve"]


def names_bundled(name_or_path: str | Path, bundled: Collection[str]) -> bool:
    """Whether `name_or_path` means something bundled rather than a path: it does when it is a
    string with no folder part that is one of the `bundled` names, whatever the working directory
    holds. Anything else is a path: a `Path`, a string with a folder or a suffix, or a name
    nothing bundled has. So a file in the working directory that has a bundled name (such as the
    `einspace` console script in a virtualenv's bin/) is reached as ./einspace, and the meaning
    of a name never depends on where a command runs."""
    plain = isinstance(name_or_path, str) and Path(name_or_path).name == name_or_path
    return plain and name_or_path in bundled


def bundled_files(folder: str, suffix: str) -> dict[str, Path]:
    """Name -> path of the files with `suffix` shipped in `einspace.grammars/<folder>`."""
    root = resources.files("einspace.grammars")
    if folder:
        root = root.joinpath(folder)
    if not root.is_dir():
        return {}
    return {Path(str(f)).stem: Path(str(f)) for f in root.iterdir() if str(f).endswith(suffix)}


def resolve(name_or_path: str | Path, bundled: dict[str, Path], what: str, plural: str) -> Path:
    """The bundled file a bundled name means (`names_bundled`), else the path, which must be a
    file; an error lists the bundled names."""
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
    """A grammar file: the bundled grammar a bundled name means, else the path, which must exist."""
    return resolve(name_or_path, bundled_grammars(), "grammar", "grammars")
