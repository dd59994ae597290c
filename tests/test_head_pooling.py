"""The head's pooling (`head_pooling`): the paper's mean, or the max over positions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einspace import compile_network, load_grammar, parse_tree
from einspace.errors import EinspaceError
from einspace.evaluators.base import Task, run_task
from einspace.evaluators.objectives import DENSE_POOLINGS, DenseHead
from einspace.evaluators.training import TrainingSettings
from einspace.network.compiler import HEAD_POOLINGS, ClassificationHead
from einspace.network.export import export_tree
from einspace.network.importer import import_model
from einspace.state import input_state

PAPER = load_grammar("einspace")
#: A convolution without a nonlinearity: with the mean head the whole network is linear in the
#: sum of the input's windows, which is the same for every order of the same parts.
LINEAR_CONV = "(S (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"


@pytest.mark.parametrize(
    "tree, shape, axes",
    [(LINEAR_CONV, (2, 5, 7), (2, 3)), ("(S (M (C linear(d=16))) (M (C identity)))", (6, 4), (1,))],
    ids=["im", "col"],
)
@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_the_head_pools_the_positions_as_asked(tree: str, shape: tuple, axes: tuple, pooling: str) -> None:
    network = compile_network(parse_tree(tree), input_state(shape), 3, PAPER, pooling=pooling)
    x = torch.randn(4, *shape)
    features = network.backbone(x)
    pooled = features.mean(axes) if pooling == "mean" else features.max(axes[-1]).values
    if pooling == "max" and len(axes) == 2:
        pooled = pooled.max(-1).values
    expected = pooled @ network.head.linear.weight.T + network.head.linear.bias
    torch.testing.assert_close(network(x), expected)


def test_the_default_is_the_papers_mean() -> None:
    network = compile_network(parse_tree(LINEAR_CONV), input_state((2, 5, 7)), 3, PAPER)
    assert network.head.pooling == "mean"
    assert TrainingSettings().head_pooling == "mean"


def test_a_pooling_that_does_not_exist_is_refused_before_building() -> None:
    message = "head pooling must be one of mean, max, got 'median'"
    with pytest.raises(EinspaceError, match=message):
        compile_network(parse_tree(LINEAR_CONV), input_state((2, 5, 7)), 3, PAPER, pooling="median")
    with pytest.raises(EinspaceError, match=message):
        ClassificationHead(input_state((2, 5, 7)), 3, "median")
    with pytest.raises(EinspaceError, match=message):
        DenseHead(input_state((2, 5, 7)), (1, 4, 4), "median")
    with pytest.raises(EinspaceError, match="setting head_pooling must be one of mean, max, got 'avg'"):
        TrainingSettings(head_pooling="avg")


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_the_dense_head_pools_as_asked(pooling: str) -> None:
    head = DenseHead(input_state((3, 8, 8)), (2, 4, 4), pooling)
    x = torch.randn(2, 3, 8, 8)
    assert DENSE_POOLINGS.keys() == HEAD_POOLINGS.keys()  # every classification pooling has its dense one
    pool = F.adaptive_avg_pool2d if pooling == "mean" else F.adaptive_max_pool2d
    expected = torch.einsum("bchw,oc->bohw", pool(x, (4, 4)), head.linear.weight)
    torch.testing.assert_close(head(x), expected + head.linear.bias[:, None, None])


@pytest.mark.parametrize("shape", [(2, 5, 7), (6, 4)], ids=["im", "col"])
def test_an_exported_max_head_computes_what_the_network_does(shape: tuple) -> None:
    tree = LINEAR_CONV if len(shape) == 3 else "(S (M (C linear(d=16))) (M (C identity)))"
    network = compile_network(parse_tree(tree), input_state(shape), 3, PAPER, pooling="max")
    exported = export_tree(parse_tree(tree), input_state(shape), grammar=PAPER, name="Net", network=network)
    assert ".amax(" in exported.source and ".mean(" not in exported.source
    namespace: dict = {}
    exec(compile(exported.source, "net.py", "exec"), namespace)
    model = namespace["Net"]()
    model.load_state_dict(exported.state_dicts["Net"])
    x = torch.randn(3, *shape)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), network.eval()(x))


def order_task(path: Path, seed: int = 0) -> str:
    """Two classes of 1x24 sequences of 2 channels: part a then part b, or b then a, at a random
    position on weak noise. Both classes hold the same values; only their order differs."""
    rng = np.random.default_rng(seed)
    a, b = np.array([1.0, -1.0]), np.array([-1.0, 1.0])
    n = 600
    y = rng.integers(0, 2, n)
    x = rng.normal(scale=0.1, size=(n, 2, 1, 24)).astype(np.float32)
    for i, start in enumerate(rng.integers(0, 22, n)):
        first, second = (a, b) if y[i] == 0 else (b, a)
        x[i, :, 0, start] += first
        x[i, :, 0, start + 1] += second
    parts = {"train": slice(0, 400), "valid": slice(400, 500), "test": slice(500, 600)}
    np.savez(path, **{f"{k}_{v}": arr[s] for k, s in parts.items() for v, arr in (("x", x), ("y", y))})
    return str(path)


def test_a_max_head_learns_an_order_that_the_mean_head_cannot_see(tmp_path: Path) -> None:
    """The reason for the setting: a linear convolution pooled by the mean is blind to the order
    of the parts (chance), pooled by the max it tells them apart."""
    settings = {"dataset": order_task(tmp_path / "order.npz"), "epochs": 15, "batch_size": 50}
    settings |= {"optimizer": "adam", "lr": 0.01, "threads": 1, "device": "cpu"}
    scores = {}
    for pooling in ("mean", "max"):
        task = Task(LINEAR_CONV, "einspace", (2, 1, 24), "training", {**settings, "head_pooling": pooling})
        result = run_task(task)
        assert result.ok, result.error
        scores[pooling] = result.fitness
    assert scores["mean"] < 0.65 and scores["max"] > 0.95, scores


#: A max head written three ways: the tensor method, the functional pooling, the pooling module.
MAX_HEADS = {
    "amax": lambda: lambda x: x.amax((2, 3)),
    "adaptive_max_pool2d": lambda: lambda x: F.adaptive_max_pool2d(x, 1).flatten(1),
    "AdaptiveMaxPool2d": lambda: nn.Sequential(nn.AdaptiveMaxPool2d(1), nn.Flatten()),
}


class _MaxHeadConv(nn.Module):
    """A convolution, then a max head written as `MAX_HEADS[pool]`."""

    def __init__(self, pool: str):
        super().__init__()
        self.conv, self.fc, self.pool = nn.Conv2d(2, 16, 3, padding=1), nn.Linear(16, 3), MAX_HEADS[pool]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(F.leaky_relu(self.conv(x), 0.01)))


@pytest.mark.parametrize("pool", list(MAX_HEADS))
def test_a_model_with_a_max_head_imports_with_that_pooling(pool: str) -> None:
    model = _MaxHeadConv(pool).eval()
    imported = import_model(model, input_state((2, 5, 6)))
    assert (imported.classes, imported.pooling) == (3, "max")
    assert "head_pooling max" in imported.tree_file("test")
    x = torch.randn(4, 2, 5, 6)
    with torch.no_grad():
        torch.testing.assert_close(imported.network(PAPER).eval()(x), model(x))


def test_an_exported_max_head_network_imports_back_to_the_same_function(tmp_path: Path) -> None:
    shape = (2, 5, 7)
    network = compile_network(parse_tree(LINEAR_CONV), input_state(shape), 3, PAPER, pooling="max").eval()
    exported = export_tree(
        parse_tree(LINEAR_CONV), input_state(shape), grammar=PAPER, name="Net", network=network
    )
    namespace: dict = {}
    exec(compile(exported.source, "net.py", "exec"), namespace)
    model = namespace["Net"]()
    model.load_state_dict(exported.state_dicts["Net"])
    imported = import_model(model.eval(), input_state(shape))
    assert imported.pooling == "max"
    x = torch.randn(3, *shape)
    with torch.no_grad():
        torch.testing.assert_close(imported.network(PAPER).eval()(x), network(x))


def test_einspace_evaluate_retrains_with_the_head_pooling_asked_for(tmp_path: Path, capsys) -> None:
    from einspace.cli import main

    (tmp_path / "conv.tree").write_text(LINEAR_CONV + "\n")
    dataset = order_task(tmp_path / "order.npz")
    base = ["evaluate", str(tmp_path / "conv.tree"), "--dataset", dataset, "--epochs", "15", "--json"]
    base += ["--batch-size", "50", "--device", "cpu"]
    scores = {}
    for pooling in ("mean", "max"):
        assert main([*base, "--lr", "0.1", "--head-pooling", pooling]) == 0
        scores[pooling] = json.loads(capsys.readouterr().out.split("\n", 1)[1])["test_accuracy"]
    assert scores["mean"] < 0.65 and scores["max"] > 0.95, scores
    assert main([*base, "--head-pooling", "median"]) == 2
    assert "setting head_pooling must be one of mean, max, got 'median'" in capsys.readouterr().err


def test_einspace_export_writes_the_head_pooling_asked_for(tmp_path: Path, capsys) -> None:
    from einspace.cli import main

    (tmp_path / "conv.tree").write_text(LINEAR_CONV + "\n")
    base = ["export", str(tmp_path / "conv.tree"), "--input", "2,5,7", "--classes", "3"]
    assert main([*base, "--out", str(tmp_path / "max.py"), "--head-pooling", "max"]) == 0
    assert main([*base, "--out", str(tmp_path / "mean.py")]) == 0
    assert ".amax((2, 3))" in (tmp_path / "max.py").read_text()
    assert ".mean((2, 3))" in (tmp_path / "mean.py").read_text()
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "bad.py"), "--head-pooling", "median"]) == 2
    assert "head pooling must be one of mean, max, got 'median'" in capsys.readouterr().err
    assert not (tmp_path / "bad.py").exists()
