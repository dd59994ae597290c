"""Weight inheritance: which terminals a child takes from its parent (unchanged derivation, same
input state, same shapes), that the values survive lowering and training, the fallbacks when a
parent's file cannot be used, and a search that keeps only its living parents' weights."""

from __future__ import annotations

import pytest
import torch
from search_helpers import experiment
from torch import nn

from einspace.checker import check_tree
from einspace.evaluators.base import Inheritance, Task, run_task
from einspace.evaluators.inheritance import Lineage, unchanged_terminals
from einspace.grammar.parser import load_grammar
from einspace.network.compiler import compile_network, lower_network
from einspace.search.inherited_weights import WEIGHTS_FOLDER
from einspace.search.loop import SearchRun, _Session
from einspace.search.report import compute_rows
from einspace.search.strategy import Candidate
from einspace.state import input_state
from einspace.tree import parse_tree


def conv(d: int) -> str:
    return f"(M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d={d}))) (R2 col2im))"


PARENT = f"(S (M {conv(16)} {conv(32)}) (M (C leaky_relu)))"
SECOND_CHANGED = f"(S (M {conv(16)} {conv(16)}) (M (C leaky_relu)))"  # 2nd conv 32 -> 16 channels
FIRST_CHANGED = f"(S (M {conv(32)} {conv(32)}) (M (C leaky_relu)))"  # 1st 16 -> 32: the 2nd reads 32
INPUT = input_state((1, 8, 8), "im")
SETTINGS = {
    "dataset": "digits",
    "epochs": 2,
    "batch_size": 64,
    "train_subset": 256,
    "valid_subset": 128,
    "threads": 1,
    "device": "cpu",
}


def checked(text: str):
    return check_tree(parse_tree(text), load_grammar("einspace"), INPUT)


def layers(network: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight, bias) of the network's layers in order (two convolutions' channel mixes, then the
    head), found without the inheritance code's own path bookkeeping; a lowered network holds
    the same parameters in the same order."""
    params = list(network.parameters())
    return list(zip(params[::2], params[1::2], strict=True))


def same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def trained_parent(tmp_path, lower: bool = True) -> tuple[nn.Module, str]:
    """A parent network with weights unlike any initialisation, saved for its children."""
    torch.manual_seed(1)
    network = compile_network(checked(PARENT), classes=10, lower=False)
    lineage = Lineage(Inheritance(save=str(tmp_path / "parent.pt")), checked(PARENT), network)
    if lower:
        lower_network(network)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(torch.randn_like(p))
    assert lineage.save(network) == {"weights_saved": 1.0}
    return network, str(tmp_path / "parent.pt")


def child_of(text: str, parent: str | None, lower: bool = False) -> tuple[nn.Module, dict[str, float]]:
    torch.manual_seed(7)
    network = compile_network(checked(text), classes=10, lower=False)
    metrics = Lineage(Inheritance(parent=parent), checked(text), network).inherit()
    if lower:
        lower_network(network)
    return network, metrics


def fresh(text: str) -> nn.Module:
    torch.manual_seed(7)
    return compile_network(checked(text), classes=10, lower=False)


def test_the_aligned_walk_finds_the_terminals_outside_the_changed_subtree():
    parent, child = parse_tree(PARENT), parse_tree(SECOND_CHANGED)
    found = unchanged_terminals(child, parent)
    # everything but the second convolution's linear (its unfold and fold are unchanged)
    first, second, activation = (0, 0), (0, 1), (1, 0, 0)
    assert found == [
        (*first, 0, 0),
        (*first, 1, 0, 0),
        (*first, 2, 0),
        (*second, 0, 0),
        (*second, 2, 0),
        activation,
    ]
    assert len(unchanged_terminals(parent, parent)) == 7
    # a node with another production (one child, not two) stops the walk below it
    assert unchanged_terminals(parse_tree("(S (M (C leaky_relu)) (M (C leaky_relu)))"), parent) == [
        activation
    ]
    # another symbol at the root: nothing corresponds
    assert unchanged_terminals(parse_tree("(X (M (C leaky_relu)) (M (C leaky_relu)))"), parent) == []


def test_a_child_takes_the_unchanged_convolution_and_keeps_fresh_weights_elsewhere(tmp_path):
    parent, path = trained_parent(tmp_path)
    child, metrics = child_of(SECOND_CHANGED, path)
    p, c, f = layers(parent), layers(child), layers(fresh(SECOND_CHANGED))
    assert same(c[0], p[0]) and not same(c[0], f[0])
    # the second convolution changed, and the head reads 16 channels where the parent's read 32
    assert same(c[1], f[1]) and same(c[2], f[2])
    total = sum(q.numel() for q in child.parameters())
    assert metrics == {
        "inherited_params": 9 * 16 + 16,
        "inherited_share": (9 * 16 + 16) / total,
        "inherited_head": 0.0,
        "inheritance_missing": 0.0,
    }


def test_a_terminal_whose_input_changed_is_not_inherited_but_the_head_is(tmp_path):
    """The second convolution is the same subtree at the same place, but reads 32 channels
    instead of 16 (its weights would not fit); the head reads 32 channels in both."""
    parent, path = trained_parent(tmp_path)
    child, metrics = child_of(FIRST_CHANGED, path)
    p, c, f = layers(parent), layers(child), layers(fresh(FIRST_CHANGED))
    assert same(c[0], f[0]) and same(c[1], f[1])
    assert same(c[2], p[2]) and not same(c[2], f[2])
    assert metrics["inherited_params"] == 32 * 10 + 10 and metrics["inherited_head"] == 1.0


@pytest.mark.parametrize("lower_parent", [True, False], ids=["lowered parent", "literal parent"])
@pytest.mark.parametrize("lower_child", [True, False], ids=["lowered child", "literal child"])
def test_an_unchanged_child_computes_what_its_trained_parent_computes(tmp_path, lower_parent, lower_child):
    """Every weight is taken, through lowering on either side (the kernels adopt the literal
    modules' parameters under the same names)."""
    parent, path = trained_parent(tmp_path, lower=lower_parent)
    child, metrics = child_of(PARENT, path, lower=lower_child)
    assert metrics["inherited_share"] == 1.0
    x = torch.randn(5, 1, 8, 8)
    assert torch.allclose(child(x), parent(x), atol=1e-5)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda path: path.unlink(), id="missing"),
        pytest.param(lambda path: path.write_bytes(b"not a torch file"), id="unreadable"),
        pytest.param(lambda path: torch.save({"tree": "(S", "terminals": {}}, path), id="bad tree"),
    ],
)
def test_a_parent_file_that_cannot_be_used_means_a_fresh_start(tmp_path, spoil):
    from pathlib import Path

    _, path = trained_parent(tmp_path)
    spoil(Path(path))
    child, metrics = child_of(SECOND_CHANGED, path)
    assert metrics == {
        "inherited_params": 0.0,
        "inherited_share": 0.0,
        "inherited_head": 0.0,
        "inheritance_missing": 1.0,
    }
    assert all(map(same, layers(child), layers(fresh(SECOND_CHANGED))))


def task(tree: str, inheritance: Inheritance | None, **settings) -> Task:
    settings = {**SETTINGS, **settings}
    return Task(tree, "einspace", (1, 8, 8), "training", settings, "im", 0, None, None, inheritance)


def test_head_init_fitted_keeps_an_inherited_head_and_fits_one_that_is_not(tmp_path):
    """FIRST_CHANGED inherits its parent's head: fitted or not, the same run; SECOND_CHANGED's
    head reads other channels, so it starts fresh, and is fitted."""
    parent_file = str(tmp_path / "p.pt")
    assert run_task(task(PARENT, Inheritance(save=parent_file))).ok
    loss = {}
    for child in (FIRST_CHANGED, SECOND_CHANGED):
        for init in ("random", "fitted"):
            result = run_task(task(child, Inheritance(parent=parent_file), head_init=init))
            assert result.ok, result.error
            loss[child, init] = result.metrics["valid_loss"]
    assert loss[FIRST_CHANGED, "random"] == loss[FIRST_CHANGED, "fitted"]
    assert loss[SECOND_CHANGED, "random"] != loss[SECOND_CHANGED, "fitted"]


def test_the_training_evaluator_saves_and_inherits_through_run_task(tmp_path):
    parent_file = str(tmp_path / "p.pt")
    parent = run_task(task(PARENT, Inheritance(save=parent_file)))
    assert parent.ok and parent.metrics["weights_saved"] == 1.0
    assert "inherited_share" not in parent.metrics  # nothing to inherit: no such metric
    child = run_task(task(SECOND_CHANGED, Inheritance(parent=parent_file)))
    assert child.ok and child.metrics["inherited_params"] == 9 * 16 + 16
    assert "weights_saved" not in child.metrics
    orphan = run_task(task(SECOND_CHANGED, Inheritance(parent=str(tmp_path / "gone.pt"))))
    assert orphan.ok and orphan.metrics["inheritance_missing"] == 1.0
    # an unwritable target leaves the result standing
    blocked = tmp_path / "file"
    blocked.write_text("")
    saved = run_task(task(PARENT, Inheritance(save=str(blocked / "p.pt"))))
    assert saved.ok and saved.metrics["weights_saved"] == 0.0
    assert Task.from_json(task(PARENT, Inheritance("a.pt", "b.pt")).to_json()).inheritance == Inheritance(
        "a.pt", "b.pt"
    )


def test_an_evaluator_that_cannot_inherit_says_so():
    t = Task(PARENT, "einspace", (1, 8, 8), "synflow", {}, "im", 0, None, None, Inheritance(save="x.pt"))
    result = run_task(t)
    assert not result.ok and "inherit weights" in result.error


def test_inherit_weights_must_be_a_boolean(tmp_path):
    from einspace.search.config import ConfigError

    with pytest.raises(ConfigError, match="inherit_weights must be true or false"):
        experiment(
            tmp_path,
            input={"shape": [1, 8, 8]},
            evaluator={"name": "training", "settings": {**SETTINGS, "inherit_weights": "yes"}},
        )


def _inheriting(tmp_path, evaluations: int, **changes):
    return experiment(
        tmp_path,
        input={"shape": [1, 8, 8]},
        limits={"max_depth": 10, "max_nodes": 40, "max_params": 20000},
        evaluator={"name": "training", "settings": {**SETTINGS, "epochs": 1, "inherit_weights": True}},
        strategy={"settings": {"evaluations": evaluations, "population": 4, "tournament": 2}},
        **changes,
    )


def test_a_search_inherits_and_keeps_only_its_living_parents_weights(tmp_path):
    e = _inheriting(tmp_path, 12)
    with SearchRun.start(e) as run:
        summary = run.run(e.make_executor(), max_results=8)
        assert not summary.finished
        population = {run.store.get(i).hash for i in run.strategy.live_parents()}
        kept = {p.stem for p in (tmp_path / WEIGHTS_FOLDER).glob("*.pt")}
        ok = {r.hash for r in run.store.history() if r.status == "ok"}
        assert kept == population & ok  # every living parent that trained, nothing else
    with SearchRun.start(e) as run:  # resumed: finds the files it left
        assert run.run(e.make_executor()).finished
        history = run.store.history()
        population = {run.store.get(i).hash for i in run.strategy.live_parents()}
    children = [r for r in history if r.origin == "mutation" and r.status == "ok"]
    assert children and all("inherited_share" in r.metrics for r in children)
    assert any(r.metrics["inherited_share"] > 0 for r in children)
    kept = {p.stem for p in (tmp_path / WEIGHTS_FOLDER).glob("*.pt")}
    assert kept <= population and kept
    _, rows = compute_rows(history)
    assert any(what == "weights inherited" for what, _ in rows)


def test_pruning_keeps_the_files_of_what_is_in_flight_and_of_its_first_parent(tmp_path):
    """A parent that aged out of the population while its child trains keeps its file until the
    child is done (the child reads it), and so does the child's own (it is being written)."""
    e = _inheriting(tmp_path, 12)
    with SearchRun.start(e) as run:
        run.run(e.make_executor(), max_results=8)
        live = {run.store.get(i).hash for i in run.strategy.live_parents()}
        aged = next(r for r in run.store.history() if r.status == "ok" and r.hash not in live)
        session = _Session(run, e.make_executor(), None, None, None)
        session.weights.path(aged.hash).write_bytes(b"kept while its child trains")
        session.weights.saved(aged.hash)
        child = Candidate(99, aged.tree, "in-flight-hash", "mutation", (aged.id,))
        session.in_flight[child.id] = child
        assert {aged.hash, "in-flight-hash"} <= session._live_weights()
        session.weights.prune(session._live_weights())
        assert session.weights.path(aged.hash).is_file()
        del session.in_flight[child.id]
        session.weights.prune(session._live_weights())
        assert not session.weights.path(aged.hash).exists()
        assert aged.hash not in session._live_weights()
