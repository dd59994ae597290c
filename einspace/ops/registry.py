"""The one registry of terminal operations, and the contract every operation fulfils."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import nn

from einspace.errors import EinspaceError, Infeasible, UnknownOperationError
from einspace.registry import Registry
from einspace.state import Signal

#: Argument values of an operation call, in the operation's declared argument order.
Args = tuple[tuple[str, Any], ...]


class Group(str, Enum):
    """The paper's four function groups (Sec. 3.1), by how many tensors go in and out."""

    BRANCHING = "branching"  # one to many
    AGGREGATION = "aggregation"  # many to one
    ROUTING = "routing"  # one to one, moves content without changing it
    COMPUTATION = "computation"  # one to one, changes content


@dataclass(frozen=True)
class Argument:
    """One argument an operation takes: its name, Python type and a check of its value.

    `check` returns None for a good value, or a short phrase saying what is wrong with it.
    """

    name: str
    kind: type
    check: Callable[[Any], str | None] = lambda value: None
    doc: str = ""


class Operation:
    """A terminal operation: the contract sampler, checker and compiler share.

    Subclasses set `name`, `group`, `arguments`, and implement `infer` (how the operation
    transforms a signal, raising `Infeasible` with a reason when it cannot apply) and `build`
    (a torch module). `param_count` and `flops` are computed from the signal alone, so a
    budget can be enforced without instantiating anything.

    Module calling conventions by group: computation and routing modules map a tensor to a
    tensor; branching modules map a tensor to a list of tensors; aggregation modules map a
    list of tensors to a tensor. Tensors carry a leading batch dimension; signals do not.
    """

    name: ClassVar[str]
    group: ClassVar[Group]
    arguments: ClassVar[tuple[Argument, ...]] = ()
    description: ClassVar[str] = ""
    #: A routing or computation operation normally acts on one tensor, so it is never offered
    #: where several branches are in flight. One whose module takes and returns the list of
    #: branches sets this, and its `infer` then sees every branch.
    takes_branches: ClassVar[bool] = False
    #: Whether einspace.network.export can write what `build` returns as plain PyTorch. Export
    #: writes modules by their type and knows those of einspace's own operations (and torch's
    #: nn.Linear, norms, nn.LeakyReLU, nn.Softmax and nn.Identity), so an operation whose modules
    #: are among them sets this; any other is refused by name, with `export_refusal` if it says why.
    exportable: ClassVar[bool] = False
    export_refusal: ClassVar[str] = ""

    def transfer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        """What the sampler and checker call: the branch count the group needs (one for
        branching, routing and computation; two or more for aggregation), then `infer`. So an
        operation written for one tensor is never applied to several, whatever its `infer` says."""
        b = len(signal)
        if self.group is Group.AGGREGATION and b < 2:
            raise infeasible(f"{self.name} is an aggregation and needs at least 2 branches, got {b}")
        if self.group is not Group.AGGREGATION and b != 1 and not self.takes_branches:
            raise infeasible(f"{self.name} acts on one tensor, and {b} branches are in flight")
        try:
            return self.infer(signal, args)
        except EinspaceError:  # Infeasible included: the operation said why it cannot apply
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in an operation becomes a sentence naming it
            raise OperationFailed(self, "infer", exc) from None

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        raise NotImplementedError

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        raise NotImplementedError

    def param_count(self, signal: Signal, args: Mapping[str, Any]) -> int:
        """Trainable parameters of the module `build` would return (default: none)."""
        return 0

    def flops(self, signal: Signal, args: Mapping[str, Any]) -> int:
        """Floating-point operations for one sample (a multiply-add counts 2) (default: none)."""
        return 0

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        """How the operation maps (mode, branching factor), ignoring shapes; None if it cannot apply.

        Used by the grammar analysis, which knows no shapes. The default follows the group:
        one-to-one operations need b == 1 and keep the mode; branching sets b from the
        argument `b`; aggregation merges any b >= 2 into one.
        """
        if self.group is Group.BRANCHING:
            return (mode, int(args["b"])) if b == 1 else None
        if self.group is Group.AGGREGATION:
            return (mode, 1) if b >= 2 else None
        return (mode, 1) if b == 1 else None

    def __repr__(self) -> str:
        return f"<operation {self.name} ({self.group.value})>"


class OperationFailed(EinspaceError):
    """An operation's own code raised (a bug, typically in a plugin): names the operation, where
    it is defined, and the line that failed."""

    def __init__(self, op: Operation, method: str, exc: Exception):
        from einspace.plugins import where_failed

        source, defined = defined_at(type(op))
        super().__init__(
            f"operation {op.name!r} (defined at {defined}) failed in {method}: {where_failed(exc, source)}"
        )


def defined_at(cls: type) -> tuple[str | None, str]:
    """(the source file, `file:line`) of an operation class; (None, its module) without source."""
    try:
        source = inspect.getsourcefile(cls)
        return source, f"{source}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        return None, cls.__module__


#: The built-in operations by the module that registers them. A look-up imports only the module of
#: the name looked up: sampling and checking a tree of the paper's operations import `core` alone,
#: whose modules are built through `torch_side`, so they never load torch (tests/test_layout.py
#: checks this table against the modules).
BUILTIN_OPERATIONS = {
    "einspace.ops.core": (
        "add",
        "clone",
        "col2im",
        "concat",
        "group_dim",
        "identity",
        "im2col",
        "leaky_relu",
        "linear",
        "matmul",
        "norm",
        "permute",
        "pos_enc",
        "softmax",
    ),
    "einspace.ops.dnarch": ("dnarch_depth", "dnarch_kernel", "dnarch_resolution", "dnarch_width"),
    "einspace.ops.nos": (
        "channel_attention",
        "channel_calibrate",
        "dynamic_calibrate",
        "dynamic_conv",
        "spatial_attention",
        "spatial_calibrate",
    ),
    "einspace.ops.xd": ("xd",),
    "einspace.ops.zoo": (
        "affine",
        "avg_pool",
        "channel_norm",
        "class_token",
        "depthwise_conv",
        "dropout",
        "first_token",
        "gelu",
        "grouped_conv",
        "hardswish",
        "layer_scale",
        "max_pool",
        "relu",
        "relu6",
        "silu",
        "squeeze_excite",
    ),
}

#: Every operation by name.
OPERATIONS: Registry[Operation] = Registry(
    "operation", builtins=BUILTIN_OPERATIONS, unknown_error=UnknownOperationError
)


def register_op(cls: type[Operation]) -> type[Operation]:
    """Class decorator: register one instance of an operation under `cls.name`.

    A second registration of the same name is an error, never a silent replacement.
    """
    if not isinstance(getattr(cls, "group", None), Group):
        raise EinspaceError(f"operation {getattr(cls, 'name', cls.__name__)!r} must set `group` to a Group")
    OPERATIONS.register(cls())
    return cls


def unregister_op(name: str) -> None:
    """Remove a registered operation (for user code and tests that register temporary ones)."""
    OPERATIONS.unregister(name)


def get_op(name: str) -> Operation:
    """The registered operation called `name`; an unknown name suggests close matches."""
    return OPERATIONS.get(name)


def has_op(name: str) -> bool:
    return name in OPERATIONS


def list_ops(pattern: str = "*") -> list[str]:
    """Names of registered operations matching a shell-style pattern, sorted."""
    return OPERATIONS.names(pattern)


def canonical_args(op: Operation, given: Mapping[str, Any]) -> Args:
    """Check argument names, types and values against `op` and order them as it declares.

    Raises EinspaceError with a message that names the argument; callers add the location.
    """
    declared = {a.name: a for a in op.arguments}
    for name in given:
        if name not in declared:
            expected = ", ".join(declared) or "no arguments"
            raise EinspaceError(f"operation {op.name!r} has no argument {name!r} (it takes {expected})")
    values = []
    for arg in op.arguments:
        if arg.name not in given:
            raise EinspaceError(f"operation {op.name!r} needs argument {arg.name!r}")
        value = given[arg.name]
        if arg.kind is int and isinstance(value, bool) or not isinstance(value, arg.kind):
            raise EinspaceError(
                f"argument {arg.name!r} of {op.name!r} must be {arg.kind.__name__}, got {value!r}"
            )
        problem = arg.check(value)
        if problem:
            raise EinspaceError(f"argument {arg.name!r} of {op.name!r} = {value!r}: {problem}")
        values.append((arg.name, value))
    return tuple(values)


def infeasible(reason: str) -> Infeasible:
    """Shorthand used by operations: `raise infeasible("kernel 16 larger than 8x8 input")`."""
    return Infeasible(reason)


def torch_side(name: str) -> ModuleType:
    """The module `name` (the torch modules an operation builds), executed at its first attribute
    access rather than now: an operation's shape rule, which sampling, checking and the search
    strategies use, then costs no torch import; only `build` does."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise EinspaceError(f"no module {name!r}")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module
