"""The experiment files shipped in experiments/ are valid: each one is checked as `einspace
search` checks it before starting (grammar, evaluator, strategy, multi-fidelity rungs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from einspace.search.config import load_experiment

EXPERIMENTS = sorted((Path(__file__).resolve().parent.parent / "experiments").glob("*.yaml"))


def test_the_shipped_experiments_are_found():
    assert {"quickstart.yaml", "digits_re.yaml", "digits_halving.yaml"} <= {p.name for p in EXPERIMENTS}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_each_shipped_experiment_passes_the_checks_a_search_makes(path):
    experiment = load_experiment(path)
    assert experiment.name == path.stem  # its run directory is named as the README says


def test_the_halving_example_promotes_the_best_sixth_over_eta_3_s_rungs():
    experiment = load_experiment(next(p for p in EXPERIMENTS if p.name == "digits_halving.yaml"))
    halving = experiment.multi_fidelity
    assert (halving.scheduler, halving.eta, halving.rungs) == ("successive_halving", 6, (1, 3, 8))
    assert halving.max_fidelity == experiment.evaluator.settings["epochs"]
