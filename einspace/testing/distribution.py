"""Is one sampler's distribution another's? Per-tree features and two-sample permutation tests.

Used to show that the exact sampling mode draws what blind rejection sampling draws (and that the
paper mode does not), in the tests and in `benchmarks/sampling.py`. The tests permute whole trees
between the two samples, so features counted several times within one tree (operations, branching
factors) are compared correctly although they are not independent draws.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from einspace.checker import CheckedTree
from einspace.ops.registry import Group, get_op
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, walk

__all__ = ["FEATURES", "TreeFeatures", "compare_samples", "features"]

#: What `compare_samples` tests, in order.
FEATURES = ("root production", "branching factors", "operations", "size")


@dataclass(frozen=True)
class TreeFeatures:
    """What the tests compare, for one tree.

    root: the root's children as written (`M M`, `B Branches A`, ...); branching: the branch count
    of each branching operation; operations: terminal names (a repeated subtree counted once, as
    the tree holds it); nodes: terminals + non-terminals. skip: the tree has a residual connection
    (a two-branch `clone`, branches merged by `add`, one branch only `identity`); convolution: it
    has an `im2col ... col2im` routing module (unfold, compute, fold).
    """

    root: str
    branching: Counter[int]
    operations: Counter[str]
    nodes: int
    skip: bool
    convolution: bool


def features(checked: CheckedTree) -> TreeFeatures:
    """The features of one checked tree (the checker's facts give the branch counts)."""
    tree = checked.tree
    branching: Counter[int] = Counter()
    operations: Counter[str] = Counter()
    skip = convolution = False
    for path, node in walk(tree):
        if isinstance(node, Terminal):
            operations[node.op] += 1
            if get_op(node.op).group is Group.BRANCHING:
                branching[len(checked.facts[path].output)] += 1
        elif isinstance(node, Nonterminal):
            skip = skip or _is_skip(node)
            convolution = convolution or _is_convolution(node)
    root = " ".join(_label(kid) for kid in tree.children) if isinstance(tree, Nonterminal) else _label(tree)
    return TreeFeatures(root, branching, operations, checked.stats.nodes, skip, convolution)


def _label(node: Node) -> str:
    if isinstance(node, Nonterminal):
        return node.symbol
    if isinstance(node, Terminal):
        return node.op
    return "[...]"


def _only_terminal(node: Node) -> Terminal | None:
    """The terminal a chain of one-child non-terminals ends in, e.g. (A add) -> add."""
    while isinstance(node, Nonterminal) and len(node.children) == 1:
        node = node.children[0]
    return node if isinstance(node, Terminal) else None


def _is_identity(node: Node) -> bool:
    return all(n.op == "identity" for _, n in walk(node) if isinstance(n, Terminal))


def _is_skip(node: Nonterminal) -> bool:
    if len(node.children) != 3:
        return False
    first, middle, last = _only_terminal(node.children[0]), node.children[1], _only_terminal(node.children[2])
    if (
        first is None
        or last is None
        or first.op != "clone"
        or dict(first.args).get("b") != 2
        or last.op != "add"
    ):
        return False
    branches = [n for _, n in walk(middle) if isinstance(n, (Parallel, Repeat))][:1]
    return (
        bool(branches) and isinstance(branches[0], Parallel) and any(map(_is_identity, branches[0].children))
    )


def _is_convolution(node: Nonterminal) -> bool:
    if len(node.children) != 3:
        return False
    first, last = _only_terminal(node.children[0]), _only_terminal(node.children[2])
    return first is not None and last is not None and first.op == "im2col" and last.op == "col2im"


# ----------------------------------------------------------------------------- tests


def compare_samples(
    a: Sequence[TreeFeatures], b: Sequence[TreeFeatures], permutations: int = 1000, random_seed: int = 0
) -> dict[str, float]:
    """Permutation p-values, per feature in `FEATURES`, for "a and b come from one distribution".

    Categorical features (root production; branching factors and operations pooled over each
    sample) use the chi-square statistic of the 2 x K table of counts; size uses the
    Kolmogorov-Smirnov statistic. p = (1 + permutations at least as extreme) / (1 + permutations).
    """
    rng = np.random.default_rng(random_seed)
    together = list(a) + list(b)
    labels = np.zeros((permutations + 1, len(together)), dtype=bool)
    labels[0, : len(a)] = True
    for row in labels[1:]:
        row[rng.permutation(len(together))[: len(a)]] = True
    tables = {
        "root production": _count_matrix([Counter([f.root]) for f in together]),
        "branching factors": _count_matrix([f.branching for f in together]),
        "operations": _count_matrix([f.operations for f in together]),
    }
    p_values = {name: _p_value(_chi_square(labels, counts)) for name, counts in tables.items()}
    p_values["size"] = _p_value(_kolmogorov_smirnov(labels, np.array([f.nodes for f in together])))
    return p_values


def _count_matrix(counters: list[Counter]) -> np.ndarray:
    keys = sorted({key for c in counters for key in c}, key=str)
    index = {key: i for i, key in enumerate(keys)}
    matrix = np.zeros((len(counters), max(len(keys), 1)))
    for row, counter in enumerate(counters):
        for key, n in counter.items():
            matrix[row, index[key]] = n
    return matrix


def _chi_square(labels: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The 2 x K chi-square statistic of the pooled counts, for each labelling (row of `labels`)."""
    first = labels.astype(float) @ counts
    second = counts.sum(axis=0) - first
    observed = np.stack([first, second], axis=1)  # labellings x 2 x K
    expected = observed.sum(axis=1, keepdims=True) * observed.sum(axis=2, keepdims=True) / counts.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        cells = np.where(expected > 0, (observed - expected) ** 2 / expected, 0.0)
    return cells.sum(axis=(1, 2))


def _kolmogorov_smirnov(labels: np.ndarray, values: np.ndarray) -> np.ndarray:
    """max |F_a - F_b| over the pooled values, for each labelling."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    ends = np.flatnonzero(np.append(ordered[1:] != ordered[:-1], True))  # last index of each value
    in_a = np.cumsum(labels[:, order], axis=1)[:, ends]
    n_a = labels[0].sum()
    n_b = labels.shape[1] - n_a
    return np.abs(in_a / n_a - (ends + 1 - in_a) / n_b).max(axis=1)


def _p_value(statistics: np.ndarray) -> float:
    observed, permuted = statistics[0], statistics[1:]
    return float((1 + np.sum(permuted >= observed - 1e-12)) / (1 + len(permuted)))
