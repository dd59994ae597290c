"""The `einspace` command in-process (exit codes, output, messages) and once as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from einspace import check_tree, content_hash, load_grammar, parse_tree
from einspace.cli import main
from einspace.state import input_state
from einspace.tree import from_json, load_tree

ROOT = Path(__file__).resolve().parent.parent
PAPER = str(ROOT / "grammars" / "einspace.pcfg")

#: im2col(4,4,0) on 3x32x32 -> col[64x48]; linear(d=32): (48 + 1) * 32 = 1568 params -> col[64x32];
#: col2im -> im[32x8x8].
PATCHIFY = "(S (R1 im2col(k=4, s=4, p=0)) (M (C linear(d=32))) (R2 col2im))"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _trees(out: str) -> list[str]:
    """The tree lines of `sample`'s text output (after each `# tree` header and its statistics)."""
    lines = out.splitlines()
    return [lines[i + 2] for i, line in enumerate(lines) if line.startswith("# tree ")]


# ----------------------------------------------------------------------------- check


def test_check_paper_grammar(capsys):
    code, out, err = run(capsys, "check", PAPER)
    assert code == 0, err
    assert "OK" in out and "start S" in out
    assert "rho = 0.98" in out  # the paper grammar at p(M -> C) = 0.32 (App. A.4)
    assert "Consistent: yes" in out


def test_check_by_bundled_name(capsys):
    code, out, _ = run(capsys, "check", "einspace_1d", "--mode", "col")
    assert code == 0
    assert "rho" in out


@pytest.fixture
def inconsistent(tmp_path) -> Path:
    path = tmp_path / "explode.pcfg"
    path.write_text("start M\nM -> M M @ 0.9 | C\nC -> identity\n")
    return path


def test_check_refuses_an_inconsistent_grammar(capsys, inconsistent):
    code, out, err = run(capsys, "check", str(inconsistent))
    assert code == 1
    assert "rho = 1.8000" in out
    assert "refused" in err and "inconsistent" in err
    assert "Traceback" not in out + err


def test_check_allow_inconsistent(capsys, inconsistent):
    code, _, err = run(capsys, "check", str(inconsistent), "--allow-inconsistent")
    assert code == 0
    assert "refused" not in err


# ----------------------------------------------------------------------------- sample


def test_sample_prints_n_valid_trees(capsys):
    code, out, err = run(capsys, "sample", PAPER, "--input", "3,32,32", "-n", "3", "--random-seed", "0")
    assert code == 0, err
    assert out.count("# tree ") == 3
    trees = _trees(out)
    assert len(trees) == 3
    grammar, x = load_grammar(PAPER), input_state((3, 32, 32))
    for line in trees:
        tree = parse_tree(line)
        check_tree(tree, grammar, x)
        assert f"hash {content_hash(tree)}" in out
    assert "params" in out and "FLOPs" in out


def test_sample_is_deterministic_by_seed(capsys):
    args = ("sample", "einspace", "--input", "64,128", "-n", "3", "--random-seed", "7")
    first, second = run(capsys, *args), run(capsys, *args)
    assert first == second
    other = run(capsys, "sample", "einspace", "--input", "64,128", "-n", "3", "--random-seed", "8")
    assert _trees(other[1]) != _trees(first[1])


def test_sample_json(capsys):
    code, out, _ = run(
        capsys, "sample", PAPER, "--input", "1,24,24", "-n", "2", "--random-seed", "3", "--format", "json"
    )
    assert code == 0
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(records) == 2
    for record in records:
        tree = from_json(record["tree"])
        checked = check_tree(tree, load_grammar(PAPER), input_state((1, 24, 24)))
        assert record["hash"] == content_hash(tree)
        assert record["params"] == checked.params


def test_sample_pretty_parses_back(capsys):
    code, out, _ = run(
        capsys, "sample", PAPER, "--input", "3,32,32", "--random-seed", "1", "--format", "pretty"
    )
    assert code == 0
    body = "\n".join(line for line in out.splitlines() if not line.startswith("#"))
    check_tree(parse_tree(body), load_grammar(PAPER), input_state((3, 32, 32)))


def test_sample_out_writes_tree_files(capsys, tmp_path):
    out_dir = tmp_path / "trees"
    code, out, _ = run(
        capsys, "sample", PAPER, "--input", "3,32,32", "-n", "3", "--random-seed", "0", "--out", str(out_dir)
    )
    assert code == 0
    files = sorted(out_dir.iterdir())
    assert [f.name for f in files] == ["tree_0000.tree", "tree_0001.tree", "tree_0002.tree"]
    assert [load_tree(f) for f in files] == [parse_tree(t) for t in _trees(out)]


def test_sample_respects_limits(capsys):
    limits = ("--max-params", "10000")
    code, out, _ = run(
        capsys, "sample", PAPER, "--input", "3,32,32", "-n", "5", "--random-seed", "0", *limits
    )
    assert code == 0
    for line in _trees(out):
        assert check_tree(parse_tree(line), load_grammar(PAPER), input_state((3, 32, 32))).params <= 10_000


def test_sample_impossible_exits_2(capsys, tmp_path):
    path = tmp_path / "big_kernel.pcfg"
    path.write_text("start S\nS -> im2col((k, s, p) = (16, 16, 0)) linear(d = 16) col2im\n")
    code, out, err = run(capsys, "sample", str(path), "--input", "3,8,8", "--random-seed", "0")
    assert code == 2
    assert err.startswith("error: found no tree of S")
    assert "Traceback" not in err


# ----------------------------------------------------------------------------- show and ops


def test_show_prints_shapes_per_node(capsys, tmp_path):
    path = tmp_path / "patchify.tree"
    path.write_text("# a patch embedding\n" + PATCHIFY + "\n")
    code, out, err = run(capsys, "show", str(path), "--input", "3,32,32")
    assert code == 0, err
    rows = {
        line.split()[0]: line.split()[1:] for line in out.splitlines() if line and not line.startswith("#")
    }
    assert rows["im2col(k=4,"][2] == "col[64x48]"  # the label has a space: "im2col(k=4, s=4, p=0)"
    assert rows["linear(d=32)"][0] == "col[64x32]"
    assert rows["linear(d=32)"][1] == "1,568"
    assert rows["col2im"][0] == "im[32x8x8]"
    assert rows["S"][0] == "im[32x8x8]"
    assert f"hash {content_hash(parse_tree(PATCHIFY))}" in out


def test_show_sampled_file_round_trip(capsys, tmp_path):
    run(capsys, "sample", "einspace", "--input", "64,128", "--random-seed", "2", "--out", str(tmp_path))
    code, out, _ = run(capsys, "show", str(tmp_path / "tree_0000.tree"), "--input", "64,128")
    assert code == 0
    header = next(line for line in out.splitlines() if not line.startswith("#"))  # after the comments
    assert header.split() == ["node", "output", "params", "FLOPs"]


def test_ops_lists_operations(capsys):
    code, out, _ = run(capsys, "ops")
    assert code == 0
    names = [line.split("(")[0] for line in out.splitlines()]
    assert {"linear", "im2col", "col2im", "clone", "add", "norm"} <= set(names)
    assert "linear(d: int)" in out
    code, out, _ = run(capsys, "ops", "im2*")
    assert [line.split("(")[0] for line in out.splitlines()] == ["im2col"]


# ----------------------------------------------------------------------------- errors: exit 2, no traceback


def _assert_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2
    assert err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err
    assert "Traceback" not in out + err


def test_bad_grammar_file(capsys, tmp_path):
    path = tmp_path / "bad.pcfg"
    path.write_text("start S\nS -> M M\nM -> C |\nC -> identity\n")
    for argv in (("check", str(path)), ("sample", str(path), "--input", "3,32,32")):
        code, out, err = run(capsys, *argv)
        _assert_error(code, out, err, f"{path}:3:9: ", "unexpected end of line")
        assert err.splitlines()[-1].strip() == "^"


def test_grammar_with_undefined_symbol(capsys, tmp_path):
    path = tmp_path / "undefined.pcfg"
    path.write_text("start S\nS -> M Q\nM -> identity\n")
    code, out, err = run(capsys, "check", str(path))
    _assert_error(code, out, err, f"{path}:2:")


def test_bad_tree_syntax(capsys, tmp_path):
    path = tmp_path / "broken.tree"
    path.write_text("# header\n(S (M (C identity))\n   (M (C identity)]\n")
    code, out, err = run(capsys, "show", str(path), "--input", "3,32,32")
    _assert_error(code, out, err, f"{path}:3:19: ", "unexpected ']'")


def test_tree_that_does_not_check(capsys, tmp_path):
    path = tmp_path / "nofold.tree"
    path.write_text("(S (R1 identity) (M (C identity)) (R2 col2im))\n")
    code, out, err = run(capsys, "show", str(path), "--input", "3,32,32")
    _assert_error(code, out, err, "at node S > R2#2: R2 cannot derive these children")
    path.write_text(PATCHIFY.replace("linear(d=32)", "linear(d=3)"))
    code, out, err = run(capsys, "show", str(path), "--input", "3,32,32")
    _assert_error(
        code, out, err, "at node S > M#1 > C#0 > linear#0: linear(d=3) is not in the grammar's grid"
    )


def test_tree_against_the_wrong_grammar(capsys, tmp_path):
    path = tmp_path / "patchify.tree"
    path.write_text(PATCHIFY)
    code, out, err = run(capsys, "show", str(path), "--input", "3,32,32", "--grammar", "einspace_1d")
    _assert_error(code, out, err, "at node S: no rule for S applies to im[3x32x32]")


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (("show", "{tmp}/missing.tree", "--input", "3,32,32"), "missing.tree"),
        (("check", "{tmp}/missing.pcfg"), "no grammar file"),
        (("sample", "{tmp}/missing.pcfg", "--input", "3,32,32"), "no grammar file"),
        (("show", "{patchify}", "--input", "3,32,32", "--grammar", "{tmp}/missing.pcfg"), "no grammar file"),
    ],
)
def test_missing_files(capsys, tmp_path, argv, fragment):
    patchify = tmp_path / "patchify.tree"
    patchify.write_text(PATCHIFY)
    argv = [a.format(tmp=tmp_path, patchify=patchify) for a in argv]
    code, out, err = run(capsys, *argv)
    _assert_error(code, out, err, fragment)


@pytest.mark.parametrize(
    "shape,fragment",
    [
        ("abc", "cannot read input shape 'abc'"),
        ("3,0,32", "must be positive"),
        ("1,2,3,4", "has 4 dimensions"),
        ("7", "has 1 dimensions"),
        ("3,-1,32", "cannot read input shape '3,-1,32': expected positive integers"),
        ("3,x,3", "cannot read input shape '3,x,3'"),
        ("3,,32", "separated by commas, like 3,32,32"),
        ("3x32x32x", "cannot read input shape"),
    ],
)
def test_bad_input_shapes(capsys, tmp_path, shape, fragment):
    path = tmp_path / "patchify.tree"
    path.write_text(PATCHIFY)
    for argv in (("sample", PAPER, "--input", shape), ("show", str(path), "--input", shape)):
        code, out, err = run(capsys, *argv)
        _assert_error(code, out, err, fragment)


def test_mode_that_does_not_fit_the_shape(capsys):
    code, out, err = run(capsys, "sample", PAPER, "--input", "3,32,32", "--mode", "col")
    _assert_error(code, out, err, "col mode needs 2 dimensions")


def test_bad_limits(capsys):
    code, out, err = run(capsys, "sample", PAPER, "--input", "3,32,32", "--min-depth", "50")
    _assert_error(code, out, err, "min_depth 50 exceeds max_depth 40")


def test_usage_errors_are_argparse_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["sample", PAPER])  # --input is required
    assert info.value.code == 2
    assert "--input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


# ----------------------------------------------------------------------------- a real process


def _console_script() -> str:
    script = Path(sys.executable).with_name("einspace")
    if not script.exists():
        pytest.skip("the einspace console script is not installed next to this Python")
    return str(script)


def test_console_script_runs(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [_console_script(), "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    for command in ("check", "sample", "show", "ops"):
        assert command in done.stdout
    done = subprocess.run(
        [_console_script(), "show", "missing.tree", "--input", "3,32,32"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_module_entry_point(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "einspace.cli", "sample", "einspace", "--input", "3,32,32", "-n", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# tree 0  hash ")
