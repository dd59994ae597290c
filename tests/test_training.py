"""The training evaluator: learns on real data, is deterministic by seed, and turns failures into results."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

import einspace as es
from einspace.errors import EinspaceError
from einspace.evaluators.base import Task, get_evaluator, list_evaluators, run_task
from einspace.evaluators.objectives import Classification
from einspace.evaluators.optim import build_optimizer, parameter_groups
from einspace.evaluators.training import final_evaluation

#: conv3x3 (16) - batch norm - leaky ReLU - a fully connected layer over the whole 8x8 map.
TINY = (
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"
    " (M (M (C norm)) (M (M (C leaky_relu))"
    " (M (R1 im2col(k=8, s=8, p=0)) (M (C linear(d=32))) (R2 col2im)))))"
)
#: Quick settings: one epoch on 512 digits, one thread (stable timings when cores are shared), on
#: the CPU even where CUDA is present (the tests state CPU behaviour: bit-identical reruns).
QUICK = {"epochs": 1, "batch_size": 32, "train_subset": 512, "threads": 1, "device": "cpu"}


def _task(settings: dict | None = None, seed: int = 0, shape: tuple[int, ...] = (1, 8, 8), tree: str = TINY):
    return Task(tree, "einspace", shape, "training", {**QUICK, **(settings or {})}, random_seed=seed)


def test_one_epoch_beats_chance_and_is_deterministic_by_seed() -> None:
    first, again, other = run_task(_task()), run_task(_task()), run_task(_task(seed=1))
    assert first.ok, first.error
    assert first.fitness > 0.5  # chance is 0.1
    assert first.metrics["valid_accuracy"] == first.fitness
    assert {"train_loss", "valid_loss", "params", "flops", "seconds"} <= set(first.metrics)
    assert _stable(first.metrics) == _stable(again.metrics)
    assert other.metrics["train_loss"] != first.metrics["train_loss"]
    assert "training" in list_evaluators() and "naswot" in list_evaluators()


@pytest.mark.parametrize(
    "settings, task_changes, reason",
    [
        ({"lr": 1e9}, {}, "training loss became (nan|inf)"),
        ({"max_params": 1000}, {}, "over budget: .* network parameters exceed the budget of 1,000"),
        ({"max_flops": 10}, {}, "over budget: .* FLOPs"),
        ({"max_activation_mb": 0.01}, {}, "over budget: .* MiB of activations for a batch of 32"),
        ({"max_seconds": 1e-6}, {}, r"predicted .* 16 steps .* exceeds the time budget of 1e-06 s"),
        ({}, {"shape": (3, 8, 8)}, "does not match dataset 'digits'"),
        ({"dataset": "adddigits"}, {}, r"does not match dataset 'adddigits'.*3x8x8"),
        ({"epoch": 1}, {}, "unknown setting 'epoch' .*did you mean 'epochs'"),
        ({"schedule": "linear"}, {}, "setting schedule must be one of cosine, step, constant, got 'linear'"),
        ({"step_mode": "graphs"}, {}, "step_mode must be one of eager, cuda_graphs, compile"),
        ({"lr": "1.0e9"}, {}, r"setting lr must be a number >= 0, got '1.0e9' \(YAML reads"),
        (
            {"metric": "relative_l2"},
            {},
            "metric 'relative_l2' does not fit dataset 'digits', a classification",
        ),
        ({"param_groups": {"weights": {"lr_sclae": 1}}}, {}, "unknown option.*lr_scale"),
        ({"param_groups": {"weights": {"optimizer": "lion"}}}, {}, "unknown optimizer 'lion'.*adamw"),
        ({"param_groups": {"weights": {"lr": 0.1, "lr_scale": 2}}}, {}, "lr or lr_scale, not both"),
        ({"param_groups": {"weights": {"betas": [0.9]}}}, {}, "betas must be two numbers"),
        ({"auxiliary_losses": {"sparsity": -1}}, {}, "auxiliary_losses.sparsity: the weight must be"),
        ({"auxiliary_losses": {"nope": {"weight": 1}}}, {}, "no network loss of that name"),
        ({}, {"tree": "(S (M (C linear(d=16))) (M (C nope)))"}, "unknown operation"),
    ],
)
def test_failures_are_results_with_reasons(settings: dict, task_changes: dict, reason: str) -> None:
    result = run_task(_task(settings, **task_changes))
    assert not result.ok and result.fitness == -math.inf
    assert result.error is not None
    assert re.search(reason, result.error), result.error


def test_over_budget_trees_are_never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("compile_network called for an over-budget tree")

    monkeypatch.setattr("einspace.evaluators.objectives.compile_network", refuse)
    monkeypatch.setattr("einspace.evaluators.objectives.compile_backbone", refuse)
    result = run_task(_task({"max_params": 10}))
    assert not result.ok and "over budget" in result.error


PHASES = ("device", "build", "data", "capture", "first_step", "steps", "validation")


def test_phase_times_account_for_the_evaluation() -> None:
    """Where an evaluation's time goes: consecutive phases that together make up its time."""
    metrics = run_task(_task()).metrics
    times = [metrics[f"time/{phase}"] for phase in PHASES]
    assert all(t >= 0 for t in times)
    assert 0.9 * metrics["seconds"] <= sum(times) <= metrics["seconds"]
    assert metrics["time/steps"] > 0 and metrics["time/first_step"] > 0


def test_cuda_graphs_off_cuda_train_eagerly_with_the_same_results() -> None:
    eager, graphs = run_task(_task()), run_task(_task({"step_mode": "cuda_graphs"}))
    assert graphs.metrics.pop("step_mode_applied") == 0.0 and "step_mode_applied" not in eager.metrics
    assert _stable(graphs.metrics) == _stable(eager.metrics)


def _stable(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a rerun reproduces exactly on the CPU (not the times)."""
    return {k: v for k, v in metrics.items() if k != "seconds" and not k.startswith("time/")}


@pytest.mark.slow
def test_a_compiled_step_trains_like_the_eager_one() -> None:
    """torch.compile on the CPU (slow: inductor compiles C++); same network, same data order."""
    eager, compiled = run_task(_task()), run_task(_task({"step_mode": "compile"}))
    assert compiled.ok, compiled.error
    assert compiled.metrics["step_mode_applied"] == 1.0
    assert compiled.metrics["train_loss"] == pytest.approx(eager.metrics["train_loss"], rel=1e-3)


def test_channels_last_path_runs_on_cpu() -> None:
    """The memory-format path that CUDA takes by default, forced on CPU: same results."""
    plain, channels_last = run_task(_task()), run_task(_task({"channels_last": True}))
    assert channels_last.ok, channels_last.error
    assert channels_last.fitness == pytest.approx(plain.fitness, abs=0.02)


class _Exhausting(nn.Module):
    """Stands in for a network too large for the device: its forward pass fails to allocate."""

    def __init__(self, error: Exception):
        super().__init__()
        self.linear = nn.Linear(1, 1)
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
    ],
    ids=["cuda", "host"],
)
def test_out_of_memory_is_a_failed_result(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    monkeypatch.setattr(Classification, "build", lambda *a, **k: _Exhausting(error))
    result = run_task(_task())
    assert not result.ok and result.error.startswith("out of memory on cpu:"), result.error


def test_other_crashes_are_failed_results_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Classification, "build", lambda *a, **k: _Exhausting(RuntimeError("boom")))
    result = run_task(_task())
    assert not result.ok and result.error == "evaluator crashed: RuntimeError: boom"


def test_final_evaluation_reports_test_accuracy() -> None:
    settings = {"epochs": 1, "threads": 1, "device": "cpu"}  # QUICK's device: the threshold is the CPU's
    metrics = final_evaluation(es.parse_tree(TINY), "digits", "einspace", settings)
    assert metrics["test_accuracy"] > 0.5 and metrics["epochs"] == 1
    assert set(metrics) >= {"test_accuracy", "test_loss", "train_loss", "params"}


def test_schedules_and_step_decay() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    common = dict(lr=1.0, momentum=0.9, weight_decay=0.0, nesterov=False, gamma=0.1, milestones=(0.5, 0.75))
    cosine = build_optimizer(model, schedule="cosine", steps_per_epoch=10, epochs=1, **common)
    step = build_optimizer(model, schedule="step", steps_per_epoch=10, epochs=1, **common)
    lrs = {"cosine": [], "step": []}
    for name, optimizers in (("cosine", cosine), ("step", step)):
        for _ in range(10):
            lrs[name].append(optimizers.learning_rates()["weights"])
            optimizers.step()
            optimizers.schedule_step()
    assert lrs["cosine"][0] == 1.0 and lrs["cosine"][-1] < 0.05
    assert lrs["step"] == pytest.approx([1.0] * 5 + [0.1] * 3 + [0.01] * 2)


def test_parameter_groups_by_kind_and_overrides() -> None:
    """Weights, norm/bias, and a future architecture parameter that declares its own group."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    alpha = nn.Parameter(torch.zeros(3))
    alpha.einspace_group = "architecture"
    model.register_parameter("alpha", alpha)
    groups = parameter_groups(model)
    assert [len(groups[k]) for k in ("weights", "norm_bias", "architecture")] == [1, 3, 1]
    overrides = {"architecture": {"optimizer": "sgd", "lr_scale": 0.1, "warmup_epochs": 1}}
    optimizer = build_optimizer(
        model, lr=0.5, momentum=0.9, weight_decay=1e-3, nesterov=False, schedule="constant",
        milestones=(), gamma=0.1, steps_per_epoch=4, epochs=2, overrides=overrides,
    )  # fmt: skip
    by_name = {g["name"]: g for g in optimizer.param_groups}
    assert by_name["weights"]["weight_decay"] == 1e-3 and by_name["architecture"]["weight_decay"] == 0.0
    assert by_name["weights"]["lr"] == 0.5
    assert by_name["architecture"]["lr"] == pytest.approx(0.05 * 0.25)  # warm-up: step 1 of 4


def test_the_optimizer_setting_chooses_every_group_that_param_groups_leaves() -> None:
    """`optimizer: adam` moves weights and norm/bias parameters with Adam at the base lr (no
    momentum option reaches it); a group's own `optimizer` still wins, and architecture
    parameters keep their Adam default."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    alpha = nn.Parameter(torch.zeros(3))
    alpha.einspace_group = "architecture"
    model.register_parameter("alpha", alpha)
    common = dict(momentum=0.9, weight_decay=0.0, nesterov=False, schedule="constant", milestones=(),
                  gamma=0.1, steps_per_epoch=1, epochs=1)  # fmt: skip
    adam = build_optimizer(model, optimizer="adam", lr=0.003, **common)
    kinds = {g["name"]: type(o).__name__ for o in adam.optimizers for g in o.param_groups}
    assert kinds == {"weights": "Adam", "norm_bias": "Adam", "architecture": "Adam"}
    assert {g["name"]: g["lr"] for g in adam.param_groups} == {
        "weights": 0.003, "norm_bias": 0.003, "architecture": 0.001}  # fmt: skip
    sgd_norms = {"norm_bias": {"optimizer": "sgd"}}
    mixed = build_optimizer(model, optimizer="adam", lr=0.003, overrides=sgd_norms, **common)
    kinds = {g["name"]: type(o).__name__ for o in mixed.optimizers for g in o.param_groups}
    assert kinds == {"weights": "Adam", "norm_bias": "SGD", "architecture": "Adam"}
    plain = build_optimizer(model, lr=0.04, **common)
    assert {type(o).__name__ for o in plain.optimizers} == {"SGD", "Adam"}  # the default: SGD, paper's recipe
    # Adam takes one step of lr x sign(gradient) on a fresh parameter: not SGD's lr x gradient
    w = model[0].weight
    before = w.detach().clone()
    # (a weighted sum: a sum of squares after batch norm is nearly constant, only its eps makes it
    # depend on the weights, and gradients that small are scaled below lr by Adam's own eps)
    x, weights = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0))
    (model(x) * weights).sum().backward()
    adam.step()
    assert torch.allclose((before - w.detach()).abs(), torch.full_like(w, 0.003), rtol=1e-3)
    with pytest.raises(EinspaceError, match="setting optimizer must be one of sgd, adam, adamw, got 'adma'"):
        get_evaluator("training", {"optimizer": "adma"})


def test_settings_errors_name_the_setting() -> None:
    with pytest.raises(EinspaceError, match="setting epochs must be an integer >= 0, got -1"):
        get_evaluator("training", {"epochs": -1})
    with pytest.raises(EinspaceError, match="setting batch_size must be an integer >= 1, got 0"):
        get_evaluator("training", {"batch_size": 0})
    with pytest.raises(EinspaceError, match="unknown evaluator 'trainig'"):
        get_evaluator("trainig")


@pytest.mark.gpu
def test_training_on_gpu_with_mixed_precision() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    result = run_task(_task({"device": "cuda", "amp": True, "threads": None}))
    assert result.ok and result.fitness > 0.5, result.error


#: A batch size that leaves a short last batch (512 = 10 x 48 + 32): the eager fall-back path.
SHORT_LAST = {"batch_size": 48, "device": "cuda", "threads": None}


@pytest.mark.gpu
def test_cuda_graphs_train_like_the_eager_step() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    eager, graphs = run_task(_task(SHORT_LAST)), run_task(_task({**SHORT_LAST, "step_mode": "cuda_graphs"}))
    assert graphs.ok, graphs.error
    assert graphs.metrics["step_mode_applied"] == 1.0
    assert graphs.metrics["train_loss"] == pytest.approx(eager.metrics["train_loss"], rel=0.05)
    assert graphs.fitness == pytest.approx(eager.fitness, abs=0.05)


@pytest.mark.gpu
def test_data_stays_on_the_gpu_between_evaluations(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from einspace.evaluators import data_cache, worker

    data_cache.clear()
    monkeypatch.setattr(worker, "_resident", None)  # as in a fresh worker process
    first = run_task(_task(SHORT_LAST))
    held = data_cache.device_bytes()
    assert first.ok and held > 0
    assert run_task(_task(SHORT_LAST)).ok and data_cache.device_bytes() == held  # reused, not copied
    assert worker.after_evaluation(None) is None  # the first: what the process keeps
    assert run_task(_task(SHORT_LAST)).ok and worker.after_evaluation(None) is None  # nothing more
    leak = torch.empty(2 * worker.LEAK_BYTES, dtype=torch.uint8, device="cuda")
    assert "still allocated" in worker.after_evaluation(None)
    del leak
    data_cache.clear()
    monkeypatch.setenv(worker.GPU_SHARE_ENV, "1e-9")  # a share too small for the data: pinned host memory
    assert run_task(_task(SHORT_LAST)).ok and data_cache.device_bytes() == 0
