"""The mutation operators insert and remove (`einspace.sampling.variation`): what each changes,
what it keeps, where it applies, and how bad weights are refused."""

from __future__ import annotations

import random

import pytest

from einspace import Limits, Variation, check_tree, load_grammar, parse_tree, sample_tree
from einspace.errors import EinspaceError, VariationError
from einspace.grammar.parser import parse_grammar
from einspace.sampling.variation import mutation_weights, sequence_symbols
from einspace.search.strategy import SearchSpace, get_strategy
from einspace.state import input_state
from einspace.tree import Node, Nonterminal, node_at, replace_at, to_text, walk

IMAGE = input_state((3, 16, 16))
LIMITS = Limits(max_depth=14, max_nodes=120)
PAPER = load_grammar("einspace")


def _sequence_paths(tree: Node) -> set[tuple[int, ...]]:
    return {
        path
        for path, node in walk(tree)
        if isinstance(node, Nonterminal)
        and node.symbol == "M"
        and len(node.children) == 2
        and all(isinstance(c, Nonterminal) and c.symbol == "M" for c in node.children)
    }


def _undo_insert(parent: Node, child: Node) -> bool:
    """Whether `child` is `parent` with one node X replaced by X(new, X) or X(X, new)."""
    for path in _sequence_paths(child):
        seq = node_at(child, path)
        for kept in seq.children:
            if replace_at(child, path, kept) == parent and (not path or node_at(parent, path) == kept):
                return True
    return False


def _undo_remove(parent: Node, child: Node) -> bool:
    """Whether `child` is `parent` with one sequence node replaced by one of its two parts."""
    return any(
        replace_at(parent, path, part) == child
        for path in _sequence_paths(parent)
        for part in node_at(parent, path).children
    )


def _trees(count: int) -> list[Node]:
    return [sample_tree(PAPER, IMAGE, random_seed=s, limits=LIMITS) for s in range(count)]


def test_the_paper_grammar_has_one_sequence_symbol():
    # M -> M M is the sequence rule; S -> M M is not one (S's parts are not S).
    assert sequence_symbols(PAPER) == {"M"}


def test_insert_keeps_the_parent_whole_and_adds_one_stage():
    variation = Variation(PAPER, IMAGE, LIMITS, rng=random.Random(0), mutations={"insert": 1})
    grown = 0
    for tree in _trees(25):
        try:
            child = variation.mutate(tree)
        except VariationError:
            continue  # a tree at the depth or node limit has no room for another stage
        grown += 1
        check_tree(child, PAPER, IMAGE)
        assert child != tree
        assert _undo_insert(tree, child), "insert changed more than one stage"
        assert len(_sequence_paths(child)) >= len(_sequence_paths(tree)) + 1  # the new stage may hold more
    assert grown >= 15
    # The new stage goes before the node and after it: both orders occur.
    orders = set()
    for seed in range(40):
        tree = parse_tree("(S (M (C norm)) (M (C leaky_relu)))")
        child = Variation(PAPER, IMAGE, LIMITS, rng=random.Random(seed), mutations={"insert": 1}).mutate(tree)
        for path in ((0,), (1,)):  # the two M nodes, the only insert sites
            if path not in _sequence_paths(child):
                continue
            first, second = node_at(child, path).children
            if first == node_at(tree, path) != second:
                orders.add("after")
            if second == node_at(tree, path) != first:
                orders.add("before")
    assert orders == {"before", "after"}


def test_remove_drops_one_stage_and_keeps_the_rest():
    variation = Variation(PAPER, IMAGE, LIMITS, rng=random.Random(1), mutations={"remove": 1})
    removed = 0
    for tree in _trees(40):
        if not _sequence_paths(tree):
            with pytest.raises(VariationError, match="no site for the mutation operators"):
                variation.mutate(tree)
            continue
        try:
            child = variation.mutate(tree)
        except VariationError:
            continue  # every removal would break the shapes downstream
        check_tree(child, PAPER, IMAGE)
        assert _undo_remove(tree, child), "remove changed something besides one sequence node"
        removed += 1
    assert removed >= 10


def test_remove_of_a_known_tree_gives_exactly_its_two_parts():
    tree = parse_tree("(S (M (M (C norm)) (M (C softmax))) (M (C leaky_relu)))")
    children = {
        Variation(PAPER, IMAGE, LIMITS, rng=random.Random(s), mutations={"remove": 1}).mutate(tree)
        for s in range(20)
    }
    assert children == {
        parse_tree("(S (M (C norm)) (M (C leaky_relu)))"),
        parse_tree("(S (M (C softmax)) (M (C leaky_relu)))"),
    }


def test_a_minimal_tree_has_nothing_to_remove_but_can_grow():
    tree = parse_tree("(S (M (C identity)) (M (C identity)))")
    refusal = r"insert and remove need a symbol with a sequence rule X -> X X\)$"
    with pytest.raises(VariationError, match=refusal):
        Variation(PAPER, IMAGE, LIMITS, mutations={"remove": 1}).mutate(tree)
    # With remove and subtree, the operator that has a site is used.
    child = Variation(
        PAPER, IMAGE, LIMITS, rng=random.Random(0), mutations={"remove": 5, "subtree": 1}
    ).mutate(tree)
    assert child != tree


def test_a_grammar_without_a_sequence_rule_has_no_insert_site():
    grammar = parse_grammar("start S\nS -> C C\nC -> identity | norm | leaky_relu\n")
    assert sequence_symbols(grammar) == frozenset()
    tree = parse_tree("(S (C identity) (C norm))")
    with pytest.raises(VariationError, match="no site"):
        Variation(grammar, IMAGE, mutations={"insert": 1}).mutate(tree)


def test_insert_respects_the_limits():
    tight = Limits(max_depth=14, max_nodes=12)
    tree = parse_tree("(S (M (C norm)) (M (C leaky_relu)))")  # 7 nodes
    variation = Variation(PAPER, IMAGE, tight, rng=random.Random(0), mutations={"insert": 1})
    for _ in range(30):
        child = variation.mutate(tree)
        nodes = sum(n.kind in ("terminal", "nonterminal") for _, n in walk(child))
        assert nodes <= 12
    # At the node limit nothing can be inserted: a new stage costs at least 4 nodes (M, M, C, op).
    full = Limits(max_depth=14, max_nodes=7)
    with pytest.raises(VariationError, match="no valid mutation"):
        Variation(PAPER, IMAGE, full, rng=random.Random(0), mutations={"insert": 1}).mutate(tree)


def test_subtree_weight_alone_is_the_default_random_stream():
    tree = sample_tree(PAPER, IMAGE, random_seed=3, limits=LIMITS)
    runs = [
        [Variation(PAPER, IMAGE, LIMITS, rng=random.Random(9), mutations=m).mutate(tree) for _ in range(5)]
        for m in (None, {"subtree": 1.0}, {"subtree": 2, "insert": 0, "remove": 0})
    ]
    assert runs[0] == runs[1] == runs[2]


def test_all_operators_mix_in_proportion():
    variation = Variation(
        PAPER, IMAGE, LIMITS, rng=random.Random(0), mutations={"subtree": 1, "insert": 1, "remove": 1}
    )
    tree = parse_tree("(S (M (M (C norm)) (M (C softmax))) (M (M (C leaky_relu)) (M (C identity))))")
    kinds = {"insert": 0, "remove": 0, "other": 0}
    for _ in range(150):
        child = variation.mutate(tree)
        if _undo_remove(tree, child):
            kinds["remove"] += 1
        elif _undo_insert(tree, child):
            kinds["insert"] += 1
        else:
            kinds["other"] += 1
    # a subtree mutation may look like an insert or a removal; each operator has a third of the draws
    assert kinds["remove"] >= 30 and kinds["insert"] >= 30 and kinds["other"] >= 20


@pytest.mark.parametrize(
    "mutations, message",
    [
        ({"insrt": 1}, r"unknown mutation operator\(s\) \['insrt'\]"),
        ({"insert": -1}, "mutation weight of 'insert' must be a finite number >= 0, got -1"),
        ({"insert": float("inf")}, "mutation weight of 'insert' must be a finite number >= 0, got inf"),
        ({"insert": "1"}, "mutation weight of 'insert'"),
        ({"insert": True}, "mutation weight of 'insert'"),
        ({"insert": float("nan")}, "mutation weight of 'insert'"),
        ({"insert": 0, "remove": 0}, "all zero"),
        ({}, "all zero"),
        (["insert"], "must map operators"),
    ],
)
def test_bad_mutation_weights_are_refused(mutations, message):
    with pytest.raises(VariationError, match=message):
        mutation_weights(mutations)


def test_weights_are_completed_with_zeros():
    assert mutation_weights({"insert": 2}) == {"subtree": 0.0, "insert": 2.0, "remove": 0.0}
    assert mutation_weights(None) == {"subtree": 1.0, "insert": 0.0, "remove": 0.0}


def test_regularised_evolution_takes_the_weights_and_keeps_them_after_a_restore():
    space = SearchSpace(PAPER, IMAGE, LIMITS)
    settings = {"evaluations": 40, "population": 5, "tournament": 2, "mutations": {"remove": 1}}
    strategy = get_strategy("regularised_evolution", space, 0, settings)
    assert strategy.variation.mutations == {"subtree": 0.0, "insert": 0.0, "remove": 1.0}
    parents: dict[int, str] = {}
    for _ in range(30):
        candidate = strategy.ask()
        parents[candidate.id] = candidate.tree
        if candidate.origin == "mutation":
            parent, child = parse_tree(parents[candidate.parents[0]]), parse_tree(candidate.tree)
            assert _undo_remove(parent, child)
        strategy.tell(candidate.id, len(candidate.tree))
    restored = get_strategy("regularised_evolution", space, 0, settings)
    restored.load_state_dict(strategy.state_dict())
    assert restored.variation.mutations == strategy.variation.mutations
    assert [restored.ask().tree for _ in range(3)] == [strategy.ask().tree for _ in range(3)]


def test_a_misspelled_operator_in_the_strategy_settings_names_it():
    with pytest.raises(EinspaceError, match="insrt"):
        get_strategy(
            "regularised_evolution", SearchSpace(PAPER, IMAGE, LIMITS), 0, {"mutations": {"insrt": 1}}
        )


def test_a_sequence_rule_of_probability_zero_is_no_site():
    # M -> M M is alternative 0 of M; with probability 0 it derives nothing, so nothing to insert.
    assert sequence_symbols(PAPER.with_probability("M", 0, 0.0)) == frozenset()


def test_only_a_sequence_of_the_nodes_own_symbol_is_removed():
    # M -> M N is two parts, but not two of M's: removing one would leave an N where an M was.
    grammar = parse_grammar("start S\nS -> M M\nM -> M M | M N | C\nN -> C\nC -> norm | leaky_relu\n")
    assert sequence_symbols(grammar) == {"M"}
    mixed = parse_tree("(S (M (M (C norm)) (N (C leaky_relu))) (M (C norm)))")
    with pytest.raises(VariationError, match=r"no site for the mutation operators \['remove'\] in this tree"):
        Variation(grammar, IMAGE, LIMITS, rng=random.Random(0), mutations={"remove": 1}).mutate(mixed)
    nested = parse_tree("(S (M (M (C norm)) (M (C leaky_relu))) (M (C norm)))")
    child = Variation(grammar, IMAGE, LIMITS, rng=random.Random(0), mutations={"remove": 1}).mutate(nested)
    assert child in {
        parse_tree("(S (M (C norm)) (M (C norm)))"),
        parse_tree("(S (M (C leaky_relu)) (M (C norm)))"),
    }


def test_unequal_weights_are_drawn_in_proportion():
    tree = parse_tree("(S (M (M (C norm)) (M (C softmax))) (M (M (C leaky_relu)) (M (C identity))))")
    for weights, removals in (
        ({"remove": 9, "insert": 1}, (120, 150)),
        ({"remove": 1, "insert": 9}, (0, 30)),
    ):
        variation = Variation(PAPER, IMAGE, LIMITS, rng=random.Random(0), mutations=weights)
        removed = sum(_undo_remove(tree, variation.mutate(tree)) for _ in range(150))
        assert removals[0] <= removed <= removals[1], (weights, removed)
    # two operators with a weight each: both are used
    variation = Variation(PAPER, IMAGE, LIMITS, rng=random.Random(0), mutations={"remove": 1, "insert": 1})
    removed = sum(_undo_remove(tree, variation.mutate(tree)) for _ in range(60))
    assert 15 <= removed <= 45


def test_insert_has_exactly_the_room_the_node_limit_leaves():
    # 7 nodes; the smallest insert adds 4: the sequence node, and (M (C op)) of 3.
    tree = parse_tree("(S (M (C norm)) (M (C leaky_relu)))")
    room = Limits(max_depth=14, max_nodes=11)
    child = Variation(PAPER, IMAGE, room, rng=random.Random(0), mutations={"insert": 1}).mutate(tree)
    assert sum(n.kind in ("terminal", "nonterminal") for _, n in walk(child)) == 11
    with pytest.raises(VariationError, match="; the tree may be minimal, or the limits too tight$"):
        Variation(PAPER, IMAGE, Limits(max_depth=14, max_nodes=10), mutations={"insert": 1}).mutate(tree)


def test_a_stage_is_derived_from_the_signal_where_it_goes():
    # The first M turns the image into columns (im2col, no col2im). A stage put before it receives
    # the image, so it may start with an im-mode operation (im2col, a permute of three axes); a
    # stage put after it receives columns, so it may hold col2im, which only col mode has (a stage
    # derived from the image could only hold one after its own im2col, which columns refuse).
    tree = parse_tree("(S (M (R1 im2col(k=4, s=4, p=0)) (M (C linear(d=32))) (R2 identity)) (M (C norm)))")
    old = node_at(tree, (0,))
    variation = Variation(PAPER, IMAGE, LIMITS, rng=random.Random(0), mutations={"insert": 1})
    before, after = [], []
    for _ in range(400):
        site = node_at(variation.mutate(tree), (0,))
        if old not in site.children or len(site.children) != 2:
            continue  # the stage went elsewhere
        first, second = site.children
        if first == old != second:
            after.append(second)
        elif second == old != first:
            before.append(first)
    assert before and after

    def starts_in_image_mode(stage: Node) -> bool:
        op = next(node for _, node in walk(stage) if node.kind == "terminal")
        return op.op == "im2col" or (op.op == "permute" and len(dict(op.args)["order"]) == 3)

    assert any(starts_in_image_mode(stage) for stage in before)
    assert not any(starts_in_image_mode(stage) for stage in after)
    assert any("col2im" in to_text(stage) for stage in after)


def _size(tree: Node) -> int:
    return sum(n.kind in ("terminal", "nonterminal") for _, n in walk(tree))


@pytest.mark.parametrize("operator", ["subtree", "insert"])
def test_a_change_may_use_all_the_room_the_limits_leave(operator):
    """Each limit's room is what the rest of the tree leaves: the depth below the site, the nodes
    and parameters outside the part a subtree mutation replaces (inside it for insert, which keeps
    it). A change may use all of it, and the children reach each limit."""
    cols = input_state((16, 32))
    tree = parse_tree("(S (M (C linear(d=64))) (M (C identity)))")  # depth 3, 7 nodes
    checked = check_tree(tree, PAPER, cols)
    limits = {
        "depth": Limits(max_depth=6, max_nodes=200),
        "nodes": Limits(max_depth=20, max_nodes=11),
        "params": Limits(max_depth=20, max_nodes=200, max_params=checked.params + 64 * 65),
    }
    reached = {}
    for name, limit in limits.items():
        variation = Variation(PAPER, cols, limit, rng=random.Random(1), mutations={operator: 1})
        children = [check_tree(variation.mutate(tree), PAPER, cols) for _ in range(150)]
        reached[name] = max(
            {"depth": c.stats.depth, "nodes": _size(c.tree), "params": c.params}[name] for c in children
        )
    assert reached == {"depth": 6, "nodes": 11, "params": checked.params + 64 * 65}


def test_a_subtree_mutation_may_spend_the_parameters_of_the_part_it_replaces():
    # At max_params exactly, a new first stage may hold as many parameters as the linear it
    # replaces; none more.
    cols = input_state((16, 32))
    tree = parse_tree("(S (M (C linear(d=64))) (M (C identity)))")
    checked = check_tree(tree, PAPER, cols)
    own = checked.facts[(0,)].params
    variation = Variation(PAPER, cols, Limits(max_depth=20, max_params=checked.params), rng=random.Random(0))
    spent = [
        check_tree(child, PAPER, cols).facts[(0,)].params
        for child in (variation.mutate(tree) for _ in range(150))
        if node_at(child, (0,)) != node_at(tree, (0,))
    ]
    assert 0 < max(spent) <= own
