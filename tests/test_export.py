"""Export: the written file, imported in a fresh process without einspace, is the compiled network.

Every check runs the exported classes in one child process per batch of files (one interpreter
start for hundreds of networks): it loads the exported state_dicts (weights-only), counts the
parameters and computes eval then train outputs, which the parent compares with
`compile_network`'s on the same inputs.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from tree_samples import cheap, sampled_trees

from einspace import Limits, Variation, check_tree, compile_network, load_grammar, parse_tree
from einspace.checker import CheckedTree
from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.network.export import class_name, export_networks, export_tree, load_weights, save_weights
from einspace.ops import Group, Operation, register_op, unregister_op
from einspace.seeds import architectures as arch
from einspace.seeds import list_seeds, load_seed
from einspace.state import input_state
from einspace.tree import Terminal, walk

ROOT = Path(__file__).resolve().parents[1]
PAPER = load_grammar("einspace")
PLUS = load_grammar("einspace_plus")
ZOO = load_grammar("einspace_zoo")

#: Runs in the child: argv = payload, results, exported files. It must not need einspace.
CHILD = r"""
import importlib.util, sys
import torch

torch.set_num_threads(1)
payload = torch.load(sys.argv[1], weights_only=True)
classes = {}
for i, path in enumerate(sys.argv[3:]):
    spec = importlib.util.spec_from_file_location(f"exported_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes.update(vars(module))
results = {"einspace_loaded": torch.tensor(any(m.split(".")[0] == "einspace" for m in sys.modules))}
for name, item in payload.items():
    model = classes[name]().to(item["input"].dtype)
    model.load_state_dict(item["state"])
    outputs = {"params": torch.tensor(sum(p.numel() for p in model.parameters()))}
    for mode in ("eval", "train"):
        model.train(mode == "train")
        with torch.no_grad():
            outputs[mode] = model(item["input"])
    results[name] = outputs
torch.save(results, sys.argv[2])
"""


pytestmark = pytest.mark.usefixtures("one_thread")


def run_exported(folder: Path, files: list[Path], payload: dict) -> dict:
    """The child's results for `payload` ({class: {"state", "input"}}), classes from `files`."""
    payload_path, results_path = folder / "payload.pt", folder / "results.pt"
    torch.save(payload, payload_path)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(payload_path), str(results_path), *map(str, files)],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = torch.load(results_path, weights_only=True)
    assert not results.pop("einspace_loaded"), "the exported file imported einspace"
    return results


def expected_outputs(network: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the compiled network computes, eval then train (the child's order: running
    statistics change in train mode)."""
    network = network.to(x.dtype)
    out = {}
    for mode in ("eval", "train"):
        network.train(mode == "train")
        with torch.no_grad():
            out[mode] = network(x)
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, relative: float) -> None:
    """Within `relative` of the largest entry: random trees can be ill-conditioned (a batch norm of
    a nearly constant channel in a batch of 2 amplifies rounding), and the exported code sums in
    another order than the fused kernels, while a wrong export is off by O(1)."""
    atol = relative * float(expected.abs().max()) + 1e-12
    torch.testing.assert_close(actual, expected, rtol=0, atol=atol, msg=lambda m: f"{what}: {m}")


def ruff(*paths: Path) -> subprocess.CompletedProcess:
    """The project's lint rules (pyproject.toml) on files outside the project (skipped where ruff,
    a development tool, is not installed: the GPU machines' Python has none)."""
    beside = Path(sys.executable).with_name("ruff")
    program = str(beside) if beside.exists() else shutil.which("ruff")
    if program is None:
        pytest.skip("ruff is not installed")
    command = [program, "check", "--no-cache"]
    command += ["--config", str(ROOT / "pyproject.toml"), *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True)


# ----------------------------------------------------------------------------- the bundled seeds

#: Seed -> (input, batch): small inputs where the tree fits; the MLP-Mixer's token MLP needs 256
#: patches, so 64×64, batch 1 (layer norms only: a batch of one is a batch).
SEED_RUNS = {
    "resnet18": ((3, 16, 16), 2),
    "resnet_small": ((1, 8, 8), 2),
    "wide_resnet16_4": ((3, 16, 16), 2),
    "densenet": ((3, 16, 16), 2),
    "vit": ((3, 16, 16), 2),
    "mlp_mixer": ((3, 64, 64), 1),
}


@dataclass
class Exported:
    """Networks written to files, with what a fresh process needs to run them and what it must give."""

    folder: Path
    files: list[Path]
    payload: dict[str, dict]
    networks: dict[str, torch.nn.Module]
    checked: dict[str, CheckedTree] = field(default_factory=dict)


@pytest.fixture(scope="module")
def seed_export(tmp_path_factory) -> Exported:
    """Every bundled seed in one file (shared by the agreement and the lint test)."""
    assert set(SEED_RUNS) == set(list_seeds())
    tmp_path = tmp_path_factory.mktemp("seeds")
    networks, payload = {}, {}
    for name, (shape, batch) in SEED_RUNS.items():
        x = input_state(shape)
        torch.manual_seed(0)
        network = compile_network(load_seed(name, PAPER, x), x, 10)
        cls = class_name(name)
        networks[cls] = network
        # float64: in train mode the last stages normalise a batch of 2 at 1x1, which amplifies
        # float32 rounding differences between equal computations (kernels summing in another order)
        inputs = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        payload[cls] = {"input": inputs}
    exported = export_networks(networks)
    path = tmp_path / "seeds.py"
    path.write_text(exported.source)
    for cls in networks:
        payload[cls]["state"] = exported.state_dicts[cls]
    return Exported(tmp_path, [path], payload, networks)


def test_every_bundled_seed_exports_and_agrees_in_a_fresh_process(seed_export: Exported):
    results = run_exported(seed_export.folder, seed_export.files, seed_export.payload)
    for cls, network in seed_export.networks.items():
        assert int(results[cls]["params"]) == sum(p.numel() for p in network.parameters())
        wanted = expected_outputs(network, seed_export.payload[cls]["input"])
        for mode in ("eval", "train"):
            assert_close(results[cls][mode], wanted[mode], f"{cls} {mode}", 1e-5)


def test_the_resnet18_export_reads_like_a_resnet():
    """Two block classes (with and without a projection shortcut), each used as a ResNet uses its
    basic block; the whole file within a budget of lines (93 now; the hand-written ResNet of
    einspace.testing.reference_models, with its block class and helpers, is about 45)."""
    x = input_state((3, 64, 64))
    source = export_tree(load_seed("resnet18", PAPER, x), x, 10, PAPER, name="ResNet18").source
    lines = source.splitlines()
    assert len(lines) <= 100, len(lines)
    assert [line for line in lines if line.startswith("class ")] == [
        "class Residual(nn.Module):",
        "class Residual2(nn.Module):",
        "class ResNet18(nn.Module):",
    ]
    assert "    def __init__(self, channels: int) -> None:" in lines
    assert "    def __init__(self, in_channels: int, out_channels: int) -> None:" in lines
    assert "        self.conv3 = nn.Conv2d(in_channels, out_channels, 1, 2, 0)" in lines
    assert "        return x + x1" in lines  # the identity shortcut, first
    assert "        self.residual3 = Residual2(64, 128)" in lines
    assert source.count("nn.Conv2d(") == 2 + 2 + 3  # the stem, Residual, Residual2 (with its shortcut)
    assert "    def __init__(self, classes: int = 10) -> None:" in lines
    assert lines[-1] == "        return self.head(x.mean((2, 3)))"


def test_exported_mixer_keeps_its_activations_dense():
    """The token MLP ends transposed; the residual sum writes x first, so that on channels-last
    images (dense tokens after the patch embedding, as on a GPU) the sum and the layer norm
    after it stay dense, as in the compiled network. x + y and y + x are the same floats."""
    x = input_state((3, 32, 32))
    exported = export_tree(arch.mlp_mixer(layers=1, width=32, tokens=64), x, 3, PAPER, name="Mixer")
    namespace: dict = {}
    exec(compile(exported.source, "mixer.py", "exec"), namespace)
    module = namespace["Mixer"](3).to(memory_format=torch.channels_last)
    seen = []
    module.residual1.register_forward_hook(lambda m, xs, out: seen.append((xs[0], out)))
    module(torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last))
    ((tokens, out),) = seen
    assert "        return x + x1" in exported.source.splitlines()
    assert tokens.is_contiguous() and out.is_contiguous()


def test_the_vit_export_calls_scaled_dot_product_attention():
    x = input_state((3, 16, 16))
    source = export_tree(load_seed("vit", PAPER, x), x, 10, PAPER, name="ViT").source
    assert "class MultiHeadAttention(nn.Module):" in source
    assert "q, k, v = self.qkv(x).split([256, 256, 256], dim=-1)" in source
    assert "x = F.scaled_dot_product_attention(q, k, v)" in source
    assert "x = self.conv1(x).flatten(2).transpose(1, 2)" in source  # the patch embedding


FIGURE_3 = (
    "(S (B clone(b=2)) (Branches [(M (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"
    " (M (M (C norm)) (M (C leaky_relu)))) (M (C linear(d=16)))]) (A add))"
)

FIGURE_3_SOURCE = '''class Residual(nn.Module):
    """Two branches of x, added."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1)
        self.norm1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(3, 16, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.conv1(x)
        x1 = self.norm1(x1)
        x1 = F.leaky_relu(x1, 0.01)
        x2 = self.conv2(x)
        return x1 + x2


class Block(nn.Module):
    """Block: input [B, 3, 12, 10] (im mode), 4 classes; tree '''


def test_figure_3_block_is_written_as_by_hand():
    """The paper's Figure 3 block: a conv-norm-act branch and a 1×1 projection, added."""
    x = input_state((3, 12, 10))
    source = export_tree(parse_tree(FIGURE_3), x, 4, PAPER, name="Block").source
    assert FIGURE_3_SOURCE in source
    assert source.rstrip().endswith(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        x = self.residual1(x)\n"
        "        return self.head(x.mean((2, 3)))"
    )


# ----------------------------------------------------------------------------- sampled and mutated trees

RANDOM_INPUTS = [(3, 16, 16), (2, 12, 20), (16, 32), (3, 9, 14), (32, 8, 8)]
SMALL = Limits(max_depth=12, max_nodes=70, max_params=200_000)
MUTANTS = Limits(max_depth=30, max_nodes=600, max_params=200_000)


def _cheap(checked: CheckedTree) -> bool:
    """Runs in milliseconds in float64."""
    return cheap(checked, max_flops=5e6, max_instances=300)


def _sampled(grammar, count: int, salt: int) -> list[CheckedTree]:
    return sampled_trees(
        grammar, RANDOM_INPUTS, SMALL, count, max_flops=5e6, max_instances=300, first_seed=salt + 1
    )


def _mutants(per_seed: int) -> list[CheckedTree]:
    """Mutants of small versions of the seeds, for 3×16×16: patterns kept, broken and rewritten."""
    x = input_state((3, 16, 16))
    seeds = {
        "resnet": arch.resnet((1, 1), (16, 32)),
        "vit": arch.vit(layers=1, width=32, heads=4, head_dim=16, hidden=32, patch=4),
        "mixer": arch.mlp_mixer(layers=1, width=32, patch=4, tokens=16),
        "densenet": arch.densenet((2, 2), growth=16, stem=32, bottleneck=2),
    }
    out = []
    for name, tree in seeds.items():
        variation = Variation(PAPER, x, MUTANTS, rng=random.Random(name))
        kept = [check_tree(tree, PAPER, x)]
        while len(kept) <= per_seed:
            checked = check_tree(variation.mutate(tree), PAPER, x)
            if _cheap(checked):
                kept.append(checked)
        out += kept
    return out


def _calibrated() -> list[CheckedTree]:
    """Every NOS calibration of einspace_plus, unary after each block of a small ResNet and as
    the aggregation of two convolution branches."""
    x = input_state((3, 16, 16))
    trees = [
        arch.resnet((1, 1), (16, 32), after_block=lambda name=name, args=args: arch.computation(name, **args))
        for name, args in (("channel_attention", {}), ("spatial_attention", {}), ("dynamic_conv", {"k": 3}))
    ]
    for name, args in (("channel_calibrate", {}), ("spatial_calibrate", {}), ("dynamic_calibrate", {"k": 5})):
        pair = arch.branching(arch.op("clone", b=2), [arch.conv(16), arch.conv(32)], arch.op(name, **args))
        trees.append(arch.network(arch.seq(arch.conv(16), pair)))
    return [check_tree(tree, PLUS, x) for tree in trees]


def _zoo_blocks() -> list[CheckedTree]:
    """Grouped convolutions and squeeze-and-excitation (both activations) of einspace_zoo after
    each block of a small ResNet; and two 1×1 convolutions of unequal widths concatenated (the
    export writes both layers and a `torch.cat`, which imports back to the tree)."""
    x = input_state((3, 16, 16))
    trees = [
        arch.resnet((1, 1), (16, 32), after_block=lambda name=name, args=args: arch.computation(name, **args))
        for name, args in (
            ("grouped_conv", {"g": 4, "k": 3, "s": 1, "p": 1}),
            ("squeeze_excite", {"r": 4, "act": "silu"}),
            ("squeeze_excite", {"r": 16, "act": "relu"}),
        )
    ]
    trees.append(arch.network(arch.seq(arch.conv(16), arch.computation("grouped_conv", g=2, k=3, s=2, p=1))))
    concat = arch.op("concat", dim=1, b=2)
    unequal = arch.branching(arch.op("clone", b=2), [arch.linear(16), arch.linear(32)], concat)
    trees.append(arch.network(arch.seq(unequal, arch.norm())))
    return [check_tree(tree, ZOO, x) for tree in trees]


def _exportable(checked: CheckedTree) -> bool:
    return not any(isinstance(n, Terminal) and n.op.startswith("dnarch") for _, n in walk(checked.tree))


@pytest.fixture(scope="module")
def sampled_export(tmp_path_factory) -> Exported:
    """Paper grammar samples, mutated seeds, einspace_plus samples (NOS calibrations and XD;
    DNArch refused), every calibration and einspace_zoo's blocks: over 250 networks, 100 to a file."""
    tmp_path = tmp_path_factory.mktemp("sampled")
    trees = _sampled(PAPER, 110, 0) + _mutants(20)
    plus = _sampled(PLUS, 80, 10_000)
    refused = [t for t in plus if not _exportable(t)]
    assert refused
    for checked in refused[:5]:
        with pytest.raises(EinspaceError, match=r"export of dnarch_\w+ is not supported"):
            export_tree(checked, classes=3)
    trees += [t for t in plus if _exportable(t)] + _calibrated() + _zoo_blocks()
    assert len(trees) >= 250
    networks, payload, expected, files, checked_trees = {}, {}, {}, [], {}
    generator = torch.Generator().manual_seed(0)
    for i, checked in enumerate(trees):
        name = f"Tree{i}"
        networks[name] = compile_network(checked, classes=3)
        shape = checked.input[0].shape
        payload[name] = {"input": torch.randn(2, *shape, generator=generator, dtype=torch.float64)}
        expected[name], checked_trees[name] = networks[name], checked
        if len(networks) == 100 or i == len(trees) - 1:
            exported = export_networks(networks)
            path = tmp_path / f"trees{len(files)}.py"
            path.write_text(exported.source)
            files.append(path)
            for key, state in exported.state_dicts.items():
                payload[key]["state"] = state
            networks = {}
    return Exported(tmp_path, files, payload, expected, checked_trees)


def test_hundreds_of_sampled_and_mutated_trees_agree_in_a_fresh_process(sampled_export: Exported):
    """The sampled export, run in one child process, against the compiled networks."""
    files, payload = sampled_export.files, sampled_export.payload
    results = run_exported(sampled_export.folder, files, payload)
    sources = "".join(path.read_text() for path in files)
    for construct in (
        "nn.Conv2d(",
        "F.scaled_dot_product_attention(",
        ".chunk(",
        "torch.cat(",
        " @ ",
        "F.unfold(",
        "groups=4)",
        "torch.sigmoid(",
    ):
        assert construct in sources, construct
    for helper in ("class ChannelAttention", "class SpatialAttention", "class DynamicKernel"):
        assert helper in sources, helper
    for name, network in sampled_export.networks.items():
        analytic = sampled_export.checked[name].params + network.head.linear.weight.numel() + 3
        assert int(results[name]["params"]) == analytic
        wanted = expected_outputs(network, payload[name]["input"])
        for mode in ("eval", "train"):
            assert_close(results[name][mode], wanted[mode], f"{name} {mode}", 1e-6)


@pytest.mark.parametrize("export", ["seed_export", "sampled_export"])
def test_exported_files_pass_the_lint_rules(request, export: str):
    """Apart from the agreement tests, so that a machine without ruff still compares the numbers."""
    files = request.getfixturevalue(export).files
    linted = ruff(*files)
    assert linted.returncode == 0, linted.stdout


# ----------------------------------------------------------------------------- refusals and the command


class _Plugin(Operation):
    """A user's operation: einspace cannot know its plain-PyTorch form."""

    name, group = "test_export_plugin", Group.COMPUTATION

    def infer(self, signal, args):
        return signal

    def build(self, signal, args):
        return torch.nn.Identity()


@pytest.fixture
def plugin():
    """The plugin operation, registered for one test only."""
    register_op(_Plugin)
    yield
    unregister_op(_Plugin.name)


REFUSED = [
    (
        "(S (M (C dnarch_width(d=16))) (M (C identity)))",
        (16, 8, 8),
        "export of dnarch_width is not supported: DNArch",
    ),
    (
        "(S (M (C test_export_plugin)) (M (C identity)))",
        (16, 8, 8),
        r"export of test_export_plugin is not supported: its class _Plugin \(defined at "
        r".*test_export.py:\d+\) does not declare `exportable = True`",
    ),
]


@pytest.mark.parametrize("tree,shape,message", REFUSED, ids=["dnarch", "plugin"])
def test_terminals_without_a_plain_form_are_refused_by_name(plugin, tree, shape, message):
    with pytest.raises(EinspaceError, match=message) as caught:
        export_tree(parse_tree(tree), input_state(shape), 3)
    assert "(node S > M#0 > C#0 > " in str(caught.value)


#: Trees with XD-operations: im mode (2-d, strided, in a residual block beside a convolution) and
#: col mode (1-d over the tokens), with their inputs.
XD_TREES = [
    (arch.network(arch.seq(arch.computation("xd", d=16, k=3, s=2, p=1), arch.act())), (16, 8, 9)),
    (
        arch.network(arch.residual(arch.seq(arch.conv(16), arch.computation("xd", d=16, k=3, s=1, p=1)))),
        (16, 6, 7),
    ),
    (arch.network(arch.seq(arch.computation("xd", d=16, k=4, s=4, p=0), arch.identity())), (12, 5)),
    (arch.network(arch.seq(arch.computation("xd", d=16, k=3, s=1, p=1), arch.identity())), (20, 5)),
]


def test_xd_operations_export_to_plain_torch_with_equal_outputs(tmp_path):
    """Every parameter random (far from the warm start, where XD is a convolution): the exported
    class, in a process without einspace, computes what the compiled network does, in float64."""
    networks, payload, expected = {}, {}, {}
    generator = torch.Generator().manual_seed(0)
    for i, (tree, shape) in enumerate(XD_TREES):
        checked = check_tree(tree, PLUS, input_state(shape))
        network = compile_network(checked, classes=3).double()
        with torch.no_grad():
            for param in network.parameters():
                param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype))
        name = f"XDTree{i}"
        networks[name] = network
        payload[name] = {"input": torch.randn(2, *shape, generator=generator, dtype=torch.float64)}
        expected[name] = expected_outputs(network, payload[name]["input"])
    exported = export_networks(networks)
    assert "class XD(nn.Module)" in exported.source and "channels_last=True" in exported.source
    for name, state in exported.state_dicts.items():
        payload[name]["state"] = state
    path = tmp_path / "xd.py"
    path.write_text(exported.source)
    results = run_exported(tmp_path, [path], payload)
    for name, network in networks.items():
        assert int(results[name]["params"]) == sum(p.numel() for p in network.parameters())
        for mode in ("eval", "train"):
            assert_close(results[name][mode], expected[name][mode], f"{name} {mode}", 1e-9)
    linted = ruff(path)
    assert linted.returncode == 0, linted.stdout


class _ExportablePlugin(Operation):
    """A user's operation whose module export knows (torch's own): it says so, and is exported."""

    name, group, exportable = "test_exportable_plugin", Group.COMPUTATION, True

    def infer(self, signal, args):
        return signal

    def build(self, signal, args):
        return torch.nn.LeakyReLU(0.25)


def test_a_plugin_that_declares_itself_exportable_is_exported(tmp_path):
    register_op(_ExportablePlugin)
    try:
        checked = check_tree(
            parse_tree("(S (M (C test_exportable_plugin)) (M (C linear(d=4))))"), None, input_state((6, 5))
        )
        network = compile_network(checked, classes=3)
        exported = export_tree(checked, name="Plugged", network=network)  # checks exportability
    finally:
        unregister_op(_ExportablePlugin.name)
    assert "F.leaky_relu(x, 0.25)" in exported.source
    path = tmp_path / "plugged.py"
    path.write_text(exported.source)
    x = torch.randn(2, 6, 5, dtype=torch.float64)
    payload = {"Plugged": {"input": x, "state": exported.state_dicts["Plugged"]}}
    results = run_exported(tmp_path, [path], payload)
    wanted = expected_outputs(network, x)
    assert_close(results["Plugged"]["eval"], wanted["eval"], "plugin", 1e-9)


def test_routing_modules_are_written_from_their_data(tmp_path, renamed_pattern_axes):
    """col2im from its fold and permute from its order (not by reading einops patterns back):
    with every pattern's axes renamed, the file is the same and computes the same."""
    tree = (
        "(S (M (R1 permute(order=(2, 3, 1))) (M (C norm)) (R2 permute(order=(3, 1, 2))))"
        " (M (R1 im2col(k=3, s=1, p=1)) (M (C norm)) (R2 col2im)))"
    )
    checked = check_tree(parse_tree(tree), None, input_state((3, 6, 8)))
    network = compile_network(checked, classes=3)
    exported = export_networks({"Routed": network})
    for line in (".permute(0, 2, 3, 1)", ".permute(0, 3, 1, 2)", ".transpose(1, 2).unflatten(2, (6, 8))"):
        assert line in exported.source, line
    path = tmp_path / "routed.py"
    path.write_text(exported.source)
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    payload = {"Routed": {"input": x, "state": exported.state_dicts["Routed"]}}
    results = run_exported(tmp_path, [path], payload)
    wanted = expected_outputs(network, x)
    for mode in ("eval", "train"):
        assert_close(results["Routed"][mode], wanted[mode], f"routed {mode}", 1e-9)


def test_weights_round_trip_through_a_weights_only_file(tmp_path):
    x = input_state((1, 8, 8))
    network = compile_network(load_seed("resnet_small", PAPER, x), x, 10)
    exported = export_tree(load_seed("resnet_small", PAPER, x), x, network=network, name="Small")
    save_weights(exported.state_dicts["Small"], tmp_path / "w.pt")
    state = torch.load(tmp_path / "w.pt", weights_only=True)
    assert state.keys() == exported.state_dicts["Small"].keys()
    namespace: dict = {}
    exec(compile(exported.source, "small.py", "exec"), namespace)
    model = namespace["Small"]()
    model.load_state_dict(state)
    network.eval(), model.eval()
    inputs = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), network(inputs))


def test_export_command_writes_the_file_and_weights(tmp_path, capsys):
    out, weights = tmp_path / "small.py", tmp_path / "small.pt"
    argv = [
        "export",
        "resnet_small",
        "--input",
        "1,8,8",
        "--classes",
        "7",
        "--out",
        str(out),
        "--weights",
        str(weights),
    ]
    assert main(argv) == 0
    assert "class ResnetSmall" in capsys.readouterr().out
    x = input_state((1, 8, 8))
    torch.manual_seed(0)  # the command's default --random-seed
    network = compile_network(load_seed("resnet_small", PAPER, x), x, 7).eval()
    namespace: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)
    model = namespace["ResnetSmall"]()
    model.load_state_dict(torch.load(weights, weights_only=True))
    inputs = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(inputs), network(inputs))
    # --load exports given weights: those of another initialisation
    torch.manual_seed(5)
    other = compile_network(load_seed("resnet_small", PAPER, x), x, 7)
    save_weights(other.state_dict(), tmp_path / "other.pt")
    argv += ["--load", str(tmp_path / "other.pt"), "--name", "Other"]
    assert main(argv) == 0
    namespace = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)
    model = namespace["Other"]()
    load_weights(model, weights)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(inputs), other.eval()(inputs))


def test_export_command_errors_exit_2_without_a_traceback(tmp_path, capsys):
    tree = tmp_path / "dnarch.tree"
    tree.write_text("(S (M (C dnarch_width(d=16))) (M (C identity)))\n")
    base = ["--input", "16,8,8", "--classes", "3", "--out", str(tmp_path / "m.py")]
    assert main(["export", str(tree), *base, "--grammar", "einspace_plus"]) == 2
    err = capsys.readouterr().err
    assert "export of dnarch_width is not supported" in err and "Traceback" not in err
    (tmp_path / "bad.pt").write_bytes(b"not a weights file")
    assert (
        main(["export", "resnet_small", *base[:1], "1,8,8", *base[2:], "--load", str(tmp_path / "bad.pt")])
        == 2
    )
    assert "cannot read weights" in capsys.readouterr().err
    assert (
        main(["export", "resnet_small", "--input", "1,8,8", "--classes", "3", "--out", "/no/such/dir/m.py"])
        == 2
    )
    assert "cannot write /no/such/dir/m.py" in capsys.readouterr().err
    torch.save({"nothing": torch.zeros(1)}, tmp_path / "wrong.pt")
    assert (
        main(["export", "resnet_small", *base[:1], "1,8,8", *base[2:], "--load", str(tmp_path / "wrong.pt")])
        == 2
    )
    assert "do not fit the network" in capsys.readouterr().err


@pytest.mark.parametrize(
    "stem,name",
    [
        ("resnet18", "Resnet18"),
        ("wide_resnet16_4", "WideResnet16_4"),
        ("tree_0001", "Tree_0001"),
        ("7x", "Network7x"),
    ],
)
def test_class_names_from_file_names(stem, name):
    assert class_name(stem) == name
