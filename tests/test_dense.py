"""Dense regression (Darcy-flow style): targets load, the App. B.1 dense head fits, relative l2 scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import einspace as es
from einspace.errors import EinspaceError
from einspace.evaluators.base import Task, run_task
from einspace.evaluators.datasets import Dataset, load_arrays
from einspace.evaluators.objectives import DenseHead, relative_l2

CONV = "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im)) (M (C leaky_relu)))"


def _arrays(target: str = "nchw") -> dict[str, np.ndarray]:
    """Targets an affine map of the input (y = 2x + 1), which one conv layer can learn."""
    rng = np.random.default_rng(0)
    out = {}
    for split, n in (("train", 256), ("valid", 64), ("test", 64)):
        x = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
        y = 2 * x + 1
        out[f"{split}_x"], out[f"{split}_y"] = x, (y[:, 0] if target == "nhw" else y)
    return out


def test_dense_targets_load_with_a_channel_axis() -> None:
    for layout in ("nchw", "nhw"):
        data = Dataset("darcy", **_arrays(layout))
        assert data.task == "regression" and data.target_shape == (1, 8, 8) and data.classes == 0
        assert "dense targets 1x8x8" in data.summary()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"valid_y": np.zeros((64, 1, 4, 4), np.float32)}, r"valid_y has targets of shape \(1, 4, 4\)"),
        ({"test_y": np.full((64, 1, 8, 8), np.nan, np.float32)}, "test_y contains 4096 NaN"),
        ({"valid_y": np.zeros(64, np.int64)}, "train_y holds dense targets"),
        ({"train_y": np.zeros((256, 8), np.float32)}, r"expected labels \(N,\) or dense targets"),
    ],
)
def test_malformed_dense_targets_are_named(tmp_path: Path, change: dict, message: str) -> None:
    np.savez(tmp_path / "bad.npz", **{**_arrays(), **change})
    with pytest.raises(EinspaceError, match=message):
        load_arrays(tmp_path / "bad.npz")


@pytest.mark.parametrize("features, target", [((16, 4, 4), (2, 8, 8)), ((10, 6), (3, 5, 5))])
def test_dense_head_output_shape_and_params(features: tuple[int, ...], target: tuple[int, int, int]) -> None:
    state = es.input_state(features)
    head = DenseHead(state, target)
    out = head(torch.randn(2, *features))
    assert out.shape == (2, *target)
    channels = features[0] if len(features) == 3 else 1
    assert sum(p.numel() for p in head.parameters()) == (channels + 1) * target[0]


def test_relative_l2_by_hand() -> None:
    target = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    assert relative_l2(2 * target, target).tolist() == [1.0, 1.0]
    assert relative_l2(target, target).tolist() == [0.0, 0.0]


def test_training_on_dense_targets_lowers_relative_l2(tmp_path: Path) -> None:
    np.savez(tmp_path / "darcy.npz", **_arrays())
    settings = {
        **{"dataset": str(tmp_path / "darcy.npz"), "batch_size": 32, "lr": 0.01, "threads": 1},
        "device": "cpu",  # where a GPU is present too: the thresholds are float32's, not bfloat16's
    }
    short = run_task(Task(CONV, "einspace", (1, 8, 8), "training", {**settings, "epochs": 1}))
    long = run_task(Task(CONV, "einspace", (1, 8, 8), "training", {**settings, "epochs": 8}))
    assert short.ok and long.ok, (short.error, long.error)
    assert long.fitness == -long.metrics["valid_relative_l2"]
    assert long.metrics["valid_relative_l2"] < 0.3 < short.metrics["valid_relative_l2"]
    wrong = run_task(Task(CONV, "einspace", (1, 8, 8), "training", {**settings, "metric": "accuracy"}))
    assert not wrong.ok and "a regression task scored by relative_l2" in wrong.error


@pytest.mark.parametrize("proxy", ["naswot", "synflow", "grad_norm"])
def test_proxies_score_dense_regression_networks(tmp_path: Path, proxy: str) -> None:
    np.savez(tmp_path / "darcy.npz", **_arrays())
    task = Task(CONV, "einspace", (1, 8, 8), proxy, {"dataset": str(tmp_path / "darcy.npz")})
    result = run_task(task)
    assert result.ok, result.error
