"""Asynchronous successive halving: its rungs, its promotion rule, what the wrapped strategy hears,
exact resume, a search through the run loop, and the experiment keys it is configured by."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import yaml
from search_helpers import BASE, experiment, history_key, merge

from einspace import Limits, input_state, load_grammar
from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.evaluators.base import Cost, task_settings
from einspace.search.config import ConfigError
from einspace.search.loop import SearchRun
from einspace.search.report import compute_rows
from einspace.search.store import Record
from einspace.search.strategy import SearchSpace, get_strategy
from einspace.search.successive_halving import SuccessiveHalving, default_rungs, rung_etas

SPACE = SearchSpace(load_grammar("einspace"), input_state((3, 16, 16)), Limits(max_depth=12, max_nodes=80))
RE = {"evaluations": 40, "population": 8, "tournament": 3}


def fitness(tree: str, fidelity: int) -> float:
    """Deterministic: longer training scores higher; some trees fail (-inf)."""
    if len(tree) % 11 == 0:
        return -math.inf
    return -abs(len(tree) - 120) / 100 - 1 / (fidelity + 1)


def wrapped(
    name: str = "regularised_evolution",
    seed: int = 0,
    rungs=(1, 3, 9),
    eta: int | tuple[int, ...] = 3,
    strategy_fitness: str = "lowest_rung",
    window: int | None = None,
) -> SuccessiveHalving:
    settings = RE if name == "regularised_evolution" else {"evaluations": 30}
    return SuccessiveHalving(get_strategy(name, SPACE, seed, settings), rungs, eta, strategy_fitness, window)


def falling(tree: str, fidelity: int) -> float:
    """Like `fitness` at the lowest rung, lower at every rung above: only the rung a member
    reached keeps it ahead in tournaments (strategy_fitness highest_rung)."""
    return fitness(tree, 1) - fidelity


def drive(
    s: SuccessiveHalving,
    in_flight: int = 3,
    stop_after: int | None = None,
    partial=lambda c: False,
    score=fitness,
    seconds=lambda c: None,
):
    """Ask/tell with up to `in_flight` outstanding, oldest told first; returns the asked candidates."""
    asked, outstanding = [], list(s.pending())
    while not s.done and (stop_after is None or len(asked) < stop_after):
        while len(outstanding) < in_flight and (c := s.ask()) is not None:
            asked.append(c)
            outstanding.append(c)
        if not outstanding:
            break
        c = outstanding.pop(0)
        s.tell(c.id, score(c.tree, c.fidelity), partial=partial(c), seconds=seconds(c))
    return asked


@pytest.mark.parametrize(
    ("low", "high", "eta", "rungs"),
    [
        (1, 8, 3, [1, 3, 8]),
        (1, 9, 3, [1, 3, 9]),
        (2, 8, 2, [2, 4, 8]),
        (1, 2, 3, [1, 2]),
        (4, 4, 3, [4]),
        (0, 8, 3, [0, 1, 3, 8]),
        (0, 1, 3, [0, 1]),
        (0, 0, 3, [0]),
    ],
)
def test_default_rungs_are_geometric_up_to_the_top(low, high, eta, rungs):
    assert default_rungs(low, high, eta) == rungs


@pytest.mark.parametrize(
    ("rungs", "eta"),
    [
        ((1,), 3),
        ((3, 1), 3),
        ((1, 1), 3),
        ((-1, 2), 3),
        ((1, 3), 1),
        ((1, 3), True),
        ((1, 3, 9), (3,)),  # one per rung below the top: two
        ((1, 3, 9), (3, 3, 3)),
        ((1, 3, 9), (3, 1)),
        ((1, 3, 9), (3, True)),
        ((1, 3, 9), ()),
    ],
)
def test_bad_rungs_or_eta_are_refused(rungs, eta):
    with pytest.raises(EinspaceError, match="successive halving needs"):
        wrapped(rungs=rungs, eta=eta)


def test_a_window_narrower_than_any_rung_s_eta_is_refused():
    wrapped(eta=(2, 6), window=6)
    with pytest.raises(EinspaceError, match=r"a window of at least eta \(6\) results, got 5"):
        wrapped(eta=(2, 6), window=5)


def test_an_unknown_strategy_fitness_is_refused():
    with pytest.raises(
        EinspaceError, match="strategy_fitness must be 'lowest_rung' or 'highest_rung', got 'best'"
    ):
        wrapped(strategy_fitness="best")


@pytest.mark.parametrize("eta", [3, (2, 4), (4, 2)])
@pytest.mark.parametrize("name", ["regularised_evolution", "random_search"])
def test_promotions_follow_the_asha_rule(name, eta):
    """Each promotion is of a result in its rung's top 1/eta (that rung's eta, where each has
    its own) when it was made, of a tree that did not fail, never twice; when the run is done,
    every rung's top 1/eta has been promoted."""
    s = wrapped(name, eta=eta)
    etas = dict(zip(s.rungs, rung_etas(eta, s.rungs), strict=False))
    asked, results = [], {}  # job id -> (fidelity, fitness)
    outstanding = []
    while not s.done:
        while len(outstanding) < 3 and (c := s.ask()) is not None:
            if c.origin == "promotion":
                (parent,) = c.parents
                low, _ = results[parent]
                assert c.fidelity == s.rungs[s.rungs.index(low) + 1]
                peers = sorted((f for fid, f in results.values() if fid == low), reverse=True)
                assert math.isfinite(results[parent][1])
                assert results[parent][1] >= peers[len(peers) // etas[low] - 1]  # within the top 1/eta
            else:
                assert c.fidelity == s.rungs[0]
            asked.append(c)
            outstanding.append(c)
        c = outstanding.pop(0)
        f = fitness(c.tree, c.fidelity)
        results[c.id] = (c.fidelity, f)
        s.tell(c.id, f)
    promoted = [c.parents[0] for c in asked if c.origin == "promotion"]
    assert len(promoted) == len(set(promoted)) > 0  # nothing promoted twice
    assert sum(c.origin != "promotion" for c in asked) == s.evaluations
    for low, high in zip(s.rungs, s.rungs[1:], strict=False):
        first = {}  # each tree's first evaluation at this rung: (fitness, job id)
        for c in asked:
            if c.fidelity == low and c.tree not in first:
                first[c.tree] = (results[c.id][1], c.id)
        ranked = sorted(first, key=lambda t: (-first[t][0], first[t][1]))
        top = [t for t in ranked[: len(ranked) // etas[low]] if math.isfinite(first[t][0])]
        assert set(top) <= {c.tree for c in asked if c.fidelity == high}  # done: none left behind


def test_a_rung_at_0_epochs_screens_before_training_and_is_not_continued_from():
    """Every new architecture is looked at untrained first; its promotion to the first training
    rung trains from scratch (there is no state at 0 epochs), later promotions go on as before."""
    s = wrapped(rungs=(0, 1, 3))
    asked = drive(s)
    assert all(c.fidelity == 0 for c in asked if c.origin != "promotion")
    from_0 = [c for c in asked if c.origin == "promotion" and c.fidelity == 1]
    later = [c for c in asked if c.origin == "promotion" and c.fidelity == 3]
    assert from_0 and later
    assert all(c.continues is None for c in from_0)
    assert all(c.continues == c.parents[0] for c in later)


def test_the_wrapped_strategy_hears_only_the_lowest_rung():
    """Its fitness and its seconds (what a strategy that weighs cost learns from)."""
    s = wrapped()
    heard = []
    original = s.base.tell

    def tell(i, f, partial=False, seconds=None):
        heard.append((f, seconds))
        original(i, f, partial=partial, seconds=seconds)

    s.base.tell = tell
    asked = drive(s, seconds=lambda c: 100.0 * c.fidelity + c.id)
    lowest = [(fitness(c.tree, 1), 100.0 + c.id) for c in asked if c.origin != "promotion"]
    assert sorted(heard) == sorted(lowest) and len(heard) == s.evaluations
    assert any(c.fidelity == 9 for c in asked)


@pytest.mark.parametrize("strategy_fitness", ["lowest_rung", "highest_rung"])
def test_with_highest_rung_a_member_holds_its_result_at_the_highest_rung_it_reached(strategy_fitness):
    """highest_rung: each living member's fitness is its tree's result at the highest rung that
    tree reached, and the rung is kept; lowest_rung: the lowest rung's result, nothing else heard."""
    s = wrapped(strategy_fitness=strategy_fitness)
    asked = drive(s)
    proposals = Counter(c.tree for c in asked if c.origin != "promotion")
    reached = {}  # tree -> the highest fidelity it was trained at
    for c in asked:
        reached[c.tree] = max(reached.get(c.tree, 0), c.fidelity)
    members = [(i, t, f) for i, t, f in s.base.population if proposals[t] == 1 and math.isfinite(f)]
    assert members
    for i, tree, f in members:
        top = reached[tree] if strategy_fitness == "highest_rung" else 1
        assert f == fitness(tree, top)
        assert s.base.rung_of.get(i, 0) == s.rungs.index(top)
    promoted_members = [i for i, t, _ in members if reached[t] > 1]
    assert promoted_members  # the run promoted some of the living
    assert bool(s.base.rung_of) == (strategy_fitness == "highest_rung")
    assert set(s.base.rung_of) <= {i for i, _, _ in s.base.population}  # the dead are forgotten


@pytest.mark.parametrize("spoil", ["partial", "failed"])
def test_a_partial_or_failed_promotion_is_not_heard(spoil):
    """highest_rung passes on only promotions scored at their full fidelity: a partial result
    (a time budget stopped it) or a failure leaves the member as it was."""
    s = wrapped(strategy_fitness="highest_rung")
    heard = []
    s.base.hear_promotion = lambda i, rung, f: heard.append((i, rung, f))
    partial = (lambda c: c.origin == "promotion") if spoil == "partial" else (lambda c: False)
    score = (lambda t, fid: fitness(t, fid) if fid == 1 else -math.inf) if spoil == "failed" else fitness
    asked = drive(s, partial=partial, score=score)
    assert any(c.origin == "promotion" for c in asked) and heard == []


def test_a_member_that_reached_a_higher_rung_wins_the_tournament_whatever_its_fitness():
    """A member heard at rung 1 beats one at the lowest rung with a higher fitness; a promotion
    of a member that died changes nothing."""
    re = get_strategy(
        "regularised_evolution", SPACE, 0, {"evaluations": 30, "population": 2, "tournament": 40}
    )
    first = [re.ask(), re.ask()]
    re.tell(first[0].id, 0.9)
    re.tell(first[1].id, 0.1)
    children = [re.ask() for _ in range(3)]
    assert {c.parents for c in children} == {(first[0].id,)}  # fitness decides at equal rungs
    re.hear_promotion(first[1].id, 1, 0.05)
    children = [re.ask() for _ in range(3)]
    assert {c.parents for c in children} == {(first[1].id,)}
    for c in children:
        re.tell(c.id, 0.5)  # the first two age out
    before = list(re.population)
    re.hear_promotion(first[0].id, 2, 0.99)
    assert re.population == before and first[1].id not in re.rung_of


def test_parents_of_mutations_are_the_evaluations_of_their_parent_trees():
    asked = drive(wrapped())
    tree_of = {c.id: c.tree for c in asked}
    mutations = [c for c in asked if c.origin == "mutation"]
    assert mutations
    for c in mutations:
        (parent,) = c.parents
        assert parent in tree_of and next(a for a in asked if a.id == parent).fidelity == 1


def test_partial_and_failed_results_are_never_promoted():
    every_other = lambda c: c.id % 2 == 0  # noqa: E731
    asked = drive(wrapped("random_search"), partial=every_other)
    promoted = [c.parents[0] for c in asked if c.origin == "promotion"]
    by_id = {c.id: c for c in asked}
    assert promoted and all(p % 2 == 1 for p in promoted)
    assert all(math.isfinite(fitness(by_id[p].tree, by_id[p].fidelity)) for p in promoted)


def test_seeds_are_promoted_to_the_top_whatever_their_rank():
    """A seed is trained up to the top rung even when its lowest-rung result ranks low."""
    seed = "(S (M (C linear(d=16))) (M (C leaky_relu)))"
    space = SearchSpace(SPACE.grammar, SPACE.input, SPACE.limits, [("small", seed)])
    s = SuccessiveHalving(get_strategy("regularised_evolution", space, 0, RE), (1, 3, 9), 3)
    asked = drive(s)
    lowest = sorted({c.tree for c in asked if c.fidelity == 1}, key=lambda t: -fitness(t, 1))
    assert lowest.index(seed) >= len(lowest) // 3  # its rank alone would not promote it
    assert {c.fidelity for c in asked if c.tree == seed} == {1, 3, 9}
    assert sum(c.tree == seed and c.fidelity == 9 for c in asked) == 1


@pytest.mark.parametrize(
    ("strategy_fitness", "window", "eta"),
    [("lowest_rung", None, 3), ("highest_rung", None, 3), ("lowest_rung", 6, 3), ("lowest_rung", 6, (2, 4))],
)
@pytest.mark.parametrize("stop_after", [1, 7, 19, 33])
def test_checkpoint_resumes_exactly(stop_after, strategy_fitness, window, eta):
    """A scheduler restored from the JSON checkpoint at any point asks what the original would,
    and its strategy hears the same promotions."""
    heard = []

    def make() -> SuccessiveHalving:
        s = wrapped(seed=5, eta=eta, strategy_fitness=strategy_fitness, window=window)
        hear = s.base.hear_promotion
        s.base.hear_promotion = lambda i, rung, f: (heard.append((i, rung, f)), hear(i, rung, f))
        return s

    score = falling if strategy_fitness == "highest_rung" else fitness  # the rung heard decides
    reference = [(c.id, c.tree, c.origin, c.parents, c.fidelity) for c in drive(make(), score=score)]
    reference_heard, heard[:] = list(heard), []
    first = make()
    asked = drive(first, stop_after=stop_after, score=score)
    restored = make()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest = drive(restored, score=score)
    got = [(c.id, c.tree, c.origin, c.parents, c.fidelity) for c in asked + rest]
    assert got == reference
    assert heard == reference_heard and bool(heard) == (strategy_fitness == "highest_rung")


def test_a_checkpoint_of_other_rungs_is_refused():
    s = wrapped()
    drive(s, stop_after=5)
    with pytest.raises(EinspaceError, match="rungs"):
        wrapped(rungs=(1, 2, 4, 9)).load_state_dict(s.state_dict())
    with pytest.raises(EinspaceError, match="strategy_fitness 'lowest_rung', not .* 'highest_rung'"):
        wrapped(strategy_fitness="highest_rung").load_state_dict(s.state_dict())
    with pytest.raises(EinspaceError, match="window None .* not .* 6"):
        wrapped(window=6).load_state_dict(s.state_dict())
    with pytest.raises(EinspaceError, match=r"eta 3, .* not \[1, 3, 9\], \[3, 6\]"):
        wrapped(eta=(3, 6)).load_state_dict(s.state_dict())
    wrapped(eta=(3, 3)).load_state_dict(s.state_dict())  # the same rate at every rung, as a list
    with pytest.raises(EinspaceError, match="successive halving switched on"):
        wrapped().load_state_dict(s.base.state_dict())


def sh_experiment(run_dir, strategy_fitness="lowest_rung", **changes):
    return experiment(
        run_dir,
        evaluator={"name": "test_fidelity", "settings": {"epochs": 9}},
        multi_fidelity={"scheduler": "successive_halving", "strategy_fitness": strategy_fitness},
        **changes,
    )


@pytest.mark.parametrize("strategy_fitness", ["lowest_rung", "highest_rung"])
def test_a_search_trains_each_rung_at_its_fidelity_and_resumes_exactly(tmp_path, strategy_fitness):
    e = sh_experiment(tmp_path / "reference", strategy_fitness, executor={"max_in_flight": 1})
    assert e.multi_fidelity.rungs == (1, 3, 9)  # resolved from min_fidelity 1, eta 3 and epochs 9
    assert e.make_strategy().strategy_fitness == strategy_fitness
    with SearchRun.start(e) as run:
        assert run.run(e.make_executor()).finished
        reference = run.store.history()
    evaluated = [r for r in reference if r.status == "ok"]
    assert {r.fidelity for r in evaluated} == {1, 3, 9}
    assert all(r.metrics["epochs"] == r.fidelity == r.cost["epochs"] for r in evaluated)
    assert all(r.cost["steps"] == 10 * r.fidelity and r.cost["cpu_seconds"] >= 0 for r in evaluated)
    keys = [(r.hash, r.fidelity) for r in evaluated]
    assert len(keys) == len(set(keys))  # no tree trained twice at one fidelity
    assert sum(r.origin != "promotion" for r in reference) == 40

    e2 = sh_experiment(tmp_path / "resumed", strategy_fitness, executor={"max_in_flight": 1})
    with SearchRun.start(e2) as run:
        assert not run.run(e2.make_executor(), max_results=23).finished
    with SearchRun.start(e2) as run:
        assert run.run(e2.make_executor()).finished
        assert history_key(run.store.history()) == history_key(reference)


def test_an_experiment_s_eta_may_be_one_per_rung_below_the_top(tmp_path):
    e = experiment(
        tmp_path,
        evaluator={"name": "test_fidelity", "settings": {"epochs": 9}},
        multi_fidelity={"scheduler": "successive_halving", "eta": [2, 4], "rungs": [1, 3, 9]},
    )
    assert e.multi_fidelity.eta == (2, 4)
    s = e.make_strategy()
    assert [level.eta for level in s._levels[:-1]] == [2, 4]
    assert json.loads(json.dumps(s.state_dict()))["eta"] == [2, 4]


def test_each_rung_s_task_names_the_top_rung_which_the_training_evaluator_hears(tmp_path):
    e = experiment(
        tmp_path,
        evaluator={"name": "training", "settings": {"epochs": 8, "max_seconds": 5}},
        multi_fidelity={"scheduler": "successive_halving", "max_fidelity": 4},
    )
    tree = "(M (C leaky_relu))"
    for fidelity in (1, 4):
        task = e.task(tree, fidelity)
        assert task.top_fidelity == 4
        assert task_settings(task) == {"epochs": fidelity, "max_seconds": 5, "top_epochs": 4}
    whole = e.task(tree)  # not a rung: the run is its own top
    assert whole.top_fidelity is None and task_settings(whole) == {"epochs": 8, "max_seconds": 5}
    other = sh_experiment(tmp_path / "other")  # an evaluator without a top-fidelity setting
    assert task_settings(other.task(tree, 3)) == {"epochs": 3}


def test_async_search_with_kills_promotes_nothing_twice(tmp_path):
    e = sh_experiment(tmp_path, executor={"max_in_flight": 4})
    for stop in (5, 17, 9):
        with SearchRun.start(e) as run:
            run.run(e.make_executor(), max_results=stop)
    with SearchRun.start(e) as run:
        assert run.run(e.make_executor()).finished
        history = run.store.history()
    promoted = [r.parents[0] for r in history if r.origin == "promotion"]
    assert promoted and len(promoted) == len(set(promoted))
    assert sorted(r.id for r in history) == list(range(len(history)))


BAD = [
    ({"eta": 1}, "multi_fidelity.eta must be an integer >= 2"),
    ({"eta": "3"}, "multi_fidelity.eta must be an integer or a list, got str '3'"),
    ({"eta": [3, 1], "rungs": [1, 3, 9]}, "multi_fidelity.eta must be an integer >= 2 or a list of them"),
    (
        {"eta": [3], "rungs": [1, 3, 9]},
        r"multi_fidelity.eta must be one integer per rung below the top \(2 for rungs \[1, 3, 9\]\)",
    ),
    ({"eta": [3, 3]}, r"multi_fidelity.eta must be one integer where .* needs explicit multi_fidelity.rungs"),
    (
        {"eta": [2, 6], "rungs": [1, 3, 9], "window": 5},
        "multi_fidelity.window must be an integer >= 6, got 5",
    ),
    ({"rungs": [3, 1]}, "multi_fidelity.rungs must be two or more strictly increasing"),
    ({"rungs": [2]}, "multi_fidelity.rungs must be two or more strictly increasing"),
    ({"rungs": [1, 2.5]}, "multi_fidelity.rungs must be integers >= 0"),
    (
        {"rungs": [1, 3, 20]},
        r"multi_fidelity.rungs: the top rung 20 is above evaluator.settings.epochs \(9\)",
    ),
    (
        {"max_fidelity": 12},
        r"multi_fidelity.max_fidelity: the top rung 12 is above evaluator.settings.epochs",
    ),
    ({"min_fidelity": 9}, "leave one rung"),
    ({"min_fidelity": -1}, "multi_fidelity.min_fidelity must be an integer >= 0, got -1"),
    ({"max_fidelity": 0}, "multi_fidelity.max_fidelity must be an integer >= 1, got 0"),
    (
        {"min_fidelity": 0},
        "multi_fidelity.min_fidelity: the lowest rung is 0, and evaluator 'test_fidelity' has no fidelity 0",
    ),
    (
        {"rungs": [0, 3, 9]},
        "multi_fidelity.rungs: the lowest rung is 0, and evaluator 'test_fidelity' has no",
    ),
    ({"scheduler": "hyperband"}, "multi_fidelity.scheduler must be 'none' or 'successive_halving'"),
    ({"rungs": [1, 3], "max_fidelity": 8}, r"multi_fidelity.max_fidelity 8 disagrees with the top of"),
    ({"promotion": "resume"}, "multi_fidelity.promotion must be 'continue' or 'retrain'"),
    ({"promotion": "continue"}, "'test_fidelity' cannot; use promotion: retrain"),
    ({"strategy_fitness": "best"}, "multi_fidelity.strategy_fitness must be 'lowest_rung' or 'highest_rung'"),
    ({"window": 2}, "multi_fidelity.window must be an integer >= 3, got 2"),
    ({"window": "all"}, "multi_fidelity.window"),
]


@pytest.mark.parametrize(("changes", "message"), BAD)
def test_bad_fidelity_settings_exit_2_naming_the_key(tmp_path, capsys, changes, message):
    raw = merge(
        BASE,
        {
            "run_dir": str(tmp_path / "run"),
            "evaluator": {"name": "test_fidelity", "settings": {"epochs": 9}},
            "multi_fidelity": {"scheduler": "successive_halving", **changes},
        },
    )
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message):
        experiment(tmp_path / "run", **{k: v for k, v in raw.items() if k in ("evaluator", "multi_fidelity")})
    assert main(["search", str(tmp_path / "exp.yaml")]) == 2
    err = capsys.readouterr().err
    assert "exp.yaml" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before the search started


def test_an_evaluator_without_fidelity_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="evaluator 'test_params' has none"):
        experiment(tmp_path, multi_fidelity={"scheduler": "successive_halving"})


def test_a_free_slot_always_gets_work_while_the_wrapped_strategy_has_some():
    """Asynchronous: with results still out, `ask` never waits for a rung to fill."""
    s = wrapped("random_search")
    outstanding = [s.ask() for _ in range(4)]
    while outstanding:
        c = outstanding.pop(0)
        s.tell(c.id, fitness(c.tree, c.fidelity))
        nxt = s.ask()
        assert nxt is not None or s.base.next_id >= s.evaluations
        if nxt is not None:
            outstanding.append(nxt)
    assert s.done


def test_the_report_says_when_no_result_reached_the_top_rung():
    """A short search may end with its best a lower rung's snapshot; the report says so, and says
    nothing once a result reached the top or where no scheduler's rungs are known."""

    def record(i: int, fidelity: int, fitness: float) -> Record:
        cost = Cost(cpu_seconds=1.0).to_json()
        return Record(
            i, f"(S t{i})", f"h{i}", "sampled", fidelity=fidelity, status="ok", fitness=fitness, cost=cost
        )

    history = [record(0, 0, 0.9), record(1, 1, 0.8), record(2, 3, 0.85), record(3, 1, 0.95)]
    checkpoint = wrapped(rungs=(0, 1, 3, 8)).state_dict()
    _, rows = compute_rows(history, checkpoint)
    top = [text for what, text in rows if what == "top rung"]
    assert top == [
        "8 not reached: the best is a result at fidelity 3, before full training "
        "(more compute, or promote more of the upper rungs: a list of etas)"
    ]
    _, rows = compute_rows([*history, record(4, 8, 0.5)], checkpoint)
    assert "top rung" not in dict(rows)
    _, rows = compute_rows(history)  # no checkpoint: the rungs are not known
    assert "top rung" not in dict(rows)
