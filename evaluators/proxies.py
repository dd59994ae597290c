"""Zero-cost proxies: score an untrained network in one or two passes, usable as a fitness.

- `naswot` (Mellor et al., "Neural Architecture Search without Training", ICML 2021): the
  log-determinant of the kernel of binary activation patterns of the rectifier units over a
  batch. Networks that give different inputs different patterns score higher.
- `synflow` (Tanaka et al., "Pruning neural networks without any data", NeurIPS 2020, used as
  a NAS proxy by Abdelfattah et al., ICLR 2021): with all weights made positive and an input
  of ones, the sum over parameters of |θ · ∂R/∂θ| where R sums the output. Data-free.
  Fitness is its natural log, which keeps the huge values of deep networks comparable.
- `grad_norm` (Abdelfattah et al. 2021): the sum of the gradient norms of the cross-entropy
  loss on one batch.

Each is deterministic given random_seed (initialisation and batch choice are seeded).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from einspace.checker import CheckedTree
from einspace.evaluators._runtime import out_of_memory
from einspace.evaluators._settings import require, settings_from
from einspace.evaluators.base import EvaluationFailed, Evaluator, register_evaluator
from einspace.evaluators.budgets import Budget, budget_violation
from einspace.evaluators.datasets import load_dataset
from einspace.evaluators.objectives import Classification, Objective, objective_for

__all__ = ["ProxySettings", "grad_norm_score", "naswot_score", "synflow_score"]

_RECTIFIERS = (nn.ReLU, nn.LeakyReLU)


def naswot_score(model: nn.Module, x: torch.Tensor) -> float:
    """log|K| with K[i, j] = number of rectifier units on which inputs i and j agree (both
    active or both inactive). -inf when two inputs share a pattern (K is singular)."""
    codes: list[torch.Tensor] = []

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        codes.append((inputs[0].detach() > 0).flatten(1).double())

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, _RECTIFIERS)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    if not codes:
        raise EvaluationFailed("naswot needs rectifier units (leaky_relu) and this network has none")
    c = torch.cat(codes, dim=1)
    kernel = c @ c.T + (1 - c) @ (1 - c).T
    # K is a sum of Gram matrices, so positive semi-definite; when it is singular slogdet
    # returns rounding noise of either sign, so decide the rank first.
    if int(torch.linalg.matrix_rank(kernel, hermitian=True)) < len(kernel):
        return -math.inf
    return float(torch.linalg.slogdet(kernel)[1])


def synflow_score(model: nn.Module, input_shape: tuple[int, ...]) -> float:
    """sum |θ · ∂R/∂θ| for R = sum of the output on an all-ones input, with |θ| as weights, in
    float64 and eval mode (batch norm as an affine map). The model's weights are changed."""
    model = model.double().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.abs_()
    model.zero_grad()
    output = model(torch.ones((1, *input_shape), dtype=torch.float64))
    output.sum().backward()
    total = 0.0
    for param in model.parameters():
        if param.grad is not None:
            total += float((param.detach() * param.grad).abs().sum())
    return total


def grad_norm_score(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: Callable[..., torch.Tensor] = F.cross_entropy
) -> float:
    """Sum over parameter tensors of the L2 norm of the gradient of `loss` on (x, y)."""
    model.train()
    model.zero_grad()
    loss(model(x), y).backward()
    return float(sum(p.grad.norm() for p in model.parameters() if p.grad is not None))


@dataclass(frozen=True)
class ProxySettings:
    """Settings shared by the proxies: where the batch comes from and the budget to respect."""

    dataset: str | None = "digits"  # naswot and grad_norm need data; synflow only its shape
    classes: int | None = None  # head size when there is no dataset (default 10)
    batch_size: int = 64
    max_params: int | None = None
    max_flops: int | None = None
    max_activation_mb: float | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.batch_size, int) and self.batch_size >= 2, "setting batch_size must be >= 2")
        classes = self.classes
        require(
            classes is None or isinstance(classes, int) and not isinstance(classes, bool) and classes >= 1,
            "setting classes must be positive",
        )


class _ProxyEvaluator(Evaluator):
    """Shared steps: load the batch, check the budget, build the network with a seeded init."""

    needs_data = True

    def __init__(self, **settings: Any):
        self.settings = settings_from(ProxySettings, self.name, settings)
        if self.needs_data and self.settings.dataset is None:
            raise EvaluationFailed(f"the {self.name} proxy needs a dataset")

    def evaluate(self, checked: CheckedTree, random_seed: int) -> dict[str, float]:
        s = self.settings
        input = checked.input[0]
        dataset = load_dataset(s.dataset) if s.dataset is not None else None
        if dataset is not None and dataset.input_shape != tuple(input.shape):
            raise EvaluationFailed(f"the task's input {input} does not match dataset {dataset.name!r}")
        if dataset is None or (s.classes and dataset.task == "classification"):
            self.objective: Objective = Classification(s.classes or 10)
        else:
            self.objective = objective_for(dataset, None)
        classes = self.objective.budget_classes
        budget = Budget(s.max_params, s.max_flops, s.max_activation_mb, s.batch_size, classes=classes)
        reason = budget_violation(checked, budget)
        if reason is not None:
            raise EvaluationFailed(f"over budget: {reason}")
        torch.manual_seed(random_seed)
        batch = None
        if dataset is not None:
            pick = np.random.default_rng(random_seed).choice(
                len(dataset.train_y), s.batch_size, replace=False
            )
            batch = torch.from_numpy(dataset.train_x[pick]), torch.from_numpy(dataset.train_y[pick])
        try:
            model = self.objective.build(checked, lower=True)
            score = self.score(model, batch, tuple(input.shape))
        except RuntimeError as exc:
            if out_of_memory(exc):
                raise EvaluationFailed(f"out of memory: {str(exc).splitlines()[0]}") from None
            raise
        return {**self.fitness(score), "params": float(checked.params), "flops": float(checked.flops)}

    def score(self, model: nn.Module, batch: Any, input_shape: tuple[int, ...]) -> float:
        raise NotImplementedError

    def fitness(self, score: float) -> dict[str, float]:
        if not math.isfinite(score):
            raise EvaluationFailed(f"{self.name} score is {score}")
        return {"fitness": score, self.name: score}


@register_evaluator
class NaswotEvaluator(_ProxyEvaluator):
    """Fitness = NASWOT's log-determinant on a batch of training images (higher is better)."""

    name = "naswot"

    def score(self, model: nn.Module, batch: Any, input_shape: tuple[int, ...]) -> float:
        return naswot_score(model, batch[0])

    def fitness(self, score: float) -> dict[str, float]:
        if score == -math.inf:
            raise EvaluationFailed("naswot: two inputs share an activation pattern (singular kernel)")
        return super().fitness(score)


@register_evaluator
class SynflowEvaluator(_ProxyEvaluator):
    """Fitness = log synflow (data-free; higher is better)."""

    name = "synflow"
    needs_data = False

    def score(self, model: nn.Module, batch: Any, input_shape: tuple[int, ...]) -> float:
        return synflow_score(model, input_shape)

    def fitness(self, score: float) -> dict[str, float]:
        if not score > 0 or not math.isfinite(score):
            raise EvaluationFailed(f"synflow is {score} (no signal path, or float64 overflow)")
        return {"fitness": math.log(score), "synflow": score}


@register_evaluator
class GradNormEvaluator(_ProxyEvaluator):
    """Fitness = gradient norm of the loss on one training batch at initialisation."""

    name = "grad_norm"

    def score(self, model: nn.Module, batch: Any, input_shape: tuple[int, ...]) -> float:
        return grad_norm_score(model, *batch, loss=self.objective.loss)
