"""What the search benchmarks share: the quick start's settings, worker processes that cannot take
the machine down, the retraining of a search's choice on train+valid, and mean ± sd in %."""

from __future__ import annotations

import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
MEMORY_LIMIT_GB = 6  # per search process
#: Issue 26: a surrogate's rank correlation counts its predictions made from at least this many results.
RHO_RESULTS = 50
#: The settings the retraining on train+valid drops from the search's: its data (given apart), time
#: limit, budgets and inheritance (a retraining starts from scratch). It keeps the rest, the
#: network's head and the training recipe.
RETRAINING_DROPS = (
    "dataset",
    "max_seconds",
    "max_params",
    "max_flops",
    "max_activation_mb",
    "inherit_weights",
)


def quickstart() -> dict[str, Any]:
    """experiments/quickstart.yaml, the settings the benchmarks' searches start from."""
    return yaml.safe_load(QUICKSTART.read_text())


def search_pool(jobs: int) -> ProcessPoolExecutor:
    """`jobs` worker processes, a fresh one per search (nothing one search leaks reaches the next)."""
    return ProcessPoolExecutor(jobs, max_tasks_per_child=1)


def confine_worker(memory_gb: float | None = MEMORY_LIMIT_GB) -> None:
    """One torch thread, and the address space capped: a tree whose memory the analytic estimate
    misses fails with an allocation error (a failed evaluation) instead of the kernel killing the
    whole worker. None leaves the address space alone (Ray and CUDA reserve far more than they use),
    and so does a machine with CUDA: under the cap CUDA cannot initialise ("cudaGetDeviceCount ...
    out of memory", seen on an H100), and torch would quietly train on the CPU."""
    import resource

    import torch

    torch.set_num_threads(1)
    if memory_gb is not None and not torch.cuda.is_available():
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def retraining(settings: dict[str, Any]) -> dict[str, Any]:
    """The retraining on train+valid of a search with evaluator `settings`: the same without its
    data, time limit, budgets and inheritance."""
    return {key: value for key, value in settings.items() if key not in RETRAINING_DROPS}


def test_accuracy(tree_text: str, dataset: str, grammar: str, settings: dict[str, Any], seed: int) -> float:
    """The test accuracy of a tree retrained from scratch on train+valid with `settings`."""
    from einspace.evaluators.training import final_evaluation
    from einspace.tree import parse_tree

    return final_evaluation(parse_tree(tree_text), dataset, grammar, settings, seed)["test_accuracy"]


def failure_kind(error: str | None) -> str:
    """A failed evaluation's reason in one word: over time (the time budget, or projected over
    it), over another budget (parameters, FLOPs, activations), or other."""
    text = (error or "").lower()
    return "time" if "second" in text or "time" in text else "budget" if "budget" in text else "other"


def mean_sd(values: list[float]) -> str:
    """Mean ± standard deviation in %, of the values that are not nan (how many, if not all)."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "failed"
    sd = statistics.stdev(known) if len(known) > 1 else math.nan
    text = f"{100 * statistics.fmean(known):5.1f} ± {100 * sd:4.1f}"
    return text if len(known) == len(values) else f"{text} ({len(known)} of {len(values)})"


def weighed_mean(values: list[tuple[float, int]]) -> float:
    """The mean of (value, weight) pairs by weight (nan when there are none): a rank correlation
    over a handful of predictions says little, and would otherwise count as much as one over
    hundreds."""
    total = sum(n for _, n in values)
    return sum(v * n for v, n in values) / total if total else math.nan
