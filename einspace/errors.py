"""One exception family for everything a person can get wrong, with locations."""

from __future__ import annotations

from dataclasses import dataclass


class EinspaceError(Exception):
    """Root of every error einspace raises on purpose; the CLI prints these without a traceback.

    It pickles with the arguments it was made with (a worker process or Ray task sends it to the
    driver): Exception's own pickling calls the class with the formatted message alone, which
    fails, or formats again, for subclasses whose constructors take other arguments."""

    def __new__(cls, *args: object, **kwargs: object) -> EinspaceError:
        error = super().__new__(cls, *args)
        error._made_with = (args, kwargs)
        return error

    def __reduce__(self) -> tuple[object, ...]:
        args, kwargs = self._made_with
        state = {k: v for k, v in self.__dict__.items() if k != "_made_with"}
        return (_remake, (type(self), args, kwargs), state)


def _remake(cls: type[EinspaceError], args: tuple, kwargs: dict) -> EinspaceError:
    return cls(*args, **kwargs)


@dataclass(frozen=True)
class Location:
    """Where something was written: a file (or '<string>'), a 1-based line and column."""

    path: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


def caret_context(source: str, line: int, column: int) -> str:
    """The source line with a caret under `column`, for error messages."""
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return ""
    text = lines[line - 1].expandtabs(1)
    return f"    {text}\n    {' ' * (column - 1)}^"


class LocatedError(EinspaceError):
    """An error about text a person wrote: message prefixed by file:line:col, caret below."""

    def __init__(self, message: str, location: Location | None = None, source: str | None = None):
        self.message = message
        self.location = location
        self.source = source
        text = message if location is None else f"{location}: {message}"
        if location is not None and source:
            context = caret_context(source, location.line, location.column)
            if context:
                text = f"{text}\n{context}"
        super().__init__(text)


class GrammarSyntaxError(LocatedError):
    """A grammar file that does not parse."""


class GrammarError(LocatedError):
    """A grammar file that parses but means nothing sensible (undefined symbol, bad probability, ...)."""


class TreeSyntaxError(LocatedError):
    """A derivation-tree text that does not parse."""


class TreeError(EinspaceError):
    """A tree the grammar cannot derive, or whose shapes don't fit; names the offending node."""

    def __init__(self, message: str, path: str = ""):
        self.message = message
        self.path = path
        super().__init__(f"at node {path or '<root>'}: {message}" if path is not None else message)


class BuildError(TreeError):
    """An operation's `build` failed while a tree was compiled: names the node's address, the
    operation and what went wrong."""


class Infeasible(EinspaceError):
    """An operation cannot apply to the given feature state; `reason` says why."""


class UnknownNameError(EinspaceError):
    """A name no registry entry has: an operation, strategy or evaluator (close matches in the message)."""


class UnknownOperationError(UnknownNameError):
    """An operation name that is not registered (with close matches in the message)."""


class SamplingError(EinspaceError):
    """The sampler could not derive a tree within its limits."""


class VariationError(EinspaceError):
    """Mutation or crossover found nothing valid to do."""


class SeedFitError(EinspaceError):
    """A seed tree that does not fit an input: `seed` names it, `reason` says where and why."""

    def __init__(self, seed: str, input: str, reason: str, about: str = ""):
        self.seed, self.input, self.reason = seed, input, reason
        super().__init__(f"seed {seed!r}{about} does not fit input {input}: {reason}")
