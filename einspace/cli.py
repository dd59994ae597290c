"""The `einspace` command: check grammars, sample trees, show trees, list operations."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from einspace.bundled import load
from einspace.checker import CheckedTree, check_tree, statistics
from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.ops.registry import get_op, list_ops
from einspace.sampler import Limits, Sampler
from einspace.state import describe, parse_input
from einspace.tree import (
    Nonterminal,
    Parallel,
    Repeat,
    Terminal,
    children,
    content_hash,
    dumps_json,
    format_terminal,
    load_tree,
    pretty,
    to_text,
    walk,
)


def _add_input(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--input",
        required=required,
        metavar="SHAPE",
        help="input shape without batch: C,H,W (im mode) or S,D (col mode)",
    )
    parser.add_argument("--mode", choices=("im", "col"), help="input mode (default: from the rank)")


def _add_limits(parser: argparse.ArgumentParser) -> None:
    defaults = Limits()
    parser.add_argument("--max-depth", type=int, default=defaults.max_depth, help="non-terminal levels")
    parser.add_argument("--max-nodes", type=int, default=defaults.max_nodes, help="terminals + non-terminals")
    parser.add_argument("--min-depth", type=int, default=defaults.min_depth)
    parser.add_argument("--max-params", type=int, default=None, help="parameter budget (analytic counts)")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=defaults.max_steps,
        help="backtracking steps per attempt before restarting",
    )


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        max_depth=args.max_depth,
        max_nodes=args.max_nodes,
        min_depth=args.min_depth,
        max_params=args.max_params,
        max_steps=args.max_steps,
    )


def _stats_line(checked: CheckedTree) -> str:
    s = statistics(checked)
    return (
        f"terminals {s['terminals']}  non-terminals {s['nonterminals']}  depth {s['depth']}  "
        f"branching {s['branching_factor']:.2f}  params {s['params']:,}  FLOPs {s['flops']:,}  "
        f"output {s['output']}"
    )


def cmd_check(args: argparse.Namespace) -> int:
    from einspace.grammar.analysis import analyse, format_analysis

    grammar = load(args.grammar)
    rules = grammar.rules
    alternatives = sum(len(r.alternatives) for r in rules)
    print(
        f"{grammar.path}: OK — start {grammar.start}, {len(grammar.nonterminals)} non-terminals, "
        f"{len(rules)} rules, {alternatives} alternatives"
    )
    origins = _rule_origins(grammar)
    if origins:
        print(origins)
    analysis = analyse(grammar, mode=args.mode)
    print(format_analysis(analysis, contexts=args.contexts))
    if not analysis.consistent and not args.allow_inconsistent:
        print(
            "refused: the grammar is inconsistent (spectral radius >= 1): sampling may never end. "
            "Raise the probability of terminating alternatives, or pass --allow-inconsistent.",
            file=sys.stderr,
        )
        return 1
    return 0


def _rule_origins(grammar: Grammar) -> str:
    """For a grammar composed of several files: where each rule, and each alternative added to
    it from another file, was written (empty for a single file)."""
    files = {a.location.path for r in grammar.rules for a in r.alternatives if a.location}
    if len(files) < 2:
        return ""
    lines = [f"composed of {len(files)} files; each rule and where it was written:"]
    for rule in grammar.rules:
        guard = f" if {' and '.join(map(str, rule.guard))}" if rule.guard else ""
        added: dict[str, int] = {}
        for alternative in rule.alternatives:
            if alternative.location and alternative.location.path != rule.location.path:
                added[alternative.location.path] = added.get(alternative.location.path, 0) + 1
        extra = "".join(f", +{n} alternative{'s' * (n > 1)} from {path}" for path, n in added.items())
        lines.append(f"  {rule.symbol + guard:<24} {rule.location}{extra}")
    return "\n".join(lines)


def cmd_sample(args: argparse.Namespace) -> int:
    grammar = load(args.grammar)
    state = parse_input(args.input, args.mode)
    sampler = Sampler(grammar, state, _limits(args), random_seed=args.random_seed)
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    for i in range(args.n):
        tree = sampler.sample()
        checked = check_tree(tree, grammar, state)
        if args.format == "json":
            print(
                json.dumps(
                    {"tree": json.loads(dumps_json(tree)), "hash": content_hash(tree), **statistics(checked)}
                )
            )
        else:
            print(f"# tree {i}  hash {content_hash(tree)}")
            print(f"# {_stats_line(checked)}")
            print(pretty(tree) if args.format == "pretty" else to_text(tree))
            print()
        if out_dir:
            (out_dir / f"tree_{i:04d}.tree").write_text(pretty(tree) + "\n")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from einspace.seeds import load_seed

    grammar = load(args.grammar)
    state = parse_input(args.input, args.mode)
    # A file path wins; otherwise a bundled seed, whose error says which seed does not fit.
    tree = load_tree(args.tree) if Path(args.tree).is_file() else load_seed(args.tree, grammar, state)
    checked = check_tree(tree, grammar, state)
    if args.dot:
        from einspace.render import to_dot

        print(to_dot(tree, Path(args.tree).stem))
        return 0
    print(f"# {args.tree}  hash {content_hash(tree)}")
    print(f"# {_stats_line(checked)}")
    print(_outline(checked))
    return 0


def _outline(checked: CheckedTree) -> str:
    """One line per node: indentation by depth, the node, the signal it produces, its parameters
    and FLOPs (for the subtree, once; a repeat's line counts all its copies)."""
    rows: list[tuple[str, ...]] = []
    for path, node in walk(checked.tree):
        facts = checked.facts[path]
        pad = "  " * len(path)
        if isinstance(node, Terminal):
            label = format_terminal(node)
        elif isinstance(node, Nonterminal):
            label = node.symbol
        elif isinstance(node, Parallel):
            label = f"[{len(children(node))} parallel branches]"
        else:
            assert isinstance(node, Repeat)
            label = f"[repeat x{node.times}, separate weights]"
        rows.append((pad + label, describe(facts.output), f"{facts.params:,}", f"{facts.flops:,}"))
    widths = [max(len(r[i]) for r in rows + [_HEADER]) for i in range(4)]
    return "\n".join(
        f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"
        for r in [_HEADER, *rows]
    )


_HEADER = ("node", "output", "params", "FLOPs")


def cmd_seeds(args: argparse.Namespace) -> int:
    """List the bundled seeds with their size at the given input, or why they don't fit it."""
    from einspace.seeds import list_seeds, load_seed, seed_description

    grammar = load(args.grammar)
    state = parse_input(args.input, args.mode)
    names = list_seeds()
    width = max((len(n) for n in names), default=0)
    print(f"# bundled seeds at input {state}: backbone parameters (the head adds classes x (width + 1))")
    for name in names:
        try:
            checked = check_tree(load_seed(name, grammar, state), grammar, state)
        except EinspaceError as exc:
            reason = str(exc).split(f" does not fit input {state}: ", 1)[-1]
            print(f"{name:<{width}}  does not fit: {reason}  ({seed_description(name).rstrip('.')})")
            continue
        output = describe(checked.output)
        print(f"{name:<{width}}  {checked.params:>12,} params  output {output:<16}  {seed_description(name)}")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    for name in list_ops(args.pattern):
        op = get_op(name)
        arguments = ", ".join(f"{a.name}: {a.kind.__name__}" for a in op.arguments)
        doc = op.description or (type(op).__doc__ or "").strip().partition("\n")[0]
        print(f"{name}({arguments})  [{op.group.value}]  {doc}")
    return 0


def _add_package_commands(package: str, sub: argparse._SubParsersAction) -> None:
    """Let `einspace.search` and `einspace.evaluators` add their own subcommands: each may have
    a `cli` module with `add_commands(subparsers)`, so this file needn't know them."""
    import importlib

    try:
        module = importlib.import_module(f"{package}.cli")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.cli":
            raise
        return
    module.add_commands(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="einspace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="parse and validate a grammar; print its consistency analysis")
    check.add_argument("grammar", help="grammar file, or a bundled name such as 'einspace'")
    check.add_argument("--mode", choices=("im", "col"), default="im", help="input mode for the analysis")
    check.add_argument("--allow-inconsistent", action="store_true", help="exit 0 even if rho >= 1")
    check.add_argument(
        "--contexts",
        action="store_true",
        help="also print the expectation matrix per (symbol, mode, b) context",
    )
    check.set_defaults(run=cmd_check)

    sample = sub.add_parser("sample", help="sample derivation trees and print them with statistics")
    sample.add_argument("grammar", help="grammar file, or a bundled name such as 'einspace'")
    _add_input(sample)
    sample.add_argument("-n", type=int, default=1, help="how many trees")
    sample.add_argument("--random-seed", type=int, default=None, help="random seed (same seed, same trees)")
    sample.add_argument("--format", choices=("text", "pretty", "json"), default="text")
    sample.add_argument("--out", help="also write each tree to DIR/tree_NNNN.tree")
    _add_limits(sample)
    sample.set_defaults(run=cmd_sample)

    show = sub.add_parser("show", help="show a tree file with the signal and parameters at every node")
    show.add_argument("tree", help="a tree file (bracket form) or a bundled seed name such as 'resnet18'")
    _add_input(show)
    show.add_argument("--grammar", default="einspace", help="grammar to check the tree against")
    show.add_argument(
        "--dot",
        action="store_true",
        help="print a Graphviz picture instead (coloured by operation group, as in the paper)",
    )
    show.set_defaults(run=cmd_show)

    seeds = sub.add_parser("seeds", help="list the bundled seed architectures and their size at an input")
    seeds.add_argument("--input", default="3,64,64", metavar="SHAPE", help="input shape (default 3,64,64)")
    seeds.add_argument("--mode", choices=("im", "col"), help="input mode (default: from the rank)")
    seeds.add_argument("--grammar", default="einspace", help="grammar to check the seeds against")
    seeds.set_defaults(run=cmd_seeds)

    for package in ("einspace.search", "einspace.evaluators"):
        _add_package_commands(package, sub)

    ops = sub.add_parser("ops", help="list the registered operations")
    ops.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'im2*'")
    ops.set_defaults(run=cmd_ops)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: errors a person can fix are printed without a traceback, exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except EinspaceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
