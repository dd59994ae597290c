"""Training that continues across the rungs of successive halving: the evaluator's saved states
(equal to uninterrupted training, fallbacks when a state cannot be used), the experiment key that
chooses it, and a search whose promotions train only the epochs between rungs."""

from __future__ import annotations

import pytest
import torch
from search_helpers import experiment

from einspace.evaluators.base import Continuation, Task, get_evaluator, run_task
from einspace.evaluators.continuation import TrainedState, read_state
from einspace.search.compute import summarise
from einspace.search.config import ConfigError
from einspace.search.loop import SearchRun
from einspace.search.report import compute_rows
from einspace.search.trained_states import STATES_FOLDER

TREE = "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im)) (M (C leaky_relu)))"
SETTINGS = {
    "dataset": "digits",
    "epochs": 6,
    "batch_size": 64,
    "train_subset": 256,
    "valid_subset": 128,
    "threads": 1,
    "device": "cpu",
}


def task(
    epochs: int, continuation: Continuation | None = None, tree: str = TREE, settings: dict = SETTINGS
) -> Task:
    return Task(tree, "einspace", (1, 8, 8), "training", settings, "im", 0, epochs, continuation)


def evaluate(
    epochs: int, continuation: Continuation | None = None, tree: str = TREE, settings: dict = SETTINGS
) -> dict[str, float]:
    result = run_task(task(epochs, continuation, tree, settings))
    assert result.ok, result.error
    return {**result.metrics, "cost_epochs": result.cost.epochs}


@pytest.mark.parametrize("head_init", ["random", "fitted"])
def test_training_in_pieces_equals_training_at_once(tmp_path, head_init):
    """1 epoch, then on to 3, then on to 6 (each saving its state) gives the loss and accuracy
    of 6 uninterrupted epochs on the same schedule, and each piece trains only its own epochs
    (a fitted head is fitted once, before the first)."""
    settings = {**SETTINGS, "head_init": head_init}
    whole = evaluate(6, Continuation(horizon=6), settings=settings)
    one = evaluate(1, Continuation(6, save=str(tmp_path / "1.pt")), settings=settings)
    three = evaluate(
        3, Continuation(6, save=str(tmp_path / "3.pt"), load=str(tmp_path / "1.pt")), settings=settings
    )
    six = evaluate(6, Continuation(6, load=str(tmp_path / "3.pt")), settings=settings)
    assert six["valid_loss"] == whole["valid_loss"] and six["valid_accuracy"] == whole["valid_accuracy"]
    assert [m["cost_epochs"] for m in (one, three, six)] == [1, 2, 3]
    assert [one["continued_from_epoch"], three["continued_from_epoch"], six["continued_from_epoch"]] == [
        0,
        1,
        3,
    ]
    assert one["state_saved"] == three["state_saved"] == 1.0 and "state_saved" not in six
    # the horizon is the schedule: one epoch of a 6-epoch schedule is not one epoch of its own
    assert one["valid_loss"] != evaluate(1, settings=settings)["valid_loss"]
    if head_init == "fitted":  # the setting changes the run
        assert whole["valid_loss"] != evaluate(6, Continuation(horizon=6))["valid_loss"]
    saved = read_state(str(tmp_path / "3.pt"), TrainedState(**torch.load(tmp_path / "3.pt")).tree, 6)
    assert saved is not None and saved.epochs == 3


OTHER_TREE = "(S (M (C linear(d=16))) (M (C leaky_relu)))"


@pytest.mark.parametrize(
    "make_unusable",
    [
        pytest.param(lambda path: None, id="missing"),
        pytest.param(lambda path: path.write_bytes(b"not a torch file"), id="unreadable"),
        pytest.param(
            lambda path: run_task(task(1, Continuation(6, save=str(path)), tree=OTHER_TREE)), id="other tree"
        ),
        pytest.param(lambda path: run_task(task(4, Continuation(6, save=str(path)))), id="as far as asked"),
    ],
)
def test_a_state_that_cannot_be_used_means_a_fresh_start_on_the_same_schedule(tmp_path, make_unusable):
    path = tmp_path / "state.pt"
    make_unusable(path)
    fresh = evaluate(3, Continuation(6))
    resumed = evaluate(3, Continuation(6, load=str(path)))
    assert resumed["continued_from_epoch"] == 0 and resumed["cost_epochs"] == 3
    assert resumed["valid_loss"] == fresh["valid_loss"]


def test_a_state_that_cannot_be_written_leaves_the_result_standing(tmp_path):
    (tmp_path / "file").write_text("")
    metrics = evaluate(1, Continuation(6, save=str(tmp_path / "file" / "1.pt")))
    assert metrics["state_saved"] == 0.0
    assert not list(tmp_path.glob("**/*.tmp"))


def test_a_schedule_shorter_than_the_run_is_refused():
    result = run_task(task(6, Continuation(horizon=3)))
    assert not result.ok and "cannot follow a schedule of 3" in result.error


def test_an_evaluator_that_cannot_continue_says_so(tmp_path):
    experiment(tmp_path)  # loads the test plugins
    assert not get_evaluator("test_params").continues and get_evaluator("training").continues
    t = Task(TREE, "einspace", (1, 8, 8), "test_params", {}, "im", 0, None, Continuation(6))
    result = run_task(t)
    assert not result.ok and "cannot continue training from a saved state" in result.error


def test_a_continuation_crosses_process_boundaries_as_plain_data():
    t = task(3, Continuation(6, save="a.pt", load="b.pt"))
    assert Task.from_json(t.to_json()) == t
    assert Task.from_json(task(3).to_json()).continuation is None


def test_promotion_resolves_to_continue_where_the_evaluator_can(tmp_path):
    sh = {"scheduler": "successive_halving"}
    training = {"name": "training", "settings": {**SETTINGS, "epochs": 9}}
    digits = {"input": {"shape": [1, 8, 8]}}
    assert experiment(tmp_path, evaluator=training, multi_fidelity=sh, **digits).multi_fidelity.continues
    retrain = {**sh, "promotion": "retrain"}
    assert not experiment(
        tmp_path, evaluator=training, multi_fidelity=retrain, **digits
    ).multi_fidelity.continues
    fidelity_only = {"name": "test_fidelity", "settings": {"epochs": 9}}
    resolved = experiment(tmp_path, evaluator=fidelity_only, multi_fidelity=sh).multi_fidelity
    assert resolved.promotion == "retrain" and not resolved.continues
    assert not experiment(tmp_path, evaluator=training, **digits).multi_fidelity.continues  # no scheduler
    with pytest.raises(ConfigError, match="multi_fidelity.promotion 'continue' needs an evaluator"):
        experiment(tmp_path, evaluator=fidelity_only, multi_fidelity={**sh, "promotion": "continue"})
    with pytest.raises(ConfigError, match="multi_fidelity.promotion must be 'continue' or 'retrain'"):
        experiment(tmp_path, evaluator=training, multi_fidelity={**sh, "promotion": "resume"}, **digits)


def test_a_search_continues_its_promotions_and_keeps_only_live_states(tmp_path):
    e = experiment(
        tmp_path,
        input={"shape": [1, 8, 8]},
        limits={"max_depth": 10, "max_nodes": 40, "max_params": 20000},
        evaluator={"name": "training", "settings": {**SETTINGS, "epochs": 4}},
        strategy={"name": "random_search", "settings": {"evaluations": 9}},
        multi_fidelity={"scheduler": "successive_halving", "eta": 2, "rungs": [1, 2, 4]},
    )
    with SearchRun.start(e) as run:
        assert run.run(e.make_executor()).finished
        history = run.store.history()
        live = run.strategy.live_states()
    by_id = {r.id: r for r in history}
    promoted = [r for r in history if r.origin == "promotion" and r.status == "ok"]
    assert promoted, "nothing was promoted"
    for r in promoted:
        lower = by_id[r.parents[0]]
        assert r.metrics["continued_from_epoch"] == lower.fidelity
        assert r.cost["epochs"] == r.fidelity - lower.fidelity
    summary = summarise(history)
    assert summary.continued == len(promoted) == summary.promoted  # none was pruned before its promotion
    _, rows = compute_rows(history)
    assert ("promotions continued from a saved state", f"{len(promoted)} of {len(promoted)}") in rows
    kept = {int(p.stem) for p in (tmp_path / STATES_FOLDER).glob("*.pt")}
    assert kept == live & {r.id for r in history if r.status == "ok" and r.fidelity < 4}
    assert all(by_id[i].fidelity < 4 for i in kept)  # the top rung saves nothing


def test_states_are_saved_between_the_rungs_only(tmp_path):
    """Nothing to go on from at 0 epochs (promotions from there train from scratch) and nothing
    to go on to after the top rung: neither saves a state; every rung between does."""
    from einspace.search.strategy import Candidate
    from einspace.search.trained_states import TrainedStates

    states = TrainedStates(tmp_path / STATES_FOLDER, horizon=8, live=set)
    saves = {f: states.continuation(Candidate(f, "t", "h", "sampled", fidelity=f)).save for f in (0, 1, 3, 8)}
    assert saves == {
        0: None,
        1: str(tmp_path / STATES_FOLDER / "1.pt"),
        3: str(tmp_path / STATES_FOLDER / "3.pt"),
        8: None,
    }
    assert states.saved == {1, 3}
    promotion = Candidate(9, "t", "h", "promotion", (1,), fidelity=3, continues=1)
    assert states.continuation(promotion).load == str(tmp_path / STATES_FOLDER / "1.pt")
