"""The `einspace` command: check grammars, sample trees, show trees, list operations."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from einspace.bundled import names_bundled
from einspace.checker import CheckedTree, check_tree
from einspace.errors import EinspaceError, GrammarError, SeedFitError
from einspace.grammar.model import Grammar
from einspace.grammar.parser import load_grammar
from einspace.ops.registry import get_op, list_ops
from einspace.outputs import writable, write_output
from einspace.plugins import import_plugins
from einspace.sampling import SAMPLING_MODES, make_sampler
from einspace.sampling.base import Limits
from einspace.state import FeatureState, describe, parse_input
from einspace.tree import (
    Node,
    Nonterminal,
    Parallel,
    Repeat,
    Terminal,
    TreeVisitor,
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
        "--min-params", type=int, default=defaults.min_params, help="fewest parameters (analytic counts)"
    )
    parser.add_argument(
        "--min-flops", type=int, default=defaults.min_flops, help="fewest FLOPs per sample (analytic counts)"
    )
    parser.add_argument("--max-flops", type=int, default=None, help="most FLOPs per sample (analytic counts)")
    parser.add_argument(
        "--max-operations",
        type=int,
        default=None,
        help="most terminal operations in the network (each Repeat copy counted)",
    )
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
        min_params=args.min_params,
        min_flops=args.min_flops,
        max_flops=args.max_flops,
        max_operations=args.max_operations,
        max_steps=args.max_steps,
    )


def _stats_line(checked: CheckedTree) -> str:
    s = checked.stats
    return (
        f"terminals {s.terminals}  operations {s.operations}  non-terminals {s.nonterminals}  "
        f"depth {s.depth}  branching {s.branching_factor:.2f}  params {s.params:,}  FLOPs {s.flops:,}  "
        f"output {s.output}"
    )


def cmd_check(args: argparse.Namespace) -> int:
    from einspace.grammar.analysis import analyse, format_analysis, never_taken

    grammar = load_grammar(args.grammar)
    rules = grammar.rules
    alternatives = sum(len(r.alternatives) for r in rules)
    print(
        f"{grammar.path}: OK — start {grammar.start}, {len(grammar.nonterminals)} non-terminals, "
        f"{len(rules)} rules, {alternatives} alternatives"
    )
    origins = _rule_origins(grammar)
    if origins:
        print(origins)
    analyses = [analyse(grammar, mode=mode) for mode in ([args.mode] if args.mode else ("im", "col"))]
    derivable = [a for a in analyses if a.derivable or a.infinite]
    if not args.mode:
        modes = " and ".join(a.mode for a in derivable) or "neither mode"
        print(f"input modes: {grammar.start} can be derived from {modes} inputs (--mode to choose one)")
        analyses = derivable or analyses
    for analysis in analyses:
        print(format_analysis(analysis, contexts=args.contexts))
    if not any(a.derivable for a in analyses):
        modes = " or ".join(a.mode for a in analyses)
        raise GrammarError(
            f"no tree can be derived from {grammar.start} with {modes} inputs: every derivation reaches "
            "an operation that cannot apply there (see the WARNING lines above)",
            grammar.rules_for(grammar.start)[0].location,
        )
    unused = never_taken(grammar, analyses)
    if unused:
        print(f"never taken ({len(unused)}): no input of these modes reaches them where they can apply")
        print("\n".join(f"  {line}" for line in unused))
    if args.verify:
        from einspace.ops.verify import verify_operations

        if not args.input:
            raise EinspaceError("--verify builds operations on sampled trees: give --input C,H,W (or S,D)")
        problems = verify_operations(grammar, parse_input(args.input, args.mode), args.verify)
        print(f"verified the operations of {args.verify} sampled trees: {len(problems) or 'no'} problems")
        if problems:
            print("\n".join(f"  {p}" for p in problems))
            return 1
    if not all(a.consistent for a in analyses) and not args.allow_inconsistent:
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
    from einspace.grammar.analysis import require_consistent

    grammar = load_grammar(args.grammar)
    state = parse_input(args.input, args.mode)
    require_consistent(grammar, state, args.allow_inconsistent)
    sampler = make_sampler(grammar, state, _limits(args), args.sampling, args.random_seed)
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        if out_dir.exists() and not out_dir.is_dir():
            raise EinspaceError(f"--out {out_dir} is a file; give a directory for the tree files")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EinspaceError(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    for i in range(args.n):
        tree = sampler.sample()
        checked = check_tree(tree, grammar, state)
        if args.format == "json":
            print(
                json.dumps(
                    {
                        "tree": json.loads(dumps_json(tree)),
                        "hash": content_hash(tree),
                        **checked.stats.as_dict(),
                    }
                )
            )
        else:
            print(f"# tree {i}  hash {content_hash(tree)}")
            print(f"# {_stats_line(checked)}")
            print(pretty(tree) if args.format == "pretty" else to_text(tree))
            print()
        if out_dir:
            write_output(out_dir / f"tree_{i:04d}.tree", pretty(tree) + "\n")
    return 0


def _tree_or_seed(name_or_path: str, grammar: Grammar, state: FeatureState) -> Node:
    """A bundled seed by name (`names_bundled`), checked to fit, whose error says which seed does not
    fit; else the tree file at that path, or when there is none, an error listing the bundled seeds."""
    from einspace.seeds import list_seeds, load_seed

    if names_bundled(name_or_path, list_seeds()) or not Path(name_or_path).is_file():
        return load_seed(name_or_path, grammar, state)
    return load_tree(name_or_path)


def cmd_show(args: argparse.Namespace) -> int:
    grammar = load_grammar(args.grammar)
    state = parse_input(args.input, args.mode)
    tree = _tree_or_seed(args.tree, grammar, state)
    checked = check_tree(tree, grammar, state)
    if args.dot:
        from einspace.pictures.dot import to_dot

        print(to_dot(tree, Path(args.tree).stem))
        return 0
    if args.render:
        from einspace.pictures import render

        print(f"wrote {render(checked, args.render, Path(args.tree).stem, args.view)}")
        return 0
    print(f"# {args.tree}  hash {content_hash(tree)}")
    print(f"# {_stats_line(checked)}")
    print("\n".join(f"# {line}" for line in _cost_lines(checked)))
    print(_outline(checked))
    return 0


#: FLOPs per example above which `show` warns that running the network on a CPU is slow.
SLOW_FLOPS = 10**9


def _cost_lines(checked: CheckedTree) -> list[str]:
    """What building and running the tree would cost, and whether this machine can: memory of the
    float32 parameters and of one example's activations, and the FLOPs per example in words."""
    from einspace.evaluators.budgets import activation_bytes
    from einspace.network.memory import format_bytes, require_memory

    parameters, activations = 4 * checked.params, activation_bytes(checked, 1)
    lines = [
        f"memory: {format_bytes(parameters)} of float32 parameters, {format_bytes(activations)} of "
        f"activations per example; {checked.flops / 1e9:,.3g} GFLOPs per example"
    ]
    try:
        require_memory({"float32 parameters": parameters}, "building it")
    except EinspaceError as exc:
        lines.append(f"too large: {exc}")
    if checked.flops > SLOW_FLOPS:
        lines.append(
            "slow: over a GFLOP per example; on a CPU one forward pass over a batch may take minutes"
        )
    return lines


def _outline(checked: CheckedTree) -> str:
    """One line per node: indentation by depth, the node, the signal it produces, its parameters
    and FLOPs (for the subtree, once; a repeat's line counts all its copies)."""
    rows: list[tuple[str, ...]] = []
    label = _OutlineLabel()
    for path, node in walk(checked.tree):
        facts = checked.facts[path]
        text = "  " * len(path) + label.visit(node)
        rows.append((text, describe(facts.output), f"{facts.params:,}", f"{facts.flops:,}"))
    widths = [max(len(r[i]) for r in rows + [_HEADER]) for i in range(4)]
    return "\n".join(
        f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"
        for r in [_HEADER, *rows]
    )


_HEADER = ("node", "output", "params", "FLOPs")


class _OutlineLabel(TreeVisitor[str]):
    """How `einspace show` names a node in its outline."""

    def terminal(self, node: Terminal) -> str:
        return format_terminal(node)

    def nonterminal(self, node: Nonterminal) -> str:
        return node.symbol

    def parallel(self, node: Parallel) -> str:
        return f"[{len(node.children)} parallel branches]"

    def repeat(self, node: Repeat) -> str:
        return f"[repeat x{node.times}, separate weights]"


def cmd_seeds(args: argparse.Namespace) -> int:
    """List the bundled seeds with their size at the given input, or why they don't fit it."""
    from einspace.seeds import list_seeds, load_seed, seed_description

    grammar = load_grammar(args.grammar)
    state = parse_input(args.input, args.mode)
    names = list_seeds()
    width = max((len(n) for n in names), default=0)
    print(f"# bundled seeds at input {state}: backbone parameters (the head adds classes x (width + 1))")
    for name in names:
        try:
            checked = check_tree(load_seed(name, grammar, state), grammar, state)
        except EinspaceError as exc:
            reason = exc.reason if isinstance(exc, SeedFitError) else str(exc)
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


def cmd_export(args: argparse.Namespace) -> int:
    """Write a tree or seed as one PyTorch file (and its weights); see einspace.network.export."""
    import torch

    from einspace.network.compiler import compile_network
    from einspace.network.export import class_name, export_tree, load_weights, save_weights

    _check_outputs(args.out, args.weights)
    grammar = load_grammar(args.grammar)
    state = parse_input(args.input, args.mode)
    tree = _tree_or_seed(args.tree, grammar, state)
    checked = check_tree(tree, grammar, state)
    name = args.name or class_name(Path(args.tree).stem)
    torch.manual_seed(args.random_seed)
    network = compile_network(checked, classes=args.classes, pooling=args.head_pooling)
    if args.load:
        load_weights(network, args.load)
    exported = export_tree(checked, name=name, network=network)
    write_output(args.out, exported.source)
    params = sum(p.numel() for p in network.parameters())
    print(f"wrote {args.out}: class {name}, {params:,} parameters, needs torch only")
    if args.weights:
        save_weights(exported.state_dicts[name], args.weights)
        print(f"wrote {args.weights}: load it with torch.load({args.weights!r}, weights_only=True)")
    return 0


def cmd_import_model(args: argparse.Namespace) -> int:
    """Trace a PyTorch model and write the tree that computes it; see einspace.network.importer."""
    import torch

    from einspace.network.export import save_weights
    from einspace.network.importer import import_model, load_factory

    _check_outputs(args.out, args.weights)
    grammar = load_grammar(args.grammar)
    state = parse_input(args.input, args.mode)
    model = load_factory(args.model)
    torch.manual_seed(args.random_seed)  # the fresh weights of substituted layers
    imported = import_model(model, state, grammar, substitute=args.substitute)
    write_output(args.out, imported.tree_file(f"einspace import-model {args.model} --input {args.input}"))
    for line in imported.substitutions:
        print(f"substituted: {line}")
    print(f"wrote {args.out}: {_stats_line(check_tree(imported.tree, grammar, state))}")
    if args.weights:
        save_weights(imported.state_dict, args.weights)
        head = f"classes={imported.classes}" if imported.classes else "no head: compile_backbone"
        if imported.classes and imported.pooling != "mean":
            head += f", pooling={imported.pooling!r}"
        print(f"wrote {args.weights}: the model's weights for compile_network(tree, input, {head})")
    return 0


def _check_outputs(*paths: str | None) -> None:
    """Check every output path before any work, so that one bad path leaves nothing written."""
    for path in paths:
        if path:
            writable(path)


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


def _positive(text: str) -> int:
    """An argparse type: a positive integer, or a message saying so."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _check_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("grammar", help="grammar file, or a bundled name such as 'einspace'")
    check.add_argument(
        "--mode", choices=("im", "col"), help="input mode to analyse (default: each mode the grammar takes)"
    )
    check.add_argument("--allow-inconsistent", action="store_true", help="exit 0 even if rho >= 1")
    check.add_argument("--input", metavar="SHAPE", help="input shape for --verify, e.g. 3,32,32")
    check.add_argument(
        "--verify",
        type=_positive,
        metavar="N",
        help="sample N trees and run every operation in them, comparing its module with its infer "
        "and param_count (for plugin authors)",
    )
    check.add_argument(
        "--contexts",
        action="store_true",
        help="also print the expectation matrix per (symbol, mode, b) context",
    )


def _sample_arguments(sample: argparse.ArgumentParser) -> None:
    sample.add_argument("grammar", help="grammar file, or a bundled name such as 'einspace'")
    _add_input(sample)
    sample.add_argument("-n", type=_positive, default=1, help="how many trees")
    sample.add_argument(
        "--allow-inconsistent", action="store_true", help="sample even if the grammar has rho >= 1"
    )
    sample.add_argument("--random-seed", type=int, default=None, help="random seed (same seed, same trees)")
    sample.add_argument("--format", choices=("text", "pretty", "json"), default="text")
    sample.add_argument("--out", help="also write each tree to DIR/tree_NNNN.tree")
    sample.add_argument(
        "--sampling",
        choices=tuple(SAMPLING_MODES),
        default="paper",
        help="paper: backtracking (the paper's sampler); exact: the grammar's distribution given validity",
    )
    _add_limits(sample)


def _show_arguments(show: argparse.ArgumentParser) -> None:
    show.add_argument("tree", help="a tree file (bracket form) or a bundled seed name such as 'resnet18'")
    _add_input(show)
    show.add_argument("--grammar", default="einspace", help="grammar to check the tree against")
    show.add_argument(
        "--dot",
        action="store_true",
        help="print a Graphviz picture instead (coloured by operation group, as in the paper)",
    )
    show.add_argument(
        "--render",
        metavar="FILE",
        help="write a picture instead, by extension: .png or .svg (see --view), .html (both, and the text)",
    )
    show.add_argument(
        "--view",
        choices=("tree", "graph"),
        default="tree",
        help="for --render to PNG/SVG: the derivation tree or the data-flow graph (default: tree)",
    )


def _seeds_arguments(seeds: argparse.ArgumentParser) -> None:
    seeds.add_argument("--input", default="3,64,64", metavar="SHAPE", help="input shape (default 3,64,64)")
    seeds.add_argument("--mode", choices=("im", "col"), help="input mode (default: from the rank)")
    seeds.add_argument("--grammar", default="einspace", help="grammar to check the seeds against")


def _ops_arguments(ops: argparse.ArgumentParser) -> None:
    ops.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'im2*'")


def _export_arguments(export: argparse.ArgumentParser) -> None:
    export.add_argument("tree", help="a tree file or a bundled seed name such as 'resnet18'")
    _add_input(export)
    export.add_argument("--classes", type=_positive, required=True, help="classes of the head")
    export.add_argument(
        "--head-pooling",
        default="mean",
        metavar="POOLING",
        help="mean (the paper's, the default) or max: how the head pools positions, as the training "
        "setting head_pooling",
    )
    export.add_argument("--out", required=True, metavar="FILE.py", help="the Python file to write")
    export.add_argument("--grammar", default="einspace", help="grammar to check the tree against")
    export.add_argument("--name", help="the class name (default: from the tree file or seed name)")
    export.add_argument("--weights", metavar="FILE", help="also write its state_dict (torch weights-only)")
    export.add_argument(
        "--load", metavar="FILE", help="weights of the compiled network (torch.save of its state_dict)"
    )
    export.add_argument("--random-seed", type=int, default=0, help="initialisation when no --load")


def _import_model_arguments(imports: argparse.ArgumentParser) -> None:
    imports.add_argument("model", metavar="MODULE:FACTORY", help="e.g. my_models.py:resnet or pkg.mod:Net")
    _add_input(imports)
    imports.add_argument("--out", required=True, metavar="FILE.tree", help="the tree file to write")
    imports.add_argument("--grammar", default="einspace", help="grammar the tree must belong to")
    imports.add_argument(
        "--substitute", action="store_true", help="use the closest expressible operations and say which"
    )
    imports.add_argument("--weights", metavar="FILE", help="also write the weights for compile_network")
    imports.add_argument("--random-seed", type=int, default=0, help="initialisation of substituted layers")


class _Command(NamedTuple):
    """One subcommand: its name, its line in `einspace --help`, its arguments and what runs it."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: The subcommands in the order `--help` lists them. A package name stands for the commands that
#: package's `cli` module adds (`_add_package_commands`), so this file needn't know them.
_COMMANDS: tuple[_Command | str, ...] = (
    _Command(
        "check", "parse and validate a grammar; print its consistency analysis", _check_arguments, cmd_check
    ),
    _Command(
        "sample", "sample derivation trees and print them with statistics", _sample_arguments, cmd_sample
    ),
    _Command(
        "show", "show a tree file with the signal and parameters at every node", _show_arguments, cmd_show
    ),
    _Command(
        "seeds", "list the bundled seed architectures and their size at an input", _seeds_arguments, cmd_seeds
    ),
    "einspace.search",
    "einspace.evaluators",
    _Command("ops", "list the registered operations", _ops_arguments, cmd_ops),
    _Command(
        "export", "write a tree or seed as one self-contained PyTorch file", _export_arguments, cmd_export
    ),
    _Command(
        "import-model",
        "trace a PyTorch model and write its derivation tree",
        _import_model_arguments,
        cmd_import_model,
    ),
)


def _add_plugin_option(command: argparse.ArgumentParser) -> None:
    """Every command takes `--plugin`, the packages' own commands included."""
    command.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import a module or .py file that registers operations or evaluators first (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The `einspace` parser, built from `_COMMANDS`."""
    parser = argparse.ArgumentParser(prog="einspace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        if isinstance(command, str):
            _add_package_commands(command, sub)
            continue
        subparser = sub.add_parser(command.name, help=command.help)
        command.arguments(subparser)
        subparser.set_defaults(run=command.run)
    for subparser in sub.choices.values():
        _add_plugin_option(subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: errors a person can fix are printed without a traceback, exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        import_plugins(args.plugin)
        return args.run(args)
    except EinspaceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
