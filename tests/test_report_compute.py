"""What a run spent, as `einspace report` and `einspace search` show it: compute in all and on
failures, per fidelity, partial results, the incumbent of a multi-fidelity run; stores built by
hand, then tiny real searches (one resumed, one multi-fidelity) against their stored costs."""

from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path
from types import SimpleNamespace

import yaml
from search_helpers import BASE, experiment, merge

from einspace.cli import main
from einspace.evaluators.base import Cost, EvaluationFailed, Evaluator, register_evaluator
from einspace.search.compute import Tally, summarise
from einspace.search.config import parse_experiment
from einspace.search.loop import STORE_NAME, open_store, run_search
from einspace.search.progress import SearchProgress
from einspace.search.report import best_records, report
from einspace.search.store import Record, SQLiteStore
from einspace.tree import content_hash


def _record(id, status="ok", fitness=0.5, cpu=1.0, tree=None, **fields) -> Record:
    """A finished evaluation of tree `(S tN)`, N = `tree` (default: `id`), whose cost is `cpu` CPU
    seconds (no cost: `cost={}`)."""
    fields.setdefault("cost", Cost(cpu_seconds=cpu, wall_seconds=2 * cpu).to_json())
    fitness = -math.inf if status == "failed" else fitness
    n = id if tree is None else tree
    return Record(
        id, f"(S t{n})", f"h{n}", fields.pop("origin", "sampled"), status=status, fitness=fitness, **fields
    )


def _store(run_dir: Path, records: list[Record]) -> Path:
    """A run directory holding `records` in this finishing order (its experiment unreadable: no grammar)."""
    store = SQLiteStore(run_dir / STORE_NAME, writer=True)
    store.set_meta("config", "{}")
    for r in records:
        store.submit(r)
        store.finish(r)
    store.close()
    return run_dir


def _compute_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("compute: "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  fidelity "))
    return lines[start:end]


def test_console_reports_total_wasted_share_partial_results_and_when_the_best_was_found(tmp_path):
    run = _store(
        tmp_path,
        [
            _record(0, fitness=0.5, cpu=10),
            _record(1, "failed", cpu=5, error="CUDA out of memory"),
            _record(2, fitness=0.8, cpu=20, partial=True),
            _record(3, "cached", fitness=0.5, cpu=0, cached_from=0, cost={}),
            _record(4, fitness=0.7, cpu=15),
        ],
    )
    text = report(run, plot=False)
    assert _compute_lines(text) == [
        "compute: total 50.0 s (CPU), 4 evaluated; wasted on failures 5.0 s (10.0%); "
        "partial results kept (time budget) 1; best found after 35.0 s"
    ]
    assert "#1  fitness 0.8  id 2  sampled  partial (time budget)\n" in text
    assert "finished 5 of ? (ok 3, failed 1, cached duplicates 1)" in text


def _multi_fidelity_history() -> list[Record]:
    """Three architectures at fidelity 1 (one fails), promoted to 3 and one of them to 9 (a
    promotion trains its parent's tree again): the low-rung results are fitter than the only
    top-rung one."""
    return [
        _record(0, fitness=0.9, cpu=4, fidelity=1),
        _record(1, fitness=0.6, cpu=4, fidelity=1),
        _record(2, "failed", cpu=2, fidelity=1, error="diverged"),
        _record(3, fitness=0.7, cpu=12, fidelity=3, origin="promotion", parents=(0,), tree=0),
        _record(4, fitness=0.65, cpu=36, fidelity=9, origin="promotion", parents=(3,), tree=0),
        _record(5, fitness=0.8, cpu=12, fidelity=3, origin="promotion", parents=(1,), tree=1),
    ]


def test_multi_fidelity_report_ranks_the_top_fidelity_first_and_spends_per_rung(tmp_path):
    history = _multi_fidelity_history()
    # each tree once, at its best-ranked evaluation: tree 0 at fidelity 9, tree 1 at 3, tree 6 at 1
    newcomer = _record(6, fitness=0.95, cpu=4, fidelity=1)
    assert [r.id for r in best_records([*history, newcomer], 5)] == [4, 5, 6]
    text = report(_store(tmp_path, history), plot=False)
    assert _compute_lines(text) == [
        "compute: total 70.0 s (CPU), 6 evaluated; wasted on failures 2.0 s (2.9%); best found after 58.0 s",
        "  fidelity 1: 3 evaluated, 10.0 s; 2 promoted (67%)",
        "  fidelity 3: 2 evaluated, 24.0 s; 1 promoted (50%)",
        "  fidelity 9: 1 evaluated, 36.0 s",
    ]
    # promotions count where they started from, so a rung promoting more than 1/eta shows; a
    # promotion answered from the cache trained nothing and is not counted
    cached = _record(6, "cached", fidelity=3, origin="promotion", parents=(1,), tree=1, cached_from=5)
    assert summarise(history).promoted_from == summarise([*history, cached]).promoted_from == {1: 2, 3: 1}
    assert "finished 3 of ? architectures and 3 promotions (ok 5, failed 1, cached duplicates 0)" in text
    assert "#1  fitness 0.65  id 4  promotion of 3  fidelity 9\n" in text


def test_report_says_how_well_each_rung_foretold_the_next(tmp_path):
    """Spearman between promoted trees' results at both rungs, over trees scored at both: a failed
    promotion and a cached one are left out, and a pair of rungs with fewer than 3 such trees
    prints nothing (no correlation to speak of)."""
    low = [_record(i, fitness=f, fidelity=1) for i, f in enumerate([0.2, 0.4, 0.6, 0.8, 0.1])]
    up = [
        _record(5 + i, fitness=f, fidelity=3, origin="promotion", parents=(i,), tree=i)
        for i, f in enumerate([0.5, 0.3, 0.7, 0.9])
    ]
    failed = _record(9, "failed", fidelity=3, origin="promotion", parents=(4,), tree=4, error="diverged")
    cached = _record(
        10, "cached", fitness=0.3, fidelity=3, origin="promotion", parents=(1,), tree=1, cached_from=6
    )
    top = [
        _record(11 + i, fitness=0.9, fidelity=8, origin="promotion", parents=(5 + i,), tree=i) for i in (2, 3)
    ]
    history = [*low, *up, failed, cached, *top]
    pairs = summarise(history).promotion_pairs
    assert pairs == {
        (1, 3): [(0.2, 0.5), (0.4, 0.3), (0.6, 0.7), (0.8, 0.9)],
        (3, 8): [(0.7, 0.9), (0.9, 0.9)],
    }
    lines = report(_store(tmp_path, history), plot=False).splitlines()
    # ranks 1 2 3 4 against 2 1 3 4: 1 - 6 * 2 / (4 * 15) = 0.8
    rung_lines = [line for line in lines if "->" in line]
    assert rung_lines == [
        "  fidelity 1 -> 3: Spearman 0.80 between 4 promoted trees' results at both; "
        "mean 0.500 at 1, 0.600 at 3"
    ]


def test_a_record_without_a_measured_cost_counts_its_wall_seconds(tmp_path):
    """Stores written before compute accounting have no cost: their seconds are the measure."""
    run = _store(tmp_path, [_record(0, cost={}, seconds=7.5)])
    assert _compute_lines(report(run, plot=False)) == [
        "compute: total 7.5 s (wall), 1 evaluated; wasted on failures 0.0 s (0.0%); best found after 7.5 s"
    ]
    with (run / "evaluations.csv").open() as f:
        (row,) = csv.DictReader(f)
    assert (row["compute_seconds"], row["cpu_seconds"], row["steps"]) == ("7.5", "", "")


def test_csv_has_fidelity_partial_and_cost_columns(tmp_path):
    gpu = Cost(cpu_seconds=3.0, gpu_seconds=2.5, wall_seconds=4.0, epochs=1.5, steps=30).to_json()
    run = _store(tmp_path, [_record(0, fidelity=2, partial=True, cost=gpu)])
    report(run, plot=False)
    with (run / "evaluations.csv").open() as f:
        reader = csv.DictReader(f)
        (row,) = reader
    assert reader.fieldnames[:4] == ["seq", "id", "status", "fitness"]
    columns = ("fidelity", "partial", "compute_seconds", "cpu_seconds", "gpu_seconds", "epochs", "steps")
    assert [row[c] for c in columns] == ["2", "True", "2.5", "3.0", "2.5", "1.5", "30"]


def test_report_writes_the_compute_plot_beside_the_fitness_plot(tmp_path):
    run = _store(tmp_path, _multi_fidelity_history())
    text = report(run)
    assert f"wrote {run / 'compute.png'}" in text
    assert (run / "compute.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_counts_the_stored_run_and_each_told_result_once():
    history = [_record(0, cpu=10), _record(1, "failed", cpu=5)]
    stream = io.StringIO()
    progress = SearchProgress(4, Tally.of(history), quiet=False, stream=stream)
    strategy = SimpleNamespace(done=False)
    progress(history[1], strategy)  # replayed on resume: already in the store
    progress(_record(2, fitness=0.9, cpu=5), strategy)
    lines = stream.getvalue().splitlines()
    assert "2/4 done  in flight 0  failed 1  cached 0  best 0.5  compute 15.0 s (wasted 33.3%)  " in lines[0]
    assert "3/4 done  in flight 0  failed 1  cached 0  best 0.9  compute 20.0 s (wasted 25.0%)  " in lines[1]


# ----------------------------------------------------------------------------- real searches


@register_evaluator
class SpinEvaluator(Evaluator):
    """Burns `spin` CPU seconds per epoch, so costs are measurable; fails half-way on a quarter of
    the trees (by hash); fitness is the test evaluators' analytic one plus a little per epoch."""

    name = "test_report_spin"
    fidelity_setting = "epochs"

    def __init__(self, epochs: int = 4, spin: float = 0.01):
        self.epochs, self.spin = epochs, spin

    def full_fidelity(self) -> int:
        return self.epochs

    def evaluate(self, checked, random_seed):
        fails = int(content_hash(checked.tree)[:8], 16) % 4 == 0
        end = time.process_time() + self.spin * self.epochs / (2 if fails else 1)
        while time.process_time() < end:
            pass
        if fails:
            raise EvaluationFailed("diverged (injected)", {"epochs": self.epochs / 2})
        params = checked.params
        return {
            "fitness": -abs(math.log10(params + 1) - 3.7) + 0.01 * self.epochs,
            "epochs": float(self.epochs),
        }


SPIN = {"evaluator": {"name": "test_report_spin"}, "strategy": {"settings": {"evaluations": 12}}}


def _stored(run_dir: Path) -> list[Record]:
    store = SQLiteStore(run_dir / STORE_NAME)
    try:
        return store.history()
    finally:
        store.close()


def _spent(history: list[Record]) -> float:
    """The run's compute from the stored costs themselves."""
    return sum(Cost.from_json(r.cost).compute_seconds for r in history if r.status != "cached")


def test_a_resumed_search_counts_the_compute_of_every_session(tmp_path, capsys):
    run_dir = tmp_path / "run"
    e = experiment(run_dir, **SPIN)
    store = open_store(e)
    try:
        assert not run_search(e, e.make_executor(), store, max_results=5).finished
    finally:
        store.close()
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(merge(BASE, {"run_dir": str(run_dir), **SPIN})))
    assert main(["search", str(tmp_path / "exp.yaml")]) == 0
    history = _stored(run_dir)
    spent, failed = _spent(history), [r for r in history if r.status == "failed"]
    assert len(history) == 12 and failed and all(Cost.from_json(r.cost).cpu_seconds > 0 for r in failed)
    share = _spent(failed) / spent
    last = [line for line in capsys.readouterr().err.splitlines() if " done  in flight " in line][-1]
    assert last.startswith("12/12 done") and f"  compute {spent:.1f} s (wasted {share:.1%})  " in last
    assert main(["report", str(run_dir), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert (
        f"compute: total {spent:.1f} s (CPU), {sum(r.status != 'cached' for r in history)} evaluated; " in out
    )
    assert f"wasted on failures {_spent(failed):.1f} s ({share:.1%})" in out
    assert "finished 12 of 12 (" in out and "[complete]" in out
    with (run_dir / "evaluations.csv").open() as f:
        assert math.isclose(sum(float(row["compute_seconds"]) for row in csv.DictReader(f)), spent)


def test_a_multi_fidelity_search_resumes_and_reports_architectures_promotions_and_each_rung(tmp_path, capsys):
    """Stopped with more records than the budget's architectures, the search is not complete:
    promotions come on top of the budget."""
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), **SPIN})
    raw["multi_fidelity"] = {"scheduler": "successive_halving", "eta": 2, "min_fidelity": 1}  # rungs 1, 2, 4
    e = parse_experiment(raw, "test.yaml")
    store = open_store(e)
    try:
        run_search(e, e.make_executor(), store, max_results=13)
        assert sum(r.origin != "promotion" for r in store.history()) < 12
    finally:
        store.close()
    assert "[complete]" not in report(tmp_path / "run", plot=False)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(tmp_path / "exp.yaml")]) == 0
    history = _stored(tmp_path / "run")
    promoted = sum(r.origin == "promotion" for r in history)
    assert len(history) == 12 + promoted
    last = [line for line in capsys.readouterr().err.splitlines() if " in flight " in line][-1]
    assert last.startswith(f"12/12 done +{promoted} promoted  ")
    text = report(tmp_path / "run", plot=False)
    assert f"finished 12 of 12 architectures and {promoted} promotions (" in text and "[complete]" in text
    rungs = []
    for fidelity in (1, 2, 4):
        at = [r for r in history if r.fidelity == fidelity and r.status != "cached"]
        line = f"  fidelity {fidelity}: {len(at)} evaluated, {_spent(at):.1f} s"
        if fidelity < 4:
            ids = {r.id for r in at}
            onward = sum(r.origin == "promotion" and r.parents[0] in ids for r in history)
            line += f"; {onward} promoted ({onward / len(at):.0%})"
        rungs.append(line)
    assert _compute_lines(text)[1:] == rungs
    assert _compute_lines(text)[0].startswith(f"compute: total {_spent(history):.1f} s (CPU), ")
    top = best_records(history, 1)[0]
    assert top.fidelity == 4 and f"#1  fitness {top.fitness:.6g}  id {top.id}  promotion of " in text
