"""Benchmark (not a test): best validation accuracy against the compute a search spent (issue 22).

Every search gets the same budget of compute (`Cost.compute_seconds` of its evaluations: CPU
seconds of the evaluating process, GPU seconds where a GPU trained) and stops once its evaluations
have spent it. Methods, each from scratch and seeded:

- RS:     random search, fresh samples from the grammar. The `random_search` strategy ignores
          `seeds`, so seeded RS is `seeded_random_search`, registered here: the seed is its
          first candidate, every later one a fresh sample.
- RE:     regularised evolution, the quick start's settings (seeded: its initial population is
          the seed, the paper's RE(RN18)).
- RE+SH:  RE inside asynchronous successive halving (`multi_fidelity`, eta 3, rungs of 1, 3 and
          8 epochs): every new architecture trains for one epoch first, the best third of each
          rung is trained on (from its saved state) to the next; seeds go to the top whatever
          their rank.
- RE+S, RE+SH+S (from scratch only): the same with surrogate screening (`screen` 8: each child
          is the best of 8 proposals as ranked by gradient boosting fitted to the run's results,
          once 20 are in).
- RE+I, RE+all (from scratch only): RE with weight inheritance (children start from their
          parent's trained weights where the mutation left the network unchanged), and RE with
          everything: successive halving, surrogate screening and inheritance. RE+all0: the same
          with successive halving's rung at 0 epochs (RE+SH0's, below): a child is first scored
          with its parent's trained weights where it inherits them, untrained elsewhere.
- RE+SH0, RE+SH0+S, RE+SH0+I (from scratch only): RE+SH (RE+SH+S, RE+SH with inheritance)
          with a rung at 0 epochs below the first: every new architecture is first scored
          before any training (with the weights it inherits, +I), its head fitted in closed form
          (`min_fidelity: 0`; einspace.evaluators.head_fit), and only the best third trains.
- RE+SH+H, RE+SH0+H (from scratch only): RE+SH (RE+SH0) where RE also hears each promotion's
          result (`strategy_fitness: highest_rung`): a member's fitness is its result at the
          highest rung it reached, and tournaments prefer members that reached a higher rung.
- RE+SH0+eta9 (from scratch only): RE+SH0 with eta 9 (rungs of 0, 1 and 8 epochs): only the best
          ninth of each rung trains on, so more of the budget goes to looking at new trees.
- RE+SH+p6, RE+SH0+p6 (from scratch only): RE+SH (RE+SH0) promoting the best sixth of each rung
          (eta 6) over the same rungs (1, 3, 8; 0, 1, 3, 8). ASHA ranks a result against its whole
          rung, and evolution's children beat the rung's early random trees, so at eta 3 it
          promoted 42-57% of each rung rather than a third; at eta 6 it promotes 19-31%.
          RE+all0+p6: RE+all0 promoting the same way. RE+all+p6: the same with RE+SH's rungs (no
          look at 0 epochs first).
- RE+all0+p6w, RE+all0+p3w (from scratch only): RE+all0+p6 (RE+all0) where each result is
          ranked once, when it comes, against its rung's last WINDOW results (`window`; a rung's
          first eta together, once the eta-th is in): only the best sixth (third) of those is
          promoted, so children of a run that improves are not promoted for beating its first
          random trees. With inheritance, a child's look uses its
          parent's trained weights and beats every cold look of the rung; without a window
          RE+all0+p6 promoted 23-62% of its inheriting children from the look.
          The RE+all methods refuse trees of under MIN_PARAMS parameters (`min_params`), as
          `--min-params` does for every method.
- RE+all0+p6wP, RE+all0+p6wR, RE+all0+p6wPR, RE+all0+p6wRG, RE+all0+p6wRG4, RE+all0+p6wRGK
          (from scratch only): RE+all0+p6w with RE's population and tournament at 48 and 12
          (+P: three times the recipe's 16 and 4, so the first population holds three times the
          fresh samples), with restarts (+R, `restart_after` 2: a population whose results have
          not beaten its best for twice its size in a row is filled again with fresh samples),
          both, or restarts that double the population and tournament each time (+RG,
          `restart_growth` 2, as IPOP does; +RG4: the same after four times the population;
          +RGK: +RG whose restarts keep the population's best, `restart_keep` 1).
- RE+SH0+S+p6wRGK (from scratch only): RE+all0+p6wRGK without weight inheritance, the method
          issue 26's inheritance target (i) compares its children with.
- RE+all0+p6wRGKF (from scratch only): RE+all0+p6wRGK where IMMIGRANTS of RE's candidates after
          the first population are fresh samples (`immigrants`): the first population decides
          which family evolution refines, and one whose looks overrate how it trains (digits seed
          10: every member a learned positional encoding, looks of 0.73-0.88, 0.76 trained) is
          never left while its looks keep improving, as no restart comes.
- RE+all0+p6wRGKC (from scratch only): RE+all0+p6wRGK whose screen weighs cost (`screen_cost`
          SCREEN_COST): a proposal predicted ten times costlier (in seconds, learnt from the run's
          own evaluations) must be predicted SCREEN_COST standard deviations of the results fitter.
          Nothing else preferred a cheap candidate to an expensive one of the same promise, and
          the digits seeds that missed RE's best had spent their minute on expensive looks.
- RE+all0+p6wL, RE+all0+p6wRGL, RE+all0+p6wRGKL (from scratch only): RE+all0+p6w, RE+all0+p6wRG
          and RE+all0+p6wRGK whose looks fit the head to LOOK_EXAMPLES training examples
          (`look_examples`) instead of 1,024: the forward passes over them are most of a look's
          cost, and looks most of these searches'.
- RE+all03+p6wRGK (from scratch only): RE+all0+p6wRGK over rungs of 0, 3 and 8 epochs: from the
          look straight to three epochs. With promotions that continue, a 1-epoch result is a
          snapshot early in the 8-epoch schedule; it scored below the look itself and ranked trees
          worse than the look did on the kept RE+all0+p6wRGK runs (`einspace report` prints both).
- RE+all0+p63wRGK (from scratch only): RE+all0+p6wRGK promoting the best sixth of the looks and
          then the best third of each trained rung (`eta: [6, 3, 3]`, ETAS_LOOK_SELECTIVE). With
          eta 6 at every rung the first tree trains at 8 epochs after 216 looks, and in 7 of the
          12 digits searches of seeds 12-23 none did within the minute: their best was a 1- or
          3-epoch snapshot. Trained rungs triple their epochs, so promoting a third of each
          spends about as much on every rung (the rule behind successive halving's eta).
- RE+M, RE+SH+M (from scratch only): RE and RE+SH with the mutation operators insert and remove
          beside subtree, weighed alike (`mutations`; README, "Mutation operators").
- RE+S+T, RE+S+T2, RE+SH+S+T (transfer, no seed architecture in the search): RE+S (RE+SH+S)
          whose surrogate is warm-started (`warm_start`) from earlier searches on digits with the
          same random seed, run first with the digits budget (their compute is not charged: they
          are earlier searches): RE from scratch (RE+S+T, RE+SH+S+T), or that and RE seeded with
          `resnet_small` (RE+S+T2). A surrogate ready from the start screens the initial population too, so
          every candidate is the best of SCREEN_TRANSFER proposals. Nothing of the task is known
          to them beforehand, but they are not from scratch either: target (c) is judged without
          them, and their own line (t) says how they do.

Tasks, none downloaded (generated ones are written as .npz under OUT/data):

- digits:      the bundled 8x8 handwritten digits, seed `resnet_small`.
- motifs:      generated sequences of 32 steps x 4 channels: ten classes, each the same five
               random ±1 vectors in its own order, added at a random position to unit noise. Every
               class holds the same values, so only their order (what a window sees) tells them
               apart: a 1-D CNN is far above an MLP. The sequences are given as 4x1x32 images (im
               mode, grammar `einspace`, seed `resnet_small`), so that convolutions (im2col, whose
               3x3 kernels on a 1-pixel-high image with padding 1 are 3-tap 1-D kernels) are in the
               space; in col mode neither bundled grammar has a local operation.
- arrangement: generated 16x16 images: eight classes, the direction (45° sectors) from a 3x3
               cross to a 3x3 ring placed at random at least 4 pixels apart on noise. What is in the
               image never changes, only where: `resnet_small` (global pooling, a small receptive
               field) is far from the ceiling that a small CNN with a flattening head reaches.

The recipe, printed at the start, is experiments/quickstart.yaml's (grammar limits, training
evaluator with one thread, batch 128, its FLOP and activation budgets, training from a fitted head
with gradients clipped to norm 1, RE's population and tournament) with 8 epochs and, per task, a
time limit of 4-6x the seed's training time on an idle core (a wall-clock limit: on a loaded
machine evaluations near it fail, which counts as waste).

Beside them, trained in the same run with the same epochs, batch size, optimiser and threads (not
clipped), in plain torch: an MLP (two hidden layers of 256), a small CNN (two conv-BN-ReLU-max-pool
blocks of 32 and 64 channels, 3x3, or 5-tap on 1-pixel-high images, then a hidden layer of 128), and
CNN-mean, the same without max-pooling and with the grammar's head (a linear layer of the mean
over positions), the kind of network the paper's grammar writes at its best. Test
accuracies, the searches' and the baselines', are of a retraining on train+valid with the recipe
(no time limit), scored on test. The incumbent of a search is `einspace.search.compute.incumbent`:
the best result at the highest fidelity it reached (so an RE+SH curve can drop when it first
reaches a higher rung).

Printed per task and method, means over seeds: the area under the best-so-far curve over the
budget, normalised by it (0 before the first result); the compute to reach 95% of RE's final best
(the same seed and start); the share of compute spent on failed evaluations; the final best
validation accuracy and the test accuracy of that choice. Then the targets: (a) RE+SH reaches
RE's final best with at most 1/3 of RE's compute (per seed: RE+SH's compute to reach it over RE's
total, averaged over seeds; a seed that never reaches it fails the target; and, read on the mean
curves, the compute at which the mean over seeds of RE+SH's incumbent reaches the mean of RE's
final bests, over RE's mean compute: one seed's luck counts less there; beside it, the 5th-95th
percentiles of that reading over BOOTSTRAP_DRAWS resamplings of the seeds, how much it owes to
which seeds ran; and the mean incumbent at the target's share of RE's mean compute, with RE's own
then: where both mean curves are flat near RE's final best, the share moves far between runs of the
same seeds, and this says how far from the target a method is), (b) at most 10% of
each method's compute (over its seeds) went to failed evaluations, (c) on motifs the best method
from scratch (by mean test accuracy) beats the plain-torch MLP; issue 26's: RE+all reaches RE's
final best with at most 1/5 of its compute ((a) again), (s) a screening method's surrogate ranks
the candidates it predicted from at least 50 results at Spearman's rho >= 0.5 (the seeds' rho
weighed by their candidates), and (i) children that inherit score at least what fresh children
of the same method without inheritance score at equal epochs.
OUT/TASK.png plots the best-so-far validation accuracy against compute, mean over seeds with a
min-max band; OUT/results.json holds every curve.

Execution: by default each search runs in its own worker process with the in-process executor
(address space capped at 6 GiB; the task's seed trains for one epoch before the search, so that
the process's one-time costs are not charged to the search), `--jobs` searches at once.
`--executor ray` runs one search at a time on a local Ray instance instead, `--jobs` evaluations
in flight, each holding `--num-gpus` of a GPU (compute is then GPU seconds: choose `--budget` to
match; a Ray worker's first evaluation includes its start-up; the baselines stay on the CPU).
Output goes to `--out` (default runs/search_efficiency).

    python benchmarks/search_efficiency.py --quick       # 1 seed, small budgets: minutes on 2 cores
    python benchmarks/search_efficiency.py               # 3 seeds, every method: 3-4 hours on 2 cores
    python benchmarks/search_efficiency.py --executor ray --num-gpus 0.25 --jobs 4 --budget 60
    python benchmarks/search_efficiency.py --tasks motifs --methods RE+SH --optimizer adam --lr 0.003
    python benchmarks/search_efficiency.py --tasks motifs --head-pooling max   # max head, not mean
    python benchmarks/search_efficiency.py --head-init random --max-grad-norm 0  # the paper's recipe

`--optimizer`, `--lr`, `--max-grad-norm` (0: none), `--head-pooling` and `--head-init` replace the
recipe's settings for the searches and their retraining; the baselines train with the optimiser
given, keep their own heads and are not clipped (clipping guards a fitted head, and slows plain
CNNs). `--population`, `--tournament` and `--immigrants` replace RE's, `--min-params`, `--min-flops` and
`--max-flops` set the limits that keep degenerate (or over-budget) candidates out. `--keep-runs`
keeps every search's run directory under OUT/runs/TASK_METHOD_SEED/run (for `einspace report`,
or to replay its history with `benchmarks/surrogate_ranking.py`); otherwise they are thrown away.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from _harness import (
    MEMORY_LIMIT_GB,
    RHO_RESULTS,
    confine_worker,
    failure_kind,
    quickstart,
    retraining,
    search_pool,
    test_accuracy,
    weighed_mean,
)

from einspace.evaluators.head_fit import HEAD_INITS
from einspace.network.compiler import HEAD_POOLINGS
from einspace.search.random_search import RandomSearch
from einspace.search.strategy import register_strategy
from einspace.search.successive_halving import default_rungs
from einspace.tree import Node

if TYPE_CHECKING:
    from torch import nn

    from einspace.evaluators.datasets import Dataset
    from einspace.evaluators.training import TrainingSettings
    from einspace.search.config import Experiment
    from einspace.search.store import Record

EPOCHS = 8  # the top fidelity of every task
HALVING = {"scheduler": "successive_halving", "eta": 3, "min_fidelity": 1}
STRATEGY_BUDGET = 10**6  # the strategies' own count of evaluations: out of reach, compute stops them
TARGET_SPEEDUP, TARGET_WASTE = 3, 0.10
TARGET_SPEEDUP_EVERYTHING = 5  # RE with successive halving, surrogate and inheritance (issue 26)
SCREEN = 8  # surrogate-screened methods: proposals per trained child
SCREEN_TRANSFER = 64  # RE+S+T: proposals per candidate, ranked by the warm-started surrogate
TRANSFER_SOURCE = "digits"  # RE+S+T: the task of the earlier search its surrogate starts from
TARGET_RHO = 0.5  # issue 26: the surrogate's rank correlation once 50 results are in
MUTATIONS = (("subtree", 1.0), ("insert", 1.0), ("remove", 1.0))  # +M: every operator alike
SURROGATE_MIN_RESULTS = 20  # screened methods: plain RE until this many results are in
ETA_WIDE = 9  # +eta9: successive halving promotes the best ninth, so more is spent on new trees
ETA_SELECTIVE = 6  # +p6: the best sixth of each rung is promoted, over eta 3's rungs
#: +p63: the best sixth of the looks, then the best third of each trained rung (whose epochs grow
#: threefold), so the first tree reaches the top after 54 looks instead of 216
ETAS_LOOK_SELECTIVE = (ETA_SELECTIVE, HALVING["eta"], HALVING["eta"])
WINDOW = 36  # +p6w: ... of its last 36 results
MIN_PARAMS = 1000  # RE+all0+p6w: no tree of fewer parameters is sampled or made by mutation
WIDE = (("population", 48), ("tournament", 12))  # +P: RE's population and tournament, 3x the recipe's
RESTART_AFTER = 2  # +R: restart a population that has not improved for this many times its size
RUNGS_NO_EPOCH_1 = (0, 3, EPOCHS)  # all03: from the look straight to 3 epochs (no 1-epoch rung)
IMMIGRANTS = 0.25  # +F: this share of RE's candidates after the first population are fresh samples
SCREEN_COST = 0.1  # +C: a tenfold cost must be predicted this many standard deviations fitter
LOOK_EXAMPLES = 512  # +L: the look at 0 epochs fits the head to this many examples (the default 1,024)
BOOTSTRAP_DRAWS = 2000  # resamplings of the seeds behind the spread of (a)'s mean-curve reading


@register_strategy
class SeededRandomSearch(RandomSearch):
    """Random search whose first candidates are the experiment's seeds, in order."""

    name = "seeded_random_search"

    def _propose(self) -> tuple[Node, str, tuple[int, ...]]:
        seeds = self.space.seed_trees()
        if self.next_id < len(seeds):
            name, tree = seeds[self.next_id]
            return tree, f"seed:{name}", ()
        return super()._propose()


# ----------------------------------------------------------------------------- tasks


def _splits(x: np.ndarray, y: np.ndarray, sizes: tuple[int, int, int]) -> dict[str, np.ndarray]:
    bounds = np.cumsum((0, *sizes))
    parts = zip(("train", "valid", "test"), bounds[:-1], bounds[1:], strict=True)
    return {f"{split}_{k}": a[lo:hi] for split, lo, hi in parts for k, a in (("x", x), ("y", y))}


def motif_sequences(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Ten orders of the same five ±1 vectors (4 channels), each added (x2) at a random position
    of 32 steps of unit noise; as images of 4 channels, 1 row and 32 columns."""
    steps, channels, length, classes, sizes = 32, 4, 5, 10, (3200, 800, 800)
    values = rng.choice([-1.0, 1.0], size=(length, channels))
    orders: list[tuple[int, ...]] = []
    while len(orders) < classes:
        order = tuple(int(i) for i in rng.permutation(length))
        if order not in orders:
            orders.append(order)
    n = sum(sizes)
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, steps, channels))
    starts = rng.integers(0, steps - length + 1, n)
    for i in range(n):
        x[i, starts[i] : starts[i] + length] += 2 * values[list(orders[y[i]])]
    return _splits(x.transpose(0, 2, 1)[:, :, None, :].astype(np.float32), y, sizes)


def arrangement_images(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A 3x3 cross and a 3x3 ring at least 4 pixels apart on 16x16 noise; the class is the
    direction from the cross to the ring in 45° sectors."""
    size, classes, sizes = 16, 8, (1500, 500, 500)
    cross = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], dtype=float)
    ring = np.array([[1, 1, 1], [1, 0, 1], [1, 1, 1]], dtype=float)
    n = sum(sizes)
    x = rng.normal(scale=0.3, size=(n, 1, size, size))
    y = np.zeros(n, dtype=np.int64)
    for i in range(n):
        a, b = rng.integers(0, size - 2, (2, 2))
        while np.abs(b - a).max() < 4:
            a, b = rng.integers(0, size - 2, (2, 2))
        y[i] = round(math.atan2(*(b - a)) / (2 * math.pi / classes)) % classes
        x[i, 0, a[0] : a[0] + 3, a[1] : a[1] + 3] += cross
        x[i, 0, b[0] : b[0] + 3, b[1] : b[1] + 3] += ring
    return _splits(x.astype(np.float32), y, sizes)


@dataclass(frozen=True)
class Task:
    """A task: its data (None: a built-in of that name), input, grammar, seed and budgets."""

    name: str
    shape: tuple[int, ...]
    grammar: str
    seed: str
    budget: float  # compute seconds per search
    quick_budget: float
    max_seconds: float  # the evaluator's time limit: wall seconds, 4-6x the seed's on an idle core
    make: Callable[[np.random.Generator], dict[str, np.ndarray]] | None = None
    mlp_target: bool = False  # target (c): the best method from scratch beats the MLP


TASKS = {
    t.name: t
    for t in (
        Task("digits", (1, 8, 8), "einspace", "resnet_small", 60, 8, 20),
        Task("motifs", (4, 1, 32), "einspace", "resnet_small", 120, 12, 20, motif_sequences, True),
        Task("arrangement", (1, 16, 16), "einspace", "resnet_small", 150, 15, 45, arrangement_images),
    )
}


@dataclass(frozen=True)
class Method:
    """A search method: a strategy, inside successive halving or not, from the task's seed or not."""

    strategy: str
    halving: bool = False
    seeded: bool = False
    screen: int = 1  # proposals per trained child, ranked by the surrogate (1: none)
    inherit: bool = False  # children start from their parent's trained weights
    mutations: tuple[tuple[str, float], ...] = ()  # mutation operators' weights (none: the paper's)
    transfer: tuple[str, ...] = ()  # the surrogate starts from these methods' searches on TRANSFER_SOURCE
    first_rung: int = 1  # successive halving's lowest rung: 0 looks at the untrained network first
    strategy_fitness: str = "lowest_rung"  # highest_rung: RE hears promotions' results too
    eta: int | tuple[int, ...] = HALVING["eta"]  # successive halving promotes the best 1/eta of each rung
    rung_eta: int | None = None  # the rungs of this eta (1, 3, 8), promotions by `eta` (None: the same)
    rungs: tuple[int, ...] | None = None  # explicit rungs, instead of those of first_rung and rung_eta
    window: int | None = None  # promotions rank a result among its rung's last `window` (None: all)
    min_params: int = 0  # the limit min_params of its searches (--min-params sets it for all)
    evolution: tuple[tuple[str, float], ...] = ()  # RE's settings over the recipe's (--population wins)
    look_examples: int | None = None  # the evaluator's look_examples (None: its default)

    @property
    def explicit_rungs(self) -> tuple[int, ...] | None:
        """Its rungs where given (`rungs`, or those of `rung_eta`); None: the scheduler's own."""
        if self.rungs or not self.rung_eta:
            return self.rungs
        return tuple(default_rungs(self.first_rung, EPOCHS, self.rung_eta))

    @property
    def everything(self) -> bool:
        return self.halving and self.screen > 1 and self.inherit


def _restarting(
    evolution: tuple = (), growth: int = 1, after: float = RESTART_AFTER, keep: int = 0
) -> tuple[tuple[str, float], ...]:
    """RE's settings `evolution` with restarts after `after` times its population, each growing
    the population and tournament by `growth` and keeping its `keep` best."""
    keeping = (("restart_keep", keep),) if keep else ()
    return (*evolution, ("restart_after", after), ("restart_growth", growth), *keeping)


#: Everything with its look first, promoting the best sixth over eta 3's rungs; variants below.
ALL0_P6 = Method(
    "regularised_evolution",
    halving=True,
    screen=SCREEN,
    inherit=True,
    first_rung=0,
    eta=ETA_SELECTIVE,
    rung_eta=HALVING["eta"],
)

#: RE+all0+p6 promoting within a window, without tiny trees: the base of the +p6w variants.
ALL0_P6W = replace(ALL0_P6, window=WINDOW, min_params=MIN_PARAMS)

#: RE+all0+p6w with restarts that double and keep the best: everything together, and its variants.
ALL0_P6W_RGK = replace(ALL0_P6W, evolution=_restarting(growth=2, keep=1))

METHODS = {
    "RS": Method("random_search"),
    "RE": Method("regularised_evolution"),
    "RE+SH": Method("regularised_evolution", halving=True),
    "RE+S": Method("regularised_evolution", screen=SCREEN),
    "RE+SH+S": Method("regularised_evolution", halving=True, screen=SCREEN),
    "RE+I": Method("regularised_evolution", inherit=True),
    "RE+all": Method("regularised_evolution", halving=True, screen=SCREEN, inherit=True),
    "RE+all0": Method("regularised_evolution", halving=True, screen=SCREEN, inherit=True, first_rung=0),
    "RE+M": Method("regularised_evolution", mutations=MUTATIONS),
    "RE+SH+M": Method("regularised_evolution", halving=True, mutations=MUTATIONS),
    "RE+SH0": Method("regularised_evolution", halving=True, first_rung=0),
    "RE+SH0+S": Method("regularised_evolution", halving=True, screen=SCREEN, first_rung=0),
    "RE+SH0+I": Method("regularised_evolution", halving=True, inherit=True, first_rung=0),
    "RE+SH+H": Method("regularised_evolution", halving=True, strategy_fitness="highest_rung"),
    "RE+SH0+H": Method("regularised_evolution", halving=True, first_rung=0, strategy_fitness="highest_rung"),
    "RE+SH0+eta9": Method("regularised_evolution", halving=True, first_rung=0, eta=ETA_WIDE),
    "RE+SH+p6": Method("regularised_evolution", halving=True, eta=ETA_SELECTIVE, rung_eta=HALVING["eta"]),
    "RE+SH0+p6": Method(
        "regularised_evolution", halving=True, first_rung=0, eta=ETA_SELECTIVE, rung_eta=HALVING["eta"]
    ),
    "RE+all0+p6": ALL0_P6,
    "RE+all0+p6w": ALL0_P6W,
    "RE+all0+p3w": replace(ALL0_P6W, eta=HALVING["eta"], rung_eta=None),
    "RE+all+p6": replace(ALL0_P6, first_rung=1, min_params=MIN_PARAMS),
    "RE+all0+p6wP": replace(ALL0_P6W, evolution=WIDE),
    "RE+all0+p6wR": replace(ALL0_P6W, evolution=_restarting()),
    "RE+all0+p6wPR": replace(ALL0_P6W, evolution=_restarting(WIDE)),
    "RE+all0+p6wRG": replace(ALL0_P6W, evolution=_restarting(growth=2)),
    "RE+all0+p6wRG4": replace(ALL0_P6W, evolution=_restarting(growth=2, after=2 * RESTART_AFTER)),
    "RE+all0+p6wRGK": ALL0_P6W_RGK,
    "RE+SH0+S+p6wRGK": replace(ALL0_P6W_RGK, inherit=False),
    "RE+all0+p6wRGKF": replace(
        ALL0_P6W, evolution=_restarting((("immigrants", IMMIGRANTS),), growth=2, keep=1)
    ),
    "RE+all0+p6wRGKC": replace(
        ALL0_P6W_RGK, evolution=(*ALL0_P6W_RGK.evolution, ("screen_cost", SCREEN_COST))
    ),
    "RE+all03+p6wRGK": replace(ALL0_P6W_RGK, rungs=RUNGS_NO_EPOCH_1),
    "RE+all0+p63wRGK": replace(ALL0_P6W_RGK, eta=ETAS_LOOK_SELECTIVE),
    "RE+all0+p6wRGKL": replace(ALL0_P6W_RGK, look_examples=LOOK_EXAMPLES),
    "RE+all0+p6wL": replace(ALL0_P6W, look_examples=LOOK_EXAMPLES),
    "RE+all0+p6wRGL": replace(ALL0_P6W, evolution=_restarting(growth=2), look_examples=LOOK_EXAMPLES),
    "RE+S+T": Method("regularised_evolution", screen=SCREEN_TRANSFER, transfer=("RE",)),
    "RE+S+T2": Method("regularised_evolution", screen=SCREEN_TRANSFER, transfer=("RE", "RE-seeded")),
    "RE+SH+S+T": Method("regularised_evolution", halving=True, screen=SCREEN_TRANSFER, transfer=("RE",)),
    "RS-seeded": Method("seeded_random_search", seeded=True),
    "RE-seeded": Method("regularised_evolution", seeded=True),
    "RE+SH-seeded": Method("regularised_evolution", halving=True, seeded=True),
}
BASELINES = ("MLP", "CNN", "CNN-mean")


@dataclass(frozen=True)
class Job:
    """One search (`method` a METHODS key) or one baseline (a BASELINES key), as plain data."""

    task: str
    method: str
    seed: int
    budget: float
    data_dir: str
    executor: str = "in_process"
    in_flight: int = 1
    num_gpus: float = 0.0
    overrides: tuple[tuple[str, Any], ...] = ()  # --optimizer, --lr, --head-*: over the recipe's
    source_budget: float = 0.0  # transfer: the compute of the earlier search on TRANSFER_SOURCE
    evolution: tuple[tuple[str, float], ...] = ()  # --population, --tournament, --immigrants: over RE
    limits: tuple[tuple[str, int], ...] = ()  # --min-params, --min-flops, --max-flops: over the recipe's
    keep_dir: str = ""  # --keep-runs: the run directories are kept under it, not thrown away


def _dataset(task: Task, data_dir: Path) -> str:
    return task.name if task.make is None else str(data_dir / f"{task.name}.npz")


def evaluator_settings(task: Task, data_dir: Path, overrides: tuple = ()) -> dict[str, Any]:
    """The quick start's evaluator settings with the task's data, EPOCHS and time limit (and the
    settings given on the command line: optimiser, head pooling)."""
    settings = quickstart()["evaluator"]["settings"]
    return {
        **settings,
        "dataset": _dataset(task, data_dir),
        "epochs": EPOCHS,
        "max_seconds": task.max_seconds,
        **dict(overrides),
    }


def experiment(job: Job, run_dir: Path, warm_start: tuple[str, ...] = ()) -> dict[str, Any]:
    """The quick start's experiment for one search: the task's input, grammar and data, the
    method's strategy (RE with the quick start's settings), the executor asked for and the runs
    its surrogate is warm-started from."""
    raw, task, method = quickstart(), TASKS[job.task], METHODS[job.method]
    data_dir = Path(job.data_dir)
    strategy = {"evaluations": STRATEGY_BUDGET}
    if method.strategy == "regularised_evolution":
        recipe = raw["strategy"]["settings"]
        strategy = {**recipe, **strategy, **dict(method.evolution), **dict(job.evolution)}
    if method.screen > 1:
        strategy = {**strategy, "screen": method.screen, "surrogate_min_results": SURROGATE_MIN_RESULTS}
    if method.mutations:
        strategy = {**strategy, "mutations": dict(method.mutations)}
    executor = (
        {"kind": "in_process"}
        if job.executor == "in_process"
        else {**raw["executor"], "max_in_flight": job.in_flight, "num_gpus": job.num_gpus}
    )
    return {
        **raw,
        "name": f"{job.task}_{job.method}_{job.seed}",
        "run_dir": str(run_dir),
        "random_seed": job.seed,
        "grammar": task.grammar,
        "input": {"shape": list(task.shape), "mode": "im"},
        "limits": {
            **raw["limits"],
            **({"min_params": method.min_params} if method.min_params else {}),
            **dict(job.limits),
        },
        "evaluator": {
            "name": raw["evaluator"]["name"],
            "settings": {
                **evaluator_settings(task, data_dir, job.overrides),
                **({"inherit_weights": True} if method.inherit else {}),
                **({"look_examples": method.look_examples} if method.look_examples else {}),
            },
        },
        "strategy": {"name": method.strategy, "settings": strategy},
        "seeds": [task.seed] if method.seeded else [],
        "executor": executor,
        **(
            {
                "multi_fidelity": {
                    **HALVING,
                    "min_fidelity": method.first_rung,
                    "eta": method.eta if isinstance(method.eta, int) else list(method.eta),
                    **({"rungs": list(rungs)} if (rungs := method.explicit_rungs) else {}),
                    "strategy_fitness": method.strategy_fitness,
                    "window": method.window,
                }
            }
            if method.halving
            else {}
        ),
        **({"warm_start": list(warm_start)} if warm_start else {}),
    }


def prepare(tasks: list[Task], data_dir: Path) -> dict[str, str]:
    """Write the generated datasets, check every task's experiment (data against input, seed
    against grammar); each task's dataset summary."""
    from einspace.evaluators.datasets import load_dataset
    from einspace.search.config import parse_experiment

    data_dir.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for task in tasks:
        if task.make is not None:
            np.savez(data_dir / f"{task.name}.npz", **task.make(np.random.default_rng(0)))
        job = Job(task.name, "RE-seeded", 0, task.budget, str(data_dir))
        e = parse_experiment(experiment(job, data_dir / "unused"), f"search_efficiency:{task.name}")
        e.check_evaluator()
        summaries[task.name] = load_dataset(_dataset(task, data_dir)).summary()
    return summaries


# ----------------------------------------------------------------------------- the jobs


def run_search(job: Job) -> dict[str, Any]:
    """One search until its evaluations have spent the budget: its best-so-far curve, its waste,
    its incumbent's validation and test accuracy (and, seeded RE, the seed's own evaluation)."""
    confine_worker(MEMORY_LIMIT_GB if job.executor == "in_process" else None)
    from einspace.search.compute import best_so_far, compute_of, incumbent, wasted
    from einspace.search.successive_halving import PROMOTION

    started, sources, warm_start = time.perf_counter(), [], []
    with _runs_dir(job) as tmp:
        for name in METHODS[job.method].transfer:
            earlier = replace(job, task=TRANSFER_SOURCE, method=name, budget=job.source_budget)
            history, _ = _search(earlier, Path(tmp) / name)
            found = incumbent(history)
            sources.append(
                {
                    "method": name,
                    "best": found.fitness if found else math.nan,
                    "total": sum(map(compute_of, history)),
                }
            )
            warm_start.append(str(Path(tmp) / name))
        history, checkpoint = _search(job, Path(tmp) / "run", tuple(warm_start))
    curve = best_so_far(history)
    best = incumbent(history)
    out: dict[str, Any] = {
        **asdict(job),
        "curve": curve,
        "total": curve[-1][0] if curve else 0.0,
        "wasted": wasted(history),
        "counts": Counter(r.status for r in history),
        "promotions": sum(r.origin == PROMOTION for r in history),
        "failures": Counter(failure_kind(r.error) for r in history if r.status == "failed"),
        "best": best.fitness if best is not None else math.nan,
        **_children(history),
        "surrogate": _surrogate(checkpoint, warm=bool(warm_start)),
        "test": _retrained(job, best.tree) if best is not None else math.nan,
        **({"sources": sources} if sources else {}),
    }
    if job.method == "RE-seeded":
        own = next(r for r in history if r.origin.startswith("seed:") and r.status != "cached")
        if own.status != "ok":
            out["seed_alone"] = (math.nan, math.nan)
        else:  # the seed is often the incumbent: its retraining is known then
            out["seed_alone"] = (
                own.fitness,
                out["test"] if own.tree == best.tree else _retrained(job, own.tree),
            )
    out["seconds"] = time.perf_counter() - started
    return out


@contextmanager
def _runs_dir(job: Job) -> Iterator[str]:
    """Where one search's run directories go: KEEP/TASK_METHOD_SEED with --keep-runs (for
    `einspace report`, or `benchmarks/surrogate_ranking.py`), else a directory thrown away after."""
    if not job.keep_dir:
        with tempfile.TemporaryDirectory() as tmp:
            yield tmp
        return
    kept = Path(job.keep_dir) / f"{job.task}_{job.method}_{job.seed}"
    if kept.exists():
        shutil.rmtree(kept)  # an earlier benchmark's: a search starts afresh, never resumes it
    kept.mkdir(parents=True)
    yield str(kept)


def _search(job: Job, run_dir: Path, warm_start: tuple[str, ...] = ()) -> tuple[list[Record], Any]:
    """Run one search in `run_dir` until its evaluations have spent `job.budget`: its history and
    last checkpoint."""
    from einspace.search.compute import compute_of
    from einspace.search.config import parse_experiment
    from einspace.search.loop import SearchRun

    spent = 0.0

    def count(record: Record, _: object) -> None:
        nonlocal spent
        spent += compute_of(record)

    e = parse_experiment(experiment(job, run_dir, warm_start), f"search_efficiency:{job.task}")
    if job.executor == "in_process":
        _warm_up(e, job)
    executor = e.make_executor()
    try:
        with SearchRun.start(e) as run:
            run.run(executor, on_result=count, should_stop=lambda: spent >= job.budget)
            return run.store.history(), run.store.load_checkpoint()
    finally:
        executor.shutdown()


def _surrogate(checkpoint: dict[str, Any] | None, warm: bool) -> dict[str, float] | None:
    """Issue 26's surrogate target: Spearman's rho between the surrogate's prediction for each
    screened candidate (made before it trained) and its measured fitness, over all of them and
    over those predicted once 50 of the run's own results were in (None: no screening).
    Screening starts at `surrogate_min_results` (20) results, or at the first candidate when
    warm-started, and every screened candidate adds one pair, so with one evaluation in flight
    the pairs from the 31st on (the 51st on, warm-started) were predicted from at least 50."""
    from einspace.search.surrogate import rank_correlation, screened_pairs

    pairs = screened_pairs(checkpoint)
    if pairs is None:
        return None
    late = pairs[RHO_RESULTS - (0 if warm else SURROGATE_MIN_RESULTS) :]
    return {
        "all": rank_correlation(pairs),
        "n": len(pairs),
        "late": rank_correlation(late),
        "n_late": len(late),
    }


def _children(history: list[Record]) -> dict[str, float | None]:
    """The mean validation accuracy of the mutation and crossover children at the lowest
    fidelity they trained at, and the mean share of their parameters they inherited (None: no
    such children, or no inheritance)."""
    children = [r for r in history if r.origin in ("mutation", "crossover") and r.status == "ok"]
    if not children:
        return {"children": None, "inherited": None}
    lowest = min(children, key=lambda r: r.fidelity or 0).fidelity
    at = [r.fitness for r in children if r.fidelity == lowest]
    shares = [r.metrics["inherited_share"] for r in children if "inherited_share" in r.metrics]
    return {"children": statistics.fmean(at), "inherited": statistics.fmean(shares) if shares else None}


def _warm_up(e: Experiment, job: Job) -> None:
    """Train the task's seed for one epoch outside the search, so that what a process pays once
    (imports, loading the data, calibrations: 2 s on digits) is not charged to the search's first
    architecture."""
    from einspace.evaluators.base import run_task
    from einspace.seeds import load_seed
    from einspace.tree import to_text

    space = e.space()
    seed = load_seed(TASKS[job.task].seed, space.grammar, space.input)
    run_task(e.task(to_text(seed), fidelity=1))


def _retrained(job: Job, tree: str) -> float:
    """The test accuracy of a tree retrained on train+valid with the recipe (nan if that fails)."""
    from einspace.evaluators.base import EvaluationFailed

    task = TASKS[job.task]
    settings = evaluator_settings(task, Path(job.data_dir), job.overrides)
    try:
        return test_accuracy(tree, settings["dataset"], task.grammar, retraining(settings), job.seed)
    except EvaluationFailed:
        return math.nan


def plain_network(model: str, shape: tuple[int, ...], classes: int) -> nn.Module:
    """The MLP (two hidden layers of 256), the small CNN (conv-BN-ReLU-max-pool blocks of 32 and
    64 channels, 3x3, or 5 taps along a 1-pixel-high image, then a hidden layer of 128), or
    CNN-mean: the same convolutions, BN and ReLU without max-pooling, and the grammar's head (a
    linear layer of the mean over positions): the yardstick of a network the paper's grammar can
    write (it has no pooling and its head is that mean)."""
    from torch import nn

    if model == "MLP":
        hidden = [nn.Linear(math.prod(shape), 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()]
        return nn.Sequential(nn.Flatten(), *hidden, nn.Linear(256, classes))
    channels, *spatial = shape
    kernel, pool = ((1, 5), (1, 2)) if spatial[0] == 1 else ((3, 3), (2, 2))
    layers: list[nn.Module] = []
    for width in (32, 64):
        padding = (kernel[0] // 2, kernel[1] // 2)
        layers += [nn.Conv2d(channels, width, kernel, padding=padding), nn.BatchNorm2d(width), nn.ReLU()]
        if model == "CNN":
            layers.append(nn.MaxPool2d(pool))
            spatial = [d // p for d, p in zip(spatial, pool, strict=True)]
        channels = width
    if model == "CNN-mean":
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))
    head = [nn.Flatten(), nn.Linear(channels * math.prod(spatial), 128), nn.ReLU(), nn.Linear(128, classes)]
    return nn.Sequential(*layers, *head)


Split = tuple[np.ndarray, np.ndarray]


def _fit(model: str, data: Dataset, train: Split, score: Split, s: TrainingSettings, seed: int) -> float:
    """Train a plain network with the training evaluator's optimiser (its `optimizer`, lr,
    momentum, weight decay and schedule, stepped per batch); its accuracy on `score`."""
    import torch
    import torch.nn.functional as F

    from einspace.evaluators.optim import build_optimizer

    torch.manual_seed(seed)
    net = plain_network(model, data.input_shape, data.classes)
    x, y = (torch.tensor(a) for a in train)
    steps = math.ceil(len(x) / s.batch_size)
    options = {**s.optimizer_options(), "max_grad_norm": None}  # the searches' guard for a fitted head
    opt = build_optimizer(net, steps_per_epoch=steps, epochs=s.epochs, **options)
    net.train()
    for _ in range(s.epochs):
        for batch in torch.randperm(len(x)).split(s.batch_size):
            loss = F.cross_entropy(net(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            opt.schedule_step()
    net.eval()
    x, y = (torch.tensor(a) for a in score)
    with torch.no_grad():
        right = sum(
            int((net(xb).argmax(1) == yb).sum()) for xb, yb in zip(x.split(1024), y.split(1024), strict=True)
        )
    return right / len(y)


def run_baseline(job: Job) -> dict[str, Any]:
    """A plain-torch baseline: trained on train (validation accuracy), retrained on train+valid
    (test accuracy), with the searches' recipe."""
    confine_worker()
    from einspace.evaluators.datasets import load_dataset
    from einspace.evaluators.training import TrainingSettings

    started, cpu = time.perf_counter(), time.process_time()
    s = TrainingSettings(**evaluator_settings(TASKS[job.task], Path(job.data_dir), job.overrides))
    data = load_dataset(s.dataset)
    (tx, ty), valid, test = (data.split(name) for name in ("train", "valid", "test"))
    best = _fit(job.method, data, (tx, ty), valid, s, job.seed)
    both = (np.concatenate([tx, valid[0]]), np.concatenate([ty, valid[1]]))
    out = {**asdict(job), "best": best, "test": _fit(job.method, data, both, test, s, job.seed)}
    return {**out, "total": time.process_time() - cpu, "seconds": time.perf_counter() - started}


# ----------------------------------------------------------------------------- the report

Curve = list[tuple[float, float | None]]


def auc(curve: Curve, budget: float) -> float:
    """The area under the best-so-far step curve on [0, budget] over the budget (0 before a result)."""
    area, at, value = 0.0, 0.0, 0.0
    for compute, best in curve:
        compute = min(compute, budget)
        area += (compute - at) * value
        at, value = compute, best if best is not None else 0.0
    return (area + (budget - at) * value) / budget


def reached(curve: Curve, target: float) -> float | None:
    """The compute at which the incumbent first reached `target`, None if it never did."""
    return next((c for c, best in curve if best is not None and best >= target), None)


def mean_curve_reading(
    curves: dict[int, Curve], reference: dict[int, dict[str, Any]], draws: int = BOOTSTRAP_DRAWS
) -> tuple[float, float, float, float]:
    """(a) read on the mean curves, over the seeds both have: the reference's mean final best, and
    the compute at which the mean over seeds of the incumbent (0 before a curve's first result)
    first reached it, as a share of the reference's mean compute (inf: never); then how much that
    share owes to which seeds ran, as the 5th and 95th percentiles of the share over `draws`
    resamplings of the seeds (with replacement; a seed's run drawn with its reference run)."""
    seeds = sorted(set(curves) & set(reference))
    grid = np.array(sorted({c for s in seeds for c, _ in curves[s]}))
    values = np.nan_to_num(np.array([_on_grid(curves[s], grid) for s in seeds]), nan=0.0)
    best = np.array([reference[s]["best"] for s in seeds])
    total = np.array([reference[s]["total"] for s in seeds])

    def share(pick: np.ndarray) -> float:
        above = np.flatnonzero(values[pick].mean(0) >= best[pick].mean())
        return grid[above[0]] / total[pick].mean() if above.size else math.inf

    every = np.arange(len(seeds))
    shares = [share(pick) for pick in np.random.default_rng(0).integers(len(seeds), size=(draws, len(seeds)))]
    # drawn shares, not interpolated between them: an interval that reaches "never" says so
    low, high = np.quantile(shares, 0.05, method="lower"), np.quantile(shares, 0.95, method="higher")
    return float(best.mean()), share(every), float(low), float(high)


def mean_best_at(curves: dict[int, Curve], seeds: list[int], compute: float) -> float:
    """The mean over `seeds` of the incumbent at `compute` (0 before a curve's first result)."""
    at = np.array([compute])
    return float(np.mean([np.nan_to_num(_on_grid(curves[s], at), nan=0.0)[0] for s in seeds]))


def _share(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.2f}"


def _reference(method: str) -> str:
    """The RE run that `method`'s compute to RE's final best is measured against (same start)."""
    return "RE-seeded" if METHODS[method].seeded else "RE"


def _by_seed(rows: list[dict[str, Any]], method: str) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in rows if r["method"] == method}


def _to_reference(rows: list[dict[str, Any]], method: str, share: float) -> dict[int, float | None]:
    """Per seed with both runs: `method`'s compute to `share` of the same seed's RE final best."""
    runs, ref = _by_seed(rows, method), _by_seed(rows, _reference(method))
    return {s: reached(runs[s]["curve"], share * ref[s]["best"]) for s in sorted(runs) if s in ref}


def _waste(rows: list[dict[str, Any]], method: str) -> float:
    """The share of a method's compute, over its seeds, that went to failed evaluations."""
    runs = [r for r in rows if r["method"] == method]
    return sum(r["wasted"] for r in runs) / max(sum(r["total"] for r in runs), 1e-9)


def _kinds(failures: dict[str, int]) -> str:
    """Failure counts by kind, most first: "3 time, 1 budget"."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(failures.items(), key=lambda kv: -kv[1]))


def _seconds(values: list[float | None]) -> str:
    """The mean compute of the seeds that reached a target (how many, if not all)."""
    got = [v for v in values if v is not None]
    if not values or not got:
        return "never" if values else "-"
    text = f"{statistics.fmean(got):.0f} s"
    return text if len(got) == len(values) else f"{text} ({len(got)}/{len(values)})"


def _pct(values: list[float]) -> str:
    """Mean ± sd in %, nan (a failed retraining) counted out and said."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "-"
    sd = f" ± {100 * statistics.stdev(known):4.1f}" if len(known) > 1 else ""
    return f"{100 * statistics.fmean(known):5.1f}{sd}" + ("" if len(known) == len(values) else "*")


#: The table's columns: heading and width (the first left-aligned).
COLUMNS = (
    ("method", 20),
    ("AUC", 6),
    ("to 95% RE", 11),
    ("wasted", 7),
    ("valid %", 12),
    ("test %", 12),
    ("evals (failed, promoted)", 26),
)


def _line(*cells: str) -> str:
    """One row of the table; missing cells at the end are blank."""
    padded = [*cells, *[""] * (len(COLUMNS) - len(cells))]
    return " ".join(
        f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
        for i, (c, (_, w)) in enumerate(zip(padded, COLUMNS, strict=True))
    )


def report_task(task: Task, summary: str, rows: list[dict[str, Any]], budget: float) -> None:
    """The task's table (searches, baselines, the seed alone) and its targets."""
    searches = [m for m in METHODS if any(r["method"] == m for r in rows)]
    print(
        f"\n{summary}; budget {budget:g} s of compute per search; seeds {sorted({r['seed'] for r in rows})}"
    )
    header = _line(*(name for name, _ in COLUMNS))
    print(header + "\n" + "-" * len(header))
    for m in searches:
        runs = [r for r in rows if r["method"] == m]
        ok, failed = (sum(r["counts"].get(k, 0) for r in runs) for k in ("ok", "failed"))
        print(
            _line(
                m,
                f"{statistics.fmean(auc(r['curve'], budget) for r in runs):.3f}",
                _seconds(list(_to_reference(rows, m, 0.95).values())),
                f"{100 * _waste(rows, m):.1f}%",
                _pct([r["best"] for r in runs]),
                _pct([r["test"] for r in runs]),
                f"{ok + failed} ({failed}, {sum(r['promotions'] for r in runs)})",
            )
        )
    for name in BASELINES:
        runs = [r for r in rows if r["method"] == name]
        if runs:
            cost = f"{statistics.fmean(r['total'] for r in runs):.0f} s CPU, both trainings"
            valid, test = _pct([r["best"] for r in runs]), _pct([r["test"] for r in runs])
            print(_line(f"{name} (plain torch)", "", "", "", valid, test, cost))
    alone = [r["seed_alone"] for r in rows if "seed_alone" in r]
    if alone:
        valid, test = _pct([v for v, _ in alone]), _pct([t for _, t in alone])
        print(_line(f"{task.seed} alone", "", "", "", valid, test, "its run in RE-seeded"))
    for line in targets(task, rows, searches):
        print(line)


def targets(task: Task, rows: list[dict[str, Any]], searches: list[str]) -> list[str]:
    """Whether each target holds, with the numbers that decide it."""
    lines = []
    for sh in (m for m in searches if METHODS[m].halving):
        ref = _reference(sh)
        if sh not in searches or ref not in searches:
            continue
        ref_runs = _by_seed(rows, ref)
        ratios = [
            (c if c is not None else math.inf) / ref_runs[s]["total"]
            for s, c in _to_reference(rows, sh, 1.0).items()
        ]
        mean = statistics.fmean(ratios)
        speedup = TARGET_SPEEDUP_EVERYTHING if METHODS[sh].everything else TARGET_SPEEDUP
        verdict = "met" if mean <= 1 / speedup else "not met"
        per = ", ".join("never" if math.isinf(r) else f"{r:.2f}" for r in ratios)
        lines.append(
            f"(a) {verdict}: {sh} reached {ref}'s final best with {mean:.2f} of {ref}'s compute "
            f"(target <= {1 / speedup:.2f}; per seed {per})"
        )
        curves = {s: r["curve"] for s, r in _by_seed(rows, sh).items()}
        target, share, low, high = mean_curve_reading(curves, ref_runs)
        lines.append(
            f"(a, mean curves) {'met' if share <= 1 / speedup else 'not met'}: the mean over seeds of "
            f"{sh}'s best so far reached {ref}'s mean final best ({100 * target:.1f}%) with "
            f"{_share(share)} of {ref}'s mean compute (5-95% over resampled seeds: "
            f"{_share(low)}-{_share(high)})"
        )
        seeds = sorted(set(curves) & set(ref_runs))
        at = statistics.fmean(ref_runs[s]["total"] for s in seeds) / speedup
        ref_curves = {s: ref_runs[s]["curve"] for s in seeds}
        lines.append(
            f"    at {1 / speedup:.2f} of {ref}'s mean compute ({at:.0f} s) the mean best so far is "
            f"{100 * mean_best_at(curves, seeds, at):.1f}% ({ref}'s then: "
            f"{100 * mean_best_at(ref_curves, seeds, at):.1f}%), against {ref}'s mean final best"
        )
    if not lines:
        lines.append("(a) not measured: needs RE and RE+SH (from the same start)")
    shares = {m: _waste(rows, m) for m in searches}
    worst = max(shares, key=shares.get) if shares else None
    if worst is not None:
        verdict = "met" if shares[worst] <= TARGET_WASTE else "not met"
        kinds: Counter[str] = Counter()
        for r in rows:
            if r["method"] == worst:
                kinds.update(r["failures"])
        lines.append(
            f"(b) {verdict}: at most {100 * shares[worst]:.1f}% of a method's compute went to failed "
            f"evaluations ({worst}, failures: {_kinds(kinds) or 'none'}; target <= {100 * TARGET_WASTE:.0f}%)"
        )
    lines += _inheritance_lines(rows, searches)
    lines += _surrogate_lines(rows, searches)
    scratch = [m for m in searches if not METHODS[m].seeded and not METHODS[m].transfer]
    mlp = [r["test"] for r in rows if r["method"] == "MLP"]
    means = {m: statistics.fmean(r["test"] for r in rows if r["method"] == m) for m in searches}
    if task.mlp_target and scratch and mlp:
        best = max(scratch, key=means.get)
        verdict = "met" if means[best] > statistics.fmean(mlp) else "not met"
        lines.append(
            f"(c) {verdict}: the best method from scratch, {best}, tests at {100 * means[best]:.1f}% "
            f"against the plain-torch MLP's {100 * statistics.fmean(mlp):.1f}%"
        )
    cnn = [r["test"] for r in rows if r["method"] == "CNN"]
    for m in (m for m in searches if METHODS[m].transfer and mlp and cnn):
        sources = [s for r in rows if r["method"] == m for s in r["sources"]]
        earlier = ", ".join(
            f"{name} best {_pct([s['best'] for s in sources if s['method'] == name]).strip()}%"
            for name in METHODS[m].transfer
        )
        lines.append(
            f"(t) {m}, no seed architecture, its surrogate warm-started from {TRANSFER_SOURCE} searches "
            f"({earlier}; {statistics.fmean(s['total'] for s in sources):.0f} s of compute each, not "
            f"charged): tests at {100 * means[m]:.1f}%, the MLP at {100 * statistics.fmean(mlp):.1f}%, "
            f"the CNN at {100 * statistics.fmean(cnn):.1f}%"
        )
    return lines


def _inheritance_lines(rows: list[dict[str, Any]], searches: list[str]) -> list[str]:
    """Issue 26's inheritance target: at equal epochs, children that inherit their parent's
    weights score at least what fresh children score (mean validation accuracy of the mutation
    children at the first fidelity they train at, against the same method without inheritance)."""
    lines = []
    for m in (m for m in searches if METHODS[m].inherit):
        without = next((o for o in searches if METHODS[o] == replace(METHODS[m], inherit=False)), None)
        mine = [r["children"] for r in rows if r["method"] == m and r.get("children") is not None]
        theirs = [r["children"] for r in rows if r["method"] == without and r.get("children") is not None]
        if without is None or not mine or not theirs:
            continue
        a, b = statistics.fmean(mine), statistics.fmean(theirs)
        shares = [r["inherited"] for r in rows if r["method"] == m and r.get("inherited") is not None]
        share = (
            f"; {100 * statistics.fmean(shares):.0f}% of parameters inherited on average" if shares else ""
        )
        lines.append(
            f"(i) {'met' if a >= b else 'not met'}: {m}'s children score {100 * a:.1f}% at equal epochs, "
            f"{without}'s fresh children {100 * b:.1f}%{share}"
        )
    return lines


def _surrogate_lines(rows: list[dict[str, Any]], searches: list[str]) -> list[str]:
    """Issue 26's surrogate target per screened method: the mean over seeds of the rank
    correlation of the children predicted once 50 results were in (and over all screened ones)."""
    lines = []
    for m in (m for m in searches if METHODS[m].screen > 1):
        seen = [r["surrogate"] for r in rows if r["method"] == m and r.get("surrogate")]
        late = [(s["late"], s["n_late"]) for s in seen if not math.isnan(s["late"])]
        every = [(s["all"], s["n"]) for s in seen if not math.isnan(s["all"])]
        if not late:
            lines.append(f"(s) not measured for {m}: no seed had 3 predictions from {RHO_RESULTS} results")
            continue
        rho = weighed_mean(late)
        per_seed = ", ".join(f"{r:.2f} ({n})" for r, n in late)
        lines.append(
            f"(s) {'met' if rho >= TARGET_RHO else 'not met'}: {m}'s surrogate ranks candidates at "
            f"Spearman {rho:.2f} once 50 results are in (per seed, with its candidates: {per_seed}; "
            f"{weighed_mean(every):.2f} over all screened; target >= {TARGET_RHO})"
        )
    return lines


def _on_grid(curve: Curve, grid: np.ndarray) -> np.ndarray:
    """The step curve's value at each grid point (nan before its first result)."""
    at = np.array([c for c, _ in curve])
    # index -1 (a grid point before the first record) picks the nan appended at the end
    values = np.array([math.nan if v is None else v for _, v in curve] + [math.nan])
    return values[np.searchsorted(at, grid, side="right") - 1]


def plot(task: str, rows: list[dict[str, Any]], budget: float, path: Path) -> None:
    """Best-so-far validation accuracy against compute: each method's mean over seeds (where all
    seeds have a result) with its min-max band; the baselines' validation accuracy as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(0, budget, 301)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    families = sorted({m.removesuffix("-seeded") for m in METHODS}, key=list(METHODS).index)
    for m in METHODS:
        curves = [r["curve"] for r in rows if r["method"] == m]
        if not curves:
            continue
        values = np.array([_on_grid(c, grid) for c in curves])
        known = ~np.isnan(values).any(axis=0)
        colour = f"C{families.index(m.removesuffix('-seeded'))}"
        style = "--" if METHODS[m].seeded else "-"
        x, seen = grid[known], values[:, known]
        ax.plot(x, seen.mean(axis=0), style, color=colour, label=m)
        ax.fill_between(x, seen.min(axis=0), seen.max(axis=0), color=colour, alpha=0.15)
    for name, style in zip(BASELINES, (":", "-.", (0, (1, 4))), strict=True):
        accs = [r["best"] for r in rows if r["method"] == name]
        if accs:
            ax.axhline(statistics.fmean(accs), color="grey", linestyle=style, label=f"{name} (plain torch)")
    ax.set(
        xlabel="cumulative compute (s)",
        ylabel="best validation accuracy so far",
        title=task,
        xlim=(0, budget),
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _progress(r: dict[str, Any]) -> str:
    """One line on a finished job."""
    what = f"{r['total']:.0f} s compute, {r['seconds']:.0f} s wall"
    if "counts" in r:
        c, kinds = r["counts"], _kinds(r["failures"])
        failed = f"{c.get('failed', 0)} failed" + (f" ({kinds})" if kinds else "")
        cached = f"{c.get('cached', 0)} cached, {r['promotions']} promotions"
        what = f"{c.get('ok', 0)} ok, {failed}, {cached}; {what}"
    for source in r.get("sources", ()):
        name, total, best = source["method"], source["total"], source["best"]
        what += f"; {TRANSFER_SOURCE} {name} first ({total:.0f} s, best {best:.1%})"
    head = f"  {r['task']} {r['method']} seed {r['seed']}"
    return f"{head}: valid {100 * r['best']:.1f} test {100 * r['test']:.1f} ({what})"


def recipe(
    tasks: list[Task],
    budgets: dict[str, float],
    executor: dict[str, Any],
    overrides: tuple = (),
    evolution: tuple = (),
    limits: tuple = (),
) -> str:
    """What every search and baseline shares, and what changes per task."""
    from einspace.evaluators.training import TrainingSettings

    raw, defaults = quickstart(), TrainingSettings()
    settings = {
        **raw["evaluator"]["settings"],
        "dataset": "*",
        "epochs": EPOCHS,
        "max_seconds": "*",
        **dict(overrides),
    }
    keys = ("optimizer", "lr", "momentum", "weight_decay", "nesterov", "schedule")
    optimiser = {k: settings.get(k, getattr(defaults, k)) for k in keys}
    rungs = default_rungs(HALVING["min_fidelity"], EPOCHS, HALVING["eta"])
    shared = {
        "source": "experiments/quickstart.yaml",
        "limits": raw["limits"] | dict(limits),
        "evaluator": {"name": raw["evaluator"]["name"], "settings": settings, "optimiser": optimiser},
        "RE": raw["strategy"]["settings"] | dict(evolution) | {"evaluations": "until the budget is spent"},
        "RE+SH": {**HALVING, "rungs": rungs},
        "RE+SH0": {**HALVING, "min_fidelity": 0, "rungs": default_rungs(0, EPOCHS, HALVING["eta"])},
        "+H": {"strategy_fitness": "highest_rung"},
        "+eta9": {"eta": ETA_WIDE, "rungs": default_rungs(0, EPOCHS, ETA_WIDE)},
        "+p6": {"eta": ETA_SELECTIVE, "rungs": "RE+SH's or RE+SH0's"},
        "+p63": {"eta": list(ETAS_LOOK_SELECTIVE)},
        "+p6w, +p3w": {"window": WINDOW},
        "RE+all+p6, RE+all0+p6w*, RE+all0+p3w": {"min_params": MIN_PARAMS},
        **{m: dict(method.evolution) for m, method in METHODS.items() if method.evolution},
        "+L": {"look_examples": LOOK_EXAMPLES},
        "all03": {"rungs": list(RUNGS_NO_EPOCH_1)},
        "retraining on train+valid": retraining(settings),
        "executor": executor,
    }
    per_task = {
        t.name: {
            "grammar": t.grammar,
            "input": list(t.shape),
            "seed": t.seed,
            "max_seconds": t.max_seconds,
            "budget_s": budgets[t.name],
        }
        for t in tasks
    }
    return f"recipe: {json.dumps(shared)}\nper task: {json.dumps(per_task)}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seed 0 only, small budgets")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0)")
    parser.add_argument(
        "--budget", type=float, default=None, help="compute seconds per search (default: per task)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="searches at once (ray: evaluations in flight)")
    parser.add_argument("--out", type=Path, default=Path("runs/search_efficiency"))
    parser.add_argument("--executor", choices=("in_process", "ray"), default="in_process")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="ray: the GPU share of each evaluation")
    parser.add_argument("--optimizer", help="instead of the recipe's (sgd): searches, baselines, retraining")
    parser.add_argument("--lr", type=float, help="instead of the recipe's learning rate (0.04)")
    parser.add_argument("--population", type=int, help="RE's population instead of the recipe's (16)")
    parser.add_argument("--tournament", type=int, help="RE's tournament size instead of the recipe's (4)")
    parser.add_argument(
        "--immigrants", type=float, help="RE's share of fresh samples after the first population (default 0)"
    )
    parser.add_argument(
        "--head-pooling",
        choices=list(HEAD_POOLINGS),
        help="the searched networks' head pooling instead of the recipe's (the paper's mean); "
        "the baselines keep their own heads",
    )
    parser.add_argument(
        "--head-init",
        choices=list(HEAD_INITS),
        help="the searched networks' head start instead of the recipe's (fitted: a linear probe before "
        "training; random: the paper's)",
    )
    parser.add_argument(
        "--max-grad-norm",
        type=float,
        help="clip each step's gradients to this norm instead of the recipe's (1.0; 0: none): searches "
        "and retraining",
    )
    parser.add_argument(
        "--min-params", type=int, help="the limit min_params for the searches (default 0: none)"
    )
    parser.add_argument(
        "--min-flops", type=int, help="the limit min_flops for the searches (default 0: none)"
    )
    parser.add_argument("--max-flops", type=int, help="the limit max_flops for the searches (default none)")
    parser.add_argument(
        "--max-operations", type=int, help="the limit max_operations for the searches (default none)"
    )
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="keep each search's run directory under OUT/runs/TASK_METHOD_SEED",
    )
    parser.add_argument(
        "--source-budget",
        type=float,
        default=None,
        help=f"transfer methods: seconds of each earlier {TRANSFER_SOURCE} search (default: its budget)",
    )
    args = parser.parse_args()
    given = (
        ("optimizer", args.optimizer),
        ("lr", args.lr),
        ("head_pooling", args.head_pooling),
        ("head_init", args.head_init),
    )
    overrides = tuple((k, v) for k, v in given if v is not None)
    if args.max_grad_norm is not None:  # 0: no clipping, whatever the recipe says
        overrides += (("max_grad_norm", args.max_grad_norm or None),)
    evolution = tuple(
        (name, value)
        for name in ("population", "tournament", "immigrants")
        if (value := getattr(args, name)) is not None
    )
    limits = tuple(
        (name, value)
        for name in ("min_params", "min_flops", "max_flops", "max_operations")
        if (value := getattr(args, name))
    )
    tasks = [TASKS[name] for name in args.tasks]
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])

    def budget_of(t: Task) -> float:
        return args.budget or (t.quick_budget if args.quick else t.budget)

    budgets = {t.name: budget_of(t) for t in tasks}
    ray = args.executor == "ray"
    in_flight = args.jobs if ray else 1
    executor = {"kind": args.executor, "searches at once": 1 if ray else args.jobs, "in flight": in_flight}
    if ray:
        executor["num_gpus"] = args.num_gpus
    data_dir = args.out.resolve() / "data"
    print(f"search efficiency: tasks {args.tasks}, methods {args.methods}, seeds {seeds}")
    print(recipe(tasks, budgets, executor, overrides, evolution, limits))
    summaries = prepare(tasks, data_dir)
    jobs = [
        (run_baseline, Job(t.name, b, s, budgets[t.name], str(data_dir), overrides=overrides))
        for t in tasks
        for b in BASELINES
        for s in seeds
    ] + [
        (
            run_search,
            Job(
                t.name,
                m,
                s,
                budgets[t.name],
                str(data_dir),
                args.executor,
                in_flight,
                args.num_gpus,
                overrides,
                args.source_budget or budget_of(TASKS[TRANSFER_SOURCE]),
                evolution,
                limits,
                str(args.out.resolve() / "runs") if args.keep_runs else "",
            ),
        )
        for t in tasks
        for m in args.methods
        for s in seeds
    ]
    started, results = time.perf_counter(), []
    with search_pool(1 if ray else args.jobs) as pool:
        futures = [pool.submit(fn, job) for fn, job in jobs]
        for future in as_completed(futures):
            results.append(future.result())
            print(_progress(results[-1]), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s wall")
    (args.out / "results.json").write_text(json.dumps(results))
    for t in tasks:
        rows = [r for r in results if r["task"] == t.name]
        report_task(t, summaries[t.name], rows, budgets[t.name])
        plot(t.name, rows, budgets[t.name], args.out / f"{t.name}.png")
    plots = ", ".join(str(args.out / f"{t.name}.png") for t in tasks)
    print(f"\nplots: {plots}; curves: {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
