"""Datasets as fixed train/valid/test arrays: the Unseen NAS `.npy` layout, `.npz` files, built-ins.

Nothing here downloads anything. A dataset is whatever arrays a user points at (a directory
with `train_x.npy ... test_y.npy`, or one `.npz` with the same keys) or a built-in generated
from data shipped in the package (`einspace.evaluators.builtin`). The input shape and the
number of classes are read from the arrays, and every way the arrays can be malformed is
reported as an EinspaceError that names the file and what is wrong, before any training.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from einspace.bundled import names_bundled
from einspace.errors import EinspaceError

__all__ = ["SPLITS", "Dataset", "list_datasets", "load_arrays", "load_dataset"]

#: The split names, in the order of the Unseen NAS file names.
SPLITS = ("train", "valid", "test")
_KEYS = tuple(f"{split}_{part}" for split in SPLITS for part in ("x", "y"))


@dataclass(frozen=True, eq=False)
class Dataset:
    """Images (N, C, H, W) or sequences (N, S, D) as float32 with, for each split, integer
    labels (N,) in [0, classes) (classification) or float targets (N, C', H', W') (dense
    regression; `classes` is 0). Validated on construction."""

    name: str
    train_x: np.ndarray = field(repr=False)
    train_y: np.ndarray = field(repr=False)
    valid_x: np.ndarray = field(repr=False)
    valid_y: np.ndarray = field(repr=False)
    test_x: np.ndarray = field(repr=False)
    test_y: np.ndarray = field(repr=False)
    classes: int = 0  # 0: one more than the largest training label
    description: str = ""

    def __post_init__(self) -> None:
        arrays = {key: getattr(self, key) for key in _KEYS}
        checked = _validate(arrays, self.name, self.classes or None)
        for key, value in checked.items():
            object.__setattr__(self, key, value)
        if not self.classes and self.task == "classification":
            object.__setattr__(self, "classes", int(checked["train_y"].max()) + 1)

    @property
    def task(self) -> str:
        """`classification` (integer labels (N,)) or `regression` (dense targets (N, C, H, W))."""
        return "classification" if self.train_y.ndim == 1 else "regression"

    @property
    def target_shape(self) -> tuple[int, ...]:
        """The shape of one target without the batch axis: () for a class label."""
        return tuple(int(d) for d in self.train_y.shape[1:])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example without the batch axis: (C, H, W) or (S, D)."""
        return tuple(int(d) for d in self.train_x.shape[1:])

    def input_problem(self, input: Any) -> str | None:
        """Why a network for `input` (a FeatureState) cannot take these examples (None: it can)."""
        if tuple(input.shape) == self.input_shape:
            return None
        shape = "x".join(map(str, self.input_shape))
        return (
            f"the task's input {input} does not match dataset {self.name!r}, whose examples "
            f"have shape {shape}"
        )

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of split `train`, `valid` or `test`."""
        if name not in SPLITS:
            raise EinspaceError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        return getattr(self, f"{name}_x"), getattr(self, f"{name}_y")

    def sizes(self) -> dict[str, int]:
        return {name: len(self.split(name)[1]) for name in SPLITS}

    def summary(self) -> str:
        """One line: name, input shape, classes and split sizes."""
        shape = "x".join(map(str, self.input_shape))
        sizes = "/".join(str(n) for n in self.sizes().values())
        if self.task == "regression":
            what = f"dense targets {'x'.join(map(str, self.target_shape))}"
        else:
            what = f"{self.classes} classes"
        return f"{self.name}: input {shape}, {what}, train/valid/test {sizes}"


def _validate(arrays: dict[str, np.ndarray], name: str, classes: int | None) -> dict[str, np.ndarray]:
    """Convert to float32 features and int64 labels, checking everything a training run relies on."""
    out: dict[str, np.ndarray] = {}
    feature_shape: tuple[int, ...] | None = None
    for split in SPLITS:
        x, y = np.asarray(arrays[f"{split}_x"]), np.asarray(arrays[f"{split}_y"])
        where = f"{name}: {split}_x"
        if x.dtype.kind not in "biuf":
            raise EinspaceError(f"{where} has dtype {x.dtype}; expected numbers")
        if x.ndim not in (3, 4):
            raise EinspaceError(
                f"{where} has shape {x.shape}; expected images (N, C, H, W) or sequences (N, S, D)"
            )
        if len(x) == 0:
            raise EinspaceError(f"{where} is empty")
        if feature_shape is None:
            feature_shape = x.shape[1:]
        elif x.shape[1:] != feature_shape:
            raise EinspaceError(
                f"{where} has examples of shape {x.shape[1:]} but train_x has {feature_shape}"
            )
        x = x.astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            bad = int((~np.isfinite(x)).sum())
            raise EinspaceError(f"{where} contains {bad} NaN or infinite values")
        if y.ndim not in (1, 3, 4):
            raise EinspaceError(
                f"{name}: {split}_y has shape {y.shape}; expected labels (N,) or dense targets "
                "(N, H, W) or (N, C, H, W)"
            )
        if len(y) != len(x):
            raise EinspaceError(f"{name}: {split}_y has {len(y)} labels for {len(x)} examples in {split}_x")
        if y.ndim > 1 or (split != "train" and out["train_y"].ndim > 1):
            out[f"{split}_x"], out[f"{split}_y"] = x, _dense_targets(y, name, split, out.get("train_y"))
            continue
        if y.dtype.kind == "f":
            if not np.isfinite(y).all() or (y != np.round(y)).any():
                raise EinspaceError(f"{name}: {split}_y has non-integer labels; expected class indices")
        elif y.dtype.kind not in "biu":
            raise EinspaceError(f"{name}: {split}_y has dtype {y.dtype}; expected integer class indices")
        y = y.astype(np.int64)
        if y.min() < 0:
            raise EinspaceError(f"{name}: {split}_y has a negative label {int(y.min())}")
        if classes is None and split == "train":
            classes = _classes_from_labels(y, name)
        if classes is not None and y.max() >= classes:
            raise EinspaceError(
                f"{name}: {split}_y has label {int(y.max())} out of range: the training labels give "
                f"{classes} classes (0..{classes - 1})"
            )
        out[f"{split}_x"], out[f"{split}_y"] = x, y
    return out


def _classes_from_labels(y: np.ndarray, name: str) -> int:
    """The class count the training labels imply, 1 + the largest; refused when it cannot be a
    classification (one class) or when the labels leave most of 0..max unused (labels that are
    ids or codes rather than class indices: a head of that width would train to nothing)."""
    classes = int(y.max()) + 1
    used = len(np.unique(y))
    if used < 2:
        label = int(y.max())
        raise EinspaceError(f"{name}: train_y has one class ({label}); a classification needs two or more")
    if used < classes / 2:
        raise EinspaceError(
            f"{name}: train_y uses {used} distinct labels but the largest is {classes - 1}; class labels "
            f"must be 0..classes-1 (relabel them, e.g. with numpy.unique(y, return_inverse=True))"
        )
    return classes


def _dense_targets(y: np.ndarray, name: str, split: str, train_y: np.ndarray | None) -> np.ndarray:
    """Float targets (N, C, H, W) for dense regression; (N, H, W) gains a channel axis."""
    if y.ndim == 1 or y.dtype.kind not in "biuf":
        raise EinspaceError(
            f"{name}: {split}_y has shape {y.shape} and dtype {y.dtype}; train_y holds dense targets, "
            "so every split needs numeric targets of the same shape"
        )
    y = (y[:, None] if y.ndim == 3 else y).astype(np.float32)
    if train_y is not None and y.shape[1:] != train_y.shape[1:]:
        raise EinspaceError(
            f"{name}: {split}_y has targets of shape {y.shape[1:]} but train_y has {train_y.shape[1:]}"
        )
    if not np.isfinite(y).all():
        raise EinspaceError(
            f"{name}: {split}_y contains {int((~np.isfinite(y)).sum())} NaN or infinite values"
        )
    return y


def load_arrays(path: str | Path, name: str | None = None) -> Dataset:
    """A dataset from a directory of Unseen NAS `.npy` files or from one `.npz` with the same keys.

    Arrays are loaded without pickle (a data file cannot run code).
    """
    path = Path(path)
    name = name or path.stem
    if path.is_dir():
        missing = [key for key in _KEYS if not (path / f"{key}.npy").is_file()]
        if missing:
            files = ", ".join(f"{k}.npy" for k in missing)
            raise EinspaceError(
                f"dataset directory {path} lacks {files} (the Unseen NAS layout has "
                f"{', '.join(f'{k}.npy' for k in _KEYS)})"
            )
        arrays = {key: _load_npy(path / f"{key}.npy") for key in _KEYS}
    elif path.is_file():
        try:
            with np.load(path, allow_pickle=False) as data:
                missing = [key for key in _KEYS if key not in data.files]
                if missing:
                    raise EinspaceError(
                        f"{path} lacks the array(s) {', '.join(missing)} (it has {', '.join(data.files)})"
                    )
                arrays = {key: data[key] for key in _KEYS}
        except (OSError, ValueError) as exc:
            raise EinspaceError(f"cannot read {path} as a .npz file: {exc}") from None
    else:
        raise EinspaceError(f"no dataset at {path}")
    try:
        return Dataset(name, **arrays)
    except EinspaceError as exc:
        raise EinspaceError(f"{exc} (in {path})") from None


def _load_npy(path: Path) -> np.ndarray:
    """The array memory-mapped read-only: worker processes on one machine share its pages (the
    page cache) instead of each holding a copy, and only what is used is read."""
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise EinspaceError(f"cannot read {path} as a .npy file: {exc}") from None


def list_datasets() -> dict[str, str]:
    """Built-in dataset name -> one-line description."""
    from einspace.evaluators.builtin import BUILTINS

    return {name: entry.description for name, entry in BUILTINS.items()}


def load_dataset(name_or_path: str | Path) -> Dataset:
    """A built-in dataset by name, or a dataset directory / `.npz` file by path: a plain name that
    is a built-in's means the built-in, whatever the working directory holds (the rule of
    `einspace.bundled.names_bundled`; a folder `digits` there is reached as ./digits).

    Cached per process (a worker evaluating many trees loads its data once); a file that
    changes on disk is read again.
    """
    from einspace.evaluators.builtin import BUILTINS

    key = str(name_or_path)
    if names_bundled(name_or_path, BUILTINS):
        return _builtin(key)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        names = ", ".join(sorted(BUILTINS))
        raise EinspaceError(
            f"no built-in dataset or path {key!r} (built-ins: {names}; or give a directory of "
            "train_x.npy ... test_y.npy, or a .npz file with those keys)"
        )
    stamp = max((p.stat().st_mtime_ns for p in path.glob("*.npy")), default=path.stat().st_mtime_ns)
    return _from_path(str(path.resolve()), stamp)


@functools.lru_cache(maxsize=8)
def _builtin(name: str) -> Dataset:
    from einspace.evaluators.builtin import BUILTINS

    return BUILTINS[name].build()


@functools.lru_cache(maxsize=4)
def _from_path(path: str, stamp: int) -> Dataset:
    return load_arrays(path)
