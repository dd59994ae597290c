"""einspace: write a grammar, sample networks that are valid by construction, compile them to torch."""

from einspace.checker import CheckedTree, check_tree, statistics
from einspace.compiler import Network, compile_backbone, compile_network
from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.ops.registry import Operation, get_op, list_ops, register_op
from einspace.sampler import Limits, Sampler, sample_tree
from einspace.state import FeatureState, input_state
from einspace.tree import content_hash, load_tree, parse_tree, pretty, to_text
from einspace.variation import Variation

__all__ = [
    "CheckedTree",
    "EinspaceError",
    "FeatureState",
    "Limits",
    "Network",
    "Operation",
    "Sampler",
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
    "parse_tree",
    "pretty",
    "register_op",
    "sample_tree",
    "statistics",
    "to_text",
]


def load_grammar(name_or_path: str = "einspace") -> Grammar:
    """Load and validate a grammar file, by path or bundled name (`einspace` = the paper's space)."""
    from einspace.bundled import load

    return load(name_or_path)
