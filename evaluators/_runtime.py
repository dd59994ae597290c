"""Where and how a network runs: device, data placement, mixed precision, memory format, and
how a training step's forward pass is launched.

Kept apart from the training loop so the loop reads the same on CPU and GPU. On CUDA the
data is copied to the device when it fits in a quarter of the free memory (of this worker's
share of the GPU, einspace.evaluators.worker) and kept there for the worker's next evaluation
(einspace.evaluators.data_cache), so there are no per-batch host-to-device copies; autocast
uses bfloat16 where the card supports it (no loss scaling needed) and float16 with a
GradScaler otherwise, and networks with 2-d convolutions (what lowering makes of
im2col·linear·col2im) get channels-last inputs, so cuDNN can pick its NHWC kernels. On CPU all
of that is off.

Step modes (`step_mode`) cut the host's work per step for small networks, whose steps are bound
by kernel launches: `cuda_graphs` records the training forward and backward once as CUDA graphs
and replays them (CUDA only: elsewhere it runs eagerly), `compile` and `compile_cuda_graphs`
hand the network to torch.compile (its default mode, or "reduce-overhead", which adds CUDA
graphs); compiling costs seconds to minutes per network, so it pays only for long trainings.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Hashable

import numpy as np
import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.evaluators import data_cache
from einspace.evaluators.optim import Optimizers
from einspace.evaluators.worker import gpu_share
from einspace.network.memory import allocation_failed

#: Fraction of the free device memory the data may take before it stays on the host.
_DATA_FRACTION = 0.25
#: What `step_mode` may be (see the module docstring).
STEP_MODES = ("eager", "cuda_graphs", "compile", "compile_cuda_graphs")


def out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an allocation failure (CUDA or host): torch's own type, or what
    the torch-free `allocation_failed` recognises, so the two never disagree."""
    return isinstance(exc, torch.cuda.OutOfMemoryError) or allocation_failed(exc)


def _is_conv(module: nn.Module) -> bool:
    """A 2-d convolution: torch's, or the lowering's fused im2col·linear·col2im kernel."""
    return isinstance(module, nn.Conv2d) or getattr(module, "kind", None) == "conv"


def resolve_device(device: str) -> torch.device:
    """The device a `device` setting names (auto: CUDA where available, else the CPU)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise EinspaceError(f"bad device {device!r}: {exc}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise EinspaceError(f"device {device!r} asked for, but CUDA is not available")
    return resolved


def autocast_dtype(device: torch.device, amp: bool) -> torch.dtype | None:
    """The mixed-precision type on `device` (None: full precision): bfloat16 where the card
    supports it, else float16; CUDA only."""
    if not amp or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


class Runtime:
    """Device-specific steps of a training run."""

    def __init__(self, device: str, amp: bool, channels_last: str | bool, deterministic: bool):
        self.device = resolve_device(device)
        cuda = self.device.type == "cuda"
        self.dtype = autocast_dtype(self.device, amp)
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype is torch.float16 else None
        self.channels_last = channels_last
        self.memory_format = torch.contiguous_format
        if cuda:
            torch.backends.cudnn.benchmark = not deterministic
            torch.backends.cudnn.deterministic = deterministic
            # set either way: a persistent worker must not carry it over from an earlier evaluation
            torch.use_deterministic_algorithms(deterministic, warn_only=True)
            self.synchronize()  # creates the CUDA context on first use, so it is timed here

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move the model to the device; channels-last where it has 2-d convolutions on CUDA."""
        use = self.channels_last
        if use == "auto":
            use = self.device.type == "cuda" and any(_is_conv(m) for m in model.modules())
        if use:
            self.memory_format = torch.channels_last
            return model.to(self.device, memory_format=torch.channels_last)
        return model.to(self.device)

    def data(
        self, x: np.ndarray, y: np.ndarray, key: Hashable | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The arrays as tensors: on the device when they fit, else in (pinned) host memory. On
        CUDA, arrays given a `key` are kept for later calls with the same key (and device)."""
        if self.device.type != "cuda":
            return _tensors(x, y)
        if key is None:
            return self._placed(x, y)
        return data_cache.cached((key, str(self.device)), lambda: self._placed(x, y))

    def _placed(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        tx, ty = _tensors(x, y)
        free, total = torch.cuda.mem_get_info(self.device)
        share = gpu_share()
        room = free if share is None else min(free, share * total)
        if tx.nbytes + ty.nbytes < _DATA_FRACTION * room:
            return tx.to(self.device), ty.to(self.device)
        return tx.pin_memory(), ty.pin_memory()

    def synchronize(self) -> None:
        """Wait for the device (on CUDA), so that a phase's wall time includes its kernels."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def training_forward(
        self, model: nn.Module, mode: str, sample: torch.Tensor
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The forward pass a training step calls under `mode` (STEP_MODES), given a batch shaped
        like every full batch; None for plain `model(x)` (eager, or graphs off CUDA)."""
        if mode == "compile":
            return torch.compile(model)
        if mode == "compile_cuda_graphs":
            return torch.compile(model, mode="reduce-overhead")
        if mode != "cuda_graphs" or self.device.type != "cuda":
            return None
        eager = type(model).forward.__get__(model)
        # make_graphed_callables runs warm-up passes, which move batch-norm statistics: undo that
        state = {k: v.clone() for k, v in model.state_dict().items()}
        dtype = self.dtype or torch.bfloat16
        with torch.autocast("cuda", dtype=dtype, enabled=self.dtype is not None, cache_enabled=False):
            torch.cuda.make_graphed_callables(model, (sample,))
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(state[k])
        batch = len(sample)
        return lambda x: model(x) if len(x) == batch else eager(x)  # the last batch may be short

    def batch(
        self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `index` of (x, y) on the device, in the model's memory format."""
        if x.device != self.device:
            xb = x[index].to(self.device, non_blocking=True)
            yb = y[index].to(self.device, non_blocking=True)
        else:
            index = index.to(self.device)
            xb, yb = x[index], y[index]
        if self.memory_format is torch.channels_last and xb.dim() == 4:
            xb = xb.contiguous(memory_format=torch.channels_last)
        return xb, yb

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor, optimizers: Optimizers) -> None:
        """loss.backward() and a step of every optimiser, through the GradScaler under float16."""
        if self.scaler is None:
            loss.backward()
            optimizers.step()
            return
        self.scaler.scale(loss).backward()
        optimizers.step(self.scaler)
        self.scaler.update()

    def release(self) -> None:
        """Free cached device memory after a failure, so the next evaluation starts clean."""
        if self.device.type == "cuda":
            data_cache.clear()
            torch.cuda.empty_cache()


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors sharing the arrays' memory; arrays memory-mapped read-only from a dataset's files
    are never written through them, so torch's warning about that is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
