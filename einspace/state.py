"""Feature attributes carried by grammar symbols: shape, mode, pending folds; a signal is b of them."""

from __future__ import annotations

from typing import NamedTuple

from einspace.errors import EinspaceError

IM = "im"
COL = "col"
MODES = (IM, COL)
RANK_OF_MODE = {IM: 3, COL: 2}


class FeatureState(NamedTuple):
    """The attributes of one feature tensor, without the batch dimension.

    shape: (C, H, W) in `im` mode, (S, D) in `col` mode (a permute may reorder the axes
    without changing the mode label, as in the paper).
    folds: the (h_out, w_out) recorded by each enclosing `im2col` whose `col2im` is still
    to come, innermost last (paper App. A.3).

    A NamedTuple because the sampler creates millions of these: cheap, immutable, hashable.
    """

    shape: tuple[int, ...]
    mode: str
    folds: tuple[tuple[int, int], ...] = ()

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.mode}[{dims}]"


#: The attributes at one point of a derivation: one FeatureState per parallel branch.
#: Its length is the paper's branching factor b (1 outside a branching module).
Signal = tuple[FeatureState, ...]


def branching(signal: Signal) -> int:
    """The branching factor b of a signal."""
    return len(signal)


def describe(signal: Signal) -> str:
    """Human-readable form of a signal: `im[3x32x32]`, `4 x col[64x16]` (equal branches) or
    `2 x (col[64x16], col[64x32])`."""
    if len(signal) == 1:
        return str(signal[0])
    if all(s == signal[0] for s in signal):
        return f"{len(signal)} x {signal[0]}"
    return f"{len(signal)} x ({', '.join(str(s) for s in signal)})"


def input_state(shape: tuple[int, ...] | list[int], mode: str | None = None) -> FeatureState:
    """The state of a network input; the mode follows from the rank unless given."""
    shape = tuple(int(d) for d in shape)
    if mode is None:
        mode = {3: IM, 2: COL}.get(len(shape))
        if mode is None:
            raise EinspaceError(
                f"input shape {shape} has {len(shape)} dimensions; give C,H,W (im mode) or S,D (col mode)"
            )
    if mode not in MODES:
        raise EinspaceError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if len(shape) != RANK_OF_MODE[mode]:
        raise EinspaceError(f"{mode} mode needs {RANK_OF_MODE[mode]} dimensions, got shape {shape}")
    if any(d <= 0 for d in shape):
        raise EinspaceError(f"input shape {shape} must be positive")
    return FeatureState(shape, mode)


def parse_input(text: str, mode: str | None = None) -> FeatureState:
    """Parse a CLI input such as `3,32,32` (im) or `64,128` (col)."""
    parts = text.replace("x", ",").split(",")
    if not all(part.strip().isdigit() for part in parts):
        raise EinspaceError(
            f"cannot read input shape {text!r}: expected positive integers separated by commas, "
            "like 3,32,32 (im: C,H,W) or 64,128 (col: S,D)"
        )
    return input_state([int(part) for part in parts], mode)
