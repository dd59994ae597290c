"""How much of a GPU an evaluation asks for when `executor.packing` is `memory`.

The share is sized from the tree's estimated training memory (einspace.evaluators.budgets
estimates the activations from the analytic shapes, nothing is built) and rounded up to a power
of two, 1/16 ... 1, so that few worker sizes exist and a worker of the right size is usually
idle for reuse. Small networks then pack many to a GPU and big ones get a whole one.
"""

from __future__ import annotations

from einspace.evaluators.base import Task

__all__ = ["BYTES_PER_PARAMETER", "PROCESS_BYTES", "SMALLEST_SHARE", "gpu_share", "training_bytes"]

#: Device memory a worker process holds besides its tensors: the CUDA context, kernels and the
#: cuBLAS/cuDNN workspaces. benchmarks/gpu_session.sh measured 844 MiB for a process that ran one
#: bf16 convolution step on an H200 (torch 2.11, CUDA 13), 72 MiB of it tensors.
PROCESS_BYTES = 900 * 2**20
#: Bytes kept per parameter while training: the weight, its gradient and two optimiser states.
BYTES_PER_PARAMETER = 16
#: The smallest share handed out.
SMALLEST_SHARE = 1 / 16
#: The batch size assumed when the task's settings do not give one (the training evaluator's).
DEFAULT_BATCH = 256


def training_bytes(task: Task) -> int:
    """Estimated device memory of training the task's tree: the process, the parameters with
    their gradients and optimiser states, and the activations of one batch at 4 bytes a value."""
    from einspace.checker import check_tree
    from einspace.evaluators.budgets import activation_bytes
    from einspace.grammar.parser import load_grammar
    from einspace.state import input_state
    from einspace.tree import parse_tree

    state = input_state(task.input_shape, task.mode)
    checked = check_tree(parse_tree(task.tree), load_grammar(task.grammar), state)
    batch = int(task.settings.get("batch_size", DEFAULT_BATCH))
    return PROCESS_BYTES + BYTES_PER_PARAMETER * checked.params + activation_bytes(checked, batch)


def gpu_share(needed: int, device_bytes: int, largest: float) -> float:
    """The smallest power-of-two share of a device of `device_bytes` holding `needed` bytes,
    at least SMALLEST_SHARE and at most `largest`."""
    share = SMALLEST_SHARE
    while share < largest and share * device_bytes < needed:
        share *= 2
    return min(share, largest)
