"""Run identity: what `Experiment.identity` covers and how `identity_changes` words a difference.

Written in the mutation-testing round (scripts/mutation.py): each expected value is computed
independently here (hashlib over the files, hand-written change lists).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from search_helpers import PLUGIN, experiment

from einspace.search.config import _file_digest, grammar_digest
from einspace.search.loop import identity_changes

BASE = "start S\nS -> M M\nM -> identity | norm\n"


def _sha(*files: Path) -> str:
    """The grammar digest written out: SHA-256 over the sorted SHA-256 hex digests of the files."""
    digest = hashlib.sha256()
    for hexdigest in sorted(hashlib.sha256(f.read_bytes()).hexdigest() for f in files):
        digest.update(hexdigest.encode())
    return digest.hexdigest()


def test_file_digest_is_the_sha256_of_the_bytes_or_missing(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_bytes(b"x = 1\n")
    assert _file_digest(path) == hashlib.sha256(b"x = 1\n").hexdigest()
    assert _file_digest(tmp_path / "absent.py") == "missing"


def test_grammar_digest_covers_every_file_of_an_extended_grammar(tmp_path: Path) -> None:
    base, child = tmp_path / "base.pcfg", tmp_path / "child.pcfg"
    base.write_text(BASE)
    child.write_text('extends "base.pcfg"\nM += softmax\n')
    assert grammar_digest(str(child)) == _sha(base, child)
    before = grammar_digest(str(child))
    base.write_text(BASE.replace("norm", "leaky_relu"))  # the base edited, the child not
    assert grammar_digest(str(child)) == _sha(base, child) != before


def test_grammar_digest_leaves_paths_out(tmp_path: Path) -> None:
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "g.pcfg").write_text(BASE)
    assert grammar_digest(str(tmp_path / "one/g.pcfg")) == grammar_digest(str(tmp_path / "two/g.pcfg"))


def test_grammar_digest_of_a_grammar_that_does_not_load_is_of_its_name() -> None:
    assert grammar_digest("no_such_grammar") == hashlib.sha256(b"no_such_grammar").hexdigest()


def test_identity_covers_plugin_contents(tmp_path: Path) -> None:
    plugin = tmp_path / "plug.py"
    plugin.write_text("VALUE = 1\n")
    e = experiment(tmp_path, plugins=[PLUGIN, str(plugin)])
    identity = e.identity()
    assert identity["plugin_content"] == {
        PLUGIN: hashlib.sha256(Path(PLUGIN).read_bytes()).hexdigest(),
        str(plugin): hashlib.sha256(b"VALUE = 1\n").hexdigest(),
    }
    assert identity["grammar_content"] == grammar_digest("einspace")
    assert identity["strategy"]["settings"] == {"population": 10, "tournament": 3}  # evaluations left out
    assert identity["limits"]["max_nodes"] == 80
    assert "executor" not in identity and "name" not in identity and "run_dir" not in identity


def test_identity_changes_words_each_leaf_and_skips_keys_an_old_store_lacked() -> None:
    old = {
        "limits": {"max_nodes": 80, "max_depth": 12},
        "strategy": {"settings": {"population": 10}},
        "grammar_content": "a",
        "plugin_content": {"p.py": "x", "q.py": "y"},
        "random_seed": 3,
    }
    new = {
        "limits": {"max_nodes": 81, "max_depth": 12},
        "strategy": {"settings": {"population": 10}},
        "grammar_content": "b",
        "plugin_content": {"p.py": "z", "q.py": "y"},
        "random_seed": 3,
        "sampling": "paper",  # a key the old store did not record
    }
    assert identity_changes(old, new) == [
        "the grammar's content: a file it is composed of was edited",
        "limits.max_nodes: 80 -> 81",
        "the content of plugin p.py",
    ]
    assert identity_changes(old, old) == []


def test_identity_changes_of_a_key_dropped_and_of_a_mapping_turned_value() -> None:
    assert identity_changes({"seeds": ["a"]}, {}) == ['seeds: ["a"] -> null']
    assert identity_changes({"limits": {"max_nodes": 1}}, {"limits": 5}) == ['limits: {"max_nodes": 1} -> 5']


def test_identity_changes_shortens_long_values_past_sixty_characters() -> None:
    sixty = "x" * 58  # 60 characters once quoted in JSON
    sixty_one = "x" * 59
    assert identity_changes({"a": sixty}, {"a": 1}) == [f'a: "{sixty}" -> 1']
    assert identity_changes({"a": sixty_one}, {"a": 1}) == ['a: "' + "x" * 56 + "... -> 1"]


def test_identity_changes_after_a_key_the_old_store_lacked_are_still_found() -> None:
    assert identity_changes({"b": 1}, {"a": 0, "b": 2}) == ["b: 1 -> 2"]


def test_identity_of_a_strategy_without_an_evaluations_setting(tmp_path: Path) -> None:
    e = experiment(tmp_path, strategy={"name": "random_search", "settings": {}})
    assert e.identity()["strategy"] == {"name": "random_search", "settings": {}}
