"""Issue 24, what a third round of malformed inputs found: each case is a command line or a call,
the exit status and message it must give, no traceback, and nothing left half-written."""

from __future__ import annotations

import collections
import pickle
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from search_helpers import BASE, merge

import einspace as es
from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.evaluators.base import Task, run_task
from einspace.network.memory import LIMIT_VARIABLE
from einspace.ops import unregister_op

TREE = "(S (M (C linear(d=16))) (M (C linear(d=16))))\n"


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def forget_plugin(op: str | None, stem: str) -> None:
    """As if in a fresh process: the operation unregistered and the plugin file `stem`.py not imported."""
    if op is not None:
        unregister_op(op)
    for name in [m for m in sys.modules if m.startswith(f"einspace_plugin_{stem}_")]:
        del sys.modules[name]


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


# ---------------------------------------------------------------- bad output paths

#: (command-case, output options, message fragment): the command is the name's first word;
#: `{d}` holds `afile` (a regular file) and the folders `dir.png`, `dir.html`, `dir.py`, `dir.pcfg`.
BAD_OUTPUTS: list[tuple[str, list[str], str]] = [
    ("export-weights-missing", ["--out", "{d}/ok.py", "--weights", "{d}/missing/w.pt"], "there is no folder"),
    ("export-out-directory", ["--out", "{d}/dir.py"], "{d}/dir.py: it is a directory"),
    ("export-weights-under-file", ["--out", "{d}/ok.py", "--weights", "{d}/afile/w.pt"], "afile is a file"),
    ("show-png-missing", ["--render", "{d}/missing/t.png"], "there is no folder {d}/missing"),
    ("show-svg-under-file", ["--render", "{d}/afile/t.svg"], "{d}/afile is a file, not a folder"),
    ("show-png-directory", ["--render", "{d}/dir.png"], "it is a directory"),
    ("show-html-directory", ["--render", "{d}/dir.html"], "it is a directory"),
    ("show-deep-missing", ["--render", "{d}/afile/x/y/t.png"], "{d}/afile is a file"),
    ("report-html-missing", ["--html", "{d}/missing/r.html"], "there is no folder"),
    ("report-html-directory", ["--html", "{d}/dir.html"], "it is a directory"),
    ("learn-missing", ["--out", "{d}/missing/g.pcfg"], "there is no folder"),
    ("learn-directory", ["--out", "{d}/dir.pcfg"], "it is a directory"),
    (
        "import-weights-missing",
        ["--out", "{d}/ok.tree", "--weights", "{d}/missing/w.pt"],
        "there is no folder",
    ),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small finished search with successful evaluations, for `report` and `learn-probabilities`."""
    root = tmp_path_factory.mktemp("run")
    (root / "mine.pcfg").write_text("extends einspace\n")
    raw = merge(
        BASE,
        {
            "run_dir": str(root / "run"),
            "grammar": str(root / "mine.pcfg"),
            "strategy": {"settings": {"evaluations": 6}},
        },
    )
    (root / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(root / "exp.yaml"), "--quiet"]) == 0
    return root / "run"


@pytest.mark.parametrize("name, options, message", BAD_OUTPUTS, ids=[c[0] for c in BAD_OUTPUTS])
def test_a_bad_output_path_is_one_sentence_and_nothing_is_written(
    tmp_path: Path, finished_run: Path, capsys, name: str, options: list[str], message: str
) -> None:
    d = tmp_path
    (d / "afile").write_text("x")
    for folder in ("dir.png", "dir.html", "dir.py", "dir.pcfg"):
        (d / folder).mkdir()
    (d / "t.tree").write_text(TREE)
    inputs = {
        "export": ["export", str(d / "t.tree"), "--input", "3,16,16", "--classes", "3"],
        "show": ["show", str(d / "t.tree"), "--input", "3,16,16"],
        "report": ["report", str(finished_run), "--no-plot"],
        "learn": ["learn-probabilities", str(finished_run)],
        "import": ["import-model", "torchvision.models:resnet18", "--input", "3,16,16"],  # checked after
    }[name.partition("-")[0]]
    before = _files(d) | _files(finished_run)
    code, out, err = _run([*inputs, *(o.format(d=d) for o in options)], capsys)
    assert code == 2, out + err
    assert err.startswith("error: cannot write ") and message.format(d=d) in err
    assert _files(d) | _files(finished_run) == before  # nothing written, not even a partial file


def test_learn_probabilities_keeps_the_runs_own_grammar_unless_forced(finished_run: Path, capsys) -> None:
    grammar = finished_run.parent / "mine.pcfg"
    code, _, err = _run(["learn-probabilities", str(finished_run), "--out", str(grammar)], capsys)
    assert code == 2 and "is a grammar file of the run" in err and "--force" in err
    assert grammar.read_text() == "extends einspace\n"
    code, out, _ = _run(["learn-probabilities", str(finished_run), "--out", str(grammar), "--force"], capsys)
    assert code == 0 and f"wrote {grammar}" in out and "Learned by" in grammar.read_text()
    grammar.write_text("extends einspace\n")  # as the other tests expect


# ---------------------------------------------------------------- grammar and tree files


def _chain(folder: Path, length: int) -> Path:
    """`length` grammar files, each extending the one before, the first extending einspace."""
    (folder / "g0.pcfg").write_text("extends einspace\n")
    for i in range(1, length):
        (folder / f"g{i}.pcfg").write_text(f'extends "g{i - 1}.pcfg"\n')
    return folder / f"g{length - 1}.pcfg"


def test_a_long_chain_of_extends_is_refused_with_its_limit_not_a_recursion_error(
    tmp_path: Path, capsys
) -> None:
    code, _, err = _run(["check", str(_chain(tmp_path, 320)), "--mode", "im"], capsys)
    assert code == 2 and "grammars extend each other more than 100 deep" in err and "g319.pcfg" in err
    assert _run(["check", str(_chain(tmp_path, 60)), "--mode", "im"], capsys)[0] == 0


#: (command line, message fragment); `{d}` holds a folder `sub`.
FOLDERS_FOR_FILES = [
    (["check", "{d}/ext.pcfg"], 'cannot extend "sub": {d}/sub is a folder, not a grammar file'),
    (["check", "{d}/sub"], "'{d}/sub' is a folder; give a grammar file"),
    (["show", "{d}/sub", "--input", "3,8,8"], "'{d}/sub' is a folder; give a seed or tree file"),
    (["export", "{d}/sub", "--input", "3,8,8", "--classes", "2", "--out", "{d}/x.py"], "is a folder"),
]


@pytest.mark.parametrize(
    "argv, message", FOLDERS_FOR_FILES, ids=[c[0][0] + str(i) for i, c in enumerate(FOLDERS_FOR_FILES)]
)
def test_a_folder_where_a_file_belongs_is_called_a_folder(tmp_path: Path, capsys, argv, message) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "ext.pcfg").write_text('extends "sub"\n')
    code, _, err = _run([a.format(d=tmp_path) for a in argv], capsys)
    assert code == 2 and message.format(d=tmp_path) in err and "no file" not in err


# ---------------------------------------------------------------- plugins

#: A plugin operation whose `infer` has a bug (line 9 raises KeyError).
BROKEN_INFER = """from einspace.ops import Group, register_op
from einspace.ops.core import UnaryOperation

@register_op
class Broken(UnaryOperation):
    name, group = "test_broken_infer", Group.COMPUTATION
    def infer(self, signal, args):
        table = {}
        return table["missing"]
"""


@pytest.mark.parametrize(
    "command",
    [
        ["sample", "{d}/g.pcfg", "--input", "3,8,8"],
        ["check", "{d}/g.pcfg", "--input", "3,8,8", "--verify", "1"],
    ],
    ids=["sample", "check-verify"],
)
def test_an_operation_whose_infer_raises_is_named_with_its_plugin_line(
    tmp_path: Path, capsys, command: list[str]
) -> None:
    (tmp_path / "broken.py").write_text(BROKEN_INFER)
    (tmp_path / "g.pcfg").write_text("start S\nS -> test_broken_infer linear(d = 4)\n")
    try:
        code, _, err = _run(
            [*(a.format(d=tmp_path) for a in command), "--plugin", str(tmp_path / "broken.py")], capsys
        )
    finally:
        forget_plugin("test_broken_infer", "broken")
    assert code == 2
    assert f"operation 'test_broken_infer' (defined at {tmp_path}/broken.py:4) failed in infer" in err
    assert f"KeyError: 'missing' ({tmp_path}/broken.py:9)" in err


@pytest.mark.parametrize(
    "body, message",
    [
        ("import sys\nsys.exit(0)\n", "it called sys.exit(0) ({p}:2)"),
        ("raise SystemExit('bye')\n", "it called sys.exit('bye') ({p}:1)"),
    ],
    ids=["exit-0", "exit-text"],
)
def test_a_plugin_that_exits_while_importing_does_not_end_the_command(
    tmp_path: Path, capsys, body: str, message: str
) -> None:
    plugin = tmp_path / "exits.py"
    plugin.write_text(body)
    code, out, err = _run(["check", "einspace", "--plugin", str(plugin)], capsys)
    assert code == 2 and "OK" not in out
    assert f"plugin '{plugin}' failed while importing: " + message.format(p=plugin) in err


# ---------------------------------------------------------------- evaluator settings, before a search

#: (training settings, message fragment): each refused by `search` before it starts.
BAD_TRAINING_SETTINGS: list[tuple[dict, str]] = [
    ({"auxiliary_losses": {"complexty": 0.1}}, "auxiliary_losses.complexty: no network loss is called"),
    ({"auxiliary_losses": {"complexity": {"target": 0}}}, "target must be a number > 0, got 0"),
    ({"auxiliary_losses": {"complexity": {"target": -2}}}, "target must be a number > 0, got -2"),
    ({"auxiliary_losses": {"complexity": {"measure": "latency"}}}, "measure must be flops or params"),
    (
        {"auxiliary_losses": {"complexity": {"targt": 0.5}}},
        "'targt' for network loss 'complexity'; did you mean 'target'",
    ),
    (
        {"param_groups": {"archtecture": {"optimizer": "adam", "lr": 0.01}}},
        "param_groups.archtecture: no parameter group is called 'archtecture'; did you mean 'architecture'",
    ),
    ({"param_groups": {"weights": {"optimizer": "lion"}}}, "param_groups.weights: unknown optimizer 'lion'"),
    ({"param_groups": {"weights": {"lr": -0.1}}}, "param_groups.weights: lr must be a number >= 0"),
    ({"param_groups": {"architecture": {"betas": [0.9, 1.0]}}}, "betas must be two numbers in [0, 1)"),
    ({"param_groups": {"weights": {"learning_rate": 0.1}}}, "unknown option(s) learning_rate"),
    ({"lrr": 0.1}, "unknown setting 'lrr' for evaluator 'training'; did you mean 'lr'"),
    ({"lr": -1}, "setting lr must be a number >= 0"),
    ({"head_pooling": "median"}, "setting head_pooling must be one of mean, max, got 'median'"),
    ({"epochs": -1}, "setting epochs must be an integer >= 0, got -1"),
    ({"head_init": "probe"}, "setting head_init must be one of random, fitted, got 'probe'"),
    ({"max_grad_norm": 0}, "setting max_grad_norm must be positive or null"),
    (
        {"step_mode": "jit"},
        "setting step_mode must be one of eager, cuda_graphs, compile, compile_cuda_graphs, got 'jit'",
    ),
]


@pytest.mark.parametrize(
    "settings, message", BAD_TRAINING_SETTINGS, ids=[m[:30] for _, m in BAD_TRAINING_SETTINGS]
)
def test_bad_evaluator_settings_stop_the_search_before_it_starts(
    tmp_path: Path, capsys, settings: dict, message: str
) -> None:
    raw = merge(BASE, {
        "run_dir": str(tmp_path / "run"), "input": {"shape": [1, 8, 8]},
        "evaluator": {"name": "training", "settings": {"dataset": "digits", "epochs": 1, **settings}},
        "strategy": {"settings": {"evaluations": 2}},
    })  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code, _, err = _run(["search", str(tmp_path / "exp.yaml")], capsys)
    assert code == 2 and "evaluator 'training'" in err and message in err, err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- finished runs


def test_search_evaluations_below_what_is_finished_is_refused(finished_run: Path, capsys) -> None:
    experiment = finished_run.parent / "exp.yaml"
    code, _, err = _run(["search", str(experiment), "--evaluations", "2", "--quiet"], capsys)
    assert code == 2 and "has finished 6 evaluations, more than the 2 asked for" in err
    code, out, _ = _run(["report", str(finished_run), "--no-plot"], capsys)
    assert code == 0 and "finished 6 of 6" in out  # the recorded budget is unchanged
    assert _run(["search", str(experiment), "--evaluations", "6", "--quiet"], capsys)[0] == 0


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished search whose every evaluation failed."""
    root = tmp_path_factory.mktemp("failed")
    raw = merge(BASE, {
        "run_dir": str(root / "run"),
        "evaluator": {"name": "test_faulty", "settings": {"fault": "raise", "every": 1}},
        "strategy": {"settings": {"evaluations": 3}},
    })  # fmt: skip
    (root / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(root / "exp.yaml"), "--quiet"]) == 1
    return root / "run"


def test_a_quiet_search_of_a_finished_failed_run_says_why_it_exits_1(failed_run: Path, capsys) -> None:
    code, out, err = _run(["search", str(failed_run.parent / "exp.yaml"), "--quiet"], capsys)
    assert code == 1 and out == "" and "best: no successful evaluation; all 3 failed:" in err


def test_report_of_an_all_failed_run_draws_without_warnings(failed_run: Path, tmp_path: Path, capsys) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, _ = _run(["report", str(failed_run), "--html", str(tmp_path / "r.html")], capsys)
    assert code == 0 and (tmp_path / "r.html").is_file() and (failed_run / "fitness.png").is_file()
    assert [str(w.message) for w in caught] == []


# ---------------------------------------------------------------- executors

#: (executor section, message fragment): refused before a search starts.
BAD_EXECUTORS: list[tuple[dict, str]] = [
    ({"kind": "in_process", "num_gpus": 0.5}, "executor.num_gpus is 0.5, but this machine has no GPU"),
    (
        {"kind": "ray", "num_gpus": 0.5, "packing": "memory", "gpu_memory_gb": -8},
        "gpu_memory_gb must be positive",
    ),
    ({"kind": "ray", "gpu_memory_gb": 0}, "executor.gpu_memory_gb must be positive, got 0"),
]


@pytest.mark.parametrize("executor, message", BAD_EXECUTORS, ids=[m[:24] for _, m in BAD_EXECUTORS])
def test_executor_settings_this_machine_cannot_honour_are_refused(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, executor: dict, message: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, on any
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "executor": executor})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code, _, err = _run(["search", str(tmp_path / "exp.yaml")], capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- grammar analysis


@pytest.mark.parametrize("mode, modes", [([], "im or col"), (["--mode", "col"], "col")])
def test_check_refuses_a_grammar_that_derives_nothing(
    tmp_path: Path, capsys, mode: list[str], modes: str
) -> None:
    (tmp_path / "g.pcfg").write_text("start S\nS -> clone(b = 2) leaky_relu add\n")
    code, _, err = _run(["check", str(tmp_path / "g.pcfg"), *mode], capsys)
    assert code == 2 and f"g.pcfg:2:1: no tree can be derived from S with {modes} inputs" in err


# ---------------------------------------------------------------- weights files


def _pickled_object(path: Path) -> None:
    with path.open("wb") as f:
        pickle.dump({"w": collections.OrderedDict(a=object)}, f, protocol=4)


#: (how the --load file is made, message fragment).
BAD_WEIGHTS: list[tuple[str, Callable[[Path], None], str]] = [
    ("text", lambda p: p.write_text("hello\n"), "not a file of tensors saved with torch.save"),
    ("pickle", _pickled_object, "not a file of tensors saved with torch.save"),
    ("empty", lambda p: p.write_bytes(b""), "not a file of tensors saved with torch.save"),
    ("folder", lambda p: p.mkdir(), "Is a directory"),
    ("missing", lambda p: None, "No such file or directory"),
]


@pytest.mark.parametrize("name, make, message", BAD_WEIGHTS, ids=[c[0] for c in BAD_WEIGHTS])
def test_weights_that_are_not_a_torch_file_never_suggest_unsafe_loading(
    tmp_path: Path, capsys, name: str, make: Callable[[Path], None], message: str
) -> None:
    (tmp_path / "t.tree").write_text(TREE)
    make(tmp_path / "w.pt")
    argv = ["export", str(tmp_path / "t.tree"), "--input", "3,16,16", "--classes", "3"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _run(
            [*argv, "--out", str(tmp_path / "m.py"), "--load", str(tmp_path / "w.pt")], capsys
        )
    assert code == 2 and f"cannot read weights {tmp_path}/w.pt: {message}" in err
    assert "weights_only" not in err and "arbitrary code" not in err and not caught
    assert not (tmp_path / "m.py").exists()


def test_a_grammar_too_large_to_analyse_says_where_and_which_flag_skips_it(tmp_path: Path, capsys) -> None:
    n = 5001  # one (symbol, context) pair each: one more than the analysis takes
    rules = [f"N{i} -> linear(d = 4) N{i + 1} @ 0.5 | identity @ 0.5" for i in range(n)]
    (tmp_path / "big.pcfg").write_text("\n".join(["start S", "S -> N0", *rules, f"N{n} -> identity"]) + "\n")
    sample = ["sample", str(tmp_path / "big.pcfg"), "--input", "2,4,4", "--random-seed", "0"]
    code, _, err = _run(sample, capsys)
    assert (
        code == 2 and "big.pcfg:5002:1: the consistency analysis stops at 5000 (symbol, context) pairs" in err
    )
    assert "skip the analysis with --allow-inconsistent" in err and err.count("\n") == 1
    assert _run([*sample, "--allow-inconsistent"], capsys)[0] == 0


#: (grammar, the symbol and line an unproductive-symbol error must name, fragment).
UNPRODUCTIVE: list[tuple[str, str, str]] = [
    ("start S\nS -> M\nM -> M linear(d = 8)\n", "g.pcfg:3:1: non-terminal M never derives", ""),
    ("start S\nS -> identity M\nM -> linear(d = 8) M\n", "g.pcfg:3:1: non-terminal M never derives", ""),
    (
        "start S\nS -> A\nA -> B linear(d = 8)\nB -> identity A\n",
        "g.pcfg:3:1: non-terminal A",
        "cycle A -> B -> A",
    ),
    ("start S\nS -> S identity\n", "g.pcfg:2:1: non-terminal S never derives", ""),
]


@pytest.mark.parametrize("text, where, fragment", UNPRODUCTIVE)
def test_a_left_recursive_rule_is_reported_under_its_own_symbol(
    tmp_path: Path, capsys, text: str, where: str, fragment: str
) -> None:
    (tmp_path / "g.pcfg").write_text(text)
    code, _, err = _run(["check", str(tmp_path / "g.pcfg")], capsys)
    assert code == 2 and where in err and fragment in err


@pytest.mark.parametrize("allow", [False, True], ids=["checked", "allow-inconsistent"])
def test_a_col_grammar_with_an_image_input_names_both_and_leaves_no_run(
    tmp_path: Path, capsys, allow: bool
) -> None:
    raw = merge(BASE, {
        "run_dir": str(tmp_path / "run"), "grammar": "einspace_1d", "input": {"shape": [1, 8, 8]},
        "evaluator": {"name": "training", "settings": {"dataset": "digits", "epochs": 1}},
        "allow_inconsistent": allow,
    })  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code, _, err = _run(["search", str(tmp_path / "exp.yaml")], capsys)
    assert code == 2 and "einspace_1d.pcfg derives no tree from the input im[1x8x8]" in err
    assert not (tmp_path / "run").exists()
    code, _, err = _run(["sample", "einspace_1d", "--input", "3,8,8"], capsys)
    assert code == 2 and "einspace_1d.pcfg derives no tree from the input im[3x8x8]" in err


# ---------------------------------------------------------------- memory


@pytest.fixture
def tiny_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stated limit of 1 KiB, and any attempt to build a module an error: refusals come first."""
    monkeypatch.setenv(LIMIT_VARIABLE, str(1 / 2**20))

    def never(*args, **kwargs):
        raise AssertionError("a module was built for a network that does not fit")

    monkeypatch.setattr("einspace.network.compiler._Compiler.sequence", never)


def test_compile_network_refuses_a_network_larger_than_the_memory_limit(tiny_memory: None) -> None:
    checked = es.check_tree(es.parse_tree(TREE), None, es.FeatureState((3, 16, 16), "im"))
    with pytest.raises(EinspaceError) as info:
        es.compile_network(checked, classes=3)
    message = str(info.value)
    assert "building a network of 336 parameters would need about 1.3 KiB of float32 parameters" in message
    assert f"more than the 1.0 KiB stated by {LIMIT_VARIABLE}" in message


def test_export_weights_refuses_it_and_writes_nothing(tiny_memory: None, tmp_path: Path, capsys) -> None:
    (tmp_path / "t.tree").write_text(TREE)
    argv = ["export", str(tmp_path / "t.tree"), "--input", "3,16,16", "--classes", "3"]
    code, _, err = _run([*argv, "--out", str(tmp_path / "m.py"), "--weights", str(tmp_path / "w.pt")], capsys)
    assert code == 2 and "336 parameters would need about 1.3 KiB" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tree"]


def test_training_refuses_before_building_with_parameter_and_activation_numbers(tiny_memory: None) -> None:
    settings = {"dataset": "digits", "epochs": 1, "train_subset": 64, "valid_subset": 32, "device": "cpu"}
    result = run_task(Task(TREE, "einspace", (1, 8, 8), "training", settings))
    assert not result.ok and result.error is not None
    assert "training a network of" in result.error and "of activations for a batch of 256" in result.error
    assert "of weights, gradients and optimiser state" in result.error


def test_show_prints_memory_and_flops_and_says_what_does_not_fit(
    tiny_memory: None, tmp_path: Path, capsys
) -> None:
    (tmp_path / "t.tree").write_text(TREE)
    code, out, _ = _run(["show", str(tmp_path / "t.tree"), "--input", "3,16,16"], capsys)
    assert code == 0
    assert (
        "# memory: 1.3 KiB of float32 parameters, 35.0 KiB of activations per example; 0.000164 GFLOPs" in out
    )
    assert "# too large: building it would need about 1.3 KiB" in out
    code, out, _ = _run(["show", "resnet18", "--input", "3,64,64"], capsys)
    assert "# slow: over a GFLOP per example" in out


# ---------------------------------------------------------------- security


#: A plugin that leaves a mark when it is imported (its code ran).
MARKING_PLUGIN = """from pathlib import Path
Path(__file__).with_name("imported.mark").write_text("ran")
"""


@pytest.fixture
def run_with_plugin(tmp_path: Path) -> Path:
    """A finished run whose experiment names a plugin, the plugin since forgotten (a fresh process)."""
    (tmp_path / "marking.py").write_text(MARKING_PLUGIN)
    raw = merge(BASE, {
        "run_dir": str(tmp_path / "run"), "plugins": [*BASE["plugins"], str(tmp_path / "marking.py")],
        "strategy": {"settings": {"evaluations": 3}},
    })  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(tmp_path / "exp.yaml"), "--quiet"]) == 0
    (tmp_path / "imported.mark").unlink()
    yield tmp_path / "run"
    forget_plugin(None, "marking")


@pytest.mark.parametrize(
    "command",
    [["report", "{run}", "--no-plot"], ["report", "{run}", "--no-plot", "--html", "{d}/r.html"]],
    ids=["report", "report-html"],
)
def test_report_imports_a_runs_plugins_only_with_consent(
    run_with_plugin: Path, capsys, command: list[str]
) -> None:
    d, mark = run_with_plugin.parent, run_with_plugin.parent / "imported.mark"
    forget_plugin(None, "marking")
    argv = [a.format(run=run_with_plugin, d=d) for a in command]
    code, out, _ = _run(argv, capsys)
    assert code == 0 and not mark.exists()
    assert f"plugins: the run was searched with plugins not loaded here ({d}/marking.py)" in out
    assert "--trust-plugins" in out
    code, out, _ = _run([*argv, "--plugin", str(d / "marking.py")], capsys)  # chosen by the user
    assert code == 0 and mark.read_text() == "ran" and "plugins:" not in out
    mark.unlink()
    forget_plugin(None, "marking")
    code, out, _ = _run([*argv, "--trust-plugins"], capsys)
    assert code == 0 and mark.read_text() == "ran" and "plugins:" not in out


def test_learn_probabilities_imports_a_runs_plugins_only_with_consent(run_with_plugin: Path, capsys) -> None:
    d = run_with_plugin.parent
    forget_plugin(None, "marking")
    code, _, _ = _run(["learn-probabilities", str(run_with_plugin), "--out", str(d / "l.pcfg")], capsys)
    assert code == 0 and not (d / "imported.mark").exists()
    code, _, _ = _run(
        ["learn-probabilities", str(run_with_plugin), "--out", str(d / "l.pcfg"), "--trust-plugins"], capsys
    )
    assert code == 0 and (d / "imported.mark").exists()


def test_readme_security_section_lists_everything_that_runs_code() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("\n## Security\n", 1)[1].split("\n## ", 1)[0]
    for what in (
        "--plugin",
        "plugins:",
        "import-model",
        "--trust-plugins",
        "weights_only=True",
        "allow_pickle=False",
    ):
        assert what in section, what
    assert "EINSPACE_MEMORY_LIMIT_GB" in section
