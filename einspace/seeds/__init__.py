"""Load seed architectures: the bundled trees of the paper's networks, or a user's tree file.

Seeds start a search from known-good networks (paper Sec. 4.3). A seed is only useful if it
fits the task's input, so loading one checks it against the grammar and the input, and says
which seed does not fit which input, and where.
"""

from __future__ import annotations

from pathlib import Path

from einspace.bundled import bundled_files, resolve
from einspace.checker import check_tree
from einspace.errors import SeedFitError, TreeError
from einspace.grammar.model import Grammar
from einspace.grammar.parser import load_grammar
from einspace.state import FeatureState, Signal, describe
from einspace.tree import Node, load_tree, read_text_file

__all__ = ["list_seeds", "load_seed", "seed_description", "seed_path"]


def _bundled() -> dict[str, Path]:
    return bundled_files("seeds", ".tree")


def list_seeds() -> list[str]:
    """Names of the bundled seeds, sorted (`resnet18`, `vit`, ...)."""
    return sorted(_bundled())


def seed_path(name_or_path: str | Path) -> Path:
    """The tree file of a seed: the path itself when it is a file, else the bundled seed of that name."""
    return resolve(name_or_path, _bundled(), "seed or tree", "seeds")


def seed_description(name_or_path: str | Path) -> str:
    """What a seed is: the first line of its file's `#` header, without the `#` and a leading
    `name:` (empty if the file has no header)."""
    path = seed_path(name_or_path)
    for line in read_text_file(path, "tree file").splitlines():
        if line.lstrip().startswith("#"):
            text = line.lstrip()[1:].strip()
            return text.removeprefix(f"{path.stem}:").strip()
        if line.strip():
            break
    return ""


def load_seed(name_or_path: str | Path, grammar: Grammar | str | None, input: FeatureState | Signal) -> Node:
    """A seed tree, checked against `grammar` (a Grammar, a bundled grammar name, or None for
    shapes only) for `input`.

    Raises SeedFitError naming the seed, the input and the node that does not fit, e.g. a
    patch larger than the image, or a token count the seed was not built for.
    """
    path = seed_path(name_or_path)
    if isinstance(grammar, str):
        grammar = load_grammar(grammar)
    tree = load_tree(path)
    try:
        check_tree(tree, grammar, input)
    except TreeError as exc:
        signal = (input,) if isinstance(input, FeatureState) else tuple(input)
        name = path.stem if Path(name_or_path) != path else str(path)
        about = seed_description(path)
        about = f" ({about.rstrip('.')})" if about else ""
        raise SeedFitError(name, describe(signal), str(exc), about) from None
    return tree
