"""Fidelity 0 of the training evaluator: the untrained network, its head fitted in closed form;
and `head_init: fitted`, the same fit as the start of training."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from search_helpers import experiment
from test_head_pooling import LINEAR_CONV, order_task

from einspace import compile_network, load_grammar, parse_tree
from einspace.errors import EinspaceError
from einspace.evaluators.base import EvaluationFailed, Task, get_evaluator, run_task
from einspace.evaluators.head_fit import FIT_EXAMPLES, RIDGE, fit_head
from einspace.evaluators.objectives import Classification
from einspace.evaluators.training import TrainingSettings
from einspace.search.compute import summarise
from einspace.search.loop import SearchRun
from einspace.state import input_state

PAPER = load_grammar("einspace")
CONV_ACT = "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im)) (M (C leaky_relu)))"


def _rows(x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[index], y[index]


def _ridge_by_numpy(
    features: np.ndarray, labels: np.ndarray, classes: int, standardise: bool = False
) -> np.ndarray:
    """The ridge fit's predictions, solved as an augmented least-squares problem (another solver
    than the module's normal equations): centred (`standardise`: and scaled) features, centred
    one-hot targets."""
    mean, scale = features.mean(0), features.std(0) if standardise else 1.0
    z = (features - mean) / scale
    onehot = np.eye(classes)[labels]
    centre = onehot.mean(0)
    n, d = z.shape
    a = np.vstack([z, np.sqrt(RIDGE * n) * np.eye(d)])
    b = np.vstack([onehot - centre, np.zeros((d, classes))])
    weights = np.linalg.lstsq(a, b, rcond=None)[0]
    return z @ weights + centre


@pytest.mark.parametrize("standardise", [False, True])
@pytest.mark.parametrize(
    "pooling, axes, n", [("mean", (2, 3), 200), ("max", (2, 3), 200), ("mean", (2, 3), 9)]
)
def test_the_head_is_the_ridge_fit_of_the_pooled_features(
    pooling: str, axes: tuple, n: int, standardise: bool
) -> None:
    """Against numpy's least squares on the augmented system, on raw or standardised features; 9
    examples (fewer than the 16 features: solved through the 9 x 9 kernel) make the
    standardisation's divisor (n, not n - 1) visible."""
    torch.manual_seed(0)
    x, y = torch.randn(n, 3, 6, 6), torch.arange(n) % 4
    network = compile_network(parse_tree(CONV_ACT), input_state((3, 6, 6)), 4, PAPER, pooling=pooling)
    before = {k: v.clone() for k, v in network.backbone.state_dict().items()}
    order = torch.Generator().manual_seed(0)
    loss, accuracy = fit_head(network, (x, y), Classification(4), _rows, 64, order, standardise=standardise)
    with torch.no_grad():
        maps = network.backbone(x).double().numpy()
        logits = network(x).double().numpy()
    features = maps.mean(axes) if pooling == "mean" else maps.max(axes)
    np.testing.assert_allclose(logits, _ridge_by_numpy(features, y.numpy(), 4, standardise), atol=2e-4)
    assert accuracy == pytest.approx(float((logits.argmax(1) == y.numpy()).mean()))
    expected_loss = torch.nn.functional.cross_entropy(torch.from_numpy(logits), y).item()
    assert loss == pytest.approx(expected_loss, abs=1e-4)
    after = network.backbone.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the backbone stays untrained


@pytest.mark.parametrize("n, system", [(9, (9, 9)), (16, (16, 16)), (17, (16, 16)), (200, (16, 16))])
def test_the_system_solved_is_the_smaller_of_features_and_examples(
    monkeypatch, n: int, system: tuple
) -> None:
    """16 features: 9 examples solve a 9 x 9 system, 17 or more the 16 x 16 one (a network with
    tens of thousands of channels in its head failed for want of gigabytes of memory)."""
    solved = []
    solve = torch.linalg.solve
    monkeypatch.setattr(torch.linalg, "solve", lambda a, b: solved.append(tuple(a.shape)) or solve(a, b))
    torch.manual_seed(0)
    x, y = torch.randn(n, 3, 6, 6), torch.arange(n) % 4
    network = compile_network(parse_tree(CONV_ACT), input_state((3, 6, 6)), 4, PAPER)
    fit_head(network, (x, y), Classification(4), _rows, 64, torch.Generator().manual_seed(0))
    assert solved == [system]


def test_raw_features_of_a_tiny_spread_are_shrunk_away_and_standardised_ones_are_not() -> None:
    """The backbone's features scaled by 1e-4: standardised, the fit scores as unscaled (the head
    undoes the scale); raw, the ridge penalty shrinks the head to the class frequencies, as SGD
    from a random head barely moves on such features."""

    class Times(torch.nn.Module):
        def __init__(self, factor: float):
            super().__init__()
            self.factor = factor

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.factor * x

    torch.manual_seed(0)
    x, y = torch.randn(200, 3, 6, 6), torch.arange(200) % 4
    torch.manual_seed(1)
    network = compile_network(parse_tree(CONV_ACT), input_state((3, 6, 6)), 4, PAPER)
    backbone, accuracy = network.backbone, {}
    for factor in (1.0, 1e-4):
        network.backbone = torch.nn.Sequential(backbone, Times(factor))
        for standardise in (False, True):
            order = torch.Generator().manual_seed(0)
            _, accuracy[factor, standardise] = fit_head(
                network, (x, y), Classification(4), _rows, 64, order, standardise=standardise
            )
    assert accuracy[1.0, True] == accuracy[1e-4, True] > 0.4
    assert accuracy[1.0, False] > 0.35 and accuracy[1e-4, False] <= 0.3, accuracy
    assert network.head.linear.weight.abs().max() > 1e3  # the standardised fit undid the scale


def test_the_fit_uses_a_seeded_sample_of_fit_examples() -> None:
    """More examples than FIT_EXAMPLES: the head is fitted on a sample that the generator picks,
    so two generators of one seed give one head, and another seed another."""
    torch.manual_seed(0)
    x, y = torch.randn(FIT_EXAMPLES + 300, 3, 4, 4), torch.randint(0, 3, (FIT_EXAMPLES + 300,))

    def head(seed: int) -> torch.Tensor:
        torch.manual_seed(1)
        network = compile_network(parse_tree(CONV_ACT), input_state((3, 4, 4)), 3, PAPER)
        fit_head(network, (x, y), Classification(3), _rows, 256, torch.Generator().manual_seed(seed))
        return network.head.linear.weight.detach().clone()

    assert torch.equal(head(0), head(0)) and not torch.equal(head(0), head(5))


def test_the_fit_uses_the_first_examples_rows_of_the_generators_order() -> None:
    """`examples` 50 of 120 rows: the head is the fit of exactly the rows the generator's
    permutation puts first, the same head as a fit given only those rows."""
    torch.manual_seed(0)
    x, y = torch.randn(120, 3, 4, 4), torch.arange(120) % 3

    def head(data: tuple[torch.Tensor, torch.Tensor], examples: int) -> torch.Tensor:
        torch.manual_seed(1)
        network = compile_network(parse_tree(CONV_ACT), input_state((3, 4, 4)), 3, PAPER)
        order = torch.Generator().manual_seed(7)
        fit_head(network, data, Classification(3), _rows, 32, order, examples=examples)
        return network.head.linear.weight.detach().clone()

    rows = torch.randperm(120, generator=torch.Generator().manual_seed(7))[:50]
    sampled = head((x, y), 50)
    torch.testing.assert_close(sampled, head((x[rows], y[rows]), 50), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(sampled, head((x, y), 51))


def test_a_class_missing_from_the_sample_gets_a_head_row_too() -> None:
    """Labels 0 and 1 only, of 4 classes: the head keeps its 4 outputs, the absent classes'
    rows fitted to 0, so they are never predicted."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 3, 4, 4), torch.arange(40) % 2
    network = compile_network(parse_tree(CONV_ACT), input_state((3, 4, 4)), 4, PAPER)
    fit_head(network, (x, y), Classification(4), _rows, 16, torch.Generator())
    assert network.head.linear.weight.shape == (4, 16)
    assert torch.all(network.head.linear.weight[2:] == 0) and torch.all(network.head.linear.bias[2:] == 0)
    with torch.no_grad():
        assert set(network(x).argmax(1).tolist()) <= {0, 1}


def test_features_that_are_not_finite_or_another_head_fail_with_a_reason() -> None:
    network = compile_network(parse_tree(CONV_ACT), input_state((3, 4, 4)), 3, PAPER)
    x, y = torch.full((10, 3, 4, 4), float("inf")), torch.zeros(10, dtype=torch.long)
    with pytest.raises(EvaluationFailed, match="^the untrained network's features are not finite: no head"):
        fit_head(network, (x, y), Classification(3), _rows, 8, torch.Generator())
    network.head = torch.nn.Flatten()
    with pytest.raises(
        EvaluationFailed,
        match="^fitting the head in closed form needs the classification head, and this network has Flatten$",
    ):
        fit_head(network, (x, y), Classification(3), _rows, 8, torch.Generator())


def test_0_epochs_scores_the_untrained_network_with_its_fitted_head(tmp_path: Path) -> None:
    """Through the evaluator: no step trained, the validation accuracy of the fitted network as
    the fitness. On a task whose classes differ only in order, a linear convolution pooled by the
    mean is blind at once (chance), a convolution and a rectifier pooled by the max is not."""
    settings = {"dataset": order_task(tmp_path / "order.npz"), "epochs": 0, "threads": 1, "device": "cpu"}
    scores = {}
    for tree, pooling in ((LINEAR_CONV, "mean"), (CONV_ACT, "max")):
        task = Task(tree, "einspace", (2, 1, 24), "training", {**settings, "head_pooling": pooling})
        result = run_task(task)
        assert result.ok, result.error
        assert result.cost.epochs == 0 and result.cost.steps == 0
        assert result.fitness == result.metrics["valid_accuracy"]
        assert run_task(task).fitness == result.fitness  # seeded: the same again
        scores[pooling] = result.fitness
    assert scores["mean"] < 0.65 and scores["max"] > 0.9, scores


def _regression(folder: Path) -> str:
    """A small dense-target dataset (1x4x4 in and out)."""
    rng = np.random.default_rng(0)
    arrays = {f"{s}_x": rng.normal(size=(8, 1, 4, 4)).astype(np.float32) for s in ("train", "valid", "test")}
    arrays |= {f"{s}_y": 2 * arrays[f"{s}_x"] for s in ("train", "valid", "test")}
    np.savez(folder / "dense.npz", **arrays)
    return str(folder / "dense.npz")


def test_epochs_below_0_and_0_epochs_on_regression_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EinspaceError, match="setting epochs must be an integer >= 0, got -1"):
        TrainingSettings(epochs=-1)
    evaluator = get_evaluator("training", {"dataset": _regression(tmp_path), "epochs": 0})
    with pytest.raises(EinspaceError, match="epochs: 0 epochs .* needs a classification dataset"):
        evaluator.check(input_state((1, 4, 4)))
    trained = get_evaluator("training", {"dataset": _regression(tmp_path)})
    assert "needs a classification dataset" in trained.fidelity_problem(0)
    assert trained.fidelity_problem(1) is None
    assert "has no fidelity 0" in get_evaluator("naswot").fidelity_problem(0)


def test_a_search_looks_at_every_architecture_untrained_first(tmp_path: Path) -> None:
    """`min_fidelity: 0`: rungs 0, 1, 2 epochs. New architectures are scored untrained; a promotion
    from 0 trains from scratch, one from 1 goes on from the saved state, and the report counts only
    the latter as promotions that could continue."""
    settings = {"dataset": "digits", "batch_size": 64, "threads": 1, "device": "cpu", "epochs": 2}
    e = experiment(
        tmp_path,
        input={"shape": [1, 8, 8]},
        limits={"max_depth": 10, "max_nodes": 40, "max_params": 20000},
        evaluator={"name": "training", "settings": settings},
        strategy={"name": "random_search", "settings": {"evaluations": 12}},
        multi_fidelity={"scheduler": "successive_halving", "eta": 3, "min_fidelity": 0},
    )
    assert e.multi_fidelity.rungs == (0, 1, 2)
    with SearchRun.start(e) as run:
        assert run.run(e.make_executor()).finished
        history = run.store.history()
    by_id = {r.id: r for r in history}
    new = [r for r in history if r.origin != "promotion" and r.status == "ok"]
    assert len(new) >= 10 and all(r.fidelity == 0 and r.cost["epochs"] == 0 for r in new)
    promoted = [r for r in history if r.origin == "promotion" and r.status == "ok"]
    from_0 = [r for r in promoted if by_id[r.parents[0]].fidelity == 0]
    from_1 = [r for r in promoted if by_id[r.parents[0]].fidelity == 1]
    assert from_0 and from_1
    assert all(r.fidelity == 1 and r.cost["epochs"] == 1 for r in from_0)
    assert all(r.metrics["continued_from_epoch"] == 1 and r.cost["epochs"] == 1 for r in from_1)
    summary = summarise(history)
    assert summary.promoted == len(promoted) and summary.resumable == summary.continued == len(from_1)


NORMED = "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im)) (M (C norm)))"


def test_in_training_mode_the_fit_sees_batch_statistics_and_leaves_the_running_ones() -> None:
    """`training`: the head is the ridge fit of the features that training computes (batch norm on
    the batch's statistics, one batch here), not of eval mode's; the running statistics stay."""
    torch.manual_seed(0)
    x, y = 3 * torch.randn(120, 3, 6, 6) + 1, torch.arange(120) % 4
    fitted = {}
    for training in (False, True):
        torch.manual_seed(1)
        network = compile_network(parse_tree(NORMED), input_state((3, 6, 6)), 4, PAPER)
        buffers = {k: v.clone() for k, v in network.named_buffers()}
        assert buffers  # the network has batch norm
        fit_head(
            network, (x, y), Classification(4), _rows, 128, torch.Generator(), training, standardise=True
        )
        assert all(torch.equal(buffers[k], v) for k, v in network.named_buffers())
        with torch.no_grad():
            probe = copy.deepcopy(network).train(training)
            features = probe.head.features(probe.backbone(x)).double().numpy()
            logits = network.head.linear(torch.from_numpy(features).float()).double().numpy()
        np.testing.assert_allclose(logits, _ridge_by_numpy(features, y.numpy(), 4, True), atol=2e-4)
        fitted[training] = network.head.linear.weight.detach().clone()
    assert not torch.allclose(fitted[False], fitted[True])


def test_head_init_fitted_starts_training_from_the_fitted_head(tmp_path: Path) -> None:
    """One epoch of SGD on the order task (max head): from the fitted head the network is right
    at once, from the random one it is still near chance; anything else is refused."""
    settings = {"dataset": order_task(tmp_path / "order.npz"), "epochs": 1, "batch_size": 50}
    settings |= {"threads": 1, "device": "cpu", "head_pooling": "max"}
    scores = {}
    for init in ("random", "fitted"):
        result = run_task(Task(CONV_ACT, "einspace", (2, 1, 24), "training", {**settings, "head_init": init}))
        assert result.ok, result.error
        scores[init] = result.fitness
    assert scores["random"] < 0.7 and scores["fitted"] > 0.9, scores
    with pytest.raises(EinspaceError, match="setting head_init must be one of random, fitted, got 'probe'"):
        TrainingSettings(head_init="probe")


def test_head_init_fitted_fits_once_on_the_features_training_sees(tmp_path: Path, monkeypatch) -> None:
    """The evaluator's fit for the start of training is in training mode (batch norm on batch
    statistics; eval mode is the identity at initialisation), at the training batch size, once,
    on standardised features, on FIT_EXAMPLES rows whatever `look_examples` says. The look at 0
    epochs scores what the training rungs start from: raw features with the random head,
    standardised ones with the fitted head; it fits on `look_examples` rows."""
    import einspace.evaluators.training as training

    calls = []

    def recording(*args, **kwargs):
        bound = inspect.signature(fit_head).bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append(tuple(bound.arguments[k] for k in ("batch_size", "training", "standardise", "examples")))
        return fit_head(*args, **kwargs)

    monkeypatch.setattr(training, "fit_head", recording)
    settings = {"dataset": order_task(tmp_path / "order.npz"), "epochs": 1, "batch_size": 50}
    settings |= {"threads": 1, "device": "cpu", "head_init": "fitted", "look_examples": 16}
    assert run_task(Task(CONV_ACT, "einspace", (2, 1, 24), "training", settings)).ok
    assert calls == [(50, True, True, FIT_EXAMPLES)]
    calls.clear()
    assert run_task(
        Task(CONV_ACT, "einspace", (2, 1, 24), "training", {**settings, "head_init": "random"})
    ).ok
    assert calls == []
    for init, standardised in (("random", False), ("fitted", True)):
        look = {**settings, "epochs": 0, "eval_batch_size": 64, "head_init": init}
        assert run_task(Task(CONV_ACT, "einspace", (2, 1, 24), "training", look)).ok
        assert calls.pop() == (64, False, standardised, 16)


@pytest.mark.parametrize("bad", [1, 0, True, 512.0, "512"])
def test_look_examples_must_be_an_integer_of_at_least_2(bad: object) -> None:
    """A ridge fit of one example has no spread to standardise by: 2 is the least."""
    with pytest.raises(EinspaceError, match=f"setting look_examples must be an integer >= 2, got {bad!r}"):
        TrainingSettings(look_examples=bad)
    assert TrainingSettings(look_examples=2).look_examples == 2


def test_head_init_fitted_on_regression_is_refused_before_the_search(tmp_path: Path) -> None:
    evaluator = get_evaluator("training", {"dataset": _regression(tmp_path), "head_init": "fitted"})
    with pytest.raises(EinspaceError, match="head_init: head_init fitted .* needs a classification dataset"):
        evaluator.check(input_state((1, 4, 4)))
    get_evaluator("training", {"dataset": _regression(tmp_path)}).check(input_state((1, 4, 4)))


def test_einspace_evaluate_takes_head_init(tmp_path: Path, capsys) -> None:
    from einspace.cli import main

    (tmp_path / "conv.tree").write_text(CONV_ACT + "\n")
    dataset = order_task(tmp_path / "order.npz")
    base = ["evaluate", str(tmp_path / "conv.tree"), "--dataset", dataset, "--epochs", "1", "--json"]
    base += ["--batch-size", "50", "--device", "cpu", "--head-pooling", "max"]
    scores = {}
    for init in ("random", "fitted"):
        assert main([*base, "--head-init", init]) == 0
        scores[init] = json.loads(capsys.readouterr().out.split("\n", 1)[1])["test_accuracy"]
    assert scores["random"] < 0.7 and scores["fitted"] > 0.9, scores
