"""What a network predicts and how it is scored: classification (accuracy) or dense regression (relative ℓ2).

The training loop is the same for both; an Objective supplies the head, the loss, the
per-example metric and how that metric becomes a fitness (maximised). The task follows from
the dataset: integer labels (N,) are classification, float targets (N, C', H', W') dense
regression (Darcy-flow style, paper App. B.1 and Table 4).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from einspace.checker import CheckedTree
from einspace.evaluators.base import EvaluationFailed
from einspace.evaluators.datasets import Dataset
from einspace.network.compiler import Network, check_head_pooling, compile_backbone, compile_network
from einspace.state import FeatureState

__all__ = ["Classification", "DenseHead", "DenseRegression", "Objective", "objective_for", "relative_l2"]


#: The dense head's adaptive pooling for each of the classification head's (HEAD_POOLINGS).
DENSE_POOLINGS = {"mean": F.adaptive_avg_pool2d, "max": F.adaptive_max_pool2d}


class DenseHead(nn.Module):
    """The paper's dense head (App. B.1): adaptive average pooling of the last two axes to the
    target's height and width (col features (S, D) first get a channel axis of size one),
    then a linear layer over the channels to the target's channels. With `pooling` "max", the
    pooling is adaptive max pooling (as the classification head's)."""

    def __init__(self, features: FeatureState, target_shape: tuple[int, int, int], pooling: str = "mean"):
        super().__init__()
        check_head_pooling(pooling)
        channels = features.shape[0] if len(features.shape) == 3 else 1
        self.size = tuple(target_shape[1:])
        self.pool = DENSE_POOLINGS[pooling]
        self.linear = nn.Linear(channels, target_shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:  # col mode: (B, S, D) -> (B, 1, S, D)
            x = x[:, None]
        x = self.pool(x, self.size)
        return rearrange(self.linear(rearrange(x, "b c h w -> b h w c")), "b h w c -> b c h w")


def relative_l2(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-example ‖prediction − target‖₂ / ‖target‖₂ (the Darcy-flow metric; lower is better)."""
    error = (prediction - target).flatten(1).norm(dim=1)
    return error / target.flatten(1).norm(dim=1).clamp_min(1e-12)


class Objective:
    """Head, loss and metric of one kind of task."""

    metric: str  # the metric's name in the results ("accuracy", "relative_l2")

    def build(self, checked: CheckedTree, lower: bool) -> nn.Module:
        raise NotImplementedError

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean training loss of a batch."""
        raise NotImplementedError

    def metric_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The metric summed over the examples of a batch (divided by N afterwards)."""
        raise NotImplementedError

    def fitness(self, metric: float) -> float:
        """The metric as a fitness to maximise."""
        return metric

    @property
    def budget_classes(self) -> int | None:
        """Classes for Budget's head count (None: the budget covers the backbone only)."""
        return None


class Classification(Objective):
    """Cross-entropy on class indices; accuracy."""

    metric = "accuracy"

    def __init__(self, classes: int, label_smoothing: float = 0.0, pooling: str = "mean"):
        self.classes, self.label_smoothing, self.pooling = classes, label_smoothing, pooling

    def build(self, checked: CheckedTree, lower: bool) -> nn.Module:
        return compile_network(checked, classes=self.classes, lower=lower, pooling=self.pooling)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target, label_smoothing=self.label_smoothing)

    def metric_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output.argmax(1) == target).sum()

    @property
    def budget_classes(self) -> int | None:
        return self.classes


class DenseRegression(Objective):
    """Mean squared error on dense targets; relative ℓ2, whose negative is the fitness."""

    metric = "relative_l2"

    def __init__(self, target_shape: tuple[int, int, int], pooling: str = "mean"):
        self.target_shape, self.pooling = target_shape, pooling

    def build(self, checked: CheckedTree, lower: bool) -> nn.Module:
        backbone = compile_backbone(checked, lower=lower)
        return Network(backbone, DenseHead(checked.output[0], self.target_shape, self.pooling))

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target)

    def metric_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return relative_l2(output, target).sum()

    def fitness(self, metric: float) -> float:
        return -metric if math.isfinite(metric) else -math.inf


def objective_for(dataset: Dataset, metric: str | None, settings: Any = None) -> Objective:
    """The objective a dataset implies; `metric`, when given, must agree with it."""
    smoothing = float(getattr(settings, "label_smoothing", 0.0))
    pooling = getattr(settings, "head_pooling", "mean")
    objective: Objective
    if dataset.task == "classification":
        objective = Classification(dataset.classes, smoothing, pooling)
    else:
        objective = DenseRegression(dataset.target_shape, pooling)  # type: ignore[arg-type]
    if metric is not None and metric != objective.metric:
        raise EvaluationFailed(
            f"metric {metric!r} does not fit dataset {dataset.name!r}, a {dataset.task} task "
            f"scored by {objective.metric}"
        )
    return objective
