"""The project as users install it: a wheel in a fresh environment, used from the repository root,
where the source folder einspace/ shadows the installed package (also in Ray workers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from einspace._source_layout import SourceCheckoutFinder
from einspace.search.store import SQLiteStore

ROOT = Path(__file__).resolve().parent.parent

#: What building the wheel reads: pyproject.toml maps the top-level folders into the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "einspace", "search", "evaluators", "grammars")

#: Run in the installed environment: whichever copy of einspace is imported, its subpackages and
#: bundled data must come from the same tree.
IMPORTS = textwrap.dedent(
    """
    import json, pathlib
    import einspace, einspace.search.loop, einspace.evaluators.budgets, einspace.grammars
    tree = pathlib.Path(einspace.__file__).parent.parent
    files = [einspace.search.__file__, einspace.evaluators.__file__, einspace.grammars.__file__]
    print(json.dumps({
        "one_tree": all(tree in pathlib.Path(f).parents for f in files),
        "start": einspace.load_grammar("einspace").start,
    }))
    """
)

#: Two evaluations of a zero-cost proxy on the bundled digits, on a local Ray instance.
EXPERIMENT = """
random_seed: 0
grammar: einspace
input: {shape: [1, 8, 8]}
limits: {max_depth: 12, max_nodes: 60}
evaluator: {name: grad_norm, settings: {dataset: digits, batch_size: 16}}
strategy: {name: random_sampling, settings: {evaluations: 2}}
executor: {kind: ray, max_in_flight: 2, num_cpus: 1, local_cpus: 2}
"""


def _run(command: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh virtual environment holding the project's wheel (built offline
    from a copy of the sources, so the checkout gets no build/ folder). Its dependencies come from
    this environment's site-packages, named in a .pth file: the .pth files inside that folder,
    such as the editable install's finder, are not processed, so einspace is not seen there."""
    tmp = tmp_path_factory.mktemp("install")
    (tmp / "src").mkdir()
    for name in BUILD_INPUTS:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp / "src" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tmp / "src" / name)
    offline = ["--disable-pip-version-check", "--no-input", "--no-deps", "--no-index"]
    build = [sys.executable, "-m", "pip", "wheel", *offline, "--no-build-isolation", "-w", "dist", "src/"]
    built = _run(build, tmp)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("einspace-*.whl")

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "env")], check=True)
    python = tmp / "env" / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp)
    (Path(site.stdout.strip()) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    absent = _run([str(python), "-c", "import einspace"], tmp)
    assert "No module named 'einspace'" in absent.stderr, "the fresh environment must not see einspace yet"

    # pip comes from the dependencies; --ignore-installed: never touch this environment's einspace.
    done = _run([str(python), "-m", "pip", "install", *offline, "--ignore-installed", str(wheel)], tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return python.parent


@pytest.mark.parametrize("where", ["repository root", "elsewhere"])
def test_installed_wheel_imports_its_subpackages(installed: Path, where: str) -> None:
    cwd = ROOT if where == "repository root" else installed.parent
    result = _run([str(installed / "python"), "-c", IMPORTS], cwd)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"one_tree": True, "start": "S"}


@pytest.mark.ray
def test_ray_search_from_the_repository_root_with_the_wheel(installed: Path, tmp_path: Path) -> None:
    """Ray workers put the driver's directory on sys.path, so there they import the source tree."""
    (tmp_path / "experiment.yaml").write_text(EXPERIMENT)
    command = [str(installed / "einspace"), "search", str(tmp_path / "experiment.yaml"), "--quiet"]
    result = _run([*command, "--run-dir", str(tmp_path / "run")], ROOT, timeout=300)
    store = SQLiteStore(tmp_path / "run" / "search.sqlite")
    try:
        history = store.history()
    finally:
        store.close()
    outcomes = [(r.status, r.error) for r in history]
    assert outcomes == [("ok", None), ("ok", None)], result.stdout + result.stderr
    assert result.returncode == 0 and all(r.worker for r in history)


def test_source_checkout_finder_serves_only_the_mapped_subpackages() -> None:
    finder = SourceCheckoutFinder(ROOT)
    spec = finder.find_spec("einspace.search")
    assert spec is not None and spec.origin == str(ROOT / "search" / "__init__.py")
    assert spec.submodule_search_locations == [str(ROOT / "search")]
    for name in ("einspace.tests", "einspace.einspace", "einspace.search.loop", "search", "einspacex.search"):
        assert finder.find_spec(name) is None, name
