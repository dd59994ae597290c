"""The training evaluator: train a compiled tree with the paper's recipe; fitness = validation metric.

Defaults are the search row of the paper's Table 4 (SGD, momentum 0.9, 8 epochs, batch 256,
lr 0.04, weight decay 3e-4, App. B.1); `final_evaluation` retrains a chosen tree on
train+valid for 64 epochs and reports the test metric, as the paper does. The metric follows
from the dataset (einspace.evaluators.objectives): accuracy for class labels, relative ℓ2
(fitness = its negative) for dense regression targets.

Before anything is built the tree is checked against the budget from its analytic counts
(einspace.evaluators.budgets) and, with a `max_seconds` time budget, against its predicted
training time (einspace.evaluators.time_model); a few steps into training the run is projected
again from the measured step time. Expected failures (over budget, predicted or projected over
the time budget, out of memory, a NaN or infinite loss) raise EvaluationFailed with the reason
and how far training got, which `run_task` records as a failed Result. A run whose time budget
runs out anyway stops, is scored, and reports `partial` 1.0 and the epochs it trained.

Multi-fidelity search can ask a run to go on from a lower rung's saved state (a `Continuation`:
einspace.evaluators.continuation): its schedule is then the top rung's, and it trains only the
epochs after the saved ones.

Determinism: the same random_seed gives bit-identical results on CPU with the same torch
version and thread count (initialisation and batch order come from seeded generators). On a
GPU, cuDNN algorithm choice and atomic adds make runs differ in the last bits unless
`deterministic: true` (slower; torch.use_deterministic_algorithms with warn_only).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from einspace.checker import CheckedTree, check_tree
from einspace.errors import EinspaceError
from einspace.evaluators._runtime import STEP_MODES, Runtime, autocast_dtype, out_of_memory, resolve_device
from einspace.evaluators._settings import require, settings_from
from einspace.evaluators.auxiliary import AuxiliaryObjective, check_auxiliary_settings
from einspace.evaluators.base import Continuation, EvaluationFailed, Evaluator, register_evaluator
from einspace.evaluators.budgets import Budget, activation_bytes, budget_violation
from einspace.evaluators.continuation import Resumption
from einspace.evaluators.datasets import Dataset, load_dataset
from einspace.evaluators.objectives import Objective, objective_for
from einspace.evaluators.optim import build_optimizer, check_param_groups
from einspace.evaluators.time_model import Forecast, Workload, calibrated
from einspace.grammar.model import Grammar
from einspace.network.memory import require_memory
from einspace.ops.trainable import architecture_metrics, constrain_architecture
from einspace.state import FeatureState
from einspace.tree import Node, content_hash

__all__ = ["FINAL_EPOCHS", "TrainingEvaluator", "TrainingSettings", "final_evaluation", "train_and_test"]

#: Epochs of the final evaluation (paper Table 4, "Epochs (eval)").
FINAL_EPOCHS = 64


@dataclass(frozen=True)
class TrainingSettings:
    """Everything a training run reads; an experiment file's evaluator settings map onto it."""

    dataset: str = "digits"  # built-in name, Unseen NAS directory, or .npz file
    epochs: int = 8
    batch_size: int = 256
    lr: float = 0.04
    momentum: float = 0.9
    weight_decay: float = 3e-4
    nesterov: bool = False
    schedule: str = "cosine"  # cosine | step | constant (stepped per batch)
    milestones: tuple[float, ...] = (0.5, 0.75)  # step schedule: fractions of training
    gamma: float = 0.1  # step schedule: factor at each milestone
    label_smoothing: float = 0.0
    param_groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # see evaluators.optim
    auxiliary_losses: dict[str, Any] = field(default_factory=dict)  # see evaluators.auxiliary
    metric: str | None = None  # accuracy | relative_l2; None: what the dataset's targets imply
    # budgets, checked from the analytic counts before anything is built (None: unlimited)
    max_params: int | None = None
    max_flops: int | None = None
    max_activation_mb: float | None = None
    max_seconds: float | None = None  # wall-clock budget for one evaluation
    predicted_time_margin: float = 3.0  # refuse trees predicted to take more than this x max_seconds
    # subsets: the first N examples of a split (quick runs and tests); None: all
    train_subset: int | None = None
    valid_subset: int | None = None
    # execution
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: bool = True  # mixed precision on CUDA (bfloat16 where supported, else float16)
    channels_last: str | bool = "auto"  # auto: on CUDA when the network has convolutions
    deterministic: bool = False
    threads: int | None = None  # torch CPU threads (e.g. 1 per worker when workers share cores)
    eval_batch_size: int = 1024
    lower: bool = True  # compile recognised patterns to fast kernels (einspace.network.lowering)
    step_mode: str = "eager"  # eager | cuda_graphs | compile | compile_cuda_graphs (evaluators._runtime)

    def __post_init__(self) -> None:
        require(
            isinstance(self.milestones, (list, tuple))
            and all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in self.milestones),
            f"setting milestones must be a list of fractions in (0, 1), got {self.milestones!r}",
        )
        object.__setattr__(self, "milestones", tuple(float(m) for m in self.milestones))
        for name in ("epochs", "batch_size", "eval_batch_size"):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"setting {name} must be a positive integer, got {value!r}",
            )
        for name in ("lr", "momentum", "weight_decay", "gamma", "label_smoothing"):
            value = getattr(self, name)
            require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                f"setting {name} must be a number >= 0, got {value!r}"
                + (" (YAML reads 1.0e9 as text; write 1.0e+9)" if isinstance(value, str) else ""),
            )
        require(
            self.schedule in ("cosine", "step", "constant"),
            "setting schedule must be cosine, step or constant",
        )
        require(all(0 < m < 1 for m in self.milestones), "setting milestones must be fractions in (0, 1)")
        require(self.label_smoothing < 1, "setting label_smoothing must be below 1")
        require(
            self.channels_last in ("auto", True, False), "setting channels_last must be auto, true or false"
        )
        require(self.step_mode in STEP_MODES, f"setting step_mode must be one of {', '.join(STEP_MODES)}")
        require(
            self.metric in (None, "accuracy", "relative_l2"),
            f"unknown metric {self.metric!r}; expected accuracy or relative_l2",
        )
        for name in ("train_subset", "valid_subset", "max_seconds", "threads"):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            require(value is None or number and value > 0, f"setting {name} must be positive or null")
        margin = self.predicted_time_margin
        require(
            isinstance(margin, (int, float)) and not isinstance(margin, bool) and margin >= 1,
            f"setting predicted_time_margin must be a number >= 1 (a factor on max_seconds), got {margin!r}",
        )
        Budget.from_settings(self.budget_settings())  # validates the budget numbers
        require(isinstance(self.param_groups, dict), "setting param_groups must be a mapping")
        check_param_groups(self.param_groups)
        require(isinstance(self.auxiliary_losses, dict), "setting auxiliary_losses must be a mapping")
        check_auxiliary_settings(self.auxiliary_losses)

    def budget_settings(self) -> dict[str, Any]:
        return {
            "max_params": self.max_params,
            "max_flops": self.max_flops,
            "max_activation_mb": self.max_activation_mb,
            "batch_size": self.batch_size,
        }


def _require_training_memory(checked: CheckedTree, batch_size: int) -> None:
    """Refuse, before building, to train a network whose float32 weights, gradients and optimiser
    state (at most four copies) and one batch's activations exceed the memory there is: the
    operating system would kill the process, with no message."""
    try:
        require_memory(
            {
                "weights, gradients and optimiser state": 16 * checked.params,
                f"activations for a batch of {batch_size}": activation_bytes(checked, batch_size),
            },
            f"training a network of {checked.params:,} parameters",
        )
    except EinspaceError as exc:
        raise EvaluationFailed(str(exc)) from None


def _subset(x: np.ndarray, y: np.ndarray, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    return (x, y) if n is None else (x[:n], y[:n])


def _check_budget(checked: CheckedTree, settings: TrainingSettings, classes: int | None) -> None:
    budget = Budget.from_settings({**settings.budget_settings(), "classes": classes})
    reason = budget_violation(checked, budget)
    if reason is not None:
        raise EvaluationFailed(f"over budget: {reason}")


def _check_input(dataset: Dataset, input: FeatureState) -> None:
    if tuple(input.shape) != dataset.input_shape:
        raise EvaluationFailed(
            f"the task's input {input} does not match dataset {dataset.name!r}, whose examples "
            f"have shape {'x'.join(map(str, dataset.input_shape))}"
        )


class _Laps:
    """Wall time of the consecutive phases of a run, as `time/<phase>` metrics: where the fixed
    cost of an evaluation goes (device start, building, data, autotuning in the first step)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.mark = time.perf_counter()

    def __call__(self, phase: str) -> None:
        """The phase `phase` ends now (and the next begins)."""
        now = time.perf_counter()
        self.times[f"time/{phase}"] = now - self.mark
        self.mark = now


#: Steps after the first (which includes lazy initialisation and autotuning) that time the
#: projection of a run under a time budget.
PROJECTION_STEPS = 3
#: Without a calibrated time model, a forward pass is taken as a third of a training step per
#: example (the backward pass costs about twice the forward).
_FORWARD_SHARE = 1 / 3


def _forecast(
    checked: CheckedTree,
    settings: TrainingSettings,
    objective: Objective,
    examples: int,
    eval_examples: int,
    epochs: int | None = None,
) -> Forecast | None:
    """The predicted time of a run of `epochs` (default: the settings') under a time budget
    (None: no budget, or no calibration on this device). Refuses, before anything is built, a
    tree predicted to take more than `predicted_time_margin` times the budget."""
    if settings.max_seconds is None:
        return None
    device = resolve_device(settings.device)
    model = calibrated(device, autocast_dtype(device, settings.amp), settings.threads)
    if model is None:
        return None
    workload = Workload.of(checked, objective.budget_classes)
    forecast = model.forecast(
        workload,
        settings.epochs if epochs is None else epochs,
        examples,
        settings.batch_size,
        eval_examples,
        settings.eval_batch_size,
    )
    limit = settings.predicted_time_margin * settings.max_seconds
    if forecast.seconds > limit:
        raise EvaluationFailed(
            f"predicted {forecast} exceeds the time budget of {settings.max_seconds:g} s "
            f"(refused beyond {settings.predicted_time_margin:g}x the budget)",
            {"epochs": 0.0, "steps": 0.0, "gpu_seconds": 0.0},
        )
    return forecast


class _Progress:
    """How far training got, as the progress metrics `run_task` turns into a Cost: epochs
    (fractional), optimiser steps, and seconds of training and scoring on a CUDA device."""

    def __init__(self, steps_per_epoch: int, cuda: bool):
        self.steps_per_epoch, self.cuda = steps_per_epoch, cuda
        self.steps = 0
        self.device_started: float | None = None
        self.device_ended: float | None = None

    def metrics(self) -> dict[str, float]:
        gpu = 0.0
        if self.cuda and self.device_started is not None:
            gpu = (self.device_ended or time.perf_counter()) - self.device_started
        return {"epochs": self.steps / self.steps_per_epoch, "steps": float(self.steps), "gpu_seconds": gpu}


class _Projection:
    """The `max_seconds` budget during training: after the first step and PROJECTION_STEPS more,
    the whole run is projected from their measured time and stopped if the projection exceeds
    the budget. Later it only says when the budget has run out."""

    def __init__(
        self,
        settings: TrainingSettings,
        started: float,
        total_steps: int,
        eval_examples: int,
        forecast: Forecast | None,
    ):
        self.limit, self.started = settings.max_seconds, started
        self.total_steps, self.forecast = total_steps, forecast
        self.eval_examples, self.batch_size = eval_examples, settings.batch_size
        self.after_first: float | None = None

    def exhausted(self) -> bool:
        return self.limit is not None and time.perf_counter() - self.started > self.limit

    def validation_seconds(self, step_seconds: float) -> float:
        """Validation time, from the forecast scaled by how far the measured step is off its
        prediction, or without a forecast from the step time itself."""
        if self.forecast is not None and self.forecast.step_seconds > 0:
            return self.forecast.validation_seconds * step_seconds / self.forecast.step_seconds
        return self.eval_examples / self.batch_size * step_seconds * _FORWARD_SHARE

    def check(self, progress: _Progress, runtime: Runtime) -> None:
        """Called after every step; raises EvaluationFailed when the projection exceeds the budget."""
        if self.limit is None or self.total_steps <= 1 + PROJECTION_STEPS:
            return
        if progress.steps == 1:
            self.after_first = time.perf_counter()  # the caller synchronised after the first step
        if progress.steps != 1 + PROJECTION_STEPS or self.after_first is None:
            return
        runtime.synchronize()
        now = time.perf_counter()
        step = (now - self.after_first) / PROJECTION_STEPS
        remaining = (self.total_steps - progress.steps) * step
        validation = self.validation_seconds(step)
        projected = now - self.started + remaining + validation
        if projected > self.limit:
            raise EvaluationFailed(
                f"projected {projected:.3g} s of training exceeds the time budget of {self.limit:g} s: "
                f"{now - self.started:.3g} s for the first {progress.steps} steps, then "
                f"{self.total_steps - progress.steps} steps x {step:.3g} s/step (measured over "
                f"{PROJECTION_STEPS}) + {validation:.3g} s validation",
                progress.metrics(),
            )


def _train(
    checked: CheckedTree,
    objective: Objective,
    train: tuple[np.ndarray, np.ndarray],
    evaluation: tuple[np.ndarray, np.ndarray],
    settings: TrainingSettings,
    random_seed: int,
    data_keys: tuple[Hashable | None, Hashable | None] = (None, None),
    forecast: Forecast | None = None,
    resumption: Resumption | None = None,
) -> dict[str, float]:
    """Build, train and score one network: eval_loss and eval_metric on `evaluation`, the
    training loss and metric of the last epoch, size, time per phase and progress (`partial`
    1.0 when the time budget stopped training). `data_keys` name the train and evaluation arrays
    for the device's data cache (None: not cached); `forecast` is the run's predicted time;
    `resumption` continues a saved run (the epochs after its own, on its schedule) and saves this one."""
    started = time.perf_counter()
    laps = _Laps()
    runtime = Runtime(settings.device, settings.amp, settings.channels_last, settings.deterministic)
    laps("device")
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(random_seed)
    shuffle = torch.Generator().manual_seed(random_seed)
    n = len(train[1])
    steps_per_epoch = math.ceil(n / settings.batch_size)
    progress = _Progress(steps_per_epoch, runtime.device.type == "cuda")
    start = resumption.start if resumption is not None else 0
    horizon = resumption.horizon if resumption is not None else settings.epochs
    budget = _Projection(
        settings, started, (settings.epochs - start) * steps_per_epoch, len(evaluation[1]), forecast
    )
    partial = False
    if runtime.device.type == "cpu":  # on a GPU, its own out-of-memory error says it
        _require_training_memory(checked, settings.batch_size)
    try:
        model = objective.build(checked, settings.lower)
        params = sum(p.numel() for p in model.parameters())
        model = runtime.prepare_model(model)
        optimizers = build_optimizer(
            model,
            lr=settings.lr,
            momentum=settings.momentum,
            weight_decay=settings.weight_decay,
            nesterov=settings.nesterov,
            schedule=settings.schedule,
            milestones=settings.milestones,
            gamma=settings.gamma,
            steps_per_epoch=steps_per_epoch,
            epochs=horizon,
            overrides=settings.param_groups,
        )
        if resumption is not None:
            resumption.restore(model, optimizers, shuffle)
        auxiliary = AuxiliaryObjective(model, checked, settings.auxiliary_losses)
        constrained = any(callable(getattr(m, "constrain_architecture", None)) for m in model.modules())
        laps("build")
        train_x, train_y = runtime.data(*train, key=data_keys[0])
        eval_x, eval_y = runtime.data(*evaluation, key=data_keys[1])
        laps("data")
        check_every = 1 if runtime.device.type == "cpu" else 25  # each check syncs a GPU
        train_loss = train_metric = 0.0
        auxiliary_terms: dict[str, float] = {}
        progress.device_started = time.perf_counter()
        model.train()
        forward, applied = _step_forward(model, runtime, settings, auxiliary, constrained, train_x)
        laps("capture")
        for epoch in range(start, settings.epochs):
            model.train()
            order = torch.randperm(n, generator=shuffle)
            loss_sum = torch.zeros((), device=runtime.device)
            metric_sum = torch.zeros((), device=runtime.device)
            seen = 0
            for step in range(steps_per_epoch):
                index = order[step * settings.batch_size : (step + 1) * settings.batch_size]
                x, y = runtime.batch(train_x, train_y, index)
                with runtime.autocast():
                    output = forward(x).float()
                    loss = objective.loss(output, y)
                    extra = auxiliary()
                optimizers.zero_grad()
                runtime.backward(loss if extra is None else loss + extra, optimizers)
                optimizers.schedule_step()
                if constrained:
                    constrain_architecture(model)
                loss_sum += loss.detach() * len(y)
                metric_sum += objective.metric_sum(output.detach(), y)
                progress.steps += 1
                seen += len(y)
                partial = budget.exhausted()
                if (step + 1) % check_every == 0 or step + 1 == steps_per_epoch or partial:
                    value = float(loss_sum)
                    if not math.isfinite(value):
                        raise EvaluationFailed(
                            f"the training loss became {value} in epoch {epoch + 1}, step {step + 1} "
                            f"(learning rate {settings.lr} too high for this network, or it is unstable)",
                            progress.metrics(),
                        )
                if epoch == step == 0:
                    runtime.synchronize()
                    laps("first_step")  # lazy initialisation, cuDNN autotuning, compilation
                budget.check(progress, runtime)
                if partial:
                    break
            train_loss, train_metric = float(loss_sum) / seen, float(metric_sum) / seen
            auxiliary_terms = auxiliary.epoch_metrics()
            if partial:
                break
        laps("steps")
        eval_loss, eval_metric = _score(model, objective, eval_x, eval_y, settings.eval_batch_size, runtime)
        laps("validation")
        progress.device_ended = time.perf_counter()
        extras = {**auxiliary_terms, **auxiliary.final_metrics(), **architecture_metrics(model)}
        if resumption is not None and not partial:
            tree = content_hash(checked.tree)
            extras.update(resumption.finish(tree, settings.epochs, model, optimizers, shuffle))
        if settings.step_mode != "eager":
            extras["step_mode_applied"] = float(applied)
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if out_of_memory(exc):
            runtime.release()
            raise EvaluationFailed(
                f"out of memory on {runtime.device}: {str(exc).splitlines()[0]}", progress.metrics()
            ) from None
        raise
    finally:
        torch.set_num_threads(threads)  # in-process executors share the process with others
    if partial:
        extras["partial"] = 1.0
    if forecast is not None:
        extras["predicted_seconds"] = forecast.seconds
    return {
        "eval_metric": eval_metric,
        "eval_loss": eval_loss,
        "train_loss": train_loss,
        f"train_{objective.metric}": train_metric,
        "params": float(params),
        "flops": float(checked.flops),
        **progress.metrics(),
        **extras,
        **laps.times,
        "seconds": time.perf_counter() - started,
    }


def _step_forward(
    model: nn.Module,
    runtime: Runtime,
    settings: TrainingSettings,
    auxiliary: AuxiliaryObjective,
    constrained: bool,
    train_x: torch.Tensor,
) -> tuple[Callable[[torch.Tensor], torch.Tensor], bool]:
    """The forward pass of a training step under `step_mode`, and whether the mode applies. CUDA
    graphs replay fixed buffers, so networks whose modules add loss terms or constrain their
    parameters after a step (trainable terminals) run eagerly; so does everything off CUDA."""
    if settings.step_mode == "eager":
        return model, False
    if settings.step_mode != "compile":
        terms = any(callable(getattr(m, "auxiliary_losses", None)) for m in model.modules())
        if constrained or terms or auxiliary.network_losses:
            return model, False
    first = torch.arange(min(len(train_x), settings.batch_size))
    sample, _ = runtime.batch(train_x, train_x, first)  # a full batch, on the device, in its format
    forward = runtime.training_forward(model, settings.step_mode, sample)
    return (model, False) if forward is None else (forward, True)


@torch.no_grad()
def _score(
    model: nn.Module,
    objective: Objective,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    runtime: Runtime,
) -> tuple[float, float]:
    """(mean loss, mean metric) of `model` on (x, y), in eval mode."""
    model.eval()
    loss = torch.zeros((), device=runtime.device)
    metric = torch.zeros((), device=runtime.device)
    for start in range(0, len(y), batch_size):
        index = torch.arange(start, min(start + batch_size, len(y)))
        xb, yb = runtime.batch(x, y, index)
        with runtime.autocast():
            output = model(xb).float()
        loss += objective.loss(output, yb) * len(yb)
        metric += objective.metric_sum(output, yb)
    return float(loss) / len(y), float(metric) / len(y)


@register_evaluator
class TrainingEvaluator(Evaluator):
    """Fitness = validation accuracy (or −relative ℓ2) after training on the train split (paper Sec. 4.1)."""

    name = "training"
    fidelity_setting = "epochs"
    continues = True

    def __init__(self, **settings: Any):
        self.settings = settings_from(TrainingSettings, self.name, settings)

    def full_fidelity(self) -> int:
        return self.settings.epochs

    def check(self, input: FeatureState) -> None:
        dataset = load_dataset(self.settings.dataset)
        try:
            _check_input(dataset, input)
        except EvaluationFailed as exc:
            raise EinspaceError(str(exc)) from None
        objective_for(dataset, self.settings.metric, self.settings)

    def evaluate(self, checked: CheckedTree, random_seed: int) -> dict[str, float]:
        return self._evaluate(checked, random_seed, None)

    def evaluate_continued(
        self, checked: CheckedTree, random_seed: int, continuation: Continuation
    ) -> dict[str, float]:
        resumption = Resumption.of(continuation, content_hash(checked.tree), self.settings.epochs)
        return self._evaluate(checked, random_seed, resumption)

    def _evaluate(
        self, checked: CheckedTree, random_seed: int, resumption: Resumption | None
    ) -> dict[str, float]:
        s = self.settings
        dataset = load_dataset(s.dataset)
        _check_input(dataset, checked.input[0])
        objective = objective_for(dataset, s.metric, s)
        _check_budget(checked, s, objective.budget_classes)
        train = _subset(dataset.train_x, dataset.train_y, s.train_subset)
        valid = _subset(dataset.valid_x, dataset.valid_y, s.valid_subset)
        keys = ((dataset, "train", s.train_subset), (dataset, "valid", s.valid_subset))
        start = resumption.start if resumption is not None else 0
        forecast = _forecast(checked, s, objective, len(train[1]), len(valid[1]), s.epochs - start)
        metrics = _train(checked, objective, train, valid, s, random_seed, keys, forecast, resumption)
        value, loss = metrics.pop("eval_metric"), metrics.pop("eval_loss")
        named = {f"valid_{objective.metric}": value, "valid_loss": loss}
        return {"fitness": objective.fitness(value), **named, **metrics}


def train_and_test(
    tree: Node,
    dataset: Dataset,
    input: FeatureState,
    grammar: Grammar | None,
    settings: TrainingSettings,
    random_seed: int = 0,
) -> dict[str, float]:
    """Train on train+valid with `settings`, report the test metric (the engine of final_evaluation)."""
    _check_input(dataset, input)
    checked = check_tree(tree, grammar, input)
    objective = objective_for(dataset, settings.metric, settings)
    _check_budget(checked, settings, objective.budget_classes)
    train = (
        np.concatenate([dataset.train_x, dataset.valid_x]),
        np.concatenate([dataset.train_y, dataset.valid_y]),
    )
    test = (dataset.test_x, dataset.test_y)
    forecast = _forecast(checked, settings, objective, len(train[1]), len(test[1]))
    metrics = _train(checked, objective, train, test, settings, random_seed, forecast=forecast)
    value, loss = metrics.pop("eval_metric"), metrics.pop("eval_loss")
    return {f"test_{objective.metric}": value, "test_loss": loss, **metrics}


def final_evaluation(
    tree: Node,
    dataset: str | Dataset = "digits",
    grammar: Grammar | str | None = "einspace",
    settings: dict[str, Any] | None = None,
    random_seed: int = 0,
) -> dict[str, float]:
    """Retrain `tree` from scratch on train+valid and evaluate on test (paper App. B.1).

    `settings` are TrainingSettings keys; epochs default to FINAL_EPOCHS (64, Table 4) rather
    than the search's 8. Raises EvaluationFailed for the failures the evaluator reports.
    """
    from einspace.grammar.parser import load_grammar
    from einspace.state import input_state

    values = {"epochs": FINAL_EPOCHS, **(settings or {})}
    if isinstance(dataset, Dataset):
        values["dataset"] = dataset.name
    resolved = settings_from(TrainingSettings, "training", values)
    data = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if isinstance(grammar, str):
        grammar = load_grammar(grammar)
    return train_and_test(tree, data, input_state(data.input_shape), grammar, resolved, random_seed)
