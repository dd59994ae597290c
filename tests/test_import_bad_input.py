"""`einspace import-model` on bad input (issue 25): a model file that does not import, a name that
is not a model, a factory or forward that raises, a script that reads its own command line while
it is imported. Each exits 2 with one message naming what and where (the user's file and line),
never a traceback and never a usage text. One table, one test looping over it."""

from __future__ import annotations

import pytest

from einspace.cli import main
from einspace.network.importer import ModelImportError, ModelLoadError, import_model, load_factory
from einspace.state import input_state

pytestmark = pytest.mark.usefixtures("one_thread")

_NET = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(x).mean(1)
"""

#: (case, the model file, FACTORY, fragments of the message, the line of the file it names or None)
CASES = [
    ("syntax error", "from torch import nn\n\ndef net(:\n    pass\n", "net", ["SyntaxError"], 3),
    (
        "missing dependency",
        "from torch import nn\nimport no_such_package_zz\n",
        "net",
        ["cannot import", "ModuleNotFoundError", "no_such_package_zz"],
        2,
    ),
    (
        "raises at import",
        "from torch import nn\nSIZES = {}\nWIDTH = SIZES['tiny']\n",
        "net",
        ["cannot import", "KeyError: 'tiny'"],
        3,
    ),
    (
        "argparse at import",
        "import argparse\nfrom torch import nn\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--epochs', type=int, required=True)\nargs = parser.parse_args()\n",
        "net",
        ["ended with sys.exit(2)", "--epochs", 'if __name__ == "__main__":'],
        5,
    ),
    (
        "sys.exit at import",
        "import sys\nfrom torch import nn\nsys.exit('train.py only')\n",
        "net",
        ["ended with sys.exit('train.py only')"],
        3,
    ),
    ("missing factory", "from torch import nn\n" + _NET, "net", ["has no callable 'net'", "'Net'"], None),
    (
        "not callable",
        "from torch import nn\nnet = [nn.Linear(2, 2)]\n",
        "net",
        ["net is a list, not a function or class that makes an nn.Module"],
        None,
    ),
    (
        "callable, not a module",
        "from torch import nn\n\n\ndef net():\n    return lambda x: x\n",
        "net",
        ["net() (defined at", "returned a function, not an nn.Module"],
        4,
    ),
    (
        "factory needs arguments",
        "from torch import nn\n\n\ndef net(width):\n    return nn.Linear(width, width)\n",
        "net",
        ["net() failed: TypeError", "missing 1 required positional argument", "without arguments"],
        4,
    ),
    (
        "factory raises",
        "from torch import nn\n\n\ndef net():\n    raise RuntimeError('no CUDA')\n",
        "net",
        ["net() failed: RuntimeError: no CUDA"],
        5,
    ),
    (
        "factory exits",
        "import sys\n\n\ndef net():\n    sys.exit(3)\n",
        "net",
        ["net() (defined at", "called sys.exit(3)"],
        5,
    ),
    (
        "forward raises",
        "import torch\nfrom torch import nn\n"
        + _NET.replace("return self.fc(x)", "raise ValueError('no')\n        return self.fc(x)"),
        "Net",
        ["cannot trace Net", "ValueError: no"],
        10,
    ),
    (
        "forward fails on the input",
        "import torch\nfrom torch import nn\n"
        + _NET.replace("self.fc(x).mean(1)", "self.fc(x) @ torch.ones(3, 3)"),
        "Net",
        ["Net does not run on inputs of shape (2, 8, 16)", "RuntimeError"],
        10,
    ),
    (
        "forward branches on the input",
        "import torch\nfrom torch import nn\n"
        + _NET.replace("return self.fc(x)", "if x.sum() > 0:\n            x = -x\n        return self.fc(x)"),
        "Net",
        ["cannot trace Net with torch.fx", "TraceError"],
        10,
    ),
]


@pytest.mark.parametrize(("case", "text", "factory", "fragments", "line"), CASES, ids=[c[0] for c in CASES])
def test_bad_model_files_exit_2_with_one_located_message(
    tmp_path, capsys, case, text, factory, fragments, line
):
    models = tmp_path / "user_model.py"
    models.write_text(text)
    argv = ["import-model", f"{models}:{factory}", "--input", "8,16", "--out", str(tmp_path / "m.tree")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "usage:" not in out + err
    assert err.startswith("error: ") and err.count("\nerror: ") == 0, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    if line is not None:
        assert f"{models}:{line}" in err, err
    assert not (tmp_path / "m.tree").exists()


def test_a_script_importing_its_arguments_gets_only_its_own_path(tmp_path):
    """The script's parser sees no einspace arguments; with all-optional ones it imports."""
    models = tmp_path / "script.py"
    models.write_text(
        "import argparse, sys\nfrom torch import nn\nARGV = list(sys.argv)\n"
        "args = argparse.ArgumentParser().parse_args()\n\n\ndef net():\n    return nn.Linear(2, 2)\n"
    )
    import sys

    before = list(sys.argv)
    model = load_factory(f"{models}:net")
    assert sys.argv == before
    assert sys.modules[type(model).__module__] is not None
    loaded = next(m for m in sys.modules.values() if getattr(m, "__file__", None) == str(models))
    assert loaded.ARGV == [str(models)]


def test_a_module_instance_is_the_model(tmp_path):
    models = tmp_path / "instance.py"
    models.write_text("from torch import nn\nmodel = nn.Sequential(nn.Linear(16, 16))\n")
    assert isinstance(load_factory(f"{models}:model"), __import__("torch").nn.Sequential)


def test_an_unknown_module_name_is_said_plainly():
    with pytest.raises(ModelLoadError, match="no such module in the current directory"):
        load_factory("einspace_no_such_module_zz:f")


def test_a_failure_inside_a_bare_sequential_names_the_layer():
    """No line of the user's code computes it: the message names the layer instead."""
    from torch import nn

    model = nn.Sequential(nn.Linear(16, 4), nn.Linear(5, 3))
    with pytest.raises(
        ModelImportError, match=r"does not run on inputs of shape \(2, 8, 16\): RuntimeError.*at .*Linear"
    ):
        import_model(model, input_state((8, 16)))
