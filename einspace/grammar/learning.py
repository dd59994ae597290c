"""Rule probabilities estimated from trees: how often each alternative was chosen, with a prior.

Each rule (a symbol under one guard: the guard context the counts are kept per) gets new
probabilities (n_a + s * p_a) / (N + s): n_a counts the nodes of the given trees that chose
alternative a under that rule, N their total, p_a the original probability and s the prior
strength, in pseudo-trees' worth of choices. A rule the trees never used keeps its probabilities.
If the estimate's spectral radius exceeds `max_rho` (or the original's, if that is higher) in an
input mode the original can derive from, it is shrunk toward the original, p = (1 - t) * estimate
+ t * original, with t found by bisection on a grid of 1/32 steps (the smallest such t when rho
falls steadily along the way; t = 1, the original itself, always qualifies).

Argument grids stay uniform: the grammar language gives probabilities to alternatives only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from einspace.checker import check_tree, derives
from einspace.errors import EinspaceError
from einspace.grammar.analysis import analyse
from einspace.grammar.model import Grammar
from einspace.state import FeatureState
from einspace.tree import Node, Nonterminal, walk

__all__ = ["LearnedGrammar", "learn_probabilities", "rule_counts", "with_probabilities"]

#: Rule index (in `Grammar.rules`) -> probability of each of its alternatives.
Probabilities = list[list[float]]

_SHRINK_STEPS = 32


@dataclass(frozen=True)
class LearnedGrammar:
    """The estimate and how it was made: counts per rule, the shrinkage toward the original
    (0: none) and the spectral radius per analysed input mode."""

    grammar: Grammar
    counts: list[list[int]]
    shrink: float
    spectral_radius: dict[str, float]


def rule_counts(grammar: Grammar, input: FeatureState, trees: Iterable[Node]) -> list[list[int]]:
    """For each rule of `grammar`, how many nodes of `trees` chose each of its alternatives. A
    repeated subtree counts once (it is one derivation); trees must check against the grammar."""
    index = {id(rule): i for i, rule in enumerate(grammar.rules)}
    counts = [[0] * len(rule.alternatives) for rule in grammar.rules]
    for tree in trees:
        checked = check_tree(tree, grammar, input)
        for path, node in walk(tree):
            if not isinstance(node, Nonterminal):
                continue
            rule = grammar.rule_for(node.symbol, checked.facts[path].input)
            assert rule is not None  # check_tree matched it
            chosen = next(a for a, alt in enumerate(rule.alternatives) if derives(alt, node.children))
            counts[index[id(rule)]][chosen] += 1
    return counts


def with_probabilities(grammar: Grammar, probabilities: Probabilities) -> Grammar:
    """A copy of `grammar` whose rule i has alternative probabilities `probabilities[i]`."""
    if len(probabilities) != len(grammar.rules):
        raise EinspaceError(f"{len(probabilities)} probability rows for {len(grammar.rules)} rules")
    rules = []
    for rule, row in zip(grammar.rules, probabilities, strict=True):
        if len(row) != len(rule.alternatives) or abs(sum(row) - 1.0) > 1e-9 or min(row) <= 0.0:
            raise EinspaceError(f"rule {rule.symbol}: {row} are not positive probabilities summing to 1")
        alternatives = tuple(
            replace(alt, probability=float(p)) for alt, p in zip(rule.alternatives, row, strict=True)
        )
        rules.append(replace(rule, alternatives=alternatives))
    return replace(grammar, rules=tuple(rules))


def _estimate(grammar: Grammar, counts: list[list[int]], prior_strength: float) -> Probabilities:
    rows = []
    for rule, row in zip(grammar.rules, counts, strict=True):
        total = sum(row)
        rows.append(
            [
                (n + prior_strength * alt.probability) / (total + prior_strength)
                for n, alt in zip(row, rule.alternatives, strict=True)
            ]
        )
    return rows


def learn_probabilities(
    grammar: Grammar,
    input: FeatureState,
    trees: Iterable[Node],
    prior_strength: float = 10.0,
    max_rho: float = 0.99,
    modes: tuple[str, ...] | None = None,
) -> LearnedGrammar:
    """The grammar with probabilities estimated from `trees` (module docstring), consistent with
    rho <= max(max_rho, the original's rho) in each of `modes` (default: every input mode the
    original can derive from; a search needs only its own)."""
    if prior_strength <= 0:
        raise EinspaceError(f"prior strength must be positive, got {prior_strength}")
    if not 0.0 < max_rho < 1.0:
        raise EinspaceError(f"max_rho must be in (0, 1), got {max_rho}")
    counts = rule_counts(grammar, input, trees)
    estimate = _estimate(grammar, counts, prior_strength)
    original = [[alt.probability for alt in rule.alternatives] for rule in grammar.rules]
    bounds, original_radii = _bounds(grammar, modes, max_rho)

    def blend(step: int) -> tuple[Grammar, dict[str, float] | None]:
        """The grammar `step` / 32 of the way back to the original, and its radii if within bounds."""
        t = step / _SHRINK_STEPS
        rows = [
            [(1 - t) * e + t * o for e, o in zip(er, orow, strict=True)]
            for er, orow in zip(estimate, original, strict=True)
        ]
        candidate = with_probabilities(grammar, rows)
        radii = {}
        for mode, bound in bounds.items():
            analysis = analyse(candidate, mode)
            if not analysis.consistent or analysis.spectral_radius > bound:
                return candidate, None
            radii[mode] = analysis.spectral_radius
        return candidate, radii

    candidate, radii = blend(0)
    if radii is not None:
        return LearnedGrammar(candidate, counts, 0.0, radii)
    good, bad = _SHRINK_STEPS, 0  # bisection between the estimate (too far) and the original (fine)
    best: tuple[Grammar, dict[str, float]] = (grammar, original_radii)
    while good - bad > 1:
        middle = (good + bad) // 2
        candidate, radii = blend(middle)
        if radii is None:
            bad = middle
        else:
            good, best = middle, (candidate, radii)
    return LearnedGrammar(best[0], counts, good / _SHRINK_STEPS, best[1])


def _analysed_bounds(
    grammar: Grammar, modes: tuple[str, ...] | None, max_rho: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Per analysed input mode, the largest rho allowed and the original's rho."""
    bounds, radii = {}, {}
    for mode in modes or ("im", "col"):
        analysis = analyse(grammar, mode)
        if modes is None and not (analysis.derivable or analysis.infinite):
            continue
        if not analysis.consistent:
            raise EinspaceError(
                f"{grammar.path} is itself inconsistent in {mode} mode: nothing to shrink toward"
            )
        bounds[mode] = max(max_rho, analysis.spectral_radius)
        radii[mode] = analysis.spectral_radius
    return bounds, radii


#: _analysed_bounds, remembered: a search learns from the same grammar again and again. (Cached by
#: wrapping, not by decorating: mutmut leaves decorated functions unmutated.)
_bounds = lru_cache(maxsize=32)(_analysed_bounds)
