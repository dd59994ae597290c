"""einspace: write a grammar, sample networks that are valid by construction, compile them to torch.

The names below are imported on first use (PEP 562), so that `import einspace.tree` or the
search strategies do not pull in torch: only what builds modules needs it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from einspace import _moved
from einspace._source_layout import install_if_source_checkout

# Imported from a source checkout (the repository root on sys.path shadows an installed einspace),
# einspace.search, .evaluators and .grammars are served from the top-level folders: see _source_layout.
install_if_source_checkout(Path(__file__).parent)
# Modules moved in the 0.2 layout are still found under their old paths, with a warning: see _moved.
_moved.install()

#: Public name -> the module that defines it.
_EXPORTS = {
    "CheckedTree": "einspace.checker",
    "TreeStats": "einspace.checker",
    "check_tree": "einspace.checker",
    "Network": "einspace.network.compiler",
    "compile_backbone": "einspace.network.compiler",
    "compile_network": "einspace.network.compiler",
    "EinspaceError": "einspace.errors",
    "TreeError": "einspace.errors",
    "Grammar": "einspace.grammar.model",
    "parse_grammar": "einspace.grammar.parser",
    "Operation": "einspace.ops.registry",
    "get_op": "einspace.ops.registry",
    "list_ops": "einspace.ops.registry",
    "register_op": "einspace.ops.registry",
    "Limits": "einspace.sampling.base",
    "Sampler": "einspace.sampling.paper",
    "sample_tree": "einspace.sampling",
    "ExactSampler": "einspace.sampling.exact",
    "SAMPLING_MODES": "einspace.sampling",
    "make_sampler": "einspace.sampling",
    "FeatureState": "einspace.state",
    "input_state": "einspace.state",
    "content_hash": "einspace.tree",
    "load_tree": "einspace.tree",
    "parse_tree": "einspace.tree",
    "pretty": "einspace.tree",
    "to_text": "einspace.tree",
    "Variation": "einspace.sampling.variation",
    "load_grammar": "einspace.grammar.parser",
}

__all__ = [
    "CheckedTree",
    "EinspaceError",
    "ExactSampler",
    "FeatureState",
    "Grammar",
    "Limits",
    "Network",
    "Operation",
    "SAMPLING_MODES",
    "Sampler",
    "TreeError",
    "TreeStats",
    "Variation",
    "check_tree",
    "compile_backbone",
    "compile_network",
    "content_hash",
    "get_op",
    "input_state",
    "list_ops",
    "load_grammar",
    "load_tree",
    "make_sampler",
    "parse_grammar",
    "parse_tree",
    "pretty",
    "register_op",
    "sample_tree",
    "to_text",
]

if TYPE_CHECKING:
    from einspace.checker import CheckedTree, TreeStats, check_tree
    from einspace.errors import EinspaceError, TreeError
    from einspace.grammar.model import Grammar
    from einspace.grammar.parser import load_grammar, parse_grammar
    from einspace.network.compiler import Network, compile_backbone, compile_network
    from einspace.ops.registry import Operation, get_op, list_ops, register_op
    from einspace.sampling import SAMPLING_MODES, Limits, Sampler, make_sampler, sample_tree
    from einspace.sampling.exact import ExactSampler
    from einspace.sampling.variation import Variation
    from einspace.state import FeatureState, input_state
    from einspace.tree import content_hash, load_tree, parse_tree, pretty, to_text


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'einspace' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
