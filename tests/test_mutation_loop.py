"""A search run's parts that need no search (search/loop.py): the results a summary counts, the
strategy and grammar a run opens with, the note on unloaded plugins, the driver's own time.

Written when mutmut first reached these functions (scripts/mutation.py, "search run"): they were
decorated (`@property`, `@cached_property`, `@contextmanager`), which mutmut skips. Each expected
value is written by hand or built independently (a strategy stepped here, the grammar loaded here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from search_helpers import SCREENED, experiment

import einspace.search.loop as loop
from einspace.errors import EinspaceError
from einspace.grammar.parser import load_grammar
from einspace.search.loop import RunSummary, SearchRun


def test_results_are_the_evaluated_cached_and_replayed_ones() -> None:
    summary = RunSummary(evaluated=2, cached=3, replayed=7, requeued=11, failed=13)
    assert summary.results == 12


def test_a_new_run_starts_a_fresh_strategy_and_a_resumed_one_its_checkpoint(tmp_path: Path) -> None:
    e = experiment(tmp_path)
    fresh = e.make_strategy()
    with SearchRun.start(e) as run:
        assert run.strategy.state_dict() == fresh.state_dict()
        stepped = e.make_strategy()
        asked = [stepped.ask() for _ in range(3)]
        run.store.save_checkpoint(stepped.state_dict())
    with SearchRun.start(e) as resumed:
        assert resumed.strategy.state_dict() == stepped.state_dict() != fresh.state_dict()
        assert [c.id for c in resumed.strategy.pending()] == [c.id for c in asked]


def test_a_run_opens_its_experiments_grammar(tmp_path: Path) -> None:
    e = experiment(tmp_path, grammar="einspace")
    with SearchRun.start(e) as run:
        assert str(run.grammar) == str(load_grammar("einspace"))
        assert run.input.shape == (3, 16, 16)


@pytest.mark.parametrize("unloaded", [(), ("plugins/ops.py",)])
def test_an_error_is_explained_by_the_plugins_left_unloaded_only_where_there_are_some(
    tmp_path: Path, unloaded: tuple[str, ...]
) -> None:
    with SearchRun.start(experiment(tmp_path)):
        pass
    with SearchRun.open(tmp_path) as run:
        run.unloaded_plugins = unloaded  # as `open` lists them when it leaves them unloaded
        with pytest.raises(EinspaceError) as caught, run._plugin_hint():
            raise EinspaceError("no such operation")
    note = f"\n({run.plugin_note()})" if unloaded else ""
    assert str(caught.value) == "no such operation" + note
    assert "plugins/ops.py" in note or not unloaded


def test_the_driver_time_is_the_sum_of_the_time_inside_each_driving_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock that advances 1 s per reading: each block lasts exactly 1 s, so two make 2 s."""
    ticks = iter(range(100, 200))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(ticks)))
    with SearchRun.start(experiment(tmp_path)) as run:
        session = loop._Session(run, None, None, None, None)
        for _ in range(2):
            with session._driving():
                pass
    assert session.summary.driver_seconds == 2.0


def test_a_new_warm_started_run_gives_its_surrogate_the_earlier_results(tmp_path: Path) -> None:
    earlier = experiment(tmp_path / "a", strategy=SCREENED)
    with SearchRun.start(earlier) as run:
        run.run(earlier.make_executor(), max_results=3)
        scored = [r for r in run.store.history() if r.status != "cached"]
    e = experiment(tmp_path / "b", strategy=SCREENED, warm_start=[str(tmp_path / "a")])
    with SearchRun.start(e) as run:
        assert run.strategy.surrogate.sources == [1] * len(scored)
        assert len(scored) == 3
    assert e.make_strategy().surrogate.sources == []  # not fed by making the strategy alone
