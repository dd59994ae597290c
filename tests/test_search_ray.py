"""Searches on a local Ray instance (2 CPUs and 4 declared, fake GPUs): end to end, fault injection,
persistent workers and fresh processes, placement over GPUs, clean-up after a killed driver."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest
from search_helpers import PARSE_COUNTER, PLUGIN, experiment, history_key, wait_for, where_log

from einspace.errors import EinspaceError
from einspace.evaluators.base import Task
from einspace.search import executors, ray_local
from einspace.search.executors import RayExecutor
from einspace.search.loop import open_store, run_search

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

#: GPUs the local instance declares: Ray schedules and sets CUDA_VISIBLE_DEVICES for them as for
#: real ones (nothing here touches a device), so placement is tested on any machine.
FAKE_GPUS = 4


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=2, num_gpus=FAKE_GPUS, include_dashboard=False, log_to_driver=False)
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
    executor = executor or e.make_executor()
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
    here = ray.get_runtime_context().get_node_id()  # each evaluation records the node it ran on
    assert {r.node for r in history if r.status == "ok"} == {here}
    assert {r.node for r in history if r.status == "cached"} <= {None}


def test_no_more_workers_start_than_the_cluster_has_cpus_for(tmp_path, monkeypatch):
    """A persistent worker holds its CPUs while idle, so a worker Ray cannot place would wait for
    ever (after a node is lost, say): with room for one, one worker takes every evaluation in turn."""
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 0.5})
    e = ray_experiment(tmp_path, strategy={"name": "random_search", "settings": {"evaluations": 4}})
    summary, history = run(e)  # max_in_flight 2, num_cpus 0.5 each
    assert summary.finished and len(history) == 4
    assert len({r.worker for r in history if r.status == "ok"}) == 1


def test_an_evaluation_whose_node_is_lost_runs_again_up_to_the_retry_limit(tmp_path, monkeypatch, caplog):
    """A worker that dies on a live node fails its evaluation (test_faults_...); one whose node has
    left the cluster does not, and its evaluation is started again on a fresh worker, at most
    NODE_LOSS_RETRIES times (here every try dies: the fault is the tree's, and the node "gone")."""
    monkeypatch.setattr(executors, "NODE_LOSS_RETRIES", 2)
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "another node", "Alive": True}])
    e = ray_experiment(
        tmp_path,
        evaluator={"name": "test_faulty", "settings": {"fault": "exit", "every": 1}},
        strategy={"name": "random_search", "settings": {"evaluations": 1}},
        executor={"max_in_flight": 1},
    )
    with caplog.at_level("WARNING", logger="einspace.search.executors"):
        summary, [record] = run(e)
    assert summary.finished and record.status == "failed" and "worker died" in record.error
    retried = [m for m in caplog.messages if "lost its node" in m]
    assert len(retried) == 2 and all(m.startswith("evaluation 0 lost its node") for m in retried)


def test_each_worker_parses_the_grammar_once(tmp_path):
    """Twenty evaluations on two persistent workers: each parses the grammar at its first
    evaluation and finds it cached, by content, at every later one."""
    log = tmp_path / "log"
    log.mkdir()
    e = ray_experiment(
        tmp_path,
        strategy={"name": "random_search", "settings": {"evaluations": 20}},
        evaluator={"name": "test_parses", "settings": {"log": str(log)}},
        plugins=[PLUGIN, PARSE_COUNTER],
    )
    executor = RayExecutor(max_in_flight=2, num_cpus=0.5, plugins=[PLUGIN, PARSE_COUNTER])
    try:
        summary, history = run(e, executor)
    finally:
        executor.shutdown()
    entries = where_log(log)
    assert summary.finished and len(entries) == sum(r.status == "ok" for r in history) >= 10
    assert {entry["parses"] for entry in entries} == {1}, entries


def test_ray_search_with_successive_halving_keeps_every_slot_busy(tmp_path, shared, monkeypatch):
    """Promotions and new architectures fill the free slots as results come back (no rung waits to
    fill): whenever the loop waits for results, both workers are busy, until the wrapped strategy
    has proposed its last architecture."""
    e = ray_experiment(
        tmp_path,
        evaluator={"name": "test_fidelity", "settings": {"epochs": 9}},
        strategy={"name": "random_search", "settings": {"evaluations": 24}},
        multi_fidelity={"scheduler": "successive_halving"},
    )
    seen, waits = [], []  # the scheduler (from the first result on); (in flight, proposals left) per wait
    wait = shared.wait

    def counting_wait(timeout=None):
        left = not seen or seen[0].base.next_id < seen[0].evaluations
        waits.append((shared.in_flight, left))
        return wait(timeout)

    monkeypatch.setattr(shared, "wait", counting_wait)
    store = open_store(e)
    try:
        summary = run_search(e, shared, store, on_result=lambda r, s: seen[:1] or seen.append(s))
        history = store.history()
    finally:
        store.close()
    assert summary.finished
    assert {r.fidelity for r in history} == {1, 3, 9} and all(r.worker for r in history if r.status == "ok")
    assert all(r.cost["cpu_seconds"] > 0 for r in history if r.status == "ok")
    busy = [n for n, left in waits if left]
    assert len(busy) > 10 and min(busy) == 2


def test_ray_workers_save_and_inherit_weights_through_the_run_directory(tmp_path, shared):
    """Workers write each trained network to the run's weights folder and children read their
    parent's file there (nothing passes through the driver); the folder keeps the living only.
    One evaluation in flight: the history is then the in-process one (which has children that
    inherit); with two, which children keep part of their parent varies from run to run."""
    settings = {
        **{"dataset": "digits", "epochs": 1, "batch_size": 64, "threads": 1, "device": "cpu"},
        **{"train_subset": 256, "valid_subset": 128, "inherit_weights": True},
    }
    e = ray_experiment(
        tmp_path,
        input={"shape": [1, 8, 8]},
        limits={"max_depth": 10, "max_nodes": 40, "max_params": 20000},
        evaluator={"name": "training", "settings": settings},
        strategy={"settings": {"evaluations": 12, "population": 4, "tournament": 2}},
        executor={"max_in_flight": 1},
    )
    store, shared.max_in_flight = open_store(e), 1
    try:
        assert run_search(e, shared, store).finished
        history = store.history()
        live = {store.get(i).hash for i, _, _ in store.load_checkpoint()["population"]}
    finally:
        store.close()
        shared.max_in_flight = 2
    children = [r for r in history if r.origin == "mutation" and r.status == "ok"]
    assert children and all(r.worker for r in children)
    assert any(r.metrics["inherited_share"] > 0 for r in children)
    assert all(r.metrics["inheritance_missing"] == 0 for r in children)
    kept = {p.stem for p in (tmp_path / "weights").glob("*.pt")}
    assert kept and kept <= live


def test_ray_with_one_in_flight_reproduces_the_in_process_history(tmp_path, shared):
    shared.max_in_flight = 1
    try:
        _, on_ray = run(ray_experiment(tmp_path / "ray", executor={"max_in_flight": 1}), shared)
    finally:
        shared.max_in_flight = 2
    in_process = experiment(tmp_path / "local")
    store = open_store(in_process)
    run_search(in_process, in_process.make_executor(), store)
    assert history_key(on_ray) == history_key(store.history())


#: (fault, the reason recorded, timeout, whether the worker is replaced by a fresh process after it)
FAULTS = [
    ("raise", "evaluator crashed: RuntimeError: injected failure", None, False),
    ("expected", "CUDA out of memory (injected)", None, True),
    ("cuda", "evaluator crashed: RuntimeError: CUDA error: an illegal memory access", None, True),
    ("nan", "fitness is nan", None, False),
    ("exit", "worker died", None, True),
    ("hang", "timed out after 2 s", 2, True),
]


def faulty_search(tmp_path, executor, fault, reason, timeout):
    """8 evaluations, a quarter of them faulty: the faults are failed results, the rest succeed.
    Returns each worker's evaluations, in the order they finished."""
    e = ray_experiment(
        tmp_path,
        evaluator={"name": "test_faulty", "settings": {"fault": fault, "every": 4}},
        strategy={"settings": {"evaluations": 8, "population": 4, "tournament": 2}},
        executor={"timeout_s": timeout},
    )
    executor.timeout_s = timeout
    try:
        summary, history = run(e, executor)
    finally:
        executor.timeout_s = None
    assert summary.finished and len(history) == 8
    failed = [r for r in history if r.status == "failed"]
    assert failed and all(reason in r.error and r.fitness == float("-inf") for r in failed)
    assert any(r.status == "ok" for r in history)
    runs = defaultdict(list)
    for record in history:  # in commit order
        if record.worker:  # None for a worker that died or was killed
            runs[record.worker].append(record)
    return runs


@pytest.mark.parametrize("fault, reason, timeout, replaced", FAULTS)
def test_faults_become_failed_results_and_the_search_goes_on(
    tmp_path, shared, fault, reason, timeout, replaced
):
    """Persistent workers go on after an ordinary failure; after an out-of-memory or CUDA error
    (or their death) a fresh process takes their place."""
    runs = faulty_search(tmp_path, shared, fault, reason, timeout)
    assert any(len(evaluations) > 1 for evaluations in runs.values())  # workers are reused
    if replaced:  # a failure is the last evaluation of its worker
        assert all(r.status == "ok" for evaluations in runs.values() for r in evaluations[:-1])
    else:
        assert len(runs) <= shared.max_in_flight  # the same workers throughout


@pytest.mark.slow
@pytest.mark.parametrize("fault, reason, timeout, replaced", FAULTS)
def test_faults_in_fresh_processes(tmp_path, fault, reason, timeout, replaced):
    """The same faults with a new process per evaluation (slow: 8 process starts per fault)."""
    executor = RayExecutor(max_in_flight=2, num_cpus=0.5, fresh_process=True, plugins=[PLUGIN])
    try:
        runs = faulty_search(tmp_path, executor, fault, reason, timeout)
    finally:
        executor.shutdown()
    assert all(len(evaluations) == 1 for evaluations in runs.values())


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


def test_asking_for_gpus_on_a_cluster_without_any_is_an_error(monkeypatch):
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(EinspaceError, match="num_gpus is 1 but the Ray cluster has no GPUs"):
        RayExecutor(num_gpus=1)


def test_evaluations_spread_over_four_gpus_with_their_fractions(tmp_path):
    """8 workers of half a GPU each on 4 GPUs: two per GPU, each seeing only its own GPU."""
    log = tmp_path / "where"
    log.mkdir()
    e = ray_experiment(
        tmp_path,
        evaluator={"name": "test_where", "settings": {"log": str(log)}},
        strategy={"name": "random_search", "settings": {"evaluations": 16}},
        executor={"max_in_flight": 8, "num_cpus": 0.125, "num_gpus": 0.5},
    )
    summary, history = run(e)
    assert summary.finished and all(r.status in ("ok", "cached") for r in history)
    entries = where_log(log)
    assert len(entries) == summary.evaluated
    gpu_of = {}
    for entry in entries:
        assert entry["share"] == 0.5 and len(entry["gpu_ids"]) == 1
        assert entry["visible"] == entry["gpu_ids"][0]  # CUDA_VISIBLE_DEVICES names its GPU only
        assert gpu_of.setdefault(entry["pid"], entry["visible"]) == entry["visible"]  # and keeps it
    workers_on = defaultdict(set)
    for pid, gpu in gpu_of.items():
        workers_on[gpu].add(pid)
    assert {gpu: len(pids) for gpu, pids in workers_on.items()} == {str(i): 2 for i in range(FAKE_GPUS)}


def test_memory_packing_sizes_queues_and_reuses_workers(tmp_path):
    """Shares from each tree's estimated memory on 16 GiB GPUs: 1/16 for a small batch, 2 GPUs
    for a huge one. A worker of the right size is reused; an idle one of another size is stopped
    to make room; a task that does not fit waits for a running one and then reuses its worker."""
    log = tmp_path / "where"
    log.mkdir()
    tree = "(S (M (C linear(d=16))) (M (C leaky_relu)))"  # 2,112 values per example at 1x8x8

    def task(batch_size):
        return Task(tree, "einspace", (1, 8, 8), "test_where", {"log": str(log), "batch_size": batch_size})

    small, huge = 32, 2**21  # 0.5 GiB + 0.26 MiB -> 1/16; 0.5 + 16.5 GiB -> 2 of 16 GiB GPUs
    executor = RayExecutor(
        max_in_flight=3, num_cpus=0.25, num_gpus=4, packing="memory", gpu_memory_gb=16, plugins=[PLUGIN]
    )
    results = {}

    def drain():
        while executor.in_flight:
            for done in executor.wait(timeout=5):
                results[done.key] = done

    try:
        for key in (0, 1):
            executor.submit(key, task(small))
            drain()
        for key in (2, 3, 4):  # 2 + 2 fill the 4 GPUs once the idle small worker is stopped; 4 waits
            executor.submit(key, task(huge))
        assert executor.in_flight == 3 and len(executor._queue) == 1
        drain()
        assert sorted(slot.share for slot in executor._idle) == [2.0, 2.0]
    finally:
        executor.shutdown()
    assert all(r.result.ok for r in results.values()) and len(results) == 5
    pid = {key: done.worker.rsplit(":", 1)[1] for key, done in results.items()}
    shares = {str(entry["pid"]): entry["share"] for entry in where_log(log)}
    assert [shares[pid[key]] for key in range(5)] == [1 / 16] * 2 + [2.0] * 3
    assert pid[1] == pid[0] and pid[2] != pid[3] and pid[4] in (pid[2], pid[3])


def test_a_killed_drivers_local_ray_is_cleaned_up_at_the_next_start(tmp_path):
    """SIGKILL leaves the raylet's agents alive; the next local start reaps them. The driver
    records its session under a temporary directory of its own (Ray's stays where it was): in the
    shared one, any other local start meanwhile (a parallel test worker's) would reap it first."""
    code = (
        "import os; from einspace.search.executors import RayExecutor; RayExecutor(local_cpus=1); "
        "print(os.getpid(), flush=True); import time; time.sleep(300)"
    )
    records = tmp_path / ray_local.RECORDS.relative_to(tempfile.gettempdir())
    ray_tmp = os.environ.get("RAY_TMPDIR", tempfile.gettempdir())
    env = {**os.environ, "TMPDIR": str(tmp_path), "RAY_TMPDIR": ray_tmp}
    driver = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        pid = int(driver.stdout.readline())
        record = json.loads((records / f"{pid}.json").read_text())
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    session = record["session_dir"]
    left = wait_for(lambda: _settled(session), 30, "the session's processes settling after the kill")
    assert left, "nothing left behind to clean up"
    ray_local.reap_orphaned_sessions(records)  # what start_local_ray does first
    wait_for(lambda: not ray_local.session_processes(session), 10, "reaping the session's processes")
    assert not (records / f"{pid}.json").exists()


def _settled(session: str, quiet: float = 1.0) -> frozenset | None:
    """The session's processes once the set has stayed the same for `quiet` seconds (what dies with
    the driver has died by then), else None."""
    before = frozenset(ray_local.session_processes(session))
    time.sleep(quiet)
    return before if frozenset(ray_local.session_processes(session)) == before else None


def _alive_nodes(ray_cli: str, port: int, env: dict[str, str]) -> int:
    """How many nodes `ray status` lists as active in the cluster at `port` (0 while it is not up)."""
    status = subprocess.run(
        [ray_cli, "status", f"--address=127.0.0.1:{port}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if status.returncode != 0:
        return 0
    active = status.stdout.partition("Active:")[2].partition("Pending:")[0]
    return sum(" node_" in line for line in active.splitlines())


@pytest.mark.slow
def test_search_over_a_two_node_cluster_started_with_ray_start(tmp_path):
    """`einspace search --ray-address auto` against a cluster started as users start one: `ray
    start --head`, and a second node joining it with `ray start --address`, both on this machine
    with one CPU each; evaluations run on both nodes (slow: starts a cluster)."""
    import yaml
    from search_helpers import BASE, merge

    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # a joining node does not pick up the token itself
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    block = ["--num-cpus", "1", "--block"]
    nodes = [
        subprocess.Popen(
            [ray_cli, "start", "--head", f"--port={port}", "--include-dashboard=false", *block], **quiet
        )
    ]
    marker = Path("/tmp/ray/ray_current_cluster")  # written by `ray start`, removed only by `ray stop`
    log = tmp_path / "where"
    log.mkdir()
    try:
        wait_for(lambda: _alive_nodes(ray_cli, port, env) == 1, 120, "the head node starting", every=1)
        nodes.append(subprocess.Popen([ray_cli, "start", f"--address=127.0.0.1:{port}", *block], **quiet))
        wait_for(lambda: _alive_nodes(ray_cli, port, env) == 2, 120, "the second node joining", every=1)
        raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "executor": {"kind": "ray", "num_cpus": 1}})
        raw["executor"]["max_in_flight"] = 2  # one worker per node: each has one CPU
        raw["evaluator"] = {"name": "test_where", "settings": {"log": str(log)}}
        raw["strategy"] = {"name": "random_search", "settings": {"evaluations": 8}}
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
        code = "import sys; from einspace.cli import main; sys.exit(main(sys.argv[1:]))"
        done = subprocess.run(
            [sys.executable, "-c", code, "search", str(tmp_path / "exp.yaml"), "--ray-address", "auto"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert len({entry["node"] for entry in where_log(log)}) == 2
    finally:
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)
            node.wait(60)
        marker.unlink(missing_ok=True)  # else later ray.init() calls would try to join the dead cluster


@pytest.mark.slow
def test_a_search_over_two_nodes_survives_losing_the_worker_node(tmp_path):
    """The README's two-node recipe: a head and a worker node started by `ray start`, each with one
    CPU and a resource of its own, and a search on both (one worker each). The worker node is
    killed (its whole process group, SIGKILL) while an evaluation runs there: that evaluation runs
    again on the head, the search finishes with every evaluation committed once and none failed,
    and `report` counts the evaluations per node (slow: starts a cluster)."""
    import yaml
    from search_helpers import BASE, merge

    from einspace.search.store import SQLiteStore

    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # a joining node does not pick up the token itself
        "RAY_health_check_period_ms": "500",  # a lost node is noticed in seconds, not half a minute
        "RAY_health_check_failure_threshold": "4",
    }
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    start = [ray_cli, "start", "--num-cpus", "1", "--block"]
    head = subprocess.Popen(
        [*start, "--head", f"--port={port}", "--include-dashboard=false", "--resources", '{"head": 1}'],
        **quiet,
    )
    worker = None
    marker = Path("/tmp/ray/ray_current_cluster")  # written by `ray start`, removed only by `ray stop`
    log = tmp_path / "where"
    log.mkdir()
    evaluations = 12
    try:
        wait_for(lambda: _alive_nodes(ray_cli, port, env) == 1, 120, "the head node starting", every=1)
        worker = subprocess.Popen(  # in a session of its own: its processes are killed together
            [*start, f"--address=127.0.0.1:{port}", "--resources", '{"worker": 1}'],
            start_new_session=True,
            **quiet,
        )
        wait_for(lambda: _alive_nodes(ray_cli, port, env) == 2, 120, "the worker node joining", every=1)
        raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "executor": {"kind": "ray", "num_cpus": 1}})
        raw["executor"]["max_in_flight"] = 2  # one worker per node: each has one CPU
        raw["evaluator"] = {"name": "test_where", "settings": {"log": str(log), "sleep": 1.0}}
        raw["strategy"] = {"name": "random_search", "settings": {"evaluations": evaluations}}
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
        code = "import sys; from einspace.cli import main; sys.exit(main(sys.argv[1:]))"
        cli = [sys.executable, "-c", code]
        search = subprocess.Popen(
            [*cli, "search", str(tmp_path / "exp.yaml"), "--ray-address", f"127.0.0.1:{port}", "--quiet"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )

        def started_on(session: int) -> list[dict]:
            return [entry for entry in where_log(log) if entry["session"] == session]

        # the second evaluation started on the worker node is sleeping there when the node dies
        wait_for(lambda: len(started_on(worker.pid)) >= 2, 240, "two evaluations on the worker node")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(60)
        _, stderr = search.communicate(timeout=300)
        assert search.returncode == 0, stderr
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        head.send_signal(signal.SIGTERM)
        head.wait(60)
        marker.unlink(missing_ok=True)  # else later ray.init() calls would try to join the dead cluster
    [lost] = {entry["node"] for entry in started_on(worker.pid)}
    assert "lost its node, retrying it elsewhere" in stderr
    history = SQLiteStore(tmp_path / "run" / "search.sqlite").history()
    assert sorted(r.id for r in history) == list(range(evaluations))  # each committed once
    assert [r.seq for r in history] == list(range(1, evaluations + 1))
    assert all(r.status in ("ok", "cached") for r in history)  # the lost evaluation did not fail
    nodes = defaultdict(int)
    for r in history:
        if r.node is not None:
            nodes[r.node] += 1
    assert len(nodes) == 2 and nodes[lost] >= 1  # finished on the worker node before it died
    started = len(where_log(log))  # every start, the lost one's included
    assert started == sum(nodes.values()) + 1
    report = subprocess.run(
        [*cli, "report", str(tmp_path / "run"), "--no-plot"], capture_output=True, text=True
    )
    line = next(x for x in report.stdout.splitlines() if x.startswith("evaluations per Ray node: "))
    assert all(f"{node[:12]} {n}" in line for node, n in nodes.items())


def test_a_pareto_search_on_ray_gives_the_in_process_history(tmp_path, shared):
    """Multi-objective evolution, with trees over a parameter limit refused before training, reaches
    the same history through Ray workers as in the driver's process."""
    pareto = {"name": "pareto_evolution", "settings": {"evaluations": 20, "population": 6, "tournament": 3}}
    section = {
        "objectives": [{"name": "fitness"}, {"name": "params"}],
        "constraints": [{"name": "params", "max": 20_000}],
    }
    shared.max_in_flight = 1
    try:
        e = ray_experiment(
            tmp_path / "ray", strategy=pareto, multi_objective=section, executor={"max_in_flight": 1}
        )
        summary, history = run(e, shared)
    finally:
        shared.max_in_flight = 2
    local = experiment(tmp_path / "local", strategy=pareto, multi_objective=section)
    _, reference = run(local)
    assert summary.finished and history_key(history) == history_key(reference)
    assert any(r.worker for r in history) and any(r.error and "infeasible" in r.error for r in history)
