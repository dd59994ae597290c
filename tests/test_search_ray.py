"""Searches on a local Ray instance (2 CPUs): end to end, fault injection, one process per evaluation."""

from __future__ import annotations

import pytest
from search_helpers import PLUGIN, experiment, history_key

from einspace.errors import EinspaceError
from einspace.search.executors import RayExecutor
from einspace.search.loop import open_store, run_search

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def shared():
    """One executor for the module: its workers start once (each start imports torch, seconds
    on two cores); tests adjust `max_in_flight`/`timeout_s`, which the executor reads per call."""
    executor = RayExecutor(max_in_flight=2, num_cpus=0.5, plugins=[PLUGIN])
    executor.start_workers()
    yield executor
    executor.shutdown()


def run(e, executor=None):
    store = open_store(e)
    own = executor is None
    executor = executor or e.executor()
    try:
        return run_search(e, executor, store), store.history()
    finally:
        if own:
            executor.shutdown()
        store.close()


def ray_experiment(tmp_path, **changes):
    executor = {"kind": "ray", "max_in_flight": 2, "num_cpus": 0.5, **changes.pop("executor", {})}
    return experiment(tmp_path, executor=executor, **changes)


def test_ray_search_completes(tmp_path, shared):
    summary, history = run(ray_experiment(tmp_path), shared)
    assert summary.finished and len(history) == 40
    assert all(r.status in ("ok", "cached") for r in history)
    assert all(r.worker for r in history if r.status == "ok")


def test_ray_with_one_in_flight_reproduces_the_in_process_history(tmp_path, shared):
    shared.max_in_flight = 1
    try:
        _, on_ray = run(ray_experiment(tmp_path / "ray", executor={"max_in_flight": 1}), shared)
    finally:
        shared.max_in_flight = 2
    in_process = experiment(tmp_path / "local")
    store = open_store(in_process)
    run_search(in_process, in_process.executor(), store)
    assert history_key(on_ray) == history_key(store.history())


@pytest.mark.parametrize(
    "fault, reason, timeout",
    [
        ("raise", "evaluator crashed: RuntimeError: injected failure", None),
        ("expected", "CUDA out of memory (injected)", None),
        ("nan", "fitness is nan", None),
        ("exit", "worker died", None),
        ("hang", "timed out after 2 s", 2),
    ],
)
def test_faults_become_failed_results_and_the_search_goes_on(tmp_path, shared, fault, reason, timeout):
    e = ray_experiment(
        tmp_path,
        evaluator={"name": "test_faulty", "settings": {"fault": fault, "every": 4}},
        strategy={"settings": {"evaluations": 8, "population": 4, "tournament": 2}},
        executor={"timeout_s": timeout},
    )
    shared.timeout_s = timeout
    try:
        summary, history = run(e, shared)
    finally:
        shared.timeout_s = None
    assert summary.finished and len(history) == 8
    failed = [r for r in history if r.status == "failed"]
    assert failed and all(reason in r.error and r.fitness == float("-inf") for r in failed)
    assert any(r.status == "ok" for r in history)


def test_fresh_process_gives_each_evaluation_its_own_worker(tmp_path):
    e = ray_experiment(
        tmp_path,
        strategy={"name": "random_search", "settings": {"evaluations": 2}},
        executor={"fresh_process": True},
    )
    summary, history = run(e)
    workers = [r.worker for r in history if r.status == "ok"]
    assert summary.finished and len(workers) == len(set(workers)) == len(history)


def test_executor_joins_a_running_ray_instead_of_starting_one():
    executor = RayExecutor(max_in_flight=1, num_cpus=0.5)
    assert not executor._owns_ray
    executor.shutdown()
    assert ray.is_initialized()


def test_asking_for_gpus_on_a_cluster_without_any_is_an_error():
    if ray.cluster_resources().get("GPU"):
        pytest.skip("this machine has GPUs")
    with pytest.raises(EinspaceError, match="num_gpus is 1 but the Ray cluster has no GPUs"):
        RayExecutor(num_gpus=1)


@pytest.mark.slow
def test_search_joins_a_cluster_started_with_ray_start(tmp_path):
    """`einspace search --ray-address auto` against `ray start --head` (slow: starts a cluster)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from search_helpers import BASE, merge

    head = subprocess.Popen(
        ["ray", "start", "--head", "--num-cpus", "2", "--include-dashboard=false", "--block"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = "/tmp/ray/ray_current_cluster"  # written by `ray start`, removed only by `ray stop`
    try:
        time.sleep(15)
        raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "executor": {"kind": "ray", "num_cpus": 0.5}})
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
        code = "import sys; from einspace.cli import main; sys.exit(main(sys.argv[1:]))"
        done = subprocess.run(
            [sys.executable, "-c", code, "search", str(tmp_path / "exp.yaml"), "--ray-address", "auto"],
            env={**os.environ},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
    finally:
        head.send_signal(signal.SIGTERM)
        head.wait(60)
        if os.path.exists(marker):  # else later ray.init() calls would try to join the dead cluster
            os.remove(marker)
