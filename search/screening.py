"""Surrogate screening: of several proposals for the next evaluation, which one to train, and what
the surrogate learns from each result (`regularised_evolution`'s `screen` and `screen_cost`).

Weighing cost (`cost_weight` c > 0): a proposal's score is its predicted fitness minus c x (the
standard deviation of the run's results) x log10(its predicted seconds), the seconds learnt from
the run's own measured evaluations (`Surrogate.predict_log_seconds`). Fitness alone prefers a
proposal predicted a hair fitter however much more it costs; with cost weighed, of proposals the
surrogate cannot tell apart the cheaper is trained, and a population drifting to expensive
networks is pulled back unless they pay. Scaling by the spread makes c mean the same on tasks
whose accuracies differ. Cost counts once the surrogate's `min_results` evaluations were measured.

Kept apart from the strategy that proposes, so that what a screen remembers between an ask and
its tell (each screened candidate's features and predictions, the trees already proposed, the
seconds a result took) is one object with one checkpoint entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from einspace.search.surrogate import Surrogate, tree_features
from einspace.tree import Node, content_hash

if TYPE_CHECKING:
    from collections.abc import Callable

    from einspace.checker import CheckedTree
    from einspace.search.strategy import Candidate, SearchSpace

__all__ = ["Proposal", "Screen"]

#: (tree, origin, parent ids, its check where the proposer made one)
Proposal = tuple[Node, str, tuple[int, ...], "CheckedTree | None"]


class Screen:
    """Ranks proposals by the surrogate's predicted fitness, less `cost_weight` x the spread of
    the results x predicted log10 seconds where cost is weighed (`Surrogate.predict_log_seconds`),
    trees not proposed before first (a repeat would only be served from the cache)."""

    def __init__(self, surrogate: Surrogate, space: SearchSpace, cost_weight: float = 0.0):
        self.surrogate, self.space, self.cost_weight = surrogate, space, cost_weight
        self._seconds: dict[int, float] = {}  # id -> measured seconds, heard with its result
        self._features: dict[int, dict[str, float]] = {}  # id -> features, of candidates not told yet
        self._predicted: dict[int, float] = {}  # id -> predicted fitness, of screened candidates
        self._predicted_cost: dict[int, float] = {}  # id -> predicted log10 seconds, where cost counted
        self._known: set[str] = set()  # hashes of the trees asked for so far

    def features_of(self, tree: Node, checked: CheckedTree | None = None) -> dict[str, float]:
        return tree_features(tree, self.space.grammar, self.space.input, checked)

    def pick(self, proposals: list[Proposal], candidate_id: int) -> Proposal:
        """The proposal ranked best, to be asked as `candidate_id` (its features and predictions
        kept for its result)."""
        features = [self.features_of(tree, checked) for tree, _, _, checked in proposals]
        predicted = self.surrogate.predict(features)
        score = predicted
        log_seconds = self.surrogate.predict_log_seconds(features) if self.cost_weight else None
        if log_seconds is not None:
            weight = self.cost_weight * self.surrogate.spread
            score = [p - weight * s for p, s in zip(predicted, log_seconds, strict=True)]
        hashes = [content_hash(tree) for tree, _, _, _ in proposals]
        best = max(range(len(proposals)), key=lambda i: (hashes[i] not in self._known, score[i], -i))
        self._features[candidate_id], self._predicted[candidate_id] = features[best], predicted[best]
        if log_seconds is not None:
            self._predicted_cost[candidate_id] = log_seconds[best]
        self._known.add(hashes[best])
        return proposals[best]

    def measured(self, candidate_id: int, seconds: float) -> None:
        """What a scored result about to be told took (a cost to learn from)."""
        self._seconds[candidate_id] = seconds

    def observe(self, candidate: Candidate, fitness: float, tree: Callable[[], Node]) -> None:
        """Hear a result: the surrogate learns it (`tree` gives the candidate's tree where its
        features were not kept) and pairs it with what was predicted."""
        features = self._features.pop(candidate.id, None)
        if features is None:
            features = self.features_of(tree())
        self.surrogate.add(features, fitness, seconds=self._seconds.pop(candidate.id, None))
        self._known.add(candidate.hash)
        if candidate.id in self._predicted:
            self.surrogate.pairs.append((self._predicted.pop(candidate.id), fitness))
        predicted_cost, measured = (
            self._predicted_cost.pop(candidate.id, None),
            self.surrogate.log_seconds[-1],
        )
        if predicted_cost is not None and measured is not None:
            self.surrogate.cost_pairs.append((predicted_cost, measured))

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.surrogate.state_dict(),
            "predicted": sorted(self._predicted.items()),
            "predicted_cost": sorted(self._predicted_cost.items()),
            "known": sorted(self._known),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.surrogate.load_state_dict(saved)
        self._features = {}  # features are recomputed from the trees when needed
        self._predicted = {int(i): float(p) for i, p in saved["predicted"]}
        self._predicted_cost = {int(i): float(p) for i, p in saved.get("predicted_cost", [])}
        self._known = set(saved["known"])
