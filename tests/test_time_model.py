"""Training time prediction and the time budget: calibration, refusal before training, projection
after a few steps, partial results, and the progress every run reports."""

from __future__ import annotations

import dataclasses
import math
import re
import time
import warnings

import pytest
import torch
from torch import nn

import einspace as es
from einspace.evaluators import time_budget, time_model
from einspace.evaluators.base import Task, run_task
from einspace.evaluators.objectives import Classification
from einspace.evaluators.time_model import TimeModel, Workload, calibrate, calibrated

#: conv3x3 (16) - batch norm - leaky ReLU - a fully connected layer over the whole 8x8 map.
TINY = (
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"
    " (M (M (C norm)) (M (M (C leaky_relu))"
    " (M (R1 im2col(k=8, s=8, p=0)) (M (C linear(d=32))) (R2 col2im)))))"
)
#: Two branches of 3x3 convolutions, added: more operations and FLOPs than TINY.
BRANCH = "(M (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=32))) (R2 col2im)) (M (C leaky_relu)))"
BRANCHED = f"(S (B clone(b=2)) (Branches [{BRANCH} {BRANCH}]) (A add))"
#: One epoch of 16 steps (512 digits in batches of 32) on one CPU thread; validation on 350.
QUICK = {"epochs": 1, "batch_size": 32, "train_subset": 512, "threads": 1, "device": "cpu"}
STEPS = 16
CPU = torch.device("cpu")


def _task(settings: dict | None = None, tree: str = TINY) -> Task:
    return Task(tree, "einspace", (1, 8, 8), "training", {**QUICK, **(settings or {})})


def _model(step: float, validation: float = 0.0, overhead: float = 0.0) -> TimeModel:
    """A time model whose every step takes `step` seconds, whatever the tree."""
    return TimeModel((step, 0.0, 0.0, 0.0), (validation, 0.0, 0.0, 0.0), overhead)


class _Sleepy(nn.Module):
    """A network whose forward passes from call `after` + 1 on sleep `seconds` (a slow network, or
    a machine that slows down part-way through training) or raise `error`."""

    def __init__(self, seconds: float, after: int = 0, error: Exception | None = None):
        super().__init__()
        self.linear = nn.Linear(64, 10)
        self.seconds, self.after, self.error, self.calls = seconds, after, error, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after:
            if self.error is not None:
                raise self.error
            time.sleep(self.seconds)
        return self.linear(x.flatten(1))


def _uses(monkeypatch: pytest.MonkeyPatch, model: TimeModel | None) -> None:
    """Make the training evaluator predict with `model` (None: as if calibration had failed)."""
    monkeypatch.setattr(time_budget, "calibrated", lambda *args: model)


def _builds(monkeypatch: pytest.MonkeyPatch, network: nn.Module) -> None:
    monkeypatch.setattr(Classification, "build", lambda *args, **kwargs: network)


def test_calibration_gives_usable_coefficients_and_predictions_grow_with_each_count() -> None:
    model = calibrated(CPU, None, threads=1)
    assert model is not None and calibrated(CPU, None, threads=1) is model  # once per process
    numbers = (*model.train, *model.forward, model.overhead_seconds)
    assert all(math.isfinite(c) and c >= 0 for c in numbers), numbers
    assert model.train[2] > 0 and model.forward[2] > 0  # per FLOP, on a CPU
    base = Workload(ops=10, flops=100_000, values=10_000)
    step = model.step_seconds(base, 32)
    assert step > 0
    for more in (Workload(20, 100_000, 10_000), Workload(10, 200_000, 10_000), Workload(10, 100_000, 20_000)):
        assert model.step_seconds(more, 32) >= step
    assert model.step_seconds(Workload(10, 10_000_000, 10_000), 32) > step  # FLOPs alone
    assert model.step_seconds(base, 64) > step
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        started = time.process_time()
        calibrate(CPU)
        assert time.process_time() - started < 5  # 0.2 s warm on one thread; generous for busy machines
    finally:
        torch.set_num_threads(threads)


def test_the_workload_counts_operations_flops_and_activations_of_a_tree() -> None:
    grammar, x = es.load_grammar("einspace"), es.input_state((1, 8, 8))
    checked = es.check_tree(es.parse_tree(BRANCHED), grammar, x)
    work = Workload.of(checked, classes=10)
    # per branch im2col, linear, col2im, leaky ReLU; the add; clone is not counted (a view)
    assert work.ops == 2 * 4 + 1
    assert work.flops > checked.flops == Workload.of(checked, None).flops
    assert work.values == 64 + 2 * (9 * 64 + 32 * 64 + 32 * 64 + 32 * 64) + 32 * 64


@pytest.mark.parametrize("tree", [TINY, BRANCHED], ids=["tiny", "branched"])
def test_prediction_is_within_a_factor_of_a_measured_run(tree: str) -> None:
    """Generous bounds: the model has three counts and a shared, noisy machine times the run. A
    load only ever slows a run (one under parallel tests took 8x the prediction), so the faster
    of two runs is compared."""
    runs = [run_task(_task({"epochs": 2, "max_seconds": 1e6}, tree)) for _ in range(2)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    predicted = runs[0].metrics["predicted_seconds"]
    measured = min(r.metrics["seconds"] for r in runs)
    assert measured / 6 < predicted < measured * 6, (predicted, measured)


@pytest.mark.parametrize(
    "max_seconds, margin, refused",
    [(2.0, 2.5, True), (7.0, 2.5, False), (2.0, 10.0, False), (5.0, 3.0, True), (6.0, 3.0, False)],
)
def test_trees_predicted_beyond_the_margin_are_refused_before_they_are_built(
    monkeypatch: pytest.MonkeyPatch, max_seconds: float, margin: float, refused: bool
) -> None:
    """16 steps of 1 s, 0.5 s validation, 0.1 s set-up: 16.6 s predicted."""
    _uses(monkeypatch, _model(1.0, 0.5, 0.1))
    if refused:
        _builds(monkeypatch, None)  # building would crash the evaluation
    result = run_task(_task({"max_seconds": max_seconds, "predicted_time_margin": margin}))
    if not refused:
        assert result.ok, result.error
        assert result.metrics["predicted_seconds"] == pytest.approx(16.6)
        return
    assert not result.ok
    expected = (
        f"predicted 16.6 s of training (1 epochs x {STEPS} steps x 1 s/step + 0.5 s validation + 0.1 s "
        f"set-up) exceeds the time budget of {max_seconds:g} s (refused beyond {margin:g}x the budget)"
    )
    assert result.error == expected
    assert (result.cost.steps, result.cost.epochs, result.cost.gpu_seconds) == (0, 0.0, 0.0)


@pytest.mark.parametrize(
    "max_seconds, top, refused",
    [(10.0, 4, True), (10.0, 2, True), (10.9, 2, False), (10.0, 1, False), (10.0, None, False)],
)
def test_a_lower_rung_refuses_a_tree_that_could_never_train_at_the_top(
    monkeypatch: pytest.MonkeyPatch, max_seconds: float, top: int | None, refused: bool
) -> None:
    """1 epoch (a rung) is predicted at 16.6 s, within 3x the budget; the top rung's 2 epochs at
    32.6 s and 4 at 64.6 s, from scratch: beyond 3 x 10 s = 30 s, within 3 x 10.9 s = 32.7 s."""
    _uses(monkeypatch, _model(1.0, 0.5, 0.1))
    if refused:
        _builds(monkeypatch, None)  # building would crash the evaluation
    task = _task({"max_seconds": max_seconds, "epochs": 4})
    result = run_task(dataclasses.replace(task, fidelity=1, top_fidelity=top))
    if not refused:
        assert result.ok, result.error
        assert result.metrics["predicted_seconds"] == pytest.approx(16.6)
        return
    assert not result.ok and result.cost.steps == 0
    assert result.error.startswith(
        f"predicted {16 * top + 0.6:g} s of training ({top} epochs x {STEPS} steps"
    )
    assert result.error.endswith(
        f"exceeds the time budget of 10 s (refused beyond 3x the budget), so it could never train "
        f"at the top rung ({top} epochs)"
    )


@pytest.mark.parametrize("top", [0, 2, True, "4"])
def test_the_top_epochs_must_be_at_least_the_run_s(top: object) -> None:
    result = run_task(_task({"epochs": 3, "top_epochs": top}))
    assert not result.ok and "setting top_epochs must be null or an integer >= epochs (3)" in result.error


@pytest.mark.parametrize("forecast", [_model(1e-6), None], ids=["predicted-fast", "no-calibration"])
def test_a_run_projected_over_budget_stops_after_a_few_steps(
    monkeypatch: pytest.MonkeyPatch, forecast: TimeModel | None
) -> None:
    """A prediction that lets the tree through (or none at all): the measured steps, 50 ms each,
    project 16 x 50 ms = 0.8 s against a budget of 0.6 s."""
    _uses(monkeypatch, forecast)
    _builds(monkeypatch, _Sleepy(0.05))
    result = run_task(_task({"max_seconds": 0.6}))
    assert not result.ok
    steps = 1 + time_budget.PROJECTION_STEPS
    assert re.fullmatch(
        rf"projected \S+ s of training exceeds the time budget of 0.6 s: \S+ s for the first {steps} steps, "
        rf"then {STEPS - steps} steps x 0\.0[5-9]\d* s/step \(measured over 3\) \+ \S+ s validation",
        result.error,
    ), result.error
    assert result.cost.steps == steps and result.cost.epochs == steps / STEPS
    assert result.cost.wall_seconds < 0.6


def test_a_run_whose_budget_runs_out_is_scored_as_a_partial_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast while projected (6 steps), then 0.1 s a step: the 0.5 s budget runs out in the first
    epoch, and what was trained is scored."""
    _uses(monkeypatch, _model(1e-6))
    _builds(monkeypatch, _Sleepy(0.1, after=6))
    result = run_task(_task({"max_seconds": 0.5, "epochs": 3}))
    assert result.ok and result.partial, result.error
    steps = result.cost.steps
    assert 6 < steps < STEPS
    assert result.metrics["epochs"] == result.cost.epochs == steps / STEPS  # fractional
    assert result.metrics["steps"] == steps and "partial" not in result.metrics
    assert 0 <= result.fitness <= 1 and math.isfinite(result.metrics["train_loss"])


def test_a_failed_calibration_falls_back_to_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken(*args: object) -> TimeModel:
        calls.append(args)
        raise RuntimeError("no probe fits")

    monkeypatch.setattr(time_model, "calibrate", broken)
    monkeypatch.setattr(time_model, "_CALIBRATIONS", {})
    with pytest.warns(RuntimeWarning, match="no training time predictions on cpu: calibration failed"):
        result = run_task(_task({"max_seconds": 1e6}))
    assert result.ok and not result.partial, result.error
    assert "predicted_seconds" not in result.metrics
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_task(_task({"max_seconds": 1e6})).ok
    assert not [w for w in caught if "no training time predictions" in str(w.message)]  # warned once
    assert len(calls) == 1  # the failure is remembered, not retried


def test_every_run_reports_its_progress_and_run_task_its_cost() -> None:
    result = run_task(_task())
    assert result.ok and not result.partial, result.error
    metrics = result.metrics
    assert (metrics["epochs"], metrics["steps"], metrics["gpu_seconds"]) == (1.0, STEPS, 0.0)
    assert "partial" not in metrics and "predicted_seconds" not in metrics  # no budget: no prediction
    cost = result.cost
    assert (cost.epochs, cost.steps, cost.gpu_seconds) == (1.0, STEPS, 0.0)
    assert 0 < cost.wall_seconds and 0 < cost.cpu_seconds and cost.compute_seconds == cost.cpu_seconds


OUT_OF_MEMORY = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")


@pytest.mark.parametrize(
    "settings, network, reason, steps",
    [
        ({"lr": 1e9}, None, "training loss became", (1, STEPS)),
        ({}, _Sleepy(0.0, after=3, error=OUT_OF_MEMORY), "out of memory on cpu", (3, 3)),
    ],
    ids=["nan", "out-of-memory"],
)
def test_failures_during_training_report_how_far_they_got(
    monkeypatch: pytest.MonkeyPatch, settings: dict, network: nn.Module | None, reason: str, steps: tuple
) -> None:
    if network is not None:
        _builds(monkeypatch, network)
    result = run_task(_task(settings))
    assert not result.ok and reason in result.error, result.error
    assert steps[0] <= result.cost.steps <= steps[1]
    assert result.cost.epochs == result.cost.steps / STEPS
    assert result.cost.cpu_seconds > 0


@pytest.mark.parametrize("margin", [0.5, "2", True])
def test_the_margin_must_be_a_factor_of_at_least_one(margin: object) -> None:
    result = run_task(_task({"predicted_time_margin": margin}))
    assert not result.ok and "setting predicted_time_margin must be a number >= 1" in result.error


@pytest.mark.gpu
def test_a_gpu_worker_calibrates_in_its_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from einspace.evaluators import worker
    from einspace.evaluators._runtime import autocast_dtype

    monkeypatch.setattr(time_model, "_CALIBRATIONS", {})
    monkeypatch.setenv(worker.GPU_SHARE_ENV, "1.0")  # restored after the test
    worker.warm_up(1.0)
    cuda = torch.device("cuda")
    model = time_model._CALIBRATIONS[(str(cuda), torch.get_num_threads(), str(autocast_dtype(cuda, True)))]
    assert model is not None and all(math.isfinite(c) and c >= 0 for c in (*model.train, *model.forward))
    result = run_task(_task({"device": "cuda", "threads": None, "max_seconds": 1e6}))
    assert result.ok and result.metrics["gpu_seconds"] > 0 and result.cost.gpu_seconds > 0, result.error
    assert result.metrics["predicted_seconds"] > 0
