"""`einspace evaluate` and `einspace datasets`: output, JSON, a user's .npz, and errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from einspace.cli import main

TINY = (
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))\n"
    "   (M (M (C norm)) (M (M (C leaky_relu))\n"
    "      (M (R1 im2col(k=8, s=8, p=0)) (M (C linear(d=32))) (R2 col2im)))))\n"
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_datasets_lists_the_builtins(capsys) -> None:
    code, out, _ = run(capsys, "datasets")
    assert code == 0
    assert "digits: input 1x8x8, 10 classes, train/valid/test 1097/350/350" in out
    assert "adddigits: input 3x8x8" in out and "multdigits" in out


def test_evaluate_trains_on_train_and_valid_and_reports_test(capsys, tmp_path: Path) -> None:
    tree = tmp_path / "tiny.tree"
    tree.write_text(TINY)
    # on the CPU where a GPU is present too (device auto would pick it): the threshold is the CPU's
    argv = ["evaluate", str(tree), "--dataset", "digits", "--epochs", "1", "--json", "--device", "cpu"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    metrics = json.loads(out.split("\n", 1)[1])
    assert metrics["test_accuracy"] > 0.5 and metrics["epochs"] == 1
    assert "training on train+valid for 1 epochs" in out


def test_evaluate_on_a_users_npz(capsys, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 40), ("valid", 10), ("test", 10)):
        arrays[f"{split}_x"] = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
        arrays[f"{split}_y"] = rng.integers(0, 3, size=n)
    np.savez(tmp_path / "mine.npz", **arrays)
    (tmp_path / "tiny.tree").write_text(TINY)
    code, out, err = run(
        capsys,
        "evaluate",
        str(tmp_path / "tiny.tree"),
        "--dataset",
        str(tmp_path / "mine.npz"),
        "--epochs",
        "1",
    )
    assert code == 0, err
    assert "mine: input 1x8x8, 3 classes" in out and "test accuracy" in out


def test_evaluate_errors_exit_2_without_traceback(capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "evaluate", "resnet18", "--dataset", "mnist")
    assert code == 2 and "no built-in dataset or path 'mnist'" in err and "Traceback" not in err
    code, _, err = run(capsys, "evaluate", "no_such_seed", "--dataset", "digits")
    assert code == 2 and "no seed or tree file 'no_such_seed'" in err
    (tmp_path / "tiny.tree").write_text(TINY)
    argv = ["evaluate", str(tmp_path / "tiny.tree"), "--dataset", "digits", "--lr", "1e9", "--device", "cpu"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "training loss became" in err


def test_evaluate_takes_the_recipe_from_an_experiment_file(capsys, tmp_path: Path) -> None:
    """The experiment's training settings are used (here a learning rate that diverges), and
    options on the command line override them."""
    (tmp_path / "tiny.tree").write_text(TINY)
    (tmp_path / "exp.yaml").write_text(
        "grammar: einspace\n"
        "input: {shape: [1, 8, 8]}\n"
        "evaluator: {name: training, settings: {dataset: digits, epochs: 8, batch_size: 64, lr: 1.0e+9,"
        " device: cpu}}\n"
        "strategy: {name: random_search}\n"
        "executor: {kind: in_process}\n"
    )
    tree, experiment = str(tmp_path / "tiny.tree"), str(tmp_path / "exp.yaml")
    code, _, err = run(capsys, "evaluate", tree, experiment, "--epochs", "1")
    assert code == 2 and "training loss became" in err and "learning rate 1000000000.0" in err
    code, out, err = run(capsys, "evaluate", tree, experiment, "--epochs", "1", "--lr", "0.04")
    assert code == 0, err
    assert "training on train+valid for 1 epochs" in out and "test accuracy" in out
