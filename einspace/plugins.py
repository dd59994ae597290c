"""User plugins: Python modules or files that register operations, evaluators or network losses.

Every command that reads grammars or trees loads them first (`einspace --plugin my_ops.py
check my.pcfg`, or `plugins:` in an experiment file), and search workers load the experiment's
plugins before they evaluate, so a registry is the same everywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from hashlib import sha1
from pathlib import Path

from einspace.errors import EinspaceError

__all__ = ["PluginError", "import_plugins", "is_loaded", "where_failed"]


class PluginError(EinspaceError):
    """A plugin that cannot be found or fails while it is imported."""


def import_plugins(plugins: Sequence[str]) -> None:
    """Import each plugin once: a dotted module name, or a `.py` file (by path).

    A plugin that is missing or raises while importing is a PluginError naming the plugin and
    the line of its own code that failed, never a traceback.
    """
    for plugin in plugins:
        if _is_file(plugin):
            _load_file(Path(plugin).resolve(), plugin)
        else:
            _load_module(plugin)


def is_loaded(plugin: str) -> bool:
    """Whether `plugin` was imported already (loading it again runs none of its code)."""
    return (_module_name(Path(plugin).resolve()) if _is_file(plugin) else plugin) in sys.modules


def _is_file(plugin: str) -> bool:
    return plugin.endswith(".py") or os.sep in plugin


def _module_name(path: Path) -> str:
    return f"einspace_plugin_{path.stem}_{sha1(str(path).encode()).hexdigest()[:8]}"


def _load_file(path: Path, given: str) -> None:
    name = _module_name(path)
    if name in sys.modules:
        return
    if not path.is_file():
        raise PluginError(f"plugin file {given!r} not found ({path})")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {given!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure in user code becomes a sentence
        del sys.modules[name]
        raise PluginError(
            f"plugin {given!r} failed while importing: {where_failed(exc, str(path))}"
        ) from None


def _load_module(plugin: str) -> None:
    if plugin in sys.modules:
        return
    try:
        importlib.import_module(plugin)
    except ModuleNotFoundError as exc:
        if exc.name and plugin.startswith(exc.name):
            raise PluginError(f"plugin module {plugin!r} cannot be imported: {exc}") from None
        raise PluginError(f"plugin {plugin!r} failed while importing: {where_failed(exc, None)}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure in user code becomes a sentence
        raise PluginError(f"plugin {plugin!r} failed while importing: {where_failed(exc, None)}") from None


def where_failed(exc: BaseException, path: str | None) -> str:
    """`ErrorType: message (file:line)`, the line being the plugin's own deepest frame that failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if path is None or f.filename == path] or frames
    place = f" ({own[-1].filename}:{own[-1].lineno})" if own else ""
    if isinstance(exc, SystemExit):  # an import must not end the command, whatever the status
        return f"it called sys.exit({exc.code!r}){place}"
    return f"{type(exc).__name__}: {exc}{place}"
