"""The package layout as rules: no import circles, the torch wall, moved modules, sizes.

The import graph is read statically: each module's module-level imports (those inside functions
and under `if TYPE_CHECKING:` run later or never, so they cannot close a circle at import time).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import networkx as nx
import pytest

from einspace._moved import MOVED
from einspace.ops.registry import BUILTIN_OPERATIONS, OPERATIONS, get_op

ROOT = Path(__file__).resolve().parent.parent

#: Folder -> the import path of the package it holds (pyproject.toml, `package-dir`).
PACKAGES = {"einspace": "einspace", "search": "einspace.search", "evaluators": "einspace.evaluators"}

#: Where torch may be imported: the network side, the torch side of the operations, the yardsticks,
#: and the evaluators that train. Everything else must not reach torch through its imports.
TORCH_SIDE = (
    "einspace.network",
    "einspace.testing",
    "einspace.ops._modules",
    "einspace.ops._dnarch_modules",
    "einspace.ops._nos_modules",
    "einspace.ops.trainable",
    "einspace.ops.verify",
    "einspace.ops._xd_butterflies",
    "einspace.ops._xd_modules",
    "einspace.ops._zoo_modules",
    "einspace.evaluators",
)


def _modules() -> dict[str, Path]:
    """Import path -> file of every module of the project's packages."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """Modules a module imports as it is executed: statements at module level, in `if`, `try`
    and `with` blocks, but not in functions, classes or `if TYPE_CHECKING:`."""
    names: list[str] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            # `from package import module` imports the module, and the package only as its parent
            # (whose import is under way whenever one of its modules is imported)
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            names += submodules if len(submodules) == len(node.names) else [base, *submodules]
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.With):
            todo += node.body
    return names


def import_graph() -> nx.DiGraph:
    """Module -> module it imports at module level; project modules, plus `torch` as one node."""
    modules = MODULES
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for name in _module_level_imports(tree, module, path.name == "__init__.py"):
            if name == module:
                continue  # `from einspace import x` in einspace/__init__.py
            if name in modules:
                graph.add_edge(module, name)
            elif name.split(".")[0] == "torch" or name.startswith("einops.layers.torch"):
                graph.add_edge(module, "torch")
            elif name in MOVED:
                graph.add_edge(module, name)
    return graph


GRAPH = import_graph()


def test_the_root_of_einspace_holds_at_most_twelve_modules() -> None:
    assert len(list((ROOT / "einspace").glob("*.py"))) <= 12


def test_every_package_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages a wheel holds: every folder of the engine is one of them."""
    listing = re.search(r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    assert listing is not None
    listed = set(re.findall(r'"([\w.]+)"', listing.group(1)))
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert packages <= listed, sorted(packages - listed)


def test_the_readme_layout_names_every_folder_and_root_module() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    layout = layout[: layout.find("\n## ", 1)] if "\n## " in layout[1:] else layout
    folders = {path.parent.name for path in (ROOT / "einspace").glob("*/__init__.py")}
    modules = {path.name for path in (ROOT / "einspace").glob("*.py") if path.name != "__init__.py"}
    missing = sorted(f"{f}/" for f in folders if f"{f}/" not in layout) + sorted(
        m for m in modules if m not in layout
    )
    assert not missing, missing


#: Sizes above which a module or a class must say in its docstring why it is "long because ...".
MAX_MODULE_LINES, MAX_CLASS_LINES = 600, 250
_REASON = re.compile(r"\blong because\b", re.IGNORECASE)


def _sources() -> list[tuple[str, ast.Module, int]]:
    """(path from the root, parsed module, lines) of every measured module of the packages."""
    paths = sorted({path.relative_to(ROOT).as_posix() for path in MODULES.values()})
    return [
        (p, ast.parse((ROOT / p).read_text(), p), len((ROOT / p).read_text().splitlines())) for p in paths
    ]


def test_no_module_is_long_without_a_reason() -> None:
    long = [
        f"{path}: {lines} lines"
        for path, tree, lines in _sources()
        if lines > MAX_MODULE_LINES and not _REASON.search(ast.get_docstring(tree) or "")
    ]
    assert not long, long


def test_no_class_is_long_without_a_reason() -> None:
    long = [
        f"{path}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path, tree, _ in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
        and not _REASON.search(ast.get_docstring(node) or "")
    ]
    assert not long, long


def test_no_import_circles() -> None:
    cycles = list(nx.simple_cycles(GRAPH))
    assert not cycles, "import circles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:5])


def test_only_the_torch_side_reaches_torch() -> None:
    """The torch wall as a folder rule: a module outside TORCH_SIDE imports nothing that imports torch."""
    reach = nx.ancestors(GRAPH, "torch")
    beyond = sorted(m for m in reach if not m.startswith(TORCH_SIDE))
    paths = [" -> ".join(nx.shortest_path(GRAPH, m, "torch")) for m in beyond]
    assert not beyond, "outside the torch side, these import torch:\n" + "\n".join(paths)


def test_nothing_in_the_project_imports_a_moved_path() -> None:
    users = sorted((user, old) for user, old in GRAPH.edges if old in MOVED)
    assert not users, users


def test_no_test_benchmark_or_notebook_imports_a_moved_path() -> None:
    """The same for the code outside the packages (this file imports old paths on purpose)."""
    old = "|".join(re.escape(path) for path in MOVED)
    leaves = "|".join(path.removeprefix("einspace.") for path in MOVED)
    statement = re.compile(
        rf"(?:from|import)\s+({old})\b(?![.\w])|from\s+einspace\s+import\s+[\w, (]*\b({leaves})\b"
    )
    files = [
        p for folder in ("tests", "benchmarks", "notebooks", "scripts") for p in (ROOT / folder).rglob("*")
    ]
    users = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in files
        if path.suffix in (".py", ".ipynb", ".sh") and path.name != Path(__file__).name
        for match in statement.finditer(path.read_text())
    ]
    assert not users, users


def test_the_builtin_operation_table_names_what_each_module_registers() -> None:
    registered: dict[str, set[str]] = {}
    for name in OPERATIONS.names():
        registered.setdefault(type(get_op(name)).__module__, set()).add(name)
    assert {module: set(names) for module, names in BUILTIN_OPERATIONS.items()} == registered


def test_the_life_of_an_operation_names_where_each_stage_lives() -> None:
    """The plugin authors' guide in the operations package's docstring: every stage, and every
    module and name it points to exists (so a move that forgets the guide fails here)."""
    import importlib
    import importlib.util

    import einspace.ops

    doc = einspace.ops.__doc__ or ""
    assert "life of an operation" in doc
    for stage in ("Shape rule", "Module", "Compilation", "Lowering", "Export", "Import"):
        assert re.search(rf"^\d\. {stage}\.", doc, re.MULTILINE), stage
    modules = set(re.findall(r"`(einspace(?:\.\w+)+)", doc))
    assert {"einspace.network.compiler", "einspace.network.lowering", "einspace.network.importer"} <= modules
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    for name in re.findall(r"`(_\w+_modules|_modules)`", doc):
        assert importlib.util.find_spec(f"einspace.ops.{name}") is not None, name
    registry = importlib.import_module("einspace.ops.registry")
    for name in ("Operation", "register_op", "torch_side", "BUILTIN_OPERATIONS"):
        assert hasattr(registry, name), name
    operation = registry.Operation
    for attribute in ("infer", "build", "param_count", "flops", "exportable", "export_refusal"):
        assert hasattr(operation, attribute), attribute


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def test_old_module_paths_warn_and_are_the_new_modules() -> None:
    """Each moved module, imported by its old path in a fresh process: a DeprecationWarning that
    names the new path, at the importing line, and the very module of the new path."""
    out = _run(
        """
        import importlib, sys, warnings
        from einspace._moved import MOVED
        for old, new in MOVED.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            [warning] = caught
            assert warning.category is DeprecationWarning, warning
            assert f"{old} moved to {new}" in str(warning.message), warning.message
            assert module is sys.modules[new] is sys.modules[old], old
        from einspace.compiler import compile_network
        from einspace.network.compiler import compile_network as new
        assert compile_network is new
        print("ok")
        """
    )
    assert out == "ok"


@pytest.mark.parametrize(
    ("grammar", "sampling"), [("einspace", "paper"), ("einspace", "exact"), ("einspace_plus", "paper")]
)
def test_checking_sampling_and_every_strategy_run_without_torch(grammar: str, sampling: str) -> None:
    """In a fresh process: sample in each mode, check, vary, and run every registered strategy
    (and successive halving around one) through ask and tell, over the paper's operations and
    the extra terminals; torch is never imported."""
    out = _run(
        f"""
        import sys
        import einspace as es
        from einspace.sampling.rejection import RejectionSampler
        from einspace.sampling.variation import Variation
        from einspace.search.strategy import SearchSpace, get_strategy, list_strategies
        from einspace.search.successive_halving import SuccessiveHalving

        grammar, x = es.load_grammar({grammar!r}), es.input_state((3, 16, 16))
        limits = es.Limits(max_depth=12, max_nodes=80)
        tree = es.make_sampler(grammar, x, limits, {sampling!r}, random_seed=0).sample()
        es.check_tree(tree, grammar, x)
        RejectionSampler(grammar, x, limits, random_seed=0).sample()
        Variation(grammar, x, limits).mutate(tree)
        space = SearchSpace(grammar, x, limits, sampling={sampling!r})
        settings = {{"evaluations": 6}}
        strategies = [get_strategy(name, space, 0, settings) for name in list_strategies()]
        strategies.append(SuccessiveHalving(get_strategy("random_search", space, 0, settings), [1, 3]))
        for strategy in strategies:
            while (candidate := strategy.ask()) is not None:
                strategy.tell(candidate.id, -len(str(candidate.tree)))
        print(sorted({{"torch", "einops"}} & set(sys.modules)))
        """
    )
    assert out == "[]"
