"""What a trainable terminal may add to a network besides weights: architecture parameters and
auxiliary losses.

Architecture parameters (XD-operations' K-matrices, DNArch mask cut-offs) describe the
operation rather than the function it computes from given weights, and usually want an
optimiser of their own (Adam with a warm-up, no weight decay). A module declares them by
local name with `mark_architecture(module, "name", ...)`; the declaration lives on the module,
so it survives `copy.deepcopy`, `.to(device)` and lowering. The training evaluator puts them
in the `architecture` parameter group (einspace.evaluators.optim).

Auxiliary losses are terms added to the training objective. A module provides its own by
defining a method `auxiliary_losses(self) -> dict[str, Tensor]`, called after each forward
pass; the trainer sums equal names over all modules. A term that depends on the whole
network (DNArch's complexity loss, a function of the total cost) is a *network loss*:
registered by name with `register_network_loss`, built once per training run from the
network and its checked tree, and switched on by naming it in the evaluator's
`auxiliary_losses` setting. Each term is multiplied by its weight from that setting (1 when
not set), added to the loss and reported among the metrics.

Two more optional module methods: `constrain_architecture(self)`, called without gradients
after every optimiser step (to clamp mask parameters into range, as DNArch does), and
`architecture_metrics(self) -> dict[str, float]`, read once after training (effective kernel
sizes, widths, ...), reported under the module's path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch
from torch import nn

from einspace.registry import Registry

__all__ = [
    "ARCHITECTURE",
    "NETWORK_LOSSES",
    "NetworkLoss",
    "architecture_metrics",
    "architecture_parameters",
    "auxiliary_loss_modules",
    "auxiliary_losses",
    "build_network_loss",
    "check_network_loss",
    "constrain_architecture",
    "is_architecture_parameter",
    "mark_architecture",
    "network_losses",
    "register_network_loss",
]

#: The parameter group of architecture parameters.
ARCHITECTURE = "architecture"
#: The module attribute holding the local names of its architecture parameters.
_DECLARED = "einspace_architecture"


def mark_architecture(module: nn.Module, *names: str) -> None:
    """Declare parameters of `module`, by their local names, as architecture parameters."""
    own = dict(module.named_parameters(recurse=False))
    for name in names:
        if name not in own:
            raise ValueError(
                f"{type(module).__name__} has no parameter {name!r} of its own to mark "
                f"(it has {', '.join(own) or 'none'})"
            )
    declared = tuple(getattr(module, _DECLARED, ()))
    setattr(module, _DECLARED, declared + tuple(n for n in names if n not in declared))


def is_architecture_parameter(module: nn.Module, name: str) -> bool:
    """Whether `module`'s own parameter `name` was declared an architecture parameter."""
    return name in getattr(module, _DECLARED, ())


def architecture_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(qualified name, parameter) of every architecture parameter in `model`."""
    for prefix, module in model.named_modules():
        for name in getattr(module, _DECLARED, ()):
            yield (f"{prefix}.{name}" if prefix else name), getattr(module, name)


def auxiliary_loss_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that provide auxiliary loss terms (found once, used every step)."""
    return [m for m in model.modules() if callable(getattr(m, "auxiliary_losses", None))]


def auxiliary_losses(model: nn.Module, modules: list[nn.Module] | None = None) -> dict[str, torch.Tensor]:
    """The auxiliary loss terms of every module of `model` (or of `modules`, from
    `auxiliary_loss_modules`), equal names summed, unweighted."""
    terms: dict[str, torch.Tensor] = {}
    for module in auxiliary_loss_modules(model) if modules is None else modules:
        for name, value in module.auxiliary_losses().items():
            terms[name] = terms[name] + value if name in terms else value
    return terms


@torch.no_grad()
def constrain_architecture(model: nn.Module) -> None:
    """Let every module that has one run its `constrain_architecture` (after an optimiser step)."""
    for module in model.modules():
        constrain = getattr(module, "constrain_architecture", None)
        if callable(constrain):
            constrain()


def architecture_metrics(model: nn.Module) -> dict[str, float]:
    """`architecture_metrics()` of every module that has it, keyed `arch/<module path>/<name>`."""
    metrics: dict[str, float] = {}
    for prefix, module in model.named_modules():
        report = getattr(module, "architecture_metrics", None)
        if callable(report):
            for name, value in report().items():
                metrics[f"arch/{prefix or 'network'}/{name}"] = float(value)
    return metrics


class NetworkLoss(Protocol):
    """A loss term over the whole network, built once per training run."""

    def loss(self) -> torch.Tensor:
        """The unweighted term, differentiable in the network's parameters."""
        ...

    def metrics(self) -> dict[str, float]:
        """What to report about it after training (e.g. effective and nominal cost)."""
        ...


#: Builds a NetworkLoss from (network, checked tree, options from the settings).
NetworkLossFactory = Callable[..., NetworkLoss]


class _NamedFactory:
    """A network loss factory under its registered name, with the factory's signature (the
    registry checks options against it) and module (a built-in registers without a detour)."""

    def __init__(self, name: str, factory: NetworkLossFactory, check: Callable[..., None] | None):
        self.name, self.factory, self.check = name, factory, check
        self.__signature__ = inspect.signature(factory)
        self.__module__ = factory.__module__

    def __call__(self, *args: Any, **kwargs: Any) -> NetworkLoss:
        return self.factory(*args, **kwargs)

    def __repr__(self) -> str:
        return f"network loss {self.name!r} ({self.__module__})"


#: The operation modules that define network losses (DNArch's complexity).
NETWORK_LOSSES: Registry[_NamedFactory] = Registry("network loss", builtins=("einspace.ops._dnarch_modules",))


def register_network_loss(
    name: str, check: Callable[..., None] | None = None
) -> Callable[[NetworkLossFactory], NetworkLossFactory]:
    """Decorator: register a network loss factory `(network, checked, **options) -> NetworkLoss`.
    `check(**options)`, if given, raises EinspaceError for bad option values: it runs before a
    search starts, when there is no network yet."""

    def register(factory: NetworkLossFactory) -> NetworkLossFactory:
        NETWORK_LOSSES.register(_NamedFactory(name, factory, check))
        return factory

    return register


def check_network_loss(name: str, options: Mapping[str, Any]) -> None:
    """The option names of network loss `name` against its factory, and their values with its
    `check`, without building it (an unknown name suggests the registered ones)."""
    NETWORK_LOSSES.check_settings(name, options, None, None)  # network and checked tree: later
    entry = NETWORK_LOSSES.get(name)
    if entry.check is not None:
        entry.check(**options)


def network_losses() -> list[str]:
    """Names of the registered network losses (the built-in ones loaded first)."""
    return NETWORK_LOSSES.names()


def build_network_loss(
    name: str, network: nn.Module, checked: Any, options: Mapping[str, Any]
) -> NetworkLoss:
    """The network loss `name` for one training run, built with `options` from the settings (an
    option its factory does not take is an error naming it)."""
    return NETWORK_LOSSES.create(name, options, network, checked)
