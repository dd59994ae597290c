"""`einspace evaluate` (final evaluation of one tree) and `einspace datasets` (the built-ins)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from einspace.errors import EinspaceError


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the `einspace` parser (called by einspace.cli)."""
    from einspace.evaluators._settings import FINAL_EPOCHS, HEAD_INITS, SCHEDULES

    evaluate = sub.add_parser(
        "evaluate",
        help="final evaluation: train a tree on train+valid, report its test metric",
        description="Retrain a tree from scratch on train+valid and evaluate it on test (paper App. B.1).",
    )
    evaluate.add_argument("tree", metavar="TREE_OR_SEED", help="a tree file, or a bundled seed name")
    evaluate.add_argument(
        "experiment",
        nargs="?",
        metavar="EXPERIMENT.yaml",
        help="an experiment file: its grammar and evaluator settings (dataset, lr, ...) are used; "
        f"epochs default to {FINAL_EPOCHS} all the same. Options given here override it.",
    )
    evaluate.add_argument("--dataset", help="built-in name, Unseen NAS directory, or .npz (default digits)")
    evaluate.add_argument("--grammar", help="grammar to check the tree against (default einspace)")
    evaluate.add_argument("--epochs", type=int, help=f"default {FINAL_EPOCHS} (paper Table 4)")
    evaluate.add_argument("--batch-size", type=int, help="default 256")
    evaluate.add_argument("--lr", type=float, help="default 0.04")
    evaluate.add_argument("--weight-decay", type=float, help="default 3e-4")
    evaluate.add_argument("--schedule", choices=SCHEDULES, help="default cosine")
    evaluate.add_argument("--max-seconds", type=float, help="give up after this long")
    evaluate.add_argument("--max-grad-norm", type=float, help="clip each step's gradients to this norm")
    evaluate.add_argument("--head-pooling", metavar="POOLING", help="mean (the paper's, default) or max")
    evaluate.add_argument(
        "--head-init", choices=HEAD_INITS, help="random (default), or fitted in closed form before training"
    )
    evaluate.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    evaluate.add_argument("--random-seed", type=int, default=0)
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.set_defaults(run=cmd_evaluate)

    datasets = sub.add_parser("datasets", help="list the built-in datasets with their shapes and classes")
    datasets.set_defaults(run=cmd_datasets)


#: Command-line option -> training setting it overrides.
_OVERRIDES = {
    "dataset": "dataset",
    "epochs": "epochs",
    "batch_size": "batch_size",
    "lr": "lr",
    "weight_decay": "weight_decay",
    "schedule": "schedule",
    "max_seconds": "max_seconds",
    "max_grad_norm": "max_grad_norm",
    "head_pooling": "head_pooling",
    "head_init": "head_init",
    "device": "device",
}


def _experiment_settings(path: str) -> tuple[str, dict[str, Any]]:
    """(grammar, training settings) of an experiment file; only a training evaluator's settings
    carry over (a proxy's batch size is not a training recipe), and its dataset in any case."""
    from einspace.search.config import load_experiment

    experiment = load_experiment(path)
    settings = dict(experiment.evaluator.settings)
    if experiment.evaluator.name != "training":
        settings = {k: v for k, v in settings.items() if k == "dataset" and v is not None}
    settings.pop("epochs", None)  # the search's epochs; a final evaluation trains longer
    settings.pop("train_subset", None)
    settings.pop("valid_subset", None)
    return experiment.grammar, settings


def cmd_evaluate(args: argparse.Namespace) -> int:
    from einspace.evaluators.datasets import load_dataset
    from einspace.evaluators.training import FINAL_EPOCHS, final_evaluation
    from einspace.grammar.parser import load_grammar
    from einspace.seeds import load_seed
    from einspace.state import input_state

    grammar_name, settings = "einspace", {}
    if args.experiment:
        grammar_name, settings = _experiment_settings(args.experiment)
    for option, key in _OVERRIDES.items():
        if getattr(args, option) is not None:
            settings[key] = getattr(args, option)
    settings.setdefault("epochs", FINAL_EPOCHS)
    dataset = load_dataset(settings.get("dataset", "digits"))
    grammar = load_grammar(args.grammar or grammar_name)
    tree = load_seed(args.tree, grammar, input_state(dataset.input_shape))
    print(f"# {dataset.summary()}; training on train+valid for {settings['epochs']} epochs")
    metrics = final_evaluation(tree, dataset, grammar, settings, args.random_seed)
    if args.json:
        print(json.dumps(metrics, indent=2))
        return 0
    metric = "test_relative_l2" if "test_relative_l2" in metrics else "test_accuracy"
    print(
        f"{metric.replace('_', ' ')} {metrics[metric]:.4f}  test loss {metrics['test_loss']:.4f}  "
        f"train loss {metrics['train_loss']:.4f}  params {int(metrics['params']):,}  "
        f"{metrics['seconds']:.1f} s"
    )
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from einspace.evaluators.datasets import list_datasets, load_dataset

    for name, description in list_datasets().items():
        try:
            line = load_dataset(name).summary()
        except EinspaceError as exc:
            line = f"{name}: unavailable ({exc})"
        print(f"{line}\n    {description}")
    print("# or give --dataset a directory of train_x.npy ... test_y.npy, or a .npz with those keys")
    return 0
