"""Benchmark (not a test): how good is a random tree of a grammar on a task, next to hand-written
trees of the same grammar? Why from-scratch search stays at chance on `motifs` (issue 22 (c)).

`benchmarks/search_efficiency.py` found every method from scratch near chance on `motifs`, while
the seeded searches reach ~90%. This separates the two explanations: the space holds no network
that learns the task in the recipe's epochs (then the hand-written trees fail too), or the
space's distribution rarely draws one (then they succeed and the random ones do not).

It draws `--trees` trees from the grammar with the search benchmark's limits (the quick start's,
paper-mode sampling), trains each with the training evaluator for `--epochs`, and trains the
hand-written trees below the same way: every row trains with each optimiser of `--optimizers`
(the recipe's SGD, lr 0.04; and Adam, lr 0.003). It prints, per optimiser: how many random trees
trained, how many failed, the best and the quantiles of their validation accuracy, how many are
more than 10 points above chance, and each hand-written tree's accuracy.

    python benchmarks/random_trees.py                      # motifs, 60 trees, 2 epochs: ~5 min
    python benchmarks/random_trees.py --trees 200 --epochs 4
    python benchmarks/random_trees.py --head-pooling max   # the head's max instead of the mean
    python benchmarks/random_trees.py --epochs 0           # untrained, the head fitted in closed form
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from search_efficiency import TASKS, Job, evaluator_settings, experiment, prepare

from einspace.evaluators.base import Task, run_task
from einspace.evaluators.head_fit import HEAD_INITS
from einspace.network.compiler import HEAD_POOLINGS
from einspace.search.config import parse_experiment
from einspace.seeds import load_seed
from einspace.tree import to_text

OPTIMIZERS = {"sgd": {"optimizer": "sgd", "lr": 0.04}, "adam": {"optimizer": "adam", "lr": 0.003}}


def _conv(width: int) -> str:
    """A 3-tap convolution written in the grammar: im2col, a linear layer, col2im."""
    return f"(M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d={width}))) (R2 col2im))"


_ACT, _NORM = "(M (C leaky_relu))", "(M (C norm))"
#: Hand-written trees of the `einspace` grammar (the seed is added per task).
HANDWRITTEN = {
    "one convolution": f"(S {_conv(64)} {_ACT})",
    "two convolutions": f"(S (M {_conv(32)} {_ACT}) (M {_conv(64)} {_ACT}))",
    "two convolutions with norm": (
        f"(S (M {_conv(32)} (M {_NORM} {_ACT})) (M {_conv(64)} (M {_NORM} {_ACT})))"
    ),
}


def random_trees(task_name: str, count: int, seed: int) -> list[str]:
    """`count` trees drawn as the search benchmark's random search draws them."""
    job = Job(task_name, "RS", seed, 0.0, "unused")
    with tempfile.TemporaryDirectory() as tmp:
        space = parse_experiment(experiment(job, Path(tmp)), "random_trees").space()
        sampler = space.sampler(random.Random(seed))
        return [to_text(sampler.sample()) for _ in range(count)]


def train(
    tree: str,
    task_name: str,
    data_dir: Path,
    epochs: int,
    optimiser: dict,
    head: tuple[tuple[str, str], ...] = (),
) -> float | None:
    """Validation accuracy after `epochs` of the recipe with `optimiser` and the `head` settings
    (head_pooling, head_init; None: failed)."""
    task = TASKS[task_name]
    settings = {**evaluator_settings(task, data_dir), "epochs": epochs, **optimiser, **dict(head)}
    result = run_task(Task(tree, task.grammar, task.shape, "training", settings, mode="im"))
    return result.fitness if result.ok else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=list(TASKS), default="motifs")
    parser.add_argument("--trees", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=list(OPTIMIZERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--head-pooling", choices=list(HEAD_POOLINGS), default="mean", help="the head's pooling"
    )
    parser.add_argument(
        "--head-init",
        choices=list(HEAD_INITS),
        default="random",
        help="the head's start (fitted: a linear probe)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/random_trees"))
    args = parser.parse_args()
    head = (("head_pooling", args.head_pooling), ("head_init", args.head_init))
    import torch

    torch.set_num_threads(1)
    task = TASKS[args.task]
    data_dir = args.out.resolve() / "data"
    print(prepare([task], data_dir)[task.name])
    from einspace.evaluators.datasets import load_dataset

    chance = 1 / load_dataset(evaluator_settings(task, data_dir)["dataset"]).classes
    trees = random_trees(task.name, args.trees, args.seed)
    from einspace.grammar.parser import load_grammar
    from einspace.state import input_state

    seed_tree = to_text(load_seed(task.seed, load_grammar(task.grammar), input_state(task.shape, "im")))
    handwritten = {f"the seed {task.seed}": seed_tree, **HANDWRITTEN}
    print(
        f"task {task.name} {task.shape}, grammar {task.grammar}, {args.trees} random trees, "
        f"{args.epochs} epochs, head pooling {args.head_pooling}, head init {args.head_init}, "
        f"chance {chance:.0%}"
    )
    for name in args.optimizers:
        started = time.process_time()
        scores = [train(t, task.name, data_dir, args.epochs, OPTIMIZERS[name], head) for t in trees]
        done = sorted(s for s in scores if s is not None)
        above = sum(s > chance + 0.10 for s in done)
        if done:
            q = statistics.quantiles(done, n=4) if len(done) > 1 else done * 3
            spread = f"best {done[-1]:.1%}, quartiles {q[0]:.1%} / {q[1]:.1%} / {q[2]:.1%}"
        else:
            spread = "none trained"
        print(
            f"\n{name} {OPTIMIZERS[name]}: random trees: {len(done)} trained, "
            f"{len(scores) - len(done)} failed; {spread}; {above} more than 10 points above chance "
            f"({time.process_time() - started:.0f} CPU s)"
        )
        for label, tree in handwritten.items():
            score = train(tree, task.name, data_dir, args.epochs, OPTIMIZERS[name], head)
            print(f"  {label}: {'failed' if score is None else f'{score:.1%}'}")


if __name__ == "__main__":
    main()
