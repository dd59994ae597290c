"""Terminal operations: one registry, the paper's fundamentals in `core`."""

from einspace.ops.registry import (
    Args,
    Argument,
    Group,
    Operation,
    canonical_args,
    get_op,
    has_op,
    list_ops,
    register_op,
    unregister_op,
)

__all__ = [
    "Args",
    "Argument",
    "Group",
    "Operation",
    "canonical_args",
    "get_op",
    "has_op",
    "list_ops",
    "register_op",
    "unregister_op",
]
