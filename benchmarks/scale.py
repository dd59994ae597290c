"""Benchmark (not a test): does the search driver slow down, or grow, as its history grows?

A search of N evaluations (default 100,000) with an instant fitness (`bench_instant`, below:
the tree's parameter count against a target, no training), regularised evolution, through the
in-process executor and through the Ray executor (local instance). It reports:

- driver time per result over the first and the last `--window` results (default 10,000) and
  their ratio: the driver process's CPU time minus its CPU time inside `executor.wait` (where
  the in-process executor evaluates and the Ray one waits for workers), i.e. the loop's own
  ask/tell/store/checkpoint. CPU time, not wall time, so that other jobs on a shared machine
  do not pass for history-dependent cost;
- the store's size on disk;
- the driver's resident memory (RSS) after the first result, at the end, and the growth between;
- the wall time of `einspace report RUN_DIR` (a fresh process, plots and CSV included) on the run;
- resume: a second run (of `--resume-evaluations`, default N) searched by `einspace search` in a
  subprocess, killed with SIGKILL once half its evaluations are committed, then started again:
  the seconds from the new process's start until its first new evaluation is committed.

Each against its target (issue 28): last/first <= 1.2, memory growth <= 200 MB, report <= 10 s,
resume <= 10 s.

    python benchmarks/scale.py [--evaluations 100000] [--executor in_process ray] [--window 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from einspace.evaluators.base import Evaluator, register_evaluator

TARGETS = {"ratio": 1.2, "memory_mb": 200.0, "report_s": 10.0, "resume_s": 10.0}
#: The parameter count the instant fitness prefers, so evolution has a slope to climb.
TARGET_PARAMS = 5_000

if __name__ != "__main__":  # imported as a plugin (driver and workers): register the evaluator once

    @register_evaluator
    class InstantEvaluator(Evaluator):
        """No training: fitness is the closeness of log10(parameters) to log10(TARGET_PARAMS)."""

        name = "bench_instant"

        def evaluate(self, checked, random_seed):  # noqa: ANN001, ANN201
            return {"fitness": -abs(math.log10(checked.params + 1) - math.log10(TARGET_PARAMS))}


def experiment_dict(run_dir: Path, executor: str, evaluations: int) -> dict[str, Any]:
    """The benchmark's experiment as plain data (it is also written as YAML for the CLI)."""
    executors = {
        "in_process": {"kind": "in_process"},
        "ray": {"kind": "ray", "max_in_flight": 4, "num_cpus": 0.5, "local_cpus": 2},
    }
    return {
        "name": f"scale_{executor}",
        "run_dir": str(run_dir),
        "random_seed": 0,
        "input": {"shape": [3, 16, 16]},
        "limits": {"max_depth": 8, "max_nodes": 30},  # small trees: parsing and checking are per result
        "evaluator": {"name": "bench_instant"},
        "strategy": {
            "name": "regularised_evolution",
            "settings": {"evaluations": evaluations, "population": 100, "tournament": 10},
        },
        "plugins": [str(Path(__file__).resolve())],
        "executor": executors[executor],
    }


def rss_mb() -> float:
    """This process's resident memory, MB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


class _TimedExecutor:
    """Delegates to an executor, adding up the CPU seconds this process spends inside `wait`
    (evaluating, in-process; waiting for workers, on Ray): not the driver's own."""

    def __init__(self, inner: Any):
        self.inner, self.waited = inner, 0.0
        self.max_in_flight = inner.max_in_flight

    def submit(self, key: int, task: Any) -> None:
        self.inner.submit(key, task)

    def wait(self, timeout: float | None = None) -> list[Any]:
        t0 = time.process_time()
        try:
            return self.inner.wait(timeout)
        finally:
            self.waited += time.process_time() - t0

    @property
    def in_flight(self) -> int:
        return self.inner.in_flight


def search(run_dir: Path, executor_kind: str, evaluations: int, window: int) -> dict[str, float]:
    """The timed search: driver seconds per result over the first and last window, memory, store size."""
    from einspace.search.config import parse_experiment
    from einspace.search.loop import SearchRun

    e = parse_experiment(experiment_dict(run_dir, executor_kind, evaluations), "scale")
    driver = array("d")  # cumulative driver seconds at each result
    rss: dict[str, float] = {}
    with SearchRun.start(e) as run:
        inner = e.make_executor()
        if hasattr(inner, "start_workers"):
            inner.start_workers(wait=True)
        executor = _TimedExecutor(inner)
        started, cpu = time.perf_counter(), time.process_time()

        def on_result(record: Any, strategy: Any) -> None:
            driver.append(time.process_time() - cpu - executor.waited)
            if len(driver) == 1:
                rss["first"] = rss["peak"] = rss_mb()
            elif len(driver) % 1000 == 0:
                rss["peak"] = max(rss["peak"], rss_mb())
                if len(driver) % window == 0:
                    print(f"  {len(driver)} results, {time.perf_counter() - started:.0f} s", flush=True)

        try:
            summary = run.run(executor, on_result=on_result)  # type: ignore[arg-type]
        finally:
            inner.shutdown()
        wall = time.perf_counter() - started
        rss["end"] = rss_mb()
    n = len(driver)
    w = min(window, n // 2)
    first = driver[w - 1] / w
    last = (driver[n - 1] - driver[n - 1 - w]) / w
    return {
        "results": n,
        "evaluated": summary.evaluated,
        "cached": summary.cached,
        "wall_s": wall,
        "window": w,
        "first_ms": 1000 * first,
        "last_ms": 1000 * last,
        "ratio": last / first,
        "store_mb": sum(p.stat().st_size for p in run_dir.glob("search.sqlite*")) / 2**20,
        "rss_first_mb": rss["first"],
        "rss_end_mb": rss["end"],
        "rss_peak_mb": max(rss["peak"], rss["end"]),
        "memory_mb": max(rss["peak"], rss["end"]) - rss["first"],
    }


def _cli(*args: str) -> list[str]:
    code = "import sys; from einspace.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, *args]


def report_seconds(run_dir: Path) -> dict[str, float]:
    """Wall seconds of `einspace report RUN_DIR` in a fresh process (its plots and CSV included),
    and of the same report in this process, whose imports are done (what the history costs)."""
    from einspace.search.report import report

    started, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(_cli("report", str(run_dir)), check=True, stdout=subprocess.DEVNULL)
    cli = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    started = time.perf_counter()
    report(run_dir)
    return {"report_s": cli, "report_cpu_s": cpu, "report_warm_s": time.perf_counter() - started}


def _committed(store: Path) -> int:
    """The last finishing order committed in a store, read by another process (0 before any)."""
    if not store.exists():
        return 0
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COALESCE(MAX(seq), 0) FROM evaluations").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _until(condition: Any, process: subprocess.Popen, timeout: float, what: str) -> Any:
    """Poll `condition` until true (return it); an error if `process` exits first or on timeout."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if process.poll() is not None:
            raise RuntimeError(f"{what}: the search exited ({process.returncode}) first")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:g} s")
        time.sleep(0.02)
    return value


def _kill(process: subprocess.Popen, sig: int) -> None:
    """Signal a search's whole process group (what is left of it), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    process.wait()


def resume_seconds(tmp: Path, executor_kind: str, evaluations: int) -> dict[str, float]:
    """Search with `einspace search` in a subprocess, SIGKILL it once half the evaluations are
    committed, start it again: seconds from the new process's start to its first new commit."""
    import yaml

    run_dir = tmp / f"resume_{executor_kind}"
    experiment = tmp / f"resume_{executor_kind}.yaml"
    experiment.write_text(yaml.safe_dump(experiment_dict(run_dir, executor_kind, evaluations)))
    store, half = run_dir / "search.sqlite", evaluations // 2
    command = _cli("search", str(experiment), "--quiet")
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        _until(lambda: _committed(store) >= half, first, 24 * 3600, "reaching half the evaluations")
    finally:
        _kill(first, signal.SIGKILL)  # the driver, and (Ray) the instance it started
    killed_at = _committed(store)
    started = time.perf_counter()
    second = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        _until(lambda: _committed(store) > killed_at, second, 600, "the resumed search's first commit")
        seconds, cpu = time.perf_counter() - started, _cpu_seconds(second.pid)
    finally:
        _kill(second, signal.SIGTERM)
    return {"killed_at": killed_at, "resume_s": seconds, "resume_cpu_s": cpu}


def _verdict(value: float, target: float) -> str:
    return "met" if value <= target else "NOT met"


def _search_and_report(tmp: Path, kind: str, evaluations: int, window: int) -> None:
    """The timed search, then the report on it: each line against its target."""
    print(f"{kind}: {evaluations} evaluations", flush=True)
    r = search(tmp / kind, kind, evaluations, window)
    r.update(report_seconds(tmp / kind))
    print(
        f"{kind}: {r['results']} results ({r['evaluated']} evaluated, {r['cached']} cached) "
        f"in {r['wall_s']:.0f} s; store {r['store_mb']:.1f} MB",
        f"  driver per result: first {r['window']} {r['first_ms']:.3f} ms, last {r['window']} "
        f"{r['last_ms']:.3f} ms, ratio {r['ratio']:.3f} (<= {TARGETS['ratio']}: "
        f"{_verdict(r['ratio'], TARGETS['ratio'])})",
        f"  driver RSS: {r['rss_first_mb']:.0f} MB after the first result, {r['rss_end_mb']:.0f} MB "
        f"at the end, peak {r['rss_peak_mb']:.0f} MB; growth {r['memory_mb']:.0f} MB "
        f"(<= {TARGETS['memory_mb']:g}: {_verdict(r['memory_mb'], TARGETS['memory_mb'])})",
        f"  einspace report: {r['report_s']:.1f} s (<= {TARGETS['report_s']:g}: "
        f"{_verdict(r['report_s'], TARGETS['report_s'])}), {r['report_cpu_s']:.1f} CPU s; "
        f"{r['report_warm_s']:.1f} s in a process with the imports done",
        sep="\n",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--evaluations", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=10_000, help="results in the first and last window")
    parser.add_argument("--executor", nargs="+", choices=("in_process", "ray"), default=["in_process", "ray"])
    parser.add_argument("--resume-evaluations", type=int, help="of the resume run (default: --evaluations)")
    parser.add_argument("--no-resume", action="store_true", help="skip the kill-and-resume measurement")
    parser.add_argument("--only-resume", action="store_true", help="only the kill-and-resume measurement")
    parser.add_argument("--keep", type=Path, help="search in this directory and keep the runs")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = args.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for kind in args.executor:
            if not args.only_resume:
                _search_and_report(tmp, kind, args.evaluations, args.window)
            if not args.no_resume:
                res = resume_seconds(tmp, kind, args.resume_evaluations or args.evaluations)
                print(
                    f"  resume after SIGKILL at {res['killed_at']} committed: {res['resume_s']:.1f} s to the "
                    f"first new commit (<= {TARGETS['resume_s']:g}: "
                    f"{_verdict(res['resume_s'], TARGETS['resume_s'])}), {res['resume_cpu_s']:.1f} CPU s "
                    "in the resumed process",
                    flush=True,
                )


if __name__ == "__main__":
    main()
