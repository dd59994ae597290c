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
einspace.evaluators.continuation; it then trains the epochs after the saved ones on the top
rung's schedule), or for 0 epochs: the untrained network, its head fitted (einspace.evaluators.head_fit).

Determinism: the same random_seed gives bit-identical results on CPU with the same torch version
and thread count (seeded initialisation and batch order). On a GPU, cuDNN's algorithm choice and
atomic adds make runs differ in the last bits unless `deterministic: true` (slower).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from einspace.checker import CheckedTree, check_tree
from einspace.errors import EinspaceError
from einspace.evaluators._runtime import Runtime, out_of_memory
from einspace.evaluators._settings import FINAL_EPOCHS, settings_from
from einspace.evaluators.auxiliary import AuxiliaryObjective
from einspace.evaluators.base import (
    Continuation,
    EvaluationFailed,
    Evaluator,
    Inheritance,
    register_evaluator,
)
from einspace.evaluators.budgets import Budget, budget_violation, require_training_memory
from einspace.evaluators.continuation import Resumption
from einspace.evaluators.datasets import Dataset, load_dataset
from einspace.evaluators.head_fit import fit_head, head_fit_problem
from einspace.evaluators.inheritance import Lineage
from einspace.evaluators.latency import forward_latency_ms
from einspace.evaluators.objectives import Objective, objective_for
from einspace.evaluators.optim import Optimizers, build_optimizer
from einspace.evaluators.time_budget import Laps, Progress, Projection, forecast_run
from einspace.evaluators.time_model import Forecast
from einspace.evaluators.training_settings import TrainingSettings
from einspace.grammar.model import Grammar
from einspace.network.compiler import lower_network
from einspace.ops.trainable import architecture_metrics, constrain_architecture
from einspace.state import FeatureState
from einspace.tree import Node, content_hash

__all__ = ["FINAL_EPOCHS", "TrainingEvaluator", "TrainingSettings", "final_evaluation", "train_and_test"]


def _subset(x: np.ndarray, y: np.ndarray, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    return (x, y) if n is None else (x[:n], y[:n])


def _check_budget(checked: CheckedTree, settings: TrainingSettings, classes: int | None) -> None:
    budget = Budget.from_settings({**settings.budget_settings(), "classes": classes})
    reason = budget_violation(checked, budget)
    if reason is not None:
        raise EvaluationFailed(f"over budget: {reason}")


def _check_input(dataset: Dataset, input: FeatureState) -> None:
    if (problem := dataset.input_problem(input)) is not None:
        raise EvaluationFailed(problem)


@dataclass
class _Model:
    """A network built for training, with what trains it and what it was built from."""

    network: nn.Module
    optimizers: Optimizers
    auxiliary: AuxiliaryObjective
    constrained: bool  # some module constrains its parameters after each step
    lineage: Lineage | None
    metrics: dict[str, float]  # size, and what was inherited


def _build(
    checked: CheckedTree,
    objective: Objective,
    settings: TrainingSettings,
    runtime: Runtime,
    schedule: tuple[int, int],
    shuffle: torch.Generator,
    resumption: Resumption | None,
    inheritance: Inheritance | None,
) -> _Model:
    """Build the network (inheriting before it is lowered), its optimisers on a schedule of
    (steps per epoch, epochs), and restore a saved state to go on from."""
    network = objective.build(checked, lower=settings.lower and inheritance is None)
    lineage, metrics = None, {}
    if inheritance is not None:  # inherit into the literal modules, then lower
        lineage = Lineage(inheritance, checked, network)
        metrics = lineage.inherit()
        if settings.lower:
            lower_network(lineage.network)
    metrics["params"] = float(sum(p.numel() for p in network.parameters()))
    network = runtime.prepare_model(network)
    optimizers = build_optimizer(
        network, steps_per_epoch=schedule[0], epochs=schedule[1], **settings.optimizer_options()
    )
    if resumption is not None:
        resumption.restore(network, optimizers, shuffle)
    auxiliary = AuxiliaryObjective(network, checked, settings.auxiliary_losses)
    constrained = any(callable(getattr(m, "constrain_architecture", None)) for m in network.modules())
    return _Model(network, optimizers, auxiliary, constrained, lineage, metrics)


@dataclass
class _Epochs:
    """What the training epochs leave: the last epoch's loss, metric and auxiliary terms, and
    whether the time budget stopped them (`partial`)."""

    loss: float = 0.0
    metric: float = 0.0
    auxiliary: dict[str, float] = field(default_factory=dict)
    partial: bool = False
    applied: bool = False  # the step mode applied (not eager)


def _train_epochs(
    built: _Model,
    objective: Objective,
    data: tuple[torch.Tensor, torch.Tensor],
    settings: TrainingSettings,
    runtime: Runtime,
    epochs: range,
    shuffle: torch.Generator,
    progress: Progress,
    budget: Projection,
    laps: Laps,
) -> _Epochs:
    """Train `built` for `epochs`, checking the loss, the projection and the time budget."""
    model, optimizers, auxiliary = built.network, built.optimizers, built.auxiliary
    train_x, train_y = data
    n, steps_per_epoch = len(train_y), progress.steps_per_epoch
    check_every = 1 if runtime.device.type == "cpu" else 25  # each check syncs a GPU
    done = _Epochs()
    model.train()
    forward, done.applied = _step_forward(model, runtime, settings, auxiliary, built.constrained, train_x)
    laps("capture")
    for epoch in epochs:
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
            if built.constrained:
                constrain_architecture(model)
            loss_sum += loss.detach() * len(y)
            metric_sum += objective.metric_sum(output.detach(), y)
            progress.steps += 1
            seen += len(y)
            done.partial = budget.exhausted()
            if (step + 1) % check_every == 0 or step + 1 == steps_per_epoch or done.partial:
                value = float(loss_sum)
                if not math.isfinite(value):
                    raise EvaluationFailed(
                        f"the training loss became {value} in epoch {epoch + 1}, step {step + 1} "
                        f"(learning rate {settings.lr} too high for this network, or it is unstable)",
                        progress.metrics(),
                    )
            if progress.steps == 1:
                runtime.synchronize()
                laps("first_step")  # lazy initialisation, cuDNN autotuning, compilation
            budget.check(progress, runtime)
            if done.partial:
                break
        done.loss, done.metric = float(loss_sum) / seen, float(metric_sum) / seen
        done.auxiliary = auxiliary.epoch_metrics()
        if done.partial:
            break
    return done


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
    inheritance: Inheritance | None = None,
) -> dict[str, float]:
    """Build, train and score one network: eval_loss and eval_metric on `evaluation`, the
    training loss and metric of the last epoch, size, time per phase and progress (`partial`
    1.0 when the time budget stopped training). `data_keys` name the train and evaluation arrays
    for the device's data cache (None: not cached); `forecast` is the run's predicted time;
    `resumption` continues a saved run (the epochs after its own, on its schedule) and saves this
    one; `inheritance` starts from a parent's weights and saves this run's for its children."""
    started = time.perf_counter()
    laps = Laps()
    runtime = Runtime(settings.device, settings.amp, settings.channels_last, settings.deterministic)
    laps("device")
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(random_seed)
    shuffle = torch.Generator().manual_seed(random_seed)
    steps_per_epoch = math.ceil(len(train[1]) / settings.batch_size)
    progress = Progress(steps_per_epoch, runtime.device.type == "cuda")
    start = resumption.start if resumption is not None else 0
    horizon = resumption.horizon if resumption is not None else settings.epochs
    budget = Projection(
        settings, started, (settings.epochs - start) * steps_per_epoch, len(evaluation[1]), forecast
    )
    if runtime.device.type == "cpu":  # on a GPU, its own out-of-memory error says it
        require_training_memory(checked, settings.batch_size)
    try:
        built = _build(
            checked,
            objective,
            settings,
            runtime,
            (steps_per_epoch, horizon),
            shuffle,
            resumption,
            inheritance,
        )
        model = built.network
        laps("build")
        train_data = runtime.data(*train, key=data_keys[0])
        eval_x, eval_y = runtime.data(*evaluation, key=data_keys[1])
        laps("data")
        progress.device_started = time.perf_counter()
        fitted = settings.head_init == "fitted"  # the look at 0 epochs scores what training starts from
        fit = partial(fit_head, model, train_data, objective, runtime.batch)
        if settings.epochs == 0:
            done = _Epochs(
                *fit(settings.eval_batch_size, shuffle, standardise=fitted, examples=settings.look_examples)
            )
        else:
            if fitted and start == 0 and not built.metrics.get("inherited_head"):
                fit(settings.batch_size, shuffle, training=True, standardise=True)
            epochs = range(start, settings.epochs)
            done = _train_epochs(
                built, objective, train_data, settings, runtime, epochs, shuffle, progress, budget, laps
            )
        laps("steps")
        eval_loss, eval_metric = _score(model, objective, eval_x, eval_y, settings.eval_batch_size, runtime)
        laps("validation")
        progress.device_ended = time.perf_counter()
        extras = {**done.auxiliary, **built.auxiliary.final_metrics(), **architecture_metrics(model)}
        if (latency_batch := settings.latency_batch_size) is not None:
            extras["latency_ms"] = forward_latency_ms(model, runtime, eval_x.shape[1:], latency_batch)
        if resumption is not None and not done.partial:
            tree = content_hash(checked.tree)
            extras.update(resumption.finish(tree, settings.epochs, model, built.optimizers, shuffle))
        if built.lineage is not None:
            extras.update(built.lineage.save(model))
        if settings.step_mode != "eager":
            extras["step_mode_applied"] = float(done.applied)
        if (clipped := built.optimizers.clipped_share()) is not None:
            extras["clipped_steps"] = clipped
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if out_of_memory(exc):
            runtime.release()
            raise EvaluationFailed(
                f"out of memory on {runtime.device}: {str(exc).splitlines()[0]}", progress.metrics()
            ) from None
        raise
    finally:
        torch.set_num_threads(threads)  # in-process executors share the process with others
    if done.partial:
        extras["partial"] = 1.0
    if forecast is not None:
        extras["predicted_seconds"] = forecast.seconds
    return {
        "eval_metric": eval_metric,
        "eval_loss": eval_loss,
        "train_loss": done.loss,
        f"train_{objective.metric}": done.metric,
        **built.metrics,
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
    top_fidelity_setting = "top_epochs"
    continues = True
    inherits = True

    def __init__(self, **settings: Any):
        self.settings = settings_from(TrainingSettings, self.name, settings)

    def full_fidelity(self) -> int:
        return self.settings.epochs

    def fidelity_problem(self, fidelity: int) -> str | None:
        if fidelity > 0:
            return None
        objective = objective_for(load_dataset(self.settings.dataset), self.settings.metric)
        return head_fit_problem(
            objective, "0 epochs (the untrained network with its head fitted in closed form)"
        )

    def check(self, input: FeatureState) -> None:
        dataset = load_dataset(self.settings.dataset)
        if (problem := dataset.input_problem(input)) is not None:
            raise EinspaceError(problem)
        objective = objective_for(dataset, self.settings.metric, self.settings)
        if (problem := self.fidelity_problem(self.settings.epochs)) is not None:
            raise EinspaceError(f"evaluator setting epochs: {problem}")
        if self.settings.head_init == "fitted" and (
            problem := head_fit_problem(objective, "head_init fitted (the head fitted before training)")
        ):
            raise EinspaceError(f"evaluator setting head_init: {problem}")

    def evaluate(self, checked: CheckedTree, random_seed: int) -> dict[str, float]:
        return self._evaluate(checked, random_seed, None)

    def evaluate_continued(
        self,
        checked: CheckedTree,
        random_seed: int,
        continuation: Continuation | None,
        inheritance: Inheritance | None = None,
    ) -> dict[str, float]:
        resumption = None
        if continuation is not None:
            resumption = Resumption.of(continuation, content_hash(checked.tree), self.settings.epochs)
        return self._evaluate(checked, random_seed, resumption, inheritance)

    def _evaluate(
        self,
        checked: CheckedTree,
        random_seed: int,
        resumption: Resumption | None,
        inheritance: Inheritance | None = None,
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
        forecast = forecast_run(checked, s, objective, len(train[1]), len(valid[1]), s.epochs - start)
        metrics = _train(
            checked, objective, train, valid, s, random_seed, keys, forecast, resumption, inheritance
        )
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
    forecast = forecast_run(checked, settings, objective, len(train[1]), len(test[1]))
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
