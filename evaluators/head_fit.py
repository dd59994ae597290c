"""Fidelity 0 of the training evaluator: the untrained network, its head fitted in closed form.

Multi-fidelity search can look at an architecture before training it at all: a rung at 0 epochs,
below the first training rung (`multi_fidelity: {min_fidelity: 0}`). The backbone keeps its random
initialisation; the classification head's linear layer is fitted to a sample of the training
examples (the setting `look_examples`) by ridge regression on one-hot targets (in float64); the
result is the validation accuracy of that network, on the same scale as a trained one's. The fit
is on the features as they are, so that the look scores what training from a random head can use:
a feature whose spread is far below the penalty's scale (a softmax over 512 channels varies by
about 1/512) is as good as absent, as it is to SGD. Standardised features (`standardise`, each
scaled to unit spread) are what `head_init: fitted` starts training from, and what the look scores
with it: such a head uses tiny features at full weight. It tells apart networks whose random
features already separate the classes from those whose features cannot (a network that averages
every position before anything mixes them is blind to order), for the price of forward passes over
a sample of the training data: no backward pass, no optimiser. Whether a network that passes this
look also trains well is the next rung's question.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from einspace.evaluators._settings import HEAD_INITS
from einspace.evaluators.base import EvaluationFailed
from einspace.evaluators.objectives import Classification, Objective
from einspace.network.compiler import ClassificationHead

__all__ = ["FIT_EXAMPLES", "HEAD_INITS", "RIDGE", "fit_head", "head_fit_problem"]
#: Training examples the head is fitted on before training (`head_init: fitted`), and by default
#: for the look at 0 epochs (the setting `look_examples`): a sample drawn with the run's data-order
#: generator.
FIT_EXAMPLES = 1024
#: The ridge penalty per example: against a feature of unit spread (a normalised one; every
#: standardised one) whose squared norm is the number of examples, a fraction of it: enough to keep
#: a fit on more features than classes from memorising the sample, small against any such feature
#: that carries signal. Raw features of a much smaller spread are shrunk to nothing.
RIDGE = 0.01


def head_fit_problem(objective: Objective, use: str) -> str | None:
    """Why the head of a network of this objective cannot be fitted for `use` (what asks for the
    fit, as the message names it; None: it can)."""
    if isinstance(objective, Classification):
        return None
    return f"{use} needs a classification dataset, and this one's metric is {objective.metric}"


def fit_head(
    network: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    objective: Objective,
    batch: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    order: torch.Generator,
    training: bool = False,
    standardise: bool = False,
    examples: int = FIT_EXAMPLES,
) -> tuple[float, float]:
    """Set the head's linear layer of `network` (backbone, then a ClassificationHead) to the ridge
    fit on up to `examples` rows of `data` drawn with `order`; returns the fitted network's
    (loss, metric) on them. `batch(x, y, index)` moves rows to the device (`Runtime.batch`). The
    features are those of eval mode, as the network is scored (batch norm at initialisation is
    the identity), or with `training` those that training sees (batch norm on the statistics of
    each batch of `batch_size`; its running statistics are left as they were); with `standardise`
    each feature is scaled to unit spread first."""
    with torch.no_grad():  # a block, not a decorator: mutation testing skips decorated functions
        head = network.head
        if not isinstance(head, ClassificationHead):
            raise EvaluationFailed(
                "fitting the head in closed form needs the classification head, and this network has "
                f"{type(head).__name__}"
            )
        x, y = data
        rows = torch.randperm(len(y), generator=order)[:examples]
        buffers = {name: b.clone() for name, b in network.named_buffers()}
        network.train(training)
        features, targets = [], []
        for start in range(0, len(rows), batch_size):
            xb, yb = batch(x, y, rows[start : start + batch_size])
            features.append(head.features(network.backbone(xb)).double())
            targets.append(yb)
        for name, b in network.named_buffers():  # a training-mode pass moved the running statistics
            b.copy_(buffers[name])
        f, labels = torch.cat(features), torch.cat(targets)
        if not torch.isfinite(f).all():
            raise EvaluationFailed("the untrained network's features are not finite: no head can be fitted")
        mean = f.mean(0)
        scale = f.std(0, correction=0) if standardise else torch.ones_like(mean)
        scale = torch.where(scale > 1e-12 * (1 + mean.abs()), scale, torch.ones_like(scale))
        z = (f - mean) / scale
        onehot = F.one_hot(labels, head.linear.out_features).double()
        centre = onehot.mean(0)
        weights = _ridge_weights(z, onehot)  # z's columns have mean 0: no centring needed
        # z @ weights + centre, written as one linear layer on the raw features
        head.linear.weight.copy_((weights / scale[:, None]).T)
        head.linear.bias.copy_(centre - (mean / scale) @ weights)
        logits = head.linear(f.to(head.linear.weight.dtype))
        metric = float(objective.metric_sum(logits, labels)) / len(labels)
        return float(objective.loss(logits, labels)), metric


def _ridge_weights(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """argmin_w |z w - targets|² + RIDGE·n·|w|² for n rows of d features: through the d x d normal
    equations, or, with more features than rows (a network can carry tens of thousands of channels
    into its head), through the n x n kernel, zᵀ (z zᵀ + RIDGE·n·I)⁻¹ targets, the same solution,
    whose system stays small (a d x d one of 16,384 features is 2 GiB)."""
    n, d = z.shape
    ridge = RIDGE * n
    if d <= n:
        gram = z.T @ z + ridge * torch.eye(d, dtype=z.dtype, device=z.device)
        return torch.linalg.solve(gram, z.T @ targets)
    kernel = z @ z.T + ridge * torch.eye(n, dtype=z.dtype, device=z.device)
    return z.T @ torch.linalg.solve(kernel, targets)
