"""The aten operations a computation runs, each with its operands' shapes, strides and dtypes: to
compare, kernel for kernel, two models that compute the same function (a lowered seed and its
hand-written model), where a transposed operand or a row-major weight means copies and slower
kernels on any device.

    with OpTrace() as trace:
        model(x).sum().backward()
    print("\\n".join(differences(expected.lines, trace.lines)))
"""

from __future__ import annotations

import difflib
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpTrace", "differences"]


class OpTrace(TorchDispatchMode):
    """Records each operation as "name operand operand -> result". Views and aliases (which move
    no data) are left out: their effect shows in the next operand's strides. The operands of
    `add` and `mul` are sorted: their order does not change the result."""

    VIEWS = frozenset(
        ("view", "_unsafe_view", "t", "transpose", "permute", "detach", "alias", "unsqueeze", "expand")
    )
    COMMUTATIVE = frozenset(("add", "mul"))

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    @property
    def names(self) -> list[str]:
        """The operations' names, in order."""
        return [line.split(" ", 1)[0] for line in self.lines]

    @staticmethod
    def describe(value: object) -> str:
        """shape/strides/dtype of a tensor (or of each tensor in a list); "" for anything else."""
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            return f"{tuple(value.shape)}/{tuple(value.stride())}/{dtype}"
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return "[" + ", ".join(OpTrace.describe(v) for v in value) + "]"
        return ""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in self.VIEWS:
            operands = [d for d in map(self.describe, args) if d]
            if name in self.COMMUTATIVE:
                operands.sort()
            self.lines.append(f"{name} {' '.join(operands)} -> {self.describe(out)}")
        return out


def differences(expected: list[str], actual: list[str], a: str = "expected", b: str = "actual") -> list[str]:
    """The lines where two traces differ: "- a ..." for what only the first ran, "+ b ..." for
    what only the second ran, in order."""
    width = max(len(a), len(b))
    out = []
    matcher = difflib.SequenceMatcher(None, expected, actual, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            out += [f"  - {a:<{width}}  {line}" for line in expected[i1:i2]]
            out += [f"  + {b:<{width}}  {line}" for line in actual[j1:j2]]
    return out
