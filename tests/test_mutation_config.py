"""Experiment files (search/config.py): the key table read from the sections' fields, the
multi-fidelity section's switches and the run directory, against hand-written values.

Written when mutmut first reached these functions (scripts/mutation.py, "experiment sections"):
they were decorated (`@cache`, `@property`), which mutmut skips. The key table is checked through
the uncached `_section_spec`, since a cached value computed by an earlier test hides a change.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from search_helpers import experiment

from einspace.search.config import Experiment, MultiFidelitySection, _section_spec, _spec

#: MultiFidelitySection's keys by hand: (what a file may give, the default); a tuple field takes a
#: list in a file, None allows null.
_MULTI_FIDELITY = {
    "scheduler": ((str,), "none"),
    "eta": ((int, list), 3),  # one for every rung, or one per rung below the top
    "window": ((int, None), None),
    "min_fidelity": ((int,), 1),
    "max_fidelity": ((int, None), None),
    "rungs": ((list, None), None),
    "promotion": ((str, None), None),
    "strategy_fitness": ((str,), "lowest_rung"),
}


def test_a_sections_keys_are_its_fields_types_and_defaults() -> None:
    assert _section_spec(MultiFidelitySection) == _MULTI_FIDELITY
    assert _spec(MultiFidelitySection) == _MULTI_FIDELITY


def test_a_nested_section_is_a_nested_table_and_a_filled_in_key_allows_null() -> None:
    table = _section_spec(Experiment)
    assert table["multi_fidelity"] == _MULTI_FIDELITY
    assert table["run_dir"] == ((str, None), None)
    assert table["name"] == ((str, None), None)  # filled in from the file name when absent
    assert table["random_seed"] == ((int,), 0)
    assert table["seeds"] == ((list,), [])  # a tuple default is a list in a file
    assert table["tracking"] == ((dict,), {})  # from its default factory
    assert "source" not in table  # not part of what the experiment is


@pytest.mark.parametrize(
    "scheduler, promotion, enabled, continues",
    [
        ("none", None, False, False),
        ("none", "continue", False, False),
        ("successive_halving", "continue", True, True),
        ("successive_halving", "retrain", True, False),
        ("successive_halving", None, True, False),
    ],
)
def test_multi_fidelity_is_enabled_by_a_scheduler_and_continues_only_when_enabled(
    scheduler: str, promotion: str | None, enabled: bool, continues: bool
) -> None:
    section = MultiFidelitySection(scheduler=scheduler, promotion=promotion)
    assert section.enabled is enabled
    assert section.continues is continues


def test_the_run_directory_is_run_dir_or_runs_slash_the_name(tmp_path: Path) -> None:
    given = experiment(tmp_path / "here")
    assert given.directory == tmp_path / "here"
    assert replace(given, run_dir=None).directory == Path("runs") / given.name
    assert replace(given, run_dir=None, name="other").directory == Path("runs/other")
