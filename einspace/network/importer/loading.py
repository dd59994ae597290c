"""The user's model for `import-model`: MODULE:FACTORY imported and called, each failure of the
user's code told as one sentence at its own file and line (never a traceback, never the usage
text of a script that reads its own arguments while it is imported).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import io
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from einspace.errors import EinspaceError, caret_context

__all__ = ["ModelLoadError", "code_location", "load_factory"]


class ModelLoadError(EinspaceError):
    """A model file that does not import, a factory that is missing, fails or makes no nn.Module."""


#: Code that is never the user's: torch's and einspace's packages (with the separator, so that
#: `…/torch/` does not match `…/torchvision/`), and Python's standard library less its installed
#: packages (torchvision, timm and the user's own are the user's code).
_OURS = tuple(
    os.path.join(os.path.realpath(p), "") for p in (Path(torch.__file__).parent, Path(__file__).parents[2])
)
_STDLIB = os.path.join(os.path.realpath(sysconfig.get_paths()["stdlib"]), "")


def _users(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = os.path.realpath(filename)
    installed = any(f"{os.sep}{d}-packages{os.sep}" in path for d in ("site", "dist"))
    return not path.startswith(_OURS) and (installed or not path.startswith(_STDLIB))


def code_location(exc: BaseException) -> str | None:
    """`file:line:col` of the deepest frame of the traceback in the user's code (a syntax error:
    its own place), then that line with a caret under it; None when the user's code is not in it.
    Messages end with it, so that the caret stays under the line."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        path, line, column = exc.filename, exc.lineno, exc.offset
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _users(f.filename)]
        if not frames or frames[-1].lineno is None:
            return None
        path, line, column = frames[-1].filename, frames[-1].lineno, None
    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        source = ""
    lines = source.splitlines()
    if column is None:  # the statement's first character
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        column = len(text) - len(text.lstrip()) + 1
    context = caret_context(source, line, column)
    return f"{path}:{line}:{column}" + (f"\n{context}" if context else "")


def _failure(exc: BaseException) -> str:
    """What the user's code raised, then where (`at file:line:col` and the line, when known)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = code_location(exc)
    return f"{type(exc).__name__}{': ' + first if first else ''}" + (f", at {where}" if where else "")


def load_factory(spec: str) -> nn.Module:
    """`MODULE:FACTORY` called without arguments: the model. MODULE is a .py file, or a module
    importable from the current directory or the installed packages; FACTORY a function or class
    that makes the model, or the model itself (an nn.Module made when the module is imported)."""
    module_name, _, factory_name = spec.rpartition(":")
    if not module_name or not factory_name:
        raise ModelLoadError(f"{spec!r}: give the model as MODULE:FACTORY, e.g. my_models.py:ResNet18")
    module = _import(spec, module_name)
    factory = getattr(module, factory_name, None)
    if factory is None:
        names = [n for n in vars(module) if not n.startswith("_")]
        close = difflib.get_close_matches(factory_name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelLoadError(f"{spec!r}: {module_name} has no callable {factory_name!r}{hint}")
    if isinstance(factory, nn.Module):
        return factory
    if not callable(factory):
        raise ModelLoadError(
            f"{spec!r}: {factory_name} is a {type(factory).__name__}, not a function or class that "
            "makes an nn.Module"
        )
    model = _call(spec, factory_name, factory)
    if not isinstance(model, nn.Module):
        made = type(model).__name__
        raise ModelLoadError(
            f"{spec!r}: {factory_name}(){_defined(factory)} returned a {made}, not an nn.Module"
        )
    return model


def _import(spec: str, module_name: str) -> ModuleType:
    """The module, run with only its own path in `sys.argv` and its error output kept back: a
    script that parses its arguments or exits while it is imported is told, not obeyed."""
    if module_name.endswith(".py"):
        path = Path(module_name)
        found = importlib.util.spec_from_file_location(f"einspace_model_{path.stem}", path)
        if not path.is_file() or found is None or found.loader is None:
            raise ModelLoadError(f"{spec!r}: no file {module_name}")
        module = importlib.util.module_from_spec(found)
        sys.modules[found.name] = module  # its own name: classes defined there can find it
        loader, argv0 = found.loader, str(path)

        def run() -> ModuleType:
            loader.exec_module(module)
            return module
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        argv0 = module_name

        def run() -> ModuleType:
            return importlib.import_module(module_name)

    saved, sys.argv = sys.argv, [argv0]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            imported = run()
        sys.stderr.write(errors.getvalue())  # its warnings, once it imported
        return imported
    except SystemExit as exc:
        said = [line for line in errors.getvalue().splitlines() if line.strip()]
        told = f" (it wrote: {said[-1].strip()})" if said else ""
        where = code_location(exc)
        raise ModelLoadError(
            f"{spec!r}: importing {module_name} ended with sys.exit({exc.code!r}){told}; a script "
            'that reads its own command line must do so under `if __name__ == "__main__":`, so '
            "that importing it only defines the model" + (f"; it exits at {where}" if where else "")
        ) from None
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ModelLoadError(
                f"{spec!r}: cannot import {module_name}: no such module in the current directory or "
                "the installed packages (a file is given as path/to/file.py)"
            ) from None
        raise ModelLoadError(f"{spec!r}: cannot import {module_name}: {_failure(exc)}") from None
    except Exception as exc:  # the user's module may fail in any way while it loads
        raise ModelLoadError(f"{spec!r}: cannot import {module_name}: {_failure(exc)}") from None
    finally:
        sys.argv = saved


def _call(spec: str, name: str, factory: Callable[[], object]) -> object:
    try:
        return factory()
    except SystemExit as exc:
        where = code_location(exc)
        raise ModelLoadError(
            f"{spec!r}: {name}(){_defined(factory)} called sys.exit({exc.code!r})"
            + (f", at {where}" if where else "")
        ) from None
    except TypeError as exc:
        if code_location(exc) is None:  # the call itself failed: it needs arguments
            raise ModelLoadError(
                f"{spec!r}: {name}() failed: TypeError: {exc}{_defined(factory)}; give a function "
                "that makes the model without arguments"
            ) from None
        raise ModelLoadError(f"{spec!r}: {name}() failed: {_failure(exc)}") from None
    except Exception as exc:  # e.g. a factory whose own code raises
        raise ModelLoadError(f"{spec!r}: {name}() failed: {_failure(exc)}") from None


def _defined(factory: Callable[[], object]) -> str:
    """` (defined at file:line)`, or nothing when Python cannot tell."""
    try:
        path = inspect.getsourcefile(factory)  # type: ignore[arg-type]
        line = inspect.getsourcelines(factory)[1]  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""
    return f" (defined at {path}:{line})" if path else ""
