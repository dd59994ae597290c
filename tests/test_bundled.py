"""The one rule for "a bundled name, or a path?" (`einspace.bundled.names_bundled`), from a table,
and every place that follows it: grammars, seeds, datasets, experiment files."""

from __future__ import annotations

from pathlib import Path

import pytest

from einspace.bundled import bundled_grammars, names_bundled
from einspace.errors import EinspaceError
from einspace.grammar.parser import load_grammar
from einspace.search.config import parse_experiment
from einspace.seeds import list_seeds, seed_path

BUNDLED = {"einspace", "resnet18", "digits"}

#: (what is given, whether it means the bundled file)
RULE = [
    ("einspace", True),  # a bundled name
    ("resnet18", True),
    ("digits", True),
    ("./einspace", False),  # a folder part: a path
    ("grammars/einspace", False),
    ("einspace.pcfg", False),  # a suffix: not a bundled name
    ("einspace_plus_mine", False),  # a name nothing bundled has: a path
    ("", False),
    (Path("einspace"), False),  # a Path is always a path
]


@pytest.mark.parametrize(("given", "bundled"), RULE)
def test_the_rule(given: str | Path, bundled: bool) -> None:
    assert names_bundled(given, BUNDLED) is bundled


def test_a_file_with_a_bundled_name_in_the_working_directory_is_reached_as_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grammars and seeds: the name means the bundled file wherever the command runs, ./name the
    file there (a virtualenv's bin/ holds an `einspace` script, for one)."""
    monkeypatch.chdir(tmp_path)
    Path("einspace").write_text("start S\nS -> M\nM if mode == col -> linear(d = 16)\n")
    Path("resnet18").write_text("(S (M (C identity)))\n")
    assert load_grammar("einspace").path == str(bundled_grammars()["einspace"])
    assert load_grammar("./einspace").rules_for("M")
    assert seed_path("resnet18").parent.name == "seeds" and seed_path("./resnet18") == Path("./resnet18")
    assert "resnet18" in list_seeds()


def test_a_dataset_folder_with_a_built_in_name_is_reached_as_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from einspace.evaluators.datasets import load_dataset

    monkeypatch.chdir(tmp_path)
    Path("digits").mkdir()  # empty: not a dataset
    assert load_dataset("digits").name == "digits"
    with pytest.raises(EinspaceError):
        load_dataset("./digits")


def test_an_experiment_file_resolves_paths_beside_it_but_not_bundled_names(tmp_path: Path) -> None:
    (tmp_path / "einspace").write_text("start S\nS -> M\nM if mode == col -> linear(d = 16)\n")
    (tmp_path / "mine.pcfg").write_text("start S\nS -> M\nM if mode == col -> linear(d = 16)\n")
    raw = {"grammar": "einspace", "input": {"shape": [8, 16], "mode": "col"}, "evaluator": {"name": "naswot"}}
    assert parse_experiment(raw, "e.yaml", tmp_path).grammar == "einspace"
    mine = parse_experiment({**raw, "grammar": "mine.pcfg"}, "e.yaml", tmp_path)
    assert mine.grammar == str((tmp_path / "mine.pcfg").resolve())
