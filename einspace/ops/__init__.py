"""Terminal operations: one registry, the paper's fundamentals in `core`.

The life of an operation, for plugin authors: where each stage of it lives.

1. Shape rule. A subclass of `Operation` (the contract is its docstring, in `registry`) with
   `name`, `group`, `arguments`, `infer` and, where it has them, `param_count` and `flops`;
   `@register_op` makes it known. Sampling, checking, budgets and the search strategies use
   only this, so the module that defines it imports no torch. (Built-in operations are listed
   in `registry.BUILTIN_OPERATIONS`, so a look-up imports only the module defining the name.)
2. Module. `build` returns the torch module. The built-in modules live on the torch side
   (`_modules` for `core`, `_nos_modules`, `_dnarch_modules`, `_xd_modules`, `_zoo_modules`),
   reached through `torch_side`, which imports them at the first build. The later stages recognise an
   operation by its module's type, so every operation whose tensor work is its own builds a
   module class of its own (`col2im` a `Col2Im`, `permute` a `Permute` that keeps its order),
   never a generic module configured by a string.
3. Compilation. `einspace.network.compiler` calls `build` at every terminal with the input
   state the checker inferred there; a `build` that fails is a `BuildError` naming the node's
   address and the operation.
4. Lowering. `einspace.network.lowering` replaces runs of modules, matched by type, with fused
   kernels (`Im2Col` · `nn.Linear` · `Col2Im` is a convolution; attention is found from its
   `Clone`, `MatMul`, `nn.Softmax` and a key `Permute` that swaps the last two axes). Modules it
   does not know run as they are: a plugin needs nothing here.
5. Export. `einspace.network.export.writer` writes modules by type (its `_HANDLERS` table). An
   operation declares `exportable = True` when its modules are ones export writes (those of
   einspace's own operations, and torch's `nn.Linear`, `nn.BatchNorm2d`, `nn.LayerNorm`,
   `nn.LeakyReLU`, `nn.Softmax` and `nn.Identity`); any other is refused by name before
   anything is written, quoting `export_refusal` when it says why.
6. Import. `einspace.network.importer` turns a traced PyTorch model into a tree: `layers` and
   `joins` recognise what the model's code computes (layers by type, reshapes and permutes by
   the values they move) and write the operations' terminals by name. It produces built-in
   operations only; a plugin operation is never imported.
"""

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
