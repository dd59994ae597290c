"""Grouping the written instances into classes (uses of one structure share a class whose constructor
takes the sizes that differ), rendering each class as source, and the exported state_dict."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from einspace.network.export.parts import Instance

__all__ = ["Class", "classes_of", "render_class", "state_of"]


@dataclass(eq=False)
class Class:
    """A generated class: the instances that use it, its constructor parameters (a name per
    slot position that differs between instances, None where all write the same value)."""

    name: str
    instances: list[Instance]
    params: list[str] = field(default_factory=list)
    slot_params: list[int | None] = field(default_factory=list)
    defaults: dict[str, int] = field(default_factory=dict)


def _tree_order(roots: list[Instance]) -> list[Instance]:
    """Every instance, children before their parents, in the order they are written."""
    order: list[Instance] = []

    def visit(instance: Instance) -> None:
        for layer in instance.layers:
            if layer.child is not None:
                visit(layer.child)
        order.append(instance)

    for root in roots:
        visit(root)
    return order


def classes_of(roots: list[Instance], taken: set[str]) -> list[Class]:
    """Instances grouped into classes: the same layers and forward code, sizes aside, share one.

    Children are classed before their parents (by height), so a parent's key can name the
    classes of its children and the sizes it passes them.
    """
    order = _tree_order(roots)
    height: dict[int, int] = {}
    for instance in order:
        kids = [height[id(layer.child)] for layer in instance.layers if layer.child is not None]
        height[id(instance)] = 1 + max(kids, default=-1)
    classes: list[Class] = []
    taken = set(taken)
    for level in sorted(set(height.values())):
        keyed: dict[tuple, Class] = {}
        made: list[Class] = []
        for instance in (i for i in order if height[id(i)] == level):
            for layer in instance.layers:
                if layer.child is not None:
                    cls = layer.child.cls
                    assert cls is not None
                    layer.template = f"{cls.name}({', '.join('{}' for _ in cls.params)})"
                    layer.slots = tuple(zip(cls.params, layer.child.arguments, strict=True))
            if any(instance is root for root in roots):
                cls = Class(instance.kind, [instance])
                made.append(cls)
            else:
                layers = tuple(
                    (lay.attr, lay.template, tuple(r for r, _ in lay.slots)) for lay in instance.layers
                )
                key = (instance.kind, instance.doc, layers, tuple(instance.lines))
                cls = keyed.get(key)
                if cls is None:
                    cls = keyed[key] = Class(_fresh(instance.kind, taken), [])
                    made.append(cls)
                cls.instances.append(instance)
            instance.cls = cls
        for cls in made:
            _parametrise(cls, is_root=cls.instances[0] in roots)
        classes.extend(made)
    return classes


def _fresh(stem: str, taken: set[str]) -> str:
    """`stem`, or `stem2`, `stem3`, ... whichever is free first; marked as taken."""
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}{n}"
    taken.add(name)
    return name


def _parametrise(cls: Class, is_root: bool) -> None:
    """Constructor parameters: one per group of slot positions of one kind (channels, features,
    stride, ...) whose values vary alike over the instances (positions that never vary stay
    literal); a network's class count is a parameter."""
    slots = [[value for layer in inst.layers for _, value in layer.slots] for inst in cls.instances]
    roles = [role for layer in cls.instances[0].layers for role, _ in layer.slots]
    groups: dict[tuple[str, tuple[int, ...]], int] = {}
    members: list[list[int]] = []
    for position, role in enumerate(roles):
        values = tuple(row[position] for row in slots)
        varies = len(set(values)) > 1 or (is_root and role == "classes")
        if not varies:
            cls.slot_params.append(None)
            continue
        key = (_base(role), values)
        if key not in groups:
            groups[key] = len(members)
            members.append([])
        members[groups[key]].append(position)
        cls.slot_params.append(groups[key])
    cls.params = _param_names([[roles[p] for p in group] for group in members])
    if is_root and "classes" in cls.params:
        cls.defaults["classes"] = slots[0][roles.index("classes")]
    for inst, row in zip(cls.instances, slots, strict=True):
        inst.arguments = tuple(row[group[0]] for group in members)


def _base(role: str) -> str:
    """The kind of a slot: `in_channels`, `out_channels` and `channels` are all channels."""
    return role.removeprefix("in_").removeprefix("out_")


def _param_names(groups: list[list[str]]) -> list[str]:
    """A name per group of roles (of one kind): the kind itself for an in_/out_ pair where no
    other group is of that kind (`channels` for a block that keeps its width), else the first role."""
    names = []
    for i, roles in enumerate(groups):
        paired = any(r.startswith("in_") for r in roles) and any(r.startswith("out_") for r in roles)
        others = {_base(r) for j, g in enumerate(groups) if j != i for r in g}
        name = _base(roles[0]) if paired and _base(roles[0]) not in others else roles[0]
        names.append(name)
    taken: set[str] = set()
    return [_fresh(name, taken) for name in names]


_WIDTH = 100  # the longest line written: the file must pass linters set to 100 or more


def _call(indent: str, head: str, items: list[str], tail: str = "") -> list[str]:
    """`head(items)tail` on one line if it fits, else the items on their own line(s)."""
    line = f"{indent}{head}({', '.join(items)}){tail}"
    if len(line) <= _WIDTH:
        return [line]
    inner = indent + "    "
    if len(inner) + len(", ".join(items)) <= _WIDTH:
        return [f"{indent}{head}(", inner + ", ".join(items), f"{indent}){tail}"]
    return [f"{indent}{head}(", *(f"{inner}{item}," for item in items), f"{indent}){tail}"]


def render_class(cls: Class) -> str:
    first = cls.instances[0]
    params = [f"{p}: int" + (f" = {cls.defaults[p]}" if p in cls.defaults else "") for p in cls.params]
    lines = [f"class {cls.name}(nn.Module):", f'    """{first.doc}"""', ""]
    lines += _call("    ", "def __init__", ["self", *params], " -> None:")
    lines.append("        super().__init__()")
    position = 0
    for layer in first.layers:
        values = []
        for _, value in layer.slots:
            param = cls.slot_params[position]
            values.append(repr(value) if param is None else cls.params[param])
            position += 1
        if layer.child is not None:  # `Block(sizes...)`: the one constructor that can grow long
            assert layer.child.cls is not None
            lines += _call("        ", f"self.{layer.attr} = {layer.child.cls.name}", values)
        else:
            lines.append(f"        self.{layer.attr} = {layer.template.format(*values)}")
    lines += ["", "    def forward(self, x: torch.Tensor) -> torch.Tensor:"]
    lines += [f"        {line}" for line in first.lines]
    return "\n".join(lines)


def state_of(instance: Instance, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of an instance and its children under their keys in the exported module."""
    out: dict[str, torch.Tensor] = {}
    for layer in instance.layers:
        key = prefix + layer.attr
        if layer.child is not None:
            out.update(state_of(layer.child, key + "."))
        for name, tensor in layer.state.items():
            out[f"{key}.{name}" if name else key] = tensor.detach().clone().contiguous()
    return out
