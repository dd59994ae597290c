"""Estimation of distribution over grammar probabilities: sample from a grammar re-learned from the best.

The first `warmup` candidates are sampled from the search space's grammar. From then on, after
every `update_every` results, the rule probabilities are re-estimated from the `elite` fittest trees
heard of so far (`einspace.grammar.learning`: counts per rule with a prior toward the original
grammar, kept consistent), and the next candidates are sampled from that learned grammar, in the
search space's sampling mode. It is what `einspace learn-probabilities` does to a finished run,
done online. Seeds are not used: every candidate is a sample.
"""

from __future__ import annotations

from typing import Any

from einspace.errors import EinspaceError
from einspace.grammar.learning import learn_probabilities, with_probabilities
from einspace.grammar.model import Grammar
from einspace.sampling import make_sampler
from einspace.search.strategy import Candidate, SearchSpace, Strategy, _positive_int, register_strategy
from einspace.tree import Node


@register_strategy
class EstimationOfDistribution(Strategy):
    """K = `evaluations` samples; after `warmup` results, from a grammar learned from the `elite`
    best so far, re-learned every `update_every` results (module docstring). Origins: `sampled`
    (the original grammar) and `learned:<n>` (the n-th estimate)."""

    name = "estimation_of_distribution"

    def __init__(
        self,
        space: SearchSpace,
        random_seed: int = 0,
        evaluations: int = 1000,
        elite: int = 20,
        warmup: int = 20,
        update_every: int = 10,
        prior_strength: float = 10.0,
        max_rho: float = 0.99,
    ):
        self.probabilities: list[list[float]] | None = None  # None: the original grammar's
        self.updates = 0
        super().__init__(space, random_seed, evaluations)
        self.elite_size = _positive_int("elite", elite)
        self.warmup = _positive_int("warmup", warmup)
        self.update_every = _positive_int("update_every", update_every)
        self.prior_strength = _positive_number("prior_strength", prior_strength)
        self.max_rho = _positive_number("max_rho", max_rho)
        if self.max_rho >= 1:
            raise EinspaceError(f"strategy setting 'max_rho' must be below 1, got {max_rho!r}")
        self.told = 0
        self.elite: list[tuple[int, str, float]] = []  # (id, tree text, fitness), fittest first

    @property
    def grammar(self) -> Grammar:
        """The grammar candidates are sampled from now."""
        if self.probabilities is None:
            return self.space.grammar
        return with_probabilities(self.space.grammar, self.probabilities)

    def _bind_rng(self) -> None:
        super()._bind_rng()
        if self.probabilities is not None:
            space = self.space
            self.sampler = make_sampler(self.grammar, space.input, space.limits, space.sampling, rng=self.rng)

    def _propose(self) -> tuple[Node, str, tuple[int, ...]]:
        origin = f"learned:{self.updates}" if self.updates else "sampled"
        return self.sampler.sample(), origin, ()

    def _observe(self, candidate: Candidate, fitness: float) -> None:
        self.told += 1
        if fitness > float("-inf"):
            self.elite.append((candidate.id, candidate.tree, fitness))
            self.elite.sort(key=lambda e: (-e[2], e[0]))
            for dropped in self.elite[self.elite_size :]:
                self.forget(dropped[0])
            del self.elite[self.elite_size :]
        if candidate.id not in {e[0] for e in self.elite}:
            self.forget(candidate.id)
        if self.told >= self.warmup and (self.told - self.warmup) % self.update_every == 0 and self.elite:
            self._learn()

    def _learn(self) -> None:
        trees = [self.tree_of(i, text) for i, text, _ in self.elite]
        space = self.space
        learned = learn_probabilities(
            space.grammar, space.input, trees, self.prior_strength, self.max_rho, (space.input.mode,)
        )
        self.probabilities = [
            [alt.probability for alt in rule.alternatives] for rule in learned.grammar.rules
        ]
        self.updates += 1
        self._bind_rng()

    def _extra_state(self) -> dict[str, Any]:
        return {
            "told": self.told,
            "elite": [list(e) for e in self.elite],
            "probabilities": self.probabilities,
            "updates": self.updates,
        }

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.told = int(state["told"])
        self.elite = [(int(i), t, float(f)) for i, t, f in state["elite"]]
        self.probabilities = state["probabilities"]
        self.updates = int(state["updates"])


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise EinspaceError(f"strategy setting {name!r} must be a positive number, got {value!r}")
    return float(value)
