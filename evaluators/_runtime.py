"""Where and how a network runs: device, data placement, mixed precision, memory format.

Kept apart from the training loop so the loop reads the same on CPU and GPU. On CUDA the
data is copied to the device once when it fits in a quarter of the free memory (no per-batch
host-to-device copies), autocast uses bfloat16 where the card supports it (no loss scaling
needed) and float16 with a GradScaler otherwise, and networks with 2-d convolutions (what
lowering makes of im2col·linear·col2im) get channels-last inputs, so cuDNN can pick its
NHWC kernels. On CPU all of that is off.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.evaluators.optim import Optimizers

#: Fraction of the free device memory the data may take before it stays on the host.
_DATA_FRACTION = 0.25


def out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an allocation failure (CUDA or host)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text


def _is_conv(module: nn.Module) -> bool:
    """A 2-d convolution: torch's, or the lowering's fused im2col·linear·col2im kernel."""
    return isinstance(module, nn.Conv2d) or getattr(module, "kind", None) == "conv"


class Runtime:
    """Device-specific steps of a training run."""

    def __init__(self, device: str, amp: bool, channels_last: str | bool, deterministic: bool):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.device = torch.device(device)
        except RuntimeError as exc:
            raise EinspaceError(f"bad device {device!r}: {exc}") from None
        cuda = self.device.type == "cuda"
        if cuda and not torch.cuda.is_available():
            raise EinspaceError(f"device {device!r} asked for, but CUDA is not available")
        self.dtype: torch.dtype | None = None
        if amp and cuda:
            self.dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype is torch.float16 else None
        self.channels_last = channels_last
        self.memory_format = torch.contiguous_format
        if cuda:
            torch.backends.cudnn.benchmark = not deterministic
            torch.backends.cudnn.deterministic = deterministic
            if deterministic:
                torch.use_deterministic_algorithms(True, warn_only=True)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move the model to the device; channels-last where it has 2-d convolutions on CUDA."""
        use = self.channels_last
        if use == "auto":
            use = self.device.type == "cuda" and any(_is_conv(m) for m in model.modules())
        if use:
            self.memory_format = torch.channels_last
            return model.to(self.device, memory_format=torch.channels_last)
        return model.to(self.device)

    def data(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The arrays as tensors: on the device when they fit, else in (pinned) host memory."""
        tx, ty = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
        if self.device.type != "cuda":
            return tx, ty
        free, _ = torch.cuda.mem_get_info(self.device)
        if tx.numel() * tx.element_size() < _DATA_FRACTION * free:
            return tx.to(self.device), ty.to(self.device)
        return tx.pin_memory(), ty.pin_memory()

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
            torch.cuda.empty_cache()
