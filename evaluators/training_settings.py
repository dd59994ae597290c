"""The settings of a training run (`TrainingSettings`): what an experiment file's training-evaluator
settings map onto, each checked on construction with an error naming it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from einspace.evaluators._runtime import STEP_MODES
from einspace.evaluators._settings import HEAD_INITS, SCHEDULES, require
from einspace.evaluators.auxiliary import check_auxiliary_settings
from einspace.evaluators.budgets import Budget
from einspace.evaluators.head_fit import FIT_EXAMPLES
from einspace.evaluators.optim import OPTIMIZERS, check_param_groups
from einspace.network.compiler import HEAD_POOLINGS

__all__ = ["TrainingSettings"]


@dataclass(frozen=True)
class TrainingSettings:
    """Everything a training run reads; an experiment file's evaluator settings map onto it."""

    dataset: str = "digits"  # built-in name, Unseen NAS directory, or .npz file
    epochs: int = 8  # 0: untrained, the head fitted in closed form (einspace.evaluators.head_fit)
    batch_size: int = 256
    optimizer: str = "sgd"  # sgd (the paper's) | adam | adamw: every group a `param_groups` entry leaves
    lr: float = 0.04
    momentum: float = 0.9  # sgd only
    weight_decay: float = 3e-4
    nesterov: bool = False
    schedule: str = "cosine"  # cosine | step | constant (stepped per batch)
    milestones: tuple[float, ...] = (0.5, 0.75)  # step schedule: fractions of training
    gamma: float = 0.1  # step schedule: factor at each milestone
    label_smoothing: float = 0.0
    max_grad_norm: float | None = None  # clip the gradients' global norm to this before each step
    head_pooling: str = "mean"  # mean (the paper's head) | max: how the head pools positions
    # random | fitted: before the first epoch (unless the head is inherited), the head's linear layer
    # is fitted in closed form to the backbone's features (einspace.evaluators.head_fit)
    head_init: str = "random"
    # the look at 0 epochs fits the head to this many training examples: its forward passes over
    # them are most of its cost (einspace.evaluators.head_fit)
    look_examples: int = FIT_EXAMPLES
    param_groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # see evaluators.optim
    auxiliary_losses: dict[str, Any] = field(default_factory=dict)  # see evaluators.auxiliary
    metric: str | None = None  # accuracy | relative_l2; None: what the dataset's targets imply
    # budgets, checked from the analytic counts before anything is built (None: unlimited)
    max_params: int | None = None
    max_flops: int | None = None
    max_activation_mb: float | None = None
    max_seconds: float | None = None  # wall-clock budget for one evaluation
    latency_batch_size: int | None = None  # measure `latency_ms` of a forward pass at this batch (None: not)
    predicted_time_margin: float = 3.0  # refuse trees predicted to take more than this x max_seconds
    # the epochs of the top rung when this run is a lower rung of a multi-fidelity search (set by
    # the search): a tree whose training for that many epochs is predicted beyond the margin is
    # refused at every rung, since it could never be trained at the top
    top_epochs: int | None = None
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
    # evolution: a child starts from its parent's trained weights where the variation left the
    # parent unchanged (einspace.evaluators.inheritance; the search keeps the parents' weights)
    inherit_weights: bool = False

    def __post_init__(self) -> None:
        require(
            isinstance(self.milestones, (list, tuple))
            and all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in self.milestones),
            f"setting milestones must be a list of fractions in (0, 1), got {self.milestones!r}",
        )
        object.__setattr__(self, "milestones", tuple(float(m) for m in self.milestones))
        for name, least in (("epochs", 0), ("batch_size", 1), ("eval_batch_size", 1), ("look_examples", 2)):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= least,
                f"setting {name} must be an integer >= {least}, got {value!r}",
            )
        top = self.top_epochs
        require(
            top is None or isinstance(top, int) and not isinstance(top, bool) and top >= self.epochs,
            f"setting top_epochs must be null or an integer >= epochs ({self.epochs}), got {top!r}",
        )
        for name in ("lr", "momentum", "weight_decay", "gamma", "label_smoothing"):
            value = getattr(self, name)
            require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                f"setting {name} must be a number >= 0, got {value!r}"
                + (" (YAML reads 1.0e9 as text; write 1.0e+9)" if isinstance(value, str) else ""),
            )
        for name, choices in (
            ("optimizer", OPTIMIZERS),
            ("schedule", SCHEDULES),
            ("head_pooling", HEAD_POOLINGS),
            ("head_init", HEAD_INITS),
            ("step_mode", STEP_MODES),
        ):
            value = getattr(self, name)
            require(value in choices, f"setting {name} must be one of {', '.join(choices)}, got {value!r}")
        require(all(0 < m < 1 for m in self.milestones), "setting milestones must be fractions in (0, 1)")
        require(self.label_smoothing < 1, "setting label_smoothing must be below 1")
        require(
            self.channels_last in ("auto", True, False), "setting channels_last must be auto, true or false"
        )
        require(
            isinstance(self.inherit_weights, bool),
            f"setting inherit_weights must be true or false, got {self.inherit_weights!r}",
        )
        require(
            self.metric in (None, "accuracy", "relative_l2"),
            f"unknown metric {self.metric!r}; expected accuracy or relative_l2",
        )
        for name in ("train_subset", "valid_subset", "max_seconds", "threads", "max_grad_norm"):
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

    def optimizer_options(self) -> dict[str, Any]:
        """`build_optimizer`'s options from these settings (all but the schedule's length)."""
        names = (
            "optimizer",
            "lr",
            "momentum",
            "weight_decay",
            "nesterov",
            "schedule",
            "milestones",
            "gamma",
            "max_grad_norm",
        )
        return {**{name: getattr(self, name) for name in names}, "overrides": self.param_groups}

    def budget_settings(self) -> dict[str, Any]:
        return {
            "max_params": self.max_params,
            "max_flops": self.max_flops,
            "max_activation_mb": self.max_activation_mb,
            "batch_size": self.batch_size,
        }
