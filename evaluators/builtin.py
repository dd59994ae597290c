"""Built-in datasets small enough for a laptop: the 8x8 digits and AddNIST/MultNIST-style composites.

The digits (1797 images, UCI / scikit-learn, see `data/README.md`) ship in the package; the
composites are generated from them at load time. Every split is fixed: a permutation drawn
from a constant seed, so a dataset name means the same arrays on every machine. Composite
examples of a split are built only from digit images of the same split, so no test image
leaks into training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import numpy as np

from einspace.evaluators.datasets import Dataset

__all__ = ["BUILTINS", "BuiltinDataset", "digit_splits"]

#: How the 1797 digits are split: the rest goes to train.
_DIGITS_VALID, _DIGITS_TEST = 350, 350
#: Composite examples per split, and the constant seeds that fix everything.
_COMPOSITE_SIZES = {"train": 4000, "valid": 1000, "test": 1000}
_SPLIT_SEED, _COMPOSITE_SEED = 0, 1


@dataclass(frozen=True)
class BuiltinDataset:
    """A named generator of a Dataset, with the line `einspace datasets` prints."""

    name: str
    description: str
    make: Callable[[], dict[str, np.ndarray]]
    classes: int

    def build(self) -> Dataset:
        return Dataset(self.name, **self.make(), classes=self.classes, description=self.description)


def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    with resources.files("einspace.evaluators").joinpath("data", "digits.npz").open("rb") as f:
        with np.load(f, allow_pickle=False) as data:
            return data["images"], data["labels"]


def digit_splits() -> dict[str, np.ndarray]:
    """The digits as (N, 1, 8, 8) float32 in [0, 1] with labels, split 1097/350/350."""
    images, labels = _raw_digits()
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(labels))
    x = (images.astype(np.float32) / 16.0)[order, None]
    y = labels.astype(np.int64)[order]
    cut = (len(y) - _DIGITS_VALID - _DIGITS_TEST, len(y) - _DIGITS_TEST)
    parts = {"train": slice(0, cut[0]), "valid": slice(cut[0], cut[1]), "test": slice(cut[1], None)}
    out: dict[str, np.ndarray] = {}
    for split, where in parts.items():
        out[f"{split}_x"], out[f"{split}_y"] = x[where], y[where]
    return out


def _composite(label: Callable[[np.ndarray], np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
    """Three digit images stacked as channels (3, 8, 8); the label is `label` of their three
    digit labels (as AddNIST and MultNIST do with MNIST, paper App. B.2)."""

    def make() -> dict[str, np.ndarray]:
        digits = digit_splits()
        rng = np.random.default_rng(_COMPOSITE_SEED)
        out: dict[str, np.ndarray] = {}
        for split, size in _COMPOSITE_SIZES.items():
            x, y = digits[f"{split}_x"], digits[f"{split}_y"]
            picks = rng.integers(0, len(y), size=(size, 3))
            out[f"{split}_x"] = x[picks, 0]  # (size, 3, 8, 8): one digit per channel
            out[f"{split}_y"] = label(y[picks]).astype(np.int64)
        return out

    return make


BUILTINS: dict[str, BuiltinDataset] = {
    entry.name: entry
    for entry in (
        BuiltinDataset(
            "digits",
            "8x8 handwritten digits (UCI via scikit-learn), 1x8x8, 10 classes",
            digit_splits,
            10,
        ),
        BuiltinDataset(
            "adddigits",
            "three digits stacked as channels, label = their sum mod 10 (AddNIST-style), 3x8x8",
            _composite(lambda d: d.sum(axis=1) % 10),
            10,
        ),
        BuiltinDataset(
            "multdigits",
            "three digits stacked as channels, label = their product mod 10 (MultNIST), 3x8x8",
            _composite(lambda d: d.prod(axis=1) % 10),
            10,
        ),
    )
}
