"""Datasets: Unseen NAS layout and .npz load; malformed arrays get tested messages; built-ins are fixed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from einspace.errors import EinspaceError
from einspace.evaluators.builtin import BUILTINS
from einspace.evaluators.datasets import SPLITS, list_datasets, load_arrays, load_dataset

SIZES = {"train": 12, "valid": 5, "test": 6}


def _arrays(shape: tuple[int, ...] = (2, 4, 4), classes: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for split, n in SIZES.items():
        out[f"{split}_x"] = rng.normal(size=(n, *shape)).astype(np.float32)
        out[f"{split}_y"] = np.arange(n) % classes
    return out


def _write_dir(folder: Path, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir(exist_ok=True)
    for key, value in arrays.items():
        np.save(folder / f"{key}.npy", value)
    return folder


@pytest.mark.parametrize("shape", [(2, 4, 4), (7, 5)], ids=["im", "col"])
def test_unseen_nas_directory_and_npz_load_the_same(tmp_path: Path, shape: tuple[int, ...]) -> None:
    arrays = _arrays(shape)
    from_dir = load_dataset(_write_dir(tmp_path / "data", arrays))
    np.savez_compressed(tmp_path / "data.npz", **arrays)
    from_npz = load_dataset(str(tmp_path / "data.npz"))
    for data in (from_dir, from_npz):
        assert data.input_shape == shape
        assert data.classes == 3
        assert data.sizes() == SIZES
        assert data.train_x.dtype == np.float32 and data.train_y.dtype == np.int64
        np.testing.assert_array_equal(data.test_x, arrays["test_x"])
    assert from_dir.name == "data" and "3 classes" in from_dir.summary()


def _drop(key: str):
    return lambda a: {k: v for k, v in a.items() if k != key}


def _set(key: str, value):
    return lambda a: {**a, key: value(a[key]) if callable(value) else value}


def _nan(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[0, 0, 0, 0] = np.nan
    return x


#: (what is wrong, how to break the arrays, a regex the message must match)
BAD_ARRAYS = [
    ("missing file", _drop("test_y"), r"lacks .*test_y"),
    ("rank 2 images", _set("train_x", lambda x: x.reshape(len(x), -1)), r"expected images \(N, C, H, W\)"),
    ("labels 2-d", _set("valid_y", lambda y: y[:, None]), r"expected labels \(N,\)"),
    ("too few labels", _set("train_y", lambda y: y[:-1]), "11 labels for 12 examples"),
    ("shape mismatch", _set("valid_x", lambda x: x[:, :1]), r"but train_x has \(2, 4, 4\)"),
    ("NaN", _set("test_x", _nan), "NaN or infinite"),
    ("negative label", _set("train_y", lambda y: y - 1), "negative label -1"),
    ("label out of range", _set("test_y", lambda y: y + 5), "label 7 out of range"),
    ("fractional labels", _set("train_y", lambda y: y + 0.5), "non-integer labels"),
    ("text features", _set("train_x", lambda x: x.astype(str)), "expected numbers"),
    ("empty split", _set("valid_x", lambda x: x[:0]), "valid_x is empty"),
]


@pytest.mark.parametrize("what, breaks, message", BAD_ARRAYS, ids=[case[0] for case in BAD_ARRAYS])
@pytest.mark.parametrize("layout", ["dir", "npz"])
def test_malformed_arrays_are_named(tmp_path: Path, layout: str, what: str, breaks, message: str) -> None:
    arrays = breaks(_arrays())
    if layout == "dir":
        path = _write_dir(tmp_path / "data", arrays)
    else:
        path = tmp_path / "data.npz"
        np.savez(path, **arrays)
    with pytest.raises(EinspaceError) as info:
        load_arrays(path)
    assert re.search(message, str(info.value)), str(info.value)


def test_unknown_names_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(EinspaceError, match="no built-in dataset or path 'mnist'.*digits"):
        load_dataset("mnist")
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    with pytest.raises(EinspaceError, match="cannot read"):
        load_dataset(bad)
    folder = _write_dir(tmp_path / "pickled", _arrays())
    np.save(folder / "train_y.npy", np.array([object()] * 12), allow_pickle=True)
    with pytest.raises(EinspaceError, match="cannot read .*train_y.npy"):
        load_arrays(folder)


@pytest.mark.parametrize(
    "name, shape, sizes",
    [
        ("digits", (1, 8, 8), {"train": 1097, "valid": 350, "test": 350}),
        ("adddigits", (3, 8, 8), {"train": 4000, "valid": 1000, "test": 1000}),
        ("multdigits", (3, 8, 8), {"train": 4000, "valid": 1000, "test": 1000}),
    ],
)
def test_builtin_shapes_and_splits(name: str, shape: tuple[int, ...], sizes: dict[str, int]) -> None:
    data = load_dataset(name)
    assert name in list_datasets()
    assert data.input_shape == shape and data.classes == 10 and data.sizes() == sizes
    assert 0.0 <= data.train_x.min() and data.train_x.max() <= 1.0
    assert set(np.unique(data.train_y)) == set(range(10))


def test_builtins_are_deterministic_and_splits_disjoint() -> None:
    first = BUILTINS["adddigits"].build()
    second = BUILTINS["adddigits"].build()
    for split in SPLITS:
        np.testing.assert_array_equal(first.split(split)[0], second.split(split)[0])
        np.testing.assert_array_equal(first.split(split)[1], second.split(split)[1])
    digits = load_dataset("digits")
    rows = {split: {x.tobytes() for x in digits.split(split)[0]} for split in SPLITS}
    # The UCI digits contain a few duplicate images; the splits share almost none.
    assert len(rows["train"] & rows["test"]) < 5 and len(rows["valid"] & rows["test"]) < 5


def test_composite_labels_follow_their_channels() -> None:
    """Each composite channel is a digit image; the label is the sum (add) or product (mult) mod 10."""
    digits = load_dataset("digits")
    lookup = {x.tobytes(): int(y) for x, y in zip(digits.test_x[:, 0], digits.test_y, strict=True)}
    for name, rule in (("adddigits", sum), ("multdigits", np.prod)):
        data = load_dataset(name)
        for x, y in zip(data.test_x[:50], data.test_y[:50], strict=True):
            labels = [lookup[channel.tobytes()] for channel in x]
            assert y == int(rule(labels)) % 10
