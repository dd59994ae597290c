"""Pictures as files: PNG or SVG of one figure, or one self-contained HTML page of a tree.

Only matplotlib is needed (no Graphviz, no browser); images in HTML are embedded as data URIs,
so a page can be mailed or opened from anywhere.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from matplotlib.figure import Figure

from einspace.checker import CheckedTree
from einspace.errors import EinspaceError
from einspace.outputs import writable, write_output
from einspace.pictures.figures import graph_figure, tree_figure
from einspace.pictures.folding import folded_text
from einspace.tree import pretty

__all__ = ["FORMATS", "VIEWS", "data_uri", "page", "render", "save", "tree_section"]

#: What `render` writes, by file extension.
FORMATS = (".png", ".svg", ".html")
#: The pictures of a tree: its derivation tree and its data-flow graph.
VIEWS = {"tree": tree_figure, "graph": graph_figure}


def save(fig: Figure, target: str | Path | io.BytesIO, fmt: str) -> None:
    """Save as PNG or SVG; an SVG carries no date, so the same tree gives the same file."""
    fig.savefig(target, format=fmt, metadata={"Date": None} if fmt == "svg" else None)


def data_uri(fig: Figure, fmt: str = "svg") -> str:
    """The figure as a `data:` URI (PNG or SVG, base64) for an HTML `img`."""
    buffer = io.BytesIO()
    save(fig, buffer, fmt)
    kind = "svg+xml" if fmt == "svg" else fmt
    return f"data:image/{kind};base64,{base64.b64encode(buffer.getvalue()).decode()}"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
img { max-width: 100%; height: auto; border: 1px solid #ddd; margin: 0.5em 0; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }
table { border-collapse: collapse; }
td, th { padding: 0.2em 0.8em; text-align: left; border-bottom: 1px solid #eee; }
figure { margin: 0 0 1em 0; }
figcaption { color: #555; font-size: 90%; }
"""


def page(title: str, body: str) -> str:
    """A complete HTML document with the shared style."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def tree_section(checked: CheckedTree, name: str, fmt: str = "svg") -> str:
    """Both pictures of a tree, one above the other, its folded text, and the full text folded away."""
    pictures = "".join(
        f'<figure><img alt="{what} of {html.escape(name)}" src="{data_uri(draw(checked, name), fmt)}">'
        f"<figcaption>{what}</figcaption></figure>"
        for what, draw in (("derivation tree", tree_figure), ("data-flow graph", graph_figure))
    )
    return (
        f"{pictures}\n<pre>{html.escape(folded_text(checked))}</pre>\n"
        f"<details><summary>full tree text</summary><pre>{html.escape(pretty(checked.tree))}</pre></details>"
    )


def render(checked: CheckedTree, path: str | Path, name: str = "tree", view: str = "tree") -> Path:
    """Write a picture of `checked` to `path`, by its extension: `.png` or `.svg` draw `view`
    (`tree` or `graph`); `.html` is a page with both pictures and the tree's text."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise EinspaceError(f"cannot render to {path}: the file name must end in {', '.join(FORMATS)}")
    if view not in VIEWS:
        raise EinspaceError(f"unknown picture {view!r}; choose one of {', '.join(VIEWS)}")
    writable(path)  # before drawing
    if suffix == ".html":
        return write_output(path, page(name, f"<h1>{html.escape(name)}</h1>\n" + tree_section(checked, name)))
    figure = VIEWS[view](checked, name)
    return write_output(path, lambda target: save(figure, target, suffix[1:]))
