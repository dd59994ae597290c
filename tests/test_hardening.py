"""What real users ran into: plugins in every command, datasets checked before a search, inputs
read strictly, consistency enforced everywhere, run identity by content, clear errors for bad
files. Each case: input -> exit status, message pattern, no traceback, nothing lost."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from search_helpers import BASE, PLUGIN, merge

import einspace as es
from einspace.cli import main
from einspace.errors import TreeError
from einspace.grammar import parse_grammar
from einspace.ops import unregister_op
from einspace.search.store import SQLiteStore

README = Path(__file__).resolve().parent.parent / "README.md"

#: A plugin registering an operation (a 1-d smoothing filter on col features, d unchanged).
OP_PLUGIN = textwrap.dedent(
    """
    import torch
    from einspace.ops import Group, register_op
    from einspace.ops.core import UnaryOperation

    @register_op
    class Halve(UnaryOperation):
        "x / 2"
        name, group = "test_halve", Group.COMPUTATION
        def module(self, state, args):
            return Half()

    class Half(torch.nn.Module):
        def forward(self, x):
            return x / 2
    """
)
GRAMMAR = "extends einspace\nC += test_halve @ 0.2\n"


@pytest.fixture
def plugin_files(tmp_path: Path):
    (tmp_path / "halve.py").write_text(OP_PLUGIN)
    (tmp_path / "mine.pcfg").write_text(GRAMMAR)
    (tmp_path / "halved.tree").write_text("(S (M (C test_halve)) (M (C linear(d=16))))\n")
    yield tmp_path
    _forget_plugin()


def _forget_plugin() -> None:
    """As if in a fresh process: the operation unregistered and its module not imported."""
    unregister_op("test_halve")
    for name in [m for m in sys.modules if m.startswith("einspace_plugin_halve_")]:
        del sys.modules[name]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# ---------------------------------------------------------------- 1. plugins in every command


def test_every_command_that_reads_grammars_or_trees_takes_plugins(plugin_files: Path, capsys) -> None:
    d = plugin_files
    plugin = ["--plugin", str(d / "halve.py")]
    commands = [
        ["check", str(d / "mine.pcfg")],
        ["sample", str(d / "mine.pcfg"), "--input", "3,16,16", "-n", "3", "--random-seed", "1"],
        ["show", str(d / "halved.tree"), "--input", "3,16,16", "--grammar", str(d / "mine.pcfg")],
        ["seeds", "--input", "3,64,64", "--grammar", str(d / "mine.pcfg")],
        ["ops", "test_*"],
    ]
    for command in commands:
        code, out, err = _run([*command, *plugin], capsys)
        assert code == 0, (command, err)
    assert "test_halve()  [computation]  x / 2" in out
    _forget_plugin()
    code, _, err = _run(commands[0], capsys)  # without the plugin the grammar names an unknown op
    assert code == 2 and "'test_halve' is neither a non-terminal" in err


def test_report_loads_the_runs_own_plugins(plugin_files: Path, capsys) -> None:
    d = plugin_files
    raw = merge(
        BASE,
        {
            "run_dir": str(d / "run"),
            "grammar": str(d / "mine.pcfg"),
            "plugins": [PLUGIN, str(d / "halve.py")],
            "strategy": {"settings": {"evaluations": 6}},
        },
    )
    (d / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert _run(["search", str(d / "exp.yaml"), "--quiet"], capsys)[0] == 0
    _forget_plugin()  # a fresh process: `report` must load the plugin itself, when trusted to
    code, out, _ = _run(["report", str(d / "run"), "--no-plot", "--trust-plugins"], capsys)
    assert code == 0 and "statistics unavailable" not in out and "terminals" in out


def test_a_plugin_that_fails_names_itself_and_its_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "broken.py").write_text("x = 1\nraise ValueError('no such table')\n")
    code, _, err = _run(["ops", "--plugin", str(tmp_path / "broken.py")], capsys)
    assert code == 2
    assert re.search(
        r"plugin '.*broken.py' failed while importing: ValueError: no such table \(.*broken.py:2\)", err
    )
    code, _, err = _run(["ops", "--plugin", "no_such_plugin_module"], capsys)
    assert code == 2 and "plugin module 'no_such_plugin_module' cannot be imported" in err


# ---------------------------------------------------------------- 2. the README's operation example


def test_readme_operation_example_is_safe_in_multi_branch_networks() -> None:
    """The README's Softsign, run as written: never offered on two branches, so sampled networks
    with branching compile and run; and `verify_operations` finds nothing wrong with it."""
    text = README.read_text()
    block = text.split("### Your own operations", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(block, namespace)  # noqa: S102 - the README's own example
    try:
        grammar = parse_grammar("extends einspace\nC += softsign @ 0.3\n", "softsign.pcfg")
        x = es.input_state((3, 16, 16))
        sampler = es.Sampler(grammar, x, es.Limits(max_depth=12, max_nodes=120), random_seed=0)
        branched_with_softsign = 0
        for _ in range(60):
            tree = sampler.sample()
            text = es.to_text(tree)
            net = es.compile_network(tree, x, classes=10)
            assert net(torch.randn(2, 3, 16, 16)).shape == (2, 10)
            branched_with_softsign += "softsign" in text and "(B " in text
        assert branched_with_softsign > 5
        from einspace.ops.verify import verify_operations

        assert verify_operations(grammar, x, trees=10) == []
        with pytest.raises(TreeError, match="softsign acts on one tensor, and 2 branches are in flight"):
            es.check_tree(es.parse_tree("(S (B clone(b=2)) (C softsign) (A add))"), None, x)
    finally:
        unregister_op("softsign")


def test_verify_finds_an_operation_whose_module_disagrees(tmp_path: Path, capsys) -> None:
    (tmp_path / "liar.py").write_text(
        textwrap.dedent(
            """
            import torch
            from einspace.ops import Group, register_op
            from einspace.ops.core import UnaryOperation

            @register_op
            class Liar(UnaryOperation):
                "claims to keep the shape, halves the channels"
                name, group = "test_liar", Group.COMPUTATION
                def module(self, state, args):
                    return torch.nn.Conv2d(state.shape[0], max(1, state.shape[0] // 2), 1)
            """
        )
    )
    (tmp_path / "liar.pcfg").write_text("extends einspace\nC += test_liar @ 0.3\n")
    try:
        code, out, _ = _run(
            [
                "check",
                str(tmp_path / "liar.pcfg"),
                "--mode",
                "im",
                "--input",
                "4,8,8",
                "--verify",
                "5",
                "--plugin",
                str(tmp_path / "liar.py"),
            ],
            capsys,
        )
        assert code == 1
        assert re.search(
            r"test_liar\(\) on im\[\d+x8x8\]: infer says \[\(\d+, 8, 8\)\] but the module outputs", out
        )
    finally:
        unregister_op("test_liar")


# ---------------------------------------------------------------- 3. datasets checked first


def _dataset(tmp_path: Path, **broken: np.ndarray) -> str:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 40), ("valid", 20), ("test", 20)):
        arrays[f"{split}_x"] = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
        arrays[f"{split}_y"] = rng.integers(0, 3, size=n)
    arrays.update(broken)
    np.savez(tmp_path / "data.npz", **arrays)
    return str(tmp_path / "data.npz")


def _training_experiment(tmp_path: Path, dataset: str, shape: list[int] | None = None) -> Path:
    raw = merge(BASE, {
        "run_dir": str(tmp_path / "run"), "input": {"shape": shape or [1, 8, 8]},
        "evaluator": {"name": "training", "settings": {"dataset": dataset, "epochs": 1, "threads": 1}},
        "strategy": {"settings": {"evaluations": 3}},
    })  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "exp.yaml"


DATASET_PROBLEMS: list[tuple[str, Callable[[], dict], str]] = [
    (
        "labels-out-of-range",
        lambda: {"train_y": np.r_[np.zeros(39, int), 1003]},
        "uses 2 distinct labels but the largest is 1003",
    ),
    ("one-class", lambda: {"train_y": np.zeros(40, int)}, "train_y has one class (0)"),
    ("nan", lambda: {"valid_x": np.full((20, 1, 8, 8), np.nan, np.float32)}, "valid_x contains 1280 NaN"),
    ("lengths", lambda: {"test_y": np.zeros(7, int)}, "test_y has 7 labels for 20 examples"),
    (
        "empty",
        lambda: {"valid_x": np.zeros((0, 1, 8, 8), np.float32), "valid_y": np.zeros(0, int)},
        "valid_x is empty",
    ),
    ("dtype", lambda: {"train_x": np.array([["a"] * 64] * 40).reshape(40, 1, 8, 8)}, "train_x has dtype <U1"),
]


@pytest.mark.parametrize("name, broken, message", DATASET_PROBLEMS, ids=[p[0] for p in DATASET_PROBLEMS])
def test_a_broken_dataset_stops_the_search_before_it_starts(
    tmp_path: Path, capsys, name, broken, message
) -> None:
    experiment = _training_experiment(tmp_path, _dataset(tmp_path, **broken()))
    code, _, err = _run(["search", str(experiment)], capsys)
    assert code == 2 and message in err and "data.npz" in err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_a_dataset_of_another_shape_or_a_missing_file_stops_it_too(tmp_path: Path, capsys) -> None:
    code, _, err = _run(
        ["search", str(_training_experiment(tmp_path, _dataset(tmp_path), [3, 8, 8]))], capsys
    )
    assert code == 2 and "does not match dataset" in err and "1x8x8" in err
    code, _, err = _run(["search", str(_training_experiment(tmp_path, str(tmp_path / "nope.npz")))], capsys)
    assert code == 2 and "nope.npz" in err


def test_a_search_whose_evaluations_all_failed_says_why_and_exits_1(tmp_path: Path, capsys) -> None:
    raw = merge(
        BASE,
        {
            "run_dir": str(tmp_path / "run"),
            "evaluator": {"name": "test_faulty", "settings": {"fault": "raise", "every": 1}},
            "strategy": {"settings": {"evaluations": 4}},
        },
    )
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code, out, _ = _run(["search", str(tmp_path / "exp.yaml")], capsys)
    assert code == 1
    assert "best: no successful evaluation; all 4 failed:" in out and "x4: " in out
    assert _run(["search", str(tmp_path / "exp.yaml"), "--quiet"], capsys)[0] == 1  # complete, still failed


# ---------------------------------------------------------------- 5. consistency everywhere

SUPERCRITICAL = "start S\nS -> M\nM -> M M @ 0.7 | linear(d = 16)\n"


def test_an_inconsistent_grammar_is_refused_unless_allowed(tmp_path: Path, capsys) -> None:
    (tmp_path / "hot.pcfg").write_text(SUPERCRITICAL)
    sample = ["sample", str(tmp_path / "hot.pcfg"), "--input", "4,8,8", "--max-nodes", "50"]
    code, _, err = _run(sample, capsys)
    assert (
        code == 2 and "inconsistent in im mode (spectral radius 1.4" in err and "--allow-inconsistent" in err
    )
    assert _run([*sample, "--allow-inconsistent"], capsys)[0] == 0
    raw = merge(
        BASE,
        {
            "run_dir": str(tmp_path / "run"),
            "grammar": str(tmp_path / "hot.pcfg"),
            "strategy": {"settings": {"evaluations": 2}},
            "limits": {"max_nodes": 50},
        },
    )
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code, _, err = _run(["search", str(tmp_path / "exp.yaml")], capsys)
    assert code == 2 and "allow_inconsistent: true" in err
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({**raw, "allow_inconsistent": True}))
    assert _run(["search", str(tmp_path / "exp.yaml"), "--quiet"], capsys)[0] == 0


# ---------------------------------------------------------------- 7. run identity and extending


def test_editing_the_grammar_in_place_is_a_changed_experiment(tmp_path: Path, capsys) -> None:
    (tmp_path / "g.pcfg").write_text("extends einspace\nM @= C @ 0.4\n")
    raw = merge(
        BASE,
        {
            "run_dir": str(tmp_path / "run"),
            "grammar": str(tmp_path / "g.pcfg"),
            "strategy": {"settings": {"evaluations": 4}},
        },
    )
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert _run(["search", str(tmp_path / "exp.yaml"), "--quiet"], capsys)[0] == 0
    (tmp_path / "g.pcfg").write_text("extends einspace\nM @= C @ 0.5\n")
    code, _, err = _run(["search", str(tmp_path / "exp.yaml"), "--quiet"], capsys)
    assert code == 2 and "the grammar's content: a file it is composed of was edited" in err


def test_a_finished_search_can_be_extended(tmp_path: Path, capsys) -> None:
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "strategy": {"settings": {"evaluations": 6}}})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert _run(["search", str(tmp_path / "exp.yaml"), "--quiet"], capsys)[0] == 0
    assert _run(["search", str(tmp_path / "exp.yaml"), "--evaluations", "10"], capsys)[0] == 0
    store = SQLiteStore(tmp_path / "run" / "search.sqlite")
    assert [r.id for r in store.history()] == list(range(10))
    store.close()  # the first six kept, four more asked by the restored strategy
    code, out, _ = _run(["report", str(tmp_path / "run"), "--no-plot"], capsys)
    assert code == 0 and "finished 10 of 10" in out


# ---------------------------------------------------------------- 8. files that are not what they seem


def test_bad_files_get_sentences(tmp_path: Path, capsys) -> None:
    (tmp_path / "binary.tree").write_bytes(bytes(range(256)))
    (tmp_path / "deep.tree").write_text("(S " * 3000 + "identity" + ")" * 3000)
    (tmp_path / "a_file").write_text("x")
    cases = [
        (["show", str(tmp_path / "binary.tree"), "--input", "3,8,8"], "is not UTF-8 text"),
        (["show", str(tmp_path / "deep.tree"), "--input", "3,8,8"], "nested too deeply to read"),
        (
            ["sample", "einspace", "--input", "3,8,8", "--out", str(tmp_path / "a_file")],
            "is a file; give a directory",
        ),
        (["sample", "einspace", "--input", "3,8,8", "-n", "-2"], None),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) if message is None else _no_raise():
            code, _, err = _run(argv, capsys)
            assert code == 2 and message in err, (argv, err)
    assert (tmp_path / "a_file").read_text() == "x"  # nothing lost


class _no_raise:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_a_run_dir_that_is_a_file_or_an_empty_store_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "run").write_text("keep me")
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "strategy": {"settings": {"evaluations": 2}}})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code, _, err = _run(["search", str(tmp_path / "exp.yaml")], capsys)
    assert code == 2 and "is a file, not a directory" in err
    assert (tmp_path / "run").read_text() == "keep me"
    (tmp_path / "run").unlink()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "search.sqlite").write_bytes(b"")
    for argv in (["search", str(tmp_path / "exp.yaml")], ["report", str(tmp_path / "run")]):
        code, _, err = _run(argv, capsys)
        assert code == 2 and "is empty (0 bytes)" in err
    assert (tmp_path / "run" / "search.sqlite").stat().st_size == 0


# ---------------------------------------------------------------- 10. check says more


def test_check_names_alternatives_never_taken_and_the_modes(tmp_path: Path, capsys) -> None:
    (tmp_path / "g.pcfg").write_text(
        "start S\nS -> M | (M, M) add | clone(b = 2) (M) * 4 add\nM if mode == col -> linear(d = 16)\n"
    )
    code, out, _ = _run(["check", str(tmp_path / "g.pcfg")], capsys)
    assert code == 0
    assert "input modes: S can be derived from col inputs" in out
    assert "never taken (2)" in out
    assert f"{tmp_path / 'g.pcfg'}:2:10: S -> (M, M) add" in out
    assert f"{tmp_path / 'g.pcfg'}:2:23: S -> clone(b = 2) (M) * 4 add" in out
    code, out, _ = _run(["check", "einspace_1d"], capsys)
    assert "from col inputs" in out and "input mode im" not in out


# ---------------------------------------------------------------- import walls


def test_strategies_stores_configs_and_trees_import_without_torch() -> None:
    """The walls the design states, checked: what does not build modules does not load torch."""
    import subprocess

    modules = [
        "einspace",
        "einspace.registry",
        "einspace.ops.registry",
        "einspace.tree",
        "einspace.grammar",
        "einspace.sampling.paper",
        "einspace.search.strategy",
        "einspace.search.successive_halving",
        "einspace.search.store",
        "einspace.search.compute",
        "einspace.search.config",
        "einspace.evaluators.base",
        "einspace.search.report",
    ]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "from einspace.cli import build_parser\nbuild_parser()\n"  # every command's options, `report`'s too
        + "print(sorted({'torch', 'einops'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
