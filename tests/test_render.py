"""Tree pictures: DOT text, folded views, the data-flow graph, and PNG/SVG/HTML files of them."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from einspace import check_tree, input_state, load_grammar, parse_tree, sample_tree
from einspace.cli import main
from einspace.ops.registry import Group
from einspace.pictures import dataflow, fold, folded_text, render
from einspace.pictures.dot import GROUP_COLOURS, NONTERMINAL_COLOUR, to_dot
from einspace.pictures.folding import Kind, count_leaves
from einspace.seeds import list_seeds, load_seed
from einspace.tree import Terminal, format_terminal, pretty, walk


def test_dot_has_every_node_and_edge_coloured_by_group():
    tree = parse_tree(
        "(S (B clone(b=2)) (Branches [(M (C norm)) (M (R1 identity) (M (C softmax)) (R2 identity))]) (A add))"
    )
    dot = to_dot(tree, "fig")
    nodes = re.findall(r'^\s+(\w+) \[label="([^"]*)", shape=\w+, fillcolor="([^"]*)"\];$', dot, re.M)
    edges = re.findall(r"^\s+\w+ -> \w+;$", dot, re.M)
    assert len(nodes) == len(list(walk(tree)))
    assert len(edges) == len(nodes) - 1
    colours = {label: colour for _, label, colour in nodes}
    assert colours["clone(b=2)"] == GROUP_COLOURS[Group.BRANCHING]
    assert colours["add"] == GROUP_COLOURS[Group.AGGREGATION]
    assert colours["identity"] == GROUP_COLOURS[Group.ROUTING]
    assert colours["softmax"] == GROUP_COLOURS[Group.COMPUTATION]
    assert colours["Branches"] == NONTERMINAL_COLOUR
    assert dot.startswith('digraph "fig" {') and dot.endswith("}")


# ----------------------------------------------------------------------------- folded views

GRAMMAR = load_grammar("einspace")
X64 = input_state((3, 64, 64))


def _seed(name):
    return check_tree(load_seed(name, GRAMMAR, X64), GRAMMAR, X64)


def _expanded_ops(view):
    """The view's operations in order with every ×k copy written out (a tree repeat stays one
    derivation, as in the tree itself)."""
    if view.kind is Kind.OP:
        ops = [view.label]
    else:
        ops = [op for child in view.children for op in _expanded_ops(child)]
    return ops * (view.times if view.kind is not Kind.REPEAT else 1)


@pytest.mark.parametrize("name", list_seeds())
def test_a_view_without_depth_folds_keeps_every_operation_in_order(name):
    checked = _seed(name)
    folding = fold(checked)
    terminals = [format_terminal(n) for _, n in walk(checked.tree) if isinstance(n, Terminal)]
    assert _expanded_ops(folding.view) == terminals
    assert folding.flattened > 0 and folding.folded == 0


def test_nested_sequences_flatten_and_identical_neighbours_collapse():
    norm, act = "(M (C norm))", "(M (C leaky_relu))"
    tree = parse_tree(f"(S (M {norm} (M {act} (M {norm} {act}))) (M (C linear(d=16))))")
    checked = check_tree(tree, GRAMMAR, input_state((3, 8, 8)))
    folding = fold(checked)
    kids = folding.view.children
    assert folding.flattened == 3  # the three M -> M M nodes merged into S
    assert [k.kind for k in kids] == [Kind.GROUP, Kind.SYMBOL]  # {norm act} x 2, then linear
    assert kids[0].times == 2 and folding.runs == 1
    assert folding.run_nodes == 2 * 3  # the second copy: (M (C norm)) and (M (C leaky_relu))
    assert "×2" in folded_text(checked) and "{" in folded_text(checked)


def test_neighbours_with_the_same_text_but_another_input_are_not_merged():
    # linear(d=16) maps 3 channels to 16, then 16 to 16: the same text, different layers.
    tree = parse_tree("(S (M (C linear(d=16))) (M (C linear(d=16))))")
    folding = fold(check_tree(tree, GRAMMAR, input_state((3, 8, 8))))
    assert [k.times for k in folding.view.children] == [1, 1] and folding.runs == 0


def test_identical_parallel_branches_are_drawn_once():
    tree = parse_tree("(S (B clone(b=2)) (Branches [(M (C norm)) (M (C norm))]) (A add))")
    folding = fold(check_tree(tree, GRAMMAR, input_state((3, 8, 8))))
    parallel = folding.view.children[1].children[0]
    assert parallel.kind is Kind.PARALLEL and [c.times for c in parallel.children] == [2]
    assert folding.branches == 1 and folding.branch_nodes == 3


def test_folding_to_a_budget_accounts_for_every_terminal():
    checked = _seed("resnet_small")  # no runs: every terminal is drawn or inside a box
    folding = fold(checked, lambda v: count_leaves(v) <= 12)
    assert count_leaves(folding.view) <= 12 and folding.folded > 0
    drawn = sum(1 for _, v in folding.view.walk() if v.kind is Kind.OP)
    boxed = sum(
        1
        for _, v in folding.view.walk()
        if v.kind is Kind.FOLDED
        for _, n in walk(v.node)
        if isinstance(n, Terminal)
    )
    assert drawn + boxed == checked.stats.terminals
    assert folding.folded_nodes == sum(
        sum(1 for _ in walk(v.node)) for _, v in folding.view.walk() if v.kind is Kind.FOLDED
    )
    assert any("folded into one box" in note for note in folding.notes())


def test_folded_text_of_a_tree_with_nothing_to_fold_is_pretty():
    tree = parse_tree("(S (R1 im2col(k=4, s=4, p=0)) (M (C linear(d=32))) (R2 col2im))")
    checked = check_tree(tree, GRAMMAR, input_state((3, 32, 32)))
    assert folded_text(checked, width=88) == pretty(tree)


def test_folded_text_fits_its_line_budget_and_says_what_it_folded():
    text = folded_text(_seed("densenet"), max_lines=20)
    lines = text.splitlines()
    assert len(lines) <= 21 and lines[-1].startswith("# folded: ") and "nodes: " in text


# ----------------------------------------------------------------------------- data-flow graph


@pytest.mark.parametrize("name", ["resnet_small", "vit"])
def test_dataflow_feeds_every_operation_all_its_inputs(name):
    checked = _seed(name)
    graph = dataflow(fold(checked))
    for n, data in graph.nodes(data=True):
        if data["kind"] == "op":
            fed = sum(graph.edges[p, n]["count"] for p in graph.predecessors(n))
            assert fed == len(checked.facts[data["path"]].input), data["label"]
        for m in graph.successors(n):
            assert graph.nodes[m]["layer"] > data["layer"]
    sinks = [n for n in graph if graph.out_degree(n) == 0]
    assert [graph.nodes[n]["kind"] for n in sinks] == ["output"]


def test_dataflow_of_a_residual_draws_the_skip_as_an_edge():
    tree = parse_tree("(S (B clone(b=2)) (Branches [(M (C norm)) (M (C identity))]) (A add))")
    graph = dataflow(fold(check_tree(tree, GRAMMAR, input_state((3, 8, 8)))))
    by_label = {d["label"]: n for n, d in graph.nodes(data=True)}
    assert graph.has_edge(by_label["clone(b=2)"], by_label["add"])  # the identity branch, not drawn
    assert graph.has_edge(by_label["norm"], by_label["add"]) and graph.graph["hidden"] == 1
    assert graph.nodes[by_label["add"]]["group"] is Group.AGGREGATION


def test_every_group_has_a_colour_and_new_operations_need_no_case():
    from einspace.pictures.figures import graph_figure

    assert set(GROUP_COLOURS) == set(Group)
    tree = parse_tree(
        "(S (M (B clone(b=2)) (Branches [(M (C dnarch_width(d=16))) (M (C norm))]) (A channel_calibrate))"
        " (M (C xd(d=16, k=3, s=1, p=1))))"
    )
    checked = check_tree(tree, None, input_state((16, 8, 8)))  # xd is in no bundled grammar yet
    groups = {d["label"]: d["group"] for _, d in dataflow(fold(checked)).nodes(data=True)}
    assert groups["channel_calibrate"] is Group.AGGREGATION
    assert groups["dnarch_width(d=16)"] is groups["xd(d=16, k=3, s=1, p=1)"] is Group.COMPUTATION
    assert graph_figure(checked).get_size_inches()[1] > 1


# ----------------------------------------------------------------------------- files


@pytest.mark.parametrize("name", list_seeds())
def test_each_seed_renders_to_png(tmp_path, name):
    from PIL import Image

    path = render(_seed(name), tmp_path / f"{name}.png", name)
    with Image.open(path) as image:
        assert image.format == "PNG" and min(image.size) > 300


def test_a_sampled_tree_renders_to_svg_and_html(tmp_path):
    x = input_state((3, 32, 32))
    checked = check_tree(sample_tree(GRAMMAR, x, random_seed=5), GRAMMAR, x)
    svg = ET.parse(render(checked, tmp_path / "t.svg", "sampled", view="graph")).getroot()
    assert svg.tag.endswith("svg") and len(list(svg.iter())) > 20
    page = render(checked, tmp_path / "t.html", "sampled").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<title>sampled</title>" in page
    assert page.count('src="data:image/svg+xml;base64,') == 2


def test_cli_show_render_writes_by_extension_and_refuses_others(tmp_path, capsys):
    assert main(["show", "resnet_small", "--input", "1,8,8", "--render", str(tmp_path / "r.svg")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "r.svg").read_text().lstrip().startswith(
        "<?xml"
    )
    assert main(["show", "resnet_small", "--input", "1,8,8", "--render", str(tmp_path / "r.pdf")]) == 2
    err = capsys.readouterr().err
    assert "r.pdf" in err and ".png, .svg, .html" in err and "Traceback" not in err
    assert not (tmp_path / "r.pdf").exists()
