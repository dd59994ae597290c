"""A model traced with torch.fx, with what einspace's import needs to read it: every node's value
on an example input, which nodes depend on the input, immediate dominators, the index map of a
run of reshapes, and the model's source line of each node.
"""

from __future__ import annotations

import inspect
import itertools
import operator
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from einspace.errors import EinspaceError, caret_context
from einspace.network.importer.loading import code_location
from einspace.state import FeatureState

__all__ = ["ModelImportError", "TracedModel", "target_name"]

#: torch's own package folder, with the separator: `…/site-packages/torch/`, not `…/torchvision`.
_TORCH_DIRS = (os.path.join(str(Path(torch.__file__).parent), ""),)


class ModelImportError(EinspaceError):
    """A model the grammar cannot express (as it is), with the model's source lines."""


class _Tracer(fx.Tracer):
    """Records, for errors at the model's code, the model's source line of every node: the
    innermost caller between torch.fx and the call of `trace` that is not in torch's own package
    (cheaper than fx's own stack traces, which load torch's compiler on first use). A node that
    only torch's code creates (the layers of a bare `nn.Sequential`) has no line: never one of
    einspace's, nor the line that called the importer.

    It traces in eval mode: what the model computes at inference (a stochastic depth whose code
    reads `self.training` is then the identity it is there)."""

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self._outer = sys._getframe(0)
        training = root.training if isinstance(root, nn.Module) else None
        if training is not None:
            root.eval()
        try:
            return super().trace(root, concrete_args)
        finally:
            if training is not None:
                root.train(training)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        frame = sys._getframe(1)
        outer = getattr(self, "_outer", None)
        while (
            frame is not None
            and frame is not outer
            and frame.f_code.co_filename.startswith((*_TORCH_DIRS, __file__))
        ):
            frame = frame.f_back
        if frame is not None and frame is not outer:
            node.meta["einspace_source"] = (frame.f_code.co_filename, frame.f_lineno)
        return node


#: Calls that only move values around: what they do is read off an index map, not their arguments.
_LAYOUT_METHODS = frozenset(
    "view reshape flatten unflatten permute transpose contiguous squeeze unsqueeze chunk split unbind".split()
)
_LAYOUT_FUNCTIONS = (torch.flatten, torch.reshape, torch.permute, torch.transpose, torch.squeeze)
_LAYOUT_FUNCTIONS += (torch.unsqueeze, torch.chunk, torch.split, torch.unbind)


def target_name(target: Any) -> str:
    """A call target as written: a method name, or a function's name."""
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


class TracedModel:
    """A model's graph, its nodes' values for one example input (batch 2), and where each node
    comes from in the model's code."""

    def __init__(self, model: nn.Module, input: FeatureState):
        self.model, self.input = model, input
        self.modules = dict(model.named_modules())
        try:
            self.graph = _Tracer().trace(model, _defaults(model))
            _drop_fixed(self.graph)
        except Exception as exc:  # torch.fx raises many kinds (TraceError, TypeError, ...)
            where = code_location(exc)
            raise ModelImportError(
                f"cannot trace {type(model).__name__} with torch.fx: {type(exc).__name__}: {exc}"
                + (f", at {where}" if where else "")
            ) from None
        self.values = self._run()
        self.dynamic = self._dynamic()
        self.placeholder = next(n for n in self.graph.nodes if n.op == "placeholder")
        self.idom = self._dominators(self.placeholder)

    # ------------------------------------------------------------- values

    def _run(self) -> dict[fx.Node, Any]:
        """Every node's value for a batch of 2 random inputs, in eval mode (restored after).
        Each node gets copies of its tensor arguments, so in-place layers keep the record."""
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != 1:
            raise ModelImportError(
                f"{type(self.model).__name__}.forward must take one tensor, not {len(placeholders)}"
            )
        parameter = next(itertools.chain(self.model.parameters(), self.model.buffers()), None)
        dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
        example = torch.randn(2, *self.input.shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._evaluate(list(self.graph.nodes), {placeholders[0]: example}, copy=True)
        except Exception as exc:  # whatever the model's own code raises for this input
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            where = code_location(exc) or self.where(self._running)
            raise ModelImportError(
                f"{type(self.model).__name__} does not run on inputs of shape {tuple(example.shape)}: "
                f"{type(exc).__name__}{': ' + first if first else ''}, at {where}"
            ) from None
        finally:
            self.model.train(training)

    def _evaluate(
        self, nodes: list[fx.Node], env: dict[fx.Node, Any], copy: bool = False
    ) -> dict[fx.Node, Any]:
        """Run `nodes` in order; values of other nodes they use come from `env`."""

        def value(n: fx.Node) -> Any:
            v = env[n] if n in env else self.values[n]
            return v.clone() if copy and isinstance(v, torch.Tensor) else v

        for node in nodes:
            if node in env or node.op == "output":
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
            self._running = node  # where a failure is, when the user's code is not in its traceback
            if node.op == "get_attr":
                result = _attribute(self.model, node.target)
            elif node.op == "call_module":
                result = self.modules[node.target](*args, **kwargs)
            elif node.op == "call_function":
                result = node.target(*args, **kwargs)
            elif node.op == "call_method":
                result = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                continue
            env[node] = result
        return env

    def _dynamic(self) -> set[fx.Node]:
        """Nodes whose value depends on the input."""
        dynamic: set[fx.Node] = set()
        for node in self.graph.nodes:
            if node.op == "placeholder" or any(a in dynamic for a in node.all_input_nodes):
                dynamic.add(node)
        return dynamic

    def inputs(self, node: fx.Node) -> list[fx.Node]:
        """The input-dependent tensors `node` computes from (or tuples of them, that a chunk or
        split makes), in argument order (`x + x` has two)."""
        found: list[fx.Node] = []
        fx.node.map_arg((node.args, node.kwargs), found.append)
        kinds = (torch.Tensor, tuple, list) if node.target is operator.getitem else torch.Tensor
        return [a for a in found if a in self.dynamic and isinstance(self.values.get(a), kinds)]

    def constants(self, node: fx.Node) -> list[Any]:
        """The arguments of `node` that do not depend on the input: numbers, or learnt tensors."""
        out = []
        for arg in (*node.args, *node.kwargs.values()):
            if isinstance(arg, fx.Node):
                if arg not in self.dynamic:
                    out.append(self.values[arg])
            elif isinstance(arg, (int, float)):
                out.append(arg)
        return out

    # ------------------------------------------------------------- locations and problems

    def where(self, node: fx.Node) -> str:
        """`file:line:col: <what>` at the model's source, with the line and a caret."""
        what = self.describe(node)
        if "einspace_source" not in node.meta:
            return what
        path, line = node.meta["einspace_source"]
        source = _source(path)
        lines = source.splitlines()
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        needle = str(node.target).rpartition(".")[2] if node.op == "call_module" else target_name(node.target)
        found = text.find(needle)
        column = found + 1 if found >= 0 else len(text) - len(text.lstrip()) + 1
        context = caret_context(source, line, column)
        return f"{path}:{line}:{column}: {what}" + (f"\n{context}" if context else "")

    def describe(self, node: fx.Node) -> str:
        """What a node is, for messages: the module with its settings, or the function and the
        module whose code calls it."""
        if node.op == "call_module":
            return f"module `{node.target}` ({self.modules[node.target]})"
        stack = node.meta.get("nn_module_stack") or {}
        inside = f" in `{next(reversed(stack.values()))[0]}`" if stack else ""
        kind = "method" if node.op == "call_method" else "function"
        return f"{kind} {target_name(node.target)}{inside}"

    def owner(self, node: fx.Node) -> tuple[str, ...]:
        """The path of the submodule whose code computes `node` (a layer: its parent module)."""
        if node.op == "call_module":
            path = str(node.target).rpartition(".")[0]
        else:
            stack = node.meta.get("nn_module_stack") or {}
            path = next(reversed(stack.values()))[0] if stack else ""
        return tuple(path.split(".")) if path else ()

    def fail(self, node: fx.Node, message: str) -> ModelImportError:
        """An error at the node's source line."""
        return ModelImportError(f"{self.where(node)}\n  {message}")

    def short(self, node: fx.Node) -> str:
        """A node's module type or function name."""
        if node.op == "call_module":
            return type(self.modules[node.target]).__name__
        return target_name(node.target)

    def _dominators(self, root: fx.Node) -> dict[fx.Node, fx.Node]:
        """Immediate dominators of the input-dependent nodes (fx lists nodes in topological order)."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        idom: dict[fx.Node, fx.Node] = {root: root}

        def meet(a: fx.Node, b: fx.Node) -> fx.Node:
            while a is not b:
                while order[a] > order[b]:
                    a = idom[a]
                while order[b] > order[a]:
                    b = idom[b]
            return a

        for node in self.graph.nodes:
            if node is root or node not in self.dynamic:
                continue
            preds = [p for p in node.all_input_nodes if p in idom]
            if preds:
                dominator = preds[0]
                for p in preds[1:]:
                    dominator = meet(dominator, p)
                idom[node] = dominator
        return idom

    def passes_unchanged(self, node: fx.Node) -> bool:
        """Whether `node` is the identity at inference: a dropout, nn.Identity, a product or
        quotient by 1, or a call of the model's own code (not torch's: a torch operation is read
        for what it is) without weights whose value is its input's on the example input, in
        eval mode (a stochastic depth, whose code reads `self.training`, or torchvision's
        fx-wrapped `stochastic_depth`)."""
        inputs = self.inputs(node)
        if len(inputs) != 1 or node.op not in ("call_module", "call_function", "call_method"):
            return False
        if node.op == "call_module":
            module = self.modules[node.target]
            if isinstance(module, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout, nn.Identity)):
                return True
            if any(True for _ in module.parameters()) or type(module).__module__.startswith("torch."):
                return False
        elif node.target in (F.dropout, F.dropout1d, F.dropout2d, F.alpha_dropout):
            return True
        elif node.target in (operator.mul, operator.truediv) or node.target in ("mul", "div"):
            constants = self.constants(node)
            return len(constants) == 1 and isinstance(constants[0], (int, float)) and constants[0] == 1
        elif node.op == "call_method" or str(getattr(node.target, "__module__", "torch")).startswith("torch"):
            return False
        before, after = self.values[inputs[0]], self.values.get(node)
        return (
            isinstance(before, torch.Tensor)
            and isinstance(after, torch.Tensor)
            and after.shape == before.shape
            and after.dtype == before.dtype
            and torch.equal(after, before)
        )

    def is_layout(self, node: fx.Node) -> bool:
        """Whether `node` only moves values (a reshape, permute, chunk or identity layer)."""
        if node.op == "call_method":
            return node.target in _LAYOUT_METHODS
        if node.op == "call_module":
            return isinstance(self.modules[node.target], (nn.Flatten, nn.Unflatten, nn.Identity))
        if node.op == "call_function" and node.target is operator.getitem:
            return isinstance(self.values.get(node.args[0]), (torch.Tensor, tuple, list))
        return node.op == "call_function" and node.target in _LAYOUT_FUNCTIONS

    def index_map(self, source: fx.Node, run: list[fx.Node]) -> torch.Tensor:
        """Where each element of the run's result comes from: flat positions in `source`."""
        value = self.values[source]
        index = torch.arange(value.numel()).reshape(value.shape)
        return self._evaluate(run, {source: index})[run[-1]] if run else index


def _defaults(model: nn.Module) -> dict[str, Any] | None:
    """The arguments of `forward` after the first that have defaults (`attn_mask=None`), fixed to
    them for tracing: the model is imported as called with one tensor."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    fixed = {
        p.name: p.default
        for p in parameters[1:]
        if p.kind in (*plain, inspect.Parameter.KEYWORD_ONLY) and p.default is not inspect.Parameter.empty
    }
    return fixed or None


def _drop_fixed(graph: fx.Graph) -> None:
    """Remove the placeholders of the arguments fixed to their defaults, with the checks fx adds
    that they keep them (the traced code has their values built in)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    doomed: list[fx.Node] = []
    for placeholder in placeholders[1:]:
        if not placeholder.args:  # no default: the model needs it, and _run says so
            continue
        todo = [placeholder]
        while todo:
            node = todo.pop()
            if node not in doomed:
                doomed.append(node)
                todo.extend(node.users)
    if any(n.op == "output" for n in doomed):
        return
    for node in reversed(list(graph.nodes)):
        if node in doomed:
            graph.erase_node(node)


def _attribute(root: nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


@cache
def _source(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
