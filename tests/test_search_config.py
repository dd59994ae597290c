"""Experiment files: every bad input has a message that names the key (one table, one test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from search_helpers import BASE, PLUGIN, experiment, merge

from einspace.search.config import ConfigError, Experiment, load_experiment, parse_experiment

BAD = [
    ({"strategy": {"settings": {"populaton": 5}}}, "populaton"),
    ({"evaluater": {}}, "unknown key 'evaluater'"),
    ({"executor": {"num_gpu": 1}}, "unknown key 'executor.num_gpu'"),
    ({"executor": {"num_gpus": "one"}}, "executor.num_gpus must be a number, got str"),
    ({"executor": {"max_in_flight": True}}, "executor.max_in_flight must be an integer"),
    ({"executor": {"max_in_flight": 0}}, "executor.max_in_flight must be positive"),
    ({"executor": {"kind": "slurm"}}, "executor.kind must be 'ray' or 'in_process'"),
    ({"executor": {"timeout_s": -1}}, "executor.timeout_s must be positive"),
    ({"input": {"shape": "3x32x32"}}, "input.shape must be a list"),
    ({"input": {"shape": [3, 0, 32]}}, "input.shape must be a list of positive integers"),
    ({"input": {"mode": "image"}}, "input.mode must be 'im' or 'col'"),
    ({"random_seed": 1.5}, "random_seed must be an integer"),
    ({"limits": {"max_depth": "deep"}}, "limits.max_depth must be an integer"),
    ({"limits": {"max_depth": 0}}, "max_depth"),
    ({"evaluator": {"name": "no_such_evaluator"}}, "unknown evaluator 'no_such_evaluator'"),
    ({"evaluator": {"settings": {"bogus": 1}}}, "unknown setting 'bogus' for evaluator 'test_params'"),
    ({"strategy": {"name": "annealing"}}, "unknown strategy 'annealing'"),
    ({"seeds": ["no_such_seed"]}, "no_such_seed"),
    ({"seeds": [3]}, r"seeds\[0\] must be a string"),
    ({"plugins": ["no.such.module"]}, "plugin module 'no.such.module'"),
    ({"grammar": "no_such_grammar"}, "no_such_grammar"),
    ({"input": {"shape": [3, 2, 2]}, "seeds": ["vit"]}, "seed 'vit'"),
]


@pytest.mark.parametrize("changes, message", BAD, ids=[m for _, m in BAD])
def test_config_errors_name_the_key(changes, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as info:
        parse_experiment(merge(BASE, changes), "exp.yaml")
    assert str(info.value).startswith("exp.yaml")


def test_missing_required_key():
    raw = merge(BASE, {})
    del raw["evaluator"]["name"]
    with pytest.raises(ConfigError, match="missing key 'evaluator.name'"):
        parse_experiment(raw, "exp.yaml")


def test_defaults_are_filled_in(tmp_path):
    e = experiment(tmp_path)
    assert e.executor.num_gpus == 0 and e.limits.max_params is None
    assert e.strategy.settings["population"] == 10


def test_yaml_file_relative_paths_and_default_run_dir(tmp_path):
    (tmp_path / "my.tree").write_text(
        (Path(__file__).parent.parent / "grammars/seeds/resnet18.tree").read_text()
    )
    raw = merge(BASE, {"seeds": ["my.tree", "resnet18"], "plugins": [PLUGIN]})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    e = load_experiment(tmp_path / "exp.yaml")
    assert e.seeds == (str((tmp_path / "my.tree").resolve()), "resnet18")
    assert e.name == "exp" and e.directory == Path("runs/exp")
    assert [name for name, _ in e.space().seeds] == ["my", "resnet18"]


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_experiment(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_experiment(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_experiment(tmp_path / "list.yaml")


def test_a_run_stores_the_checked_file_as_plain_data_and_reads_it_back(tmp_path):
    """The stored form (a run's `config` and `experiment` metadata) is what resuming and reports
    read: every key with its default, paths resolved, lists as lists; it must not drift."""
    e = experiment(tmp_path)
    stored = {
        "name": "test",
        "run_dir": str(tmp_path),
        "random_seed": 3,
        "grammar": "einspace",
        "sampling": "paper",
        "allow_inconsistent": False,
        "input": {"shape": [3, 16, 16], "mode": None},
        "limits": {
            "max_depth": 12,
            "max_nodes": 80,
            "min_depth": 0,
            "max_params": None,
            "min_params": 0,
            "min_flops": 0,
            "max_flops": None,
            "max_operations": None,
            "max_steps": 20_000,
            "max_attempts": 100,
        },
        "evaluator": {"name": "test_params", "settings": {}},
        "strategy": {
            "name": "regularised_evolution",
            "settings": {"evaluations": 40, "population": 10, "tournament": 3},
        },
        "seeds": [],
        "plugins": [PLUGIN],
        "warm_start": [],
        "multi_fidelity": {
            "scheduler": "none",
            "eta": 3,
            "window": None,
            "min_fidelity": 1,
            "max_fidelity": None,
            "rungs": None,
            "promotion": None,
            "strategy_fitness": "lowest_rung",
        },
        "multi_objective": {"objectives": [], "constraints": [], "reference": None, "batch_size": 1},
        "executor": {
            "kind": "in_process",
            "max_in_flight": 1,
            "num_cpus": 1,
            "num_gpus": 0,
            "timeout_s": None,
            "fresh_process": None,
            "local_cpus": None,
            "packing": "fixed",
            "gpu_memory_gb": None,
        },
        "tracking": {},
    }
    assert json.loads(e.to_json()) == stored
    identity = e.identity()
    resumable = {"name", "run_dir", "executor", "tracking"}
    assert set(identity) == set(stored) - resumable | {"grammar_content", "plugin_content"}
    assert identity["strategy"]["settings"] == {"population": 10, "tournament": 3}
    assert list(identity["plugin_content"]) == [PLUGIN]
    assert Experiment.from_json(e.to_json(), "test.yaml") == e
    older = {k: v for k, v in stored.items() if k not in ("sampling", "allow_inconsistent", "multi_fidelity")}
    older["limits"] = {k: v for k, v in stored["limits"].items() if k != "max_operations"}
    assert Experiment.from_json(json.dumps(older), "test.yaml") == e  # keys added since: defaults


def test_a_key_is_written_once_as_a_field() -> None:
    """The checked keys are the fields of `Experiment` and its sections, and what a file leaves out
    gets the field's default: a file naming only what is required is the dataclasses' defaults."""
    from dataclasses import fields

    from einspace.sampling import Limits
    from einspace.search.config import ExecutorSection, MultiFidelitySection, StrategySection, _check, _spec

    spec = _spec(Experiment)
    assert list(spec) == [f.name for f in fields(Experiment) if f.name != "source"]
    assert list(spec["executor"]) == [f.name for f in fields(ExecutorSection)]
    minimal = {"input": {"shape": [3, 8, 8]}, "evaluator": {"name": "e"}}
    e = Experiment.from_dict(_check(minimal, spec, "", "f.yaml"), "f.yaml")
    assert (e.limits, e.executor, e.strategy) == (Limits(), ExecutorSection(), StrategySection())
    assert e.multi_fidelity == MultiFidelitySection() and e.input.shape == (3, 8, 8) and e.seeds == ()
