"""A model of fitness learned online from a run's own results, to screen proposals before any is
trained (surrogate-screened regularised evolution: `regularised_evolution`'s `screen` setting).

Each tree becomes a few dozen numbers read off the derivation without building a network: how
often each operation occurs (with and without its arguments; a repeated branch counts once per
copy), which operation follows which in the order the network applies them, depth, size, the
analytic parameter and FLOP counts of the checked tree, and the shapes its checker inferred: how
wide the features the head reads are, over how many positions it pools, and the narrowest point on
the way (a network that squeezes its features through one channel cannot classify, however it
trains). A regressor from scikit-learn (gradient boosting or random forest, the optional extra
`einspace[surrogate]`) is fitted to the (features, fitness) of every result told so far, and of
earlier runs' results where the search is warm-started from them (`einspace.search.warm_start`).
An earlier run's fitness is mapped from the range of its own results onto the range of this
run's, so runs on other tasks, whose accuracies differ, say the same thing about which trees are
better; a failed evaluation counts as the worst result of its run. It is refitted whenever the
results have grown by a fifth since the last fit, always on the results in the order they were
told and with the run's seed, so a resumed run refits the very same model and screens exactly as
the interrupted one would have.

Where screening weighs cost (`screen_cost`), a second regressor of the same kind learns from the
same features how long this run's evaluations took (log10 of the measured seconds of each scored
result; failures, results served from the cache and earlier runs' results say nothing about it),
so the cost is the run's own, on its device and at its fidelity, not a guess from FLOPs.

How well it ranks is measured on results it had not seen: each screened candidate's prediction is
kept and, when its result comes back, paired with it; `rank_correlation` (Spearman) of the pairs
is what `einspace report` prints, and likewise of the predicted and measured seconds where cost
counted.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from einspace.errors import EinspaceError
from einspace.search.strategy import saved_state
from einspace.tree import Node, format_terminal, walk_depths

if TYPE_CHECKING:
    from einspace.checker import CheckedTree
    from einspace.grammar.model import Grammar
    from einspace.state import FeatureState

__all__ = ["SURROGATES", "Surrogate", "rank_correlation", "screened_pairs", "shape_features", "tree_features"]

#: The regressors a surrogate may use: scikit-learn class, and its settings. The first is the default:
#: replayed on kept runs (benchmarks/surrogate_ranking.py) it ranked better than the forest on digits
#: and arrangement and as well on motifs.
SURROGATES: dict[str, tuple[str, dict[str, Any]]] = {
    "gradient_boosting": (
        "GradientBoostingRegressor",
        {"n_estimators": 100, "max_depth": 3, "subsample": 0.8},
    ),
    "random_forest": ("RandomForestRegressor", {"n_estimators": 50, "min_samples_leaf": 2}),
}

#: Refit once the results number this factor times those of the last fit (plus one).
REFIT_GROWTH = 1.2
#: Measured seconds below this are taken as this: the clock's resolution, not a cost.
_SHORTEST_S = 1e-3


def tree_features(
    tree: Node, grammar: Grammar, input: FeatureState, checked: CheckedTree | None = None
) -> dict[str, float]:
    """What the surrogate sees of a tree: counts of operations (`op:` name, `call:` name with its
    arguments), of consecutive operations in application order (`next:` a>b), depth, nodes, and,
    from the checked tree (`checked` if the caller has it; a tree that does not check has none of
    them), log parameters and FLOPs and its shapes (`shape_features`)."""
    from einspace.checker import check_tree

    counts: Counter[str] = Counter()
    ops: list[str] = []
    depths = [depth for _, _, depth in walk_depths(tree)]
    stack: list[tuple[Node, int]] = [(tree, 1)]
    while stack:  # pre-order with multiplicity: a Repeat's branch counts once per copy
        node, times = stack.pop()
        if node.kind == "terminal":
            counts[f"op:{node.op}"] += times
            counts[f"call:{format_terminal(node)}"] += times
            ops.append(node.op)
        elif node.kind == "repeat":
            stack.append((node.child, times * node.times))
        else:
            stack.extend((child, times) for child in reversed(node.children))
    for a, b in zip(ops, ops[1:], strict=False):
        counts[f"next:{a}>{b}"] += 1
    features = {key: float(n) for key, n in counts.items()}
    features.update(depth=float(max(depths)), nodes=float(len(depths)), terminals=float(len(ops)))
    if checked is None:
        try:
            checked = check_tree(tree, grammar, input)
        except EinspaceError:
            return features
    features.update(log_params=math.log1p(checked.params), log_flops=math.log1p(checked.flops))
    features.update(shape_features(checked))
    return features


def shape_features(checked: CheckedTree) -> dict[str, float]:
    """The checked tree's shapes, as logs: the width of the features the head reads (channels in
    im mode, the last axis in col mode) and the positions it pools (`head_width`,
    `head_positions`), and the narrowest width and the smallest feature map of any node's
    output (`min_width`, `min_size`)."""
    outputs = [state for facts in checked.facts.values() for state in facts.output]
    head = checked.output[0]
    return {
        "head_width": math.log(_width(head)),
        "head_positions": math.log(math.prod(head.shape) // _width(head)),
        "min_width": math.log(min(map(_width, outputs))),
        "min_size": math.log(min(math.prod(state.shape) for state in outputs)),
    }


def _width(state: FeatureState) -> int:
    return state.shape[0] if state.mode == "im" else state.shape[-1]


def screened_pairs(
    checkpoint: dict[str, Any] | None, seconds: bool = False
) -> list[tuple[float, float]] | None:
    """The (predicted, measured) fitness of every child a run's surrogate screened, in the order
    they came back (a failed one measured -inf), from its checkpoint (a wrapped strategy's state is
    under `base`); None when the run screens nothing. `seconds`: the log10 seconds of those
    screened while cost counted instead (None also when no cost was ever predicted)."""
    state = saved_state(checkpoint, "surrogate")
    if state is None:
        return None
    if seconds:
        return [(p, m) for p, m in state["surrogate"].get("cost_pairs", [])] or None
    return [(p, -math.inf if m is None else m) for p, m in state["surrogate"]["pairs"]]


def rank_correlation(pairs: list[tuple[float, float]]) -> float:
    """Spearman's rank correlation of (predicted, measured) pairs, ties ranked by their mean rank
    (nan below 3 pairs or when either side is constant)."""
    if len(pairs) < 3:
        return math.nan
    a, b = _ranks([p for p, _ in pairs]), _ranks([m for _, m in pairs])
    mean = (len(pairs) - 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(a, b, strict=True))
    var_a, var_b = (sum((x - mean) ** 2 for x in r) for r in (a, b))
    return cov / math.sqrt(var_a * var_b) if var_a and var_b else math.nan


def _finite_range(values: Iterable[float]) -> tuple[float, float] | None:
    finite = [v for v in values if math.isfinite(v)]
    return (min(finite), max(finite)) if finite else None


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2
        start = end + 1
    return ranks


class Surrogate:
    """The online model of one run: its training data (features, fitness) in the order told, the
    fitted regressor (refitted as the data grows) and the (predicted, measured) pairs of the
    candidates it screened."""

    def __init__(
        self, kind: str = "gradient_boosting", random_seed: int = 0, min_results: int = 20, cost: bool = False
    ):
        if kind not in SURROGATES:
            known = ", ".join(SURROGATES)
            raise EinspaceError(f"strategy setting 'surrogate' must be one of {known}, got {kind!r}")
        self.kind, self.random_seed, self.min_results = kind, random_seed, min_results
        self.models_cost = cost  # whether to fit the model of log seconds too
        self.features: list[dict[str, float]] = []
        self.fitness: list[float] = []
        self.sources: list[int] = []  # 0: this run; 1, 2, ...: the runs it was warm-started from
        self.log_seconds: list[float | None] = []  # log10 of what each took, where measured here
        self.pairs: list[tuple[float, float]] = []
        self.cost_pairs: list[tuple[float, float]] = []  # (predicted, measured) log10 seconds, screened
        self._model: Any = None
        self._cost_model: Any = None  # None until `min_results` measured results are in
        self._columns: list[str] = []
        self.fitted_on = 0  # how many results the current model was fitted to
        self.spread = 0.0  # standard deviation of the scored results' fitness (as fitted) at the last fit
        _regressor_class(kind)  # a missing scikit-learn is an error when the search is set up

    @property
    def ready(self) -> bool:
        """Whether there are enough results, some of them scored, to screen with."""
        return len(self.fitness) >= self.min_results and any(math.isfinite(f) for f in self.fitness)

    def add(
        self, features: dict[str, float], fitness: float, source: int = 0, seconds: float | None = None
    ) -> None:
        """One result: its tree's features, fitness, which run it is from, and the seconds it took
        (None: not measured). Only a scored result's seconds are a cost: a failure's are how long
        it took to fail."""
        self.features.append(features)
        self.fitness.append(fitness)
        self.sources.append(source)
        measured = seconds is not None and math.isfinite(fitness)
        self.log_seconds.append(math.log10(max(seconds, _SHORTEST_S)) if measured else None)

    def predict(self, candidates: list[dict[str, float]]) -> list[float]:
        """Predicted fitness of each candidate (refitting first if the data grew by a fifth)."""
        if self._model is None or len(self.fitness) >= self.fitted_on * REFIT_GROWTH + 1:
            self._fit(len(self.fitness))
        return [float(v) for v in self._model.predict(self._matrix(candidates))]

    def predict_log_seconds(self, candidates: list[dict[str, float]]) -> list[float] | None:
        """Predicted log10 seconds of evaluating each candidate, by the model of the last fit
        (`predict` refits); None while fewer than `min_results` were measured or cost is not
        modelled."""
        if self._cost_model is None:
            return None
        return [float(v) for v in self._cost_model.predict(self._matrix(candidates))]

    def _fit(self, n: int) -> None:
        own = _finite_range(self.fitness[i] for i in range(n) if self.sources[i] == 0) or (0.0, 1.0)
        target = list(self.fitness[:n])
        for source in set(self.sources[:n]) - {0}:
            rows = [i for i in range(n) if self.sources[i] == source]
            low, high = _finite_range(self.fitness[i] for i in rows) or own
            for i in rows:  # onto this run's range; failed: its worst
                scaled = (self.fitness[i] - low) / (high - low) if high > low else 1.0
                target[i] = own[0] + (own[1] - own[0]) * scaled if math.isfinite(scaled) else own[0]
        target = [t if math.isfinite(t) else own[0] for t in target]  # this run's failures: its worst
        self._columns = sorted({key for row in self.features[:n] for key in row})
        self._model = self._regressor()
        self._model.fit(self._matrix(self.features[:n]), target)
        self.fitted_on = n
        scored = [t for t, f in zip(target, self.fitness[:n], strict=True) if math.isfinite(f)]
        self.spread = statistics.pstdev(scored) if scored else 0.0
        measured = [i for i in range(n) if self.log_seconds[i] is not None]
        self._cost_model = None
        if self.models_cost and len(measured) >= self.min_results:
            self._cost_model = self._regressor()
            rows = self._matrix([self.features[i] for i in measured])
            self._cost_model.fit(rows, [self.log_seconds[i] for i in measured])

    def _regressor(self) -> Any:
        _, settings = SURROGATES[self.kind]
        return _regressor_class(self.kind)(**settings, random_state=self.random_seed)

    def _matrix(self, rows: list[dict[str, float]]) -> list[list[float]]:
        return [[row.get(key, 0.0) for key in self._columns] for row in rows]

    def state_dict(self) -> dict[str, Any]:
        """JSON-able; the model itself is not stored but refitted on load."""
        return {
            "features": self.features,
            "fitness": [None if f == -math.inf else f for f in self.fitness],
            "sources": self.sources,
            "log_seconds": self.log_seconds,
            "pairs": [[p, None if m == -math.inf else m] for p, m in self.pairs],
            "cost_pairs": self.cost_pairs,
            "fitted_on": self.fitted_on,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.features = [dict(row) for row in state["features"]]
        self.fitness = [-math.inf if f is None else float(f) for f in state["fitness"]]
        self.sources = [int(x) for x in state["sources"]]
        # a checkpoint written before cost was modelled measured nothing
        self.log_seconds = list(state.get("log_seconds", [None] * len(self.sources)))
        self.pairs = [(float(p), -math.inf if m is None else float(m)) for p, m in state["pairs"]]
        self.cost_pairs = [(float(p), float(m)) for p, m in state.get("cost_pairs", [])]
        self._model = None
        if state["fitted_on"]:
            self._fit(int(state["fitted_on"]))


def _regressor_class(kind: str) -> Any:
    try:
        import sklearn.ensemble
    except ImportError:
        raise EinspaceError(
            "surrogate screening (strategy setting 'screen' above 1) needs scikit-learn: "
            "pip install 'einspace[surrogate]'"
        ) from None
    return getattr(sklearn.ensemble, SURROGATES[kind][0])
