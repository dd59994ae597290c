"""Surrogate-screened regularised evolution: the tree features, the rank correlation (against
scipy), what screening changes (nothing before enough results; better children after), exact
resume, the missing extra, and the report line."""

from __future__ import annotations

import json
import math
import random
import sys

import pytest
import scipy.stats
import yaml
from search_helpers import BASE, SCREENED, experiment, merge

from einspace import Limits, input_state, load_grammar
from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.search.loop import SearchRun
from einspace.search.report import report
from einspace.search.strategy import SearchSpace, get_strategy
from einspace.search.surrogate import Surrogate, rank_correlation, tree_features
from einspace.tree import parse_tree, to_text

GRAMMAR = load_grammar("einspace")
INPUT = input_state((3, 16, 16))
SPACE = SearchSpace(GRAMMAR, INPUT, Limits(max_depth=12, max_nodes=80))


def fitness(tree: str) -> float:
    """A learnable stand-in for training: normalisation and activations help, size beyond a point
    hurts; some trees fail."""
    if len(tree) % 13 == 0:
        return -math.inf
    return tree.count("norm") + 0.5 * tree.count("leaky_relu") - len(tree) / 400


def seconds(tree: str) -> float:
    """A stand-in for what evaluating a tree takes: tenfold per four computations."""
    return 0.001 * 10 ** (tree.count("(C ") / 4)


def run(
    screen: int,
    seed: int = 0,
    evaluations: int = 120,
    stop_after: int | None = None,
    state=None,
    seconds=None,
    **settings,
):
    """Ask and tell one at a time; `seconds(tree)`, where given, is what a scored result took."""
    settings = {"evaluations": evaluations, "population": 12, "tournament": 3, "screen": screen, **settings}
    s = get_strategy("regularised_evolution", SPACE, seed, {"surrogate_min_results": 15, **settings})
    if state is not None:
        s.load_state_dict(json.loads(json.dumps(state)))
    asked = []
    while not s.done and (stop_after is None or len(asked) < stop_after):
        c = s.ask()
        asked.append(c)
        f = fitness(c.tree)
        s.tell(c.id, f, seconds=seconds(c.tree) if seconds is not None else None)
    return s, asked


def test_features_count_operations_with_their_copies_and_their_order():
    branch = "(M (M (C norm)) (M (C leaky_relu)))"
    tree = parse_tree(f"(S (B clone(b=4)) (Branches {branch}*4) (A concat(dim=1, b=4)))")
    f = tree_features(tree, GRAMMAR, INPUT)
    assert f["op:norm"] == f["op:leaky_relu"] == 4 and f["op:clone"] == f["op:concat"] == 1
    assert f["call:clone(b=4)"] == 1 and f["call:concat(dim=1, b=4)"] == 1
    # the order in which operations are applied: the repeated branch once
    order = ("clone>norm", "norm>leaky_relu", "leaky_relu>concat")
    assert {k.removeprefix("next:") for k in f if k.startswith("next:")} == set(order)
    assert f["terminals"] == 4 and f["log_params"] > 0 and f["log_flops"] > 0
    bad = tree_features(parse_tree("(S (M (C linear(d=8))) (M (C nope)))"), GRAMMAR, INPUT)
    assert "log_params" not in bad and bad["op:nope"] == 1  # a tree that does not check: no counts
    assert "head_width" not in bad and "min_width" not in bad


def test_features_hold_the_shapes_the_head_reads_and_the_narrowest_point():
    # 3x16x16 -> patches: col 4x192 -> linear: col 4x64 -> im 64x2x2 -> a convolution: im 128x2x2
    patchify = "(M (R1 im2col(k=8, s=8, p=0)) (M (C linear(d=64))) (R2 col2im))"
    conv = "(M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=128))) (R2 col2im))"
    f = tree_features(parse_tree(f"(S {patchify} {conv})"), GRAMMAR, INPUT)
    shapes = {k: round(math.exp(f[k]), 6) for k in ("head_width", "head_positions", "min_width", "min_size")}
    # a col signal's width is its last axis (64), not its first (4 positions)
    assert shapes == {"head_width": 128, "head_positions": 4, "min_width": 64, "min_size": 256}
    plain = tree_features(parse_tree("(S (M (C norm)) (M (C leaky_relu)))"), GRAMMAR, INPUT)
    assert plain["head_width"] == plain["min_width"] == math.log(3)
    assert plain["head_positions"] == math.log(256) and plain["min_size"] == math.log(768)


@pytest.mark.parametrize("seed", range(5))
def test_rank_correlation_is_spearmans(seed):
    rng = random.Random(seed)
    pairs = [(rng.choice([0.1, 0.2, 0.3, rng.random()]), rng.random()) for _ in range(30)]
    assert rank_correlation(pairs) == pytest.approx(
        scipy.stats.spearmanr(*zip(*pairs, strict=True)).statistic
    )
    assert math.isnan(rank_correlation(pairs[:2])) and math.isnan(rank_correlation([(1, 2), (1, 3), (1, 4)]))


def test_screening_starts_only_once_enough_results_are_in():
    _, plain = run(screen=1, evaluations=40)
    _, screened = run(screen=6, evaluations=40)
    # the i-th ask follows i results: plain RE until the 15th result is in
    assert [a.tree for a in screened[:15]] == [a.tree for a in plain[:15]]
    assert [a.tree for a in screened] != [a.tree for a in plain]


def test_screened_children_are_fitter_and_the_surrogate_ranks_them():
    plain = [fitness(c.tree) for seed in range(3) for c in run(1, seed, 80)[1][30:]]
    screened_runs = [run(6, seed, 80) for seed in range(3)]
    screened = [fitness(c.tree) for _, asked in screened_runs for c in asked[30:]]
    finite = lambda xs: [x for x in xs if math.isfinite(x)]  # noqa: E731
    assert sum(finite(screened)) / len(finite(screened)) > sum(finite(plain)) / len(finite(plain)) + 0.5
    for s, _ in screened_runs:
        assert len(s.surrogate.pairs) == 80 - 15  # every child asked once the model was ready
        assert rank_correlation(s.surrogate.pairs) >= 0.5


def warm(strategy, seed: int, count: int = 60) -> None:
    """Give a strategy's surrogate `count` results of random trees before its first ask, as a warm
    start from an earlier run does."""
    sampler = SPACE.sampler(random.Random(1000 + seed))
    for _ in range(count):
        tree = sampler.sample()
        strategy.surrogate.add(tree_features(tree, GRAMMAR, INPUT), fitness(to_text(tree)), source=1)


def test_a_surrogate_ready_from_the_start_screens_the_initial_samples_too():
    """Warm-started, the initial population is the surrogate's pick of 6 samples each: fitter on
    average than plain samples, each with its prediction paired with its result; not warm, the
    initial samples are the sampler's own (the test above)."""
    gains = []
    for seed in range(3):
        settings = {"evaluations": 12, "population": 12, "tournament": 3, "surrogate_min_results": 15}
        plain = get_strategy("regularised_evolution", SPACE, seed, {**settings, "screen": 1})
        screened = get_strategy("regularised_evolution", SPACE, seed, {**settings, "screen": 6})
        warm(screened, seed)
        means = []
        for s in (plain, screened):
            asked = [s.ask() for _ in range(12)]
            assert {c.origin for c in asked} == {"sampled"}
            for c in asked:
                s.tell(c.id, fitness(c.tree))
            means.append(sum(f for c in asked if math.isfinite(f := fitness(c.tree))) / 12)
        assert len(screened.surrogate.pairs) == 12
        gains.append(means[1] - means[0])
    assert min(gains) > 0 and sum(gains) / 3 > 0.5


def test_initial_samples_after_enough_results_are_screened():
    """With a population larger than the results the surrogate needs, the initial samples asked
    after it is ready are screened (they differ from plain RE's and carry predictions)."""
    settings = {"evaluations": 30, "population": 30, "tournament": 3, "surrogate_min_results": 15}
    streams = []
    for screen in (1, 6):
        s = get_strategy("regularised_evolution", SPACE, 0, {**settings, "screen": screen})
        asked = []
        while not s.done:
            asked.append(s.ask())
            s.tell(asked[-1].id, fitness(asked[-1].tree))
        streams.append([c.tree for c in asked])
    assert streams[0][:15] == streams[1][:15] and streams[0][15:] != streams[1][15:]
    assert len(s.surrogate.pairs) == 30 - 15


def test_screening_prefers_trees_not_proposed_before():
    """A repeat would only come from the cache: with 6 proposals per child none is a repeat here
    (before this rule, 4 to 6 of 65 screened children were)."""
    for seed in range(3):
        _, asked = run(6, seed, 80)
        hashes = [c.hash for c in asked]
        assert not [h for i, h in enumerate(hashes) if i >= 15 and h in hashes[:i]]


@pytest.mark.parametrize(("stop_after", "screen_cost"), [(10, 0), (33, 0), (10, 1), (37, 1)])
def test_a_screened_run_resumes_exactly(stop_after, screen_cost):
    """Weighing cost too (`screen_cost`): the cost model is refitted on load like the other."""
    timed = {"seconds": seconds, "screen_cost": screen_cost} if screen_cost else {}
    _, whole = run(4, evaluations=50, **timed)
    first, head = run(4, evaluations=50, stop_after=stop_after, **timed)
    _, tail = run(4, evaluations=50, state=first.state_dict(), **timed)
    assert [c.tree for c in head + tail] == [c.tree for c in whole]


def test_bad_settings_and_a_missing_extra_are_named(monkeypatch):
    with pytest.raises(EinspaceError, match="'surrogate' must be one of gradient_boosting, random_forest"):
        get_strategy("regularised_evolution", SPACE, 0, {"screen": 4, "surrogate": "svm"})
    with pytest.raises(EinspaceError, match="'screen' must be an integer >= 1"):
        get_strategy("regularised_evolution", SPACE, 0, {"screen": 0})
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.delitem(sys.modules, "sklearn.ensemble", raising=False)
    with pytest.raises(EinspaceError, match=r"needs scikit-learn: pip install 'einspace\[surrogate\]'"):
        Surrogate()
    get_strategy("regularised_evolution", SPACE, 0, {"screen": 1})  # plain RE never needs it


def test_gradient_boosting_is_the_default_and_random_forest_screens_too():
    settings = {"evaluations": 40, "population": 8, "screen": 4}
    assert get_strategy("regularised_evolution", SPACE, 0, settings).surrogate.kind == "gradient_boosting"
    s = get_strategy("regularised_evolution", SPACE, 0, {**settings, "surrogate": "random_forest"})
    assert s.surrogate.kind == "random_forest"
    s.screening.surrogate = Surrogate("random_forest", 0, 10)
    while not s.done:
        c = s.ask()
        s.tell(c.id, fitness(c.tree))
    assert len(s.surrogate.pairs) == 40 - 10


def test_the_report_prints_the_rank_correlation(tmp_path):
    strategy = {
        "name": "regularised_evolution",
        "settings": {
            "evaluations": 30,
            "population": 8,
            "tournament": 3,
            "screen": 4,
            "surrogate_min_results": 10,
        },
    }
    e = experiment(tmp_path, strategy=strategy)
    with SearchRun.start(e) as r:
        assert r.run(e.make_executor()).finished
        pairs = r.strategy.surrogate.pairs
    text = report(tmp_path, plot=False)
    rho = rank_correlation(pairs)
    expected = f"surrogate rank correlation (Spearman, screened results): {rho:.2f} over {len(pairs)}"
    assert len(pairs) == 30 - 10 and expected in text
    assert "cost model" not in text  # cost did not count: nothing to say about it


def finished_run(run_dir, **changes):
    e = experiment(run_dir, strategy=SCREENED, **changes)
    with SearchRun.start(e) as r:
        assert r.run(e.make_executor()).finished
        return r.store.history()


def test_a_warm_started_search_screens_from_its_first_candidate_and_resumes_exactly(tmp_path):
    earlier = finished_run(tmp_path / "a")
    e = experiment(tmp_path / "b", strategy=SCREENED, warm_start=[str(tmp_path / "a")], random_seed=5)
    with SearchRun.start(e) as r:
        surrogate = r.strategy.surrogate
        assert surrogate.sources.count(1) == sum(x.status != "cached" for x in earlier)
        assert r.run(e.make_executor()).finished
        history = r.store.history()
        assert len(surrogate.pairs) == 24  # every candidate screened, the initial samples too
    with SearchRun.open(tmp_path / "b") as r:  # the identity holds the warm start
        assert json.loads(r.store.get_meta("experiment"))["warm_start"] == [str(tmp_path / "a")]
    with pytest.raises(EinspaceError, match="warm_start"):
        SearchRun.start(experiment(tmp_path / "b", strategy=SCREENED, random_seed=5))
    resumed = experiment(tmp_path / "c", strategy=SCREENED, warm_start=[str(tmp_path / "a")], random_seed=5)
    with SearchRun.start(resumed) as r:
        r.run(resumed.make_executor(), max_results=9)
    with SearchRun.start(resumed) as r:
        assert r.run(resumed.make_executor()).finished
        assert [x.tree for x in r.store.history()] == [x.tree for x in history]


def test_bad_warm_starts_are_refused_naming_the_run(tmp_path, capsys):
    finished_run(tmp_path / "plus", grammar="einspace_plus")
    (tmp_path / "plain").mkdir()
    SearchRun.start(experiment(tmp_path / "empty", strategy=SCREENED)).close()
    finished_run(tmp_path / "ok")
    cases = [
        (tmp_path / "missing", "no such run directory"),
        (tmp_path / "plain", "is not a search run directory"),
        (tmp_path / "empty", "has no scored evaluation"),
        (tmp_path / "plus", "searched grammar 'einspace_plus', not 'einspace'"),
    ]
    for run_dir, message in cases:
        with pytest.raises(EinspaceError, match=rf"warm_start\[0\] {run_dir}: {message}"):
            experiment(tmp_path / "new", strategy=SCREENED, warm_start=[str(run_dir)])
    with pytest.raises(EinspaceError, match="warm_start needs a surrogate"):
        experiment(tmp_path / "new", warm_start=[str(tmp_path / "ok")])
    raw = merge(BASE, {"run_dir": str(tmp_path / "new"), "strategy": SCREENED})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(tmp_path / "exp.yaml"), "--warm-start", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "--warm-start: warm_start[0]" in err and "no such run directory" in err and "Traceback" not in err
    assert not (tmp_path / "new").exists()


def test_a_warm_start_hears_a_multi_fidelity_run_at_its_lowest_rung_as_the_run_did():
    """Scored and failed results of the lowest rung only: promotions, cached repeats and jobs
    still running are not what the earlier run's strategy heard."""
    from einspace.search.store import Record, State, Status
    from einspace.search.warm_start import heard_results

    def record(i: int, fidelity: int | None, status: Status | None, state: State = State.FINISHED) -> Record:
        return Record(i, f"t{i}", f"h{i}", "sampled", state=state, status=status, fidelity=fidelity)

    history = [
        record(0, 3, Status.OK),
        record(1, 1, Status.OK),
        record(2, 1, Status.FAILED),
        record(3, 1, Status.CACHED),
        record(4, 8, Status.OK),
        record(5, 1, None, State.RUNNING),
    ]
    assert [r.id for r in heard_results(history)] == [1, 2]
    single_fidelity = [record(0, None, Status.OK), record(1, None, Status.FAILED)]
    assert [r.id for r in heard_results(single_fidelity)] == [0, 1]
    assert heard_results([record(0, 1, Status.CACHED)]) == []
