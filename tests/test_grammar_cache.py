"""A grammar is parsed once per process and content: loading it again, evaluating many trees or
asking an experiment for its space again parses nothing until one of its files changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from search_helpers import experiment

from einspace.errors import GrammarError
from einspace.grammar import parser
from einspace.grammar.parser import load_grammar
from einspace.ops import Group, register_op, unregister_op
from einspace.ops.core import UnaryOperation
from einspace.search.loop import open_store, run_search

GRAMMAR = "start S\nS -> M | (M, M) add\nM if mode == col -> linear(d = 16) | linear(d = 32)\n"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths parsed from now on, with an empty cache."""
    seen: list[str] = []
    parse = parser.parse_grammar

    def counted(text: str, path: str = "<string>", **kwargs):  # noqa: ANN202
        seen.append(path)
        return parse(text, path, **kwargs)

    monkeypatch.setattr(parser, "parse_grammar", counted)
    monkeypatch.setattr(parser, "_LOADED", {})
    return seen


def test_a_grammar_is_parsed_again_only_when_one_of_its_files_changes(
    tmp_path: Path, parses: list[str]
) -> None:
    base, child = tmp_path / "base.pcfg", tmp_path / "child.pcfg"
    base.write_text(GRAMMAR)
    child.write_text('extends "base.pcfg"\nM += linear(d = 64)\n')
    first = load_grammar(child)
    assert load_grammar(child) is first and load_grammar(str(child)) is first
    assert parses == [str(child), str(base)]
    base.write_text(GRAMMAR.replace("d = 32", "d = 128"))  # the extended file changes: both again
    changed = load_grammar(child)
    assert changed is not first and parses[2:] == [str(child), str(base)]
    child.write_text('extends "base.pcfg"\nM += linear(d = 256)\n')  # the file itself: base is cached
    assert load_grammar(child) is not changed and parses[4:] == [str(child)]
    assert load_grammar("einspace") is load_grammar("einspace") and len(parses) == 6


def test_a_plugin_operation_coming_or_going_makes_grammars_parse_again(
    tmp_path: Path, parses: list[str]
) -> None:
    """Whether a grammar is valid depends on the registered operations, not only on its text."""
    path = tmp_path / "mine.pcfg"
    path.write_text(GRAMMAR.replace("linear(d = 32)", "test_cached_op"))

    @register_op
    class CachedOp(UnaryOperation):
        name, group = "test_cached_op", Group.COMPUTATION

    try:
        assert load_grammar(path) is load_grammar(path) and len(parses) == 1
    finally:
        unregister_op("test_cached_op")
    with pytest.raises(GrammarError, match="'test_cached_op' is neither a non-terminal"):
        load_grammar(path)


def test_a_search_of_twenty_evaluations_parses_its_grammar_once(tmp_path: Path, parses: list[str]) -> None:
    e = experiment(tmp_path, strategy={"name": "random_search", "settings": {"evaluations": 20}})
    assert e.space() is e.space()
    store = open_store(e)
    executor = e.make_executor()
    try:
        summary = run_search(e, executor, store)
    finally:
        executor.shutdown()
        store.close()
    assert summary.finished
    assert len(parses) == 1, parses
