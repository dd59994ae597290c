"""One generic registry of named things (operations, strategies, evaluators) and building them by name."""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from einspace.errors import EinspaceError, UnknownNameError

T = TypeVar("T")

#: An unknown name without a close match lists the registered names when there are at most this many.
_LISTED = 12


class Registry(Generic[T]):
    """Entries of one kind by name: a second entry under a name is refused, an unknown name suggests
    close matches.

    `builtins` names the modules that register the built-in entries as they are imported, either
    as a sequence or as a mapping from each module to the names it registers. They are imported
    when a name is missing (in order until it is found; with a mapping, only the module that
    declares it) and all of them when the names are listed; never with the module that holds the
    registry: so that module imports none of them (no import cycle), and a built-in module that
    needs torch costs nothing until one of its own entries is looked up.
    """

    def __init__(
        self,
        kind: str,
        builtins: Sequence[str] | Mapping[str, Sequence[str]] = (),
        unknown_error: type[UnknownNameError] = UnknownNameError,
    ):
        self.kind = kind
        #: Built-in module -> the names it declares (None: known only once it is imported).
        self.builtins: dict[str, frozenset[str] | None] = (
            {module: frozenset(names) for module, names in builtins.items()}
            if isinstance(builtins, Mapping)
            else dict.fromkeys(builtins)
        )
        self.unknown_error = unknown_error
        self._entries: dict[str, T] = {}
        self._imported: set[str] = set()
        self._importing = False
        #: How many entries from outside the built-in modules were added or removed so far: what
        #: was decided from the entries (a grammar's validity, say) is stale once this has moved.
        self.changes = 0

    def register(self, entry: T) -> T:
        """Add `entry` under its `name` attribute and return it, so that `register` serves as a
        class decorator. Nothing is ever replaced: `unregister` first. An entry from outside the
        built-in modules loads those that may hold its name first (all but the ones declaring other
        names: a plugin evaluator does not import torch for the training evaluator's module), so that
        taking a built-in's name fails here, clearly, not later inside the built-in's import."""
        name = getattr(entry, "name", None)
        if not isinstance(name, str) or not name:
            label = getattr(entry, "__name__", type(entry).__name__)
            raise EinspaceError(f"{label} must set a string `name` to be a registered {self.kind}")
        if getattr(entry, "__module__", None) not in self.builtins:
            self.load_builtins(until=name)
            self.changes += 1
        if name in self._entries:
            raise EinspaceError(f"{self.kind} {name!r} is already registered ({self._entries[name]!r})")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove an entry if there is one (for plugins and tests that register temporary ones)."""
        if self._entries.pop(name, None) is not None:
            self.changes += 1

    def get(self, name: str) -> T:
        """The entry called `name`; an unknown name raises `unknown_error` saying what was meant."""
        if name not in self:
            raise self.unknown_error(self._unknown_message(name))
        return self._entries[name]

    def names(self, pattern: str = "*") -> list[str]:
        """Registered names matching a shell-style pattern, sorted."""
        self.load_builtins()
        return sorted(n for n in self._entries if fnmatch.fnmatch(n, pattern))

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self.load_builtins(until=name)
        return name in self._entries

    def load_builtins(self, until: object = None) -> None:
        """Import the built-in modules not imported yet, in order, stopping as soon as an entry named
        `until` is registered and skipping modules that declare other names; an import that fails is
        tried again next time. A built-in module that looks names up while it imports sees the
        entries registered so far and imports nothing."""
        if self._importing:
            return
        self._importing = True
        try:
            for module, declared in self.builtins.items():
                if until is not None and until in self._entries:
                    return
                elsewhere = until is not None and declared is not None and until not in declared
                if module in self._imported or elsewhere:
                    continue
                importlib.import_module(module)
                self._imported.add(module)
        finally:
            self._importing = False

    def create(self, name: str, settings: Mapping[str, Any] | None, /, *args: Any, **given: Any) -> Any:
        """The class registered as `name`, called with `args` and `given` (from the caller) and
        `settings` (from a person). A setting the class does not take is an EinspaceError naming it;
        what the class raises itself, TypeError included, passes through unchanged, so a bug in a
        constructor is never reported as a bad setting. Checking values is the class's job."""
        settings = {} if settings is None else settings
        self.check_settings(name, settings, *args, **given)
        return self.get(name)(*args, **given, **settings)

    def check_settings(self, name: str, settings: Mapping[str, Any], /, *args: Any, **given: Any) -> None:
        """What `create` checks of the setting names, without creating anything (so a search can
        refuse a typo before it starts, when no network exists to pass as `args`)."""
        _check_settings(f"{self.kind} {name!r}", inspect.signature(self.get(name)), settings, args, given)

    def _unknown_message(self, name: str) -> str:
        """Why `name` is unknown, with the close names among all entries: every built-in module is
        imported first (a look-up imports only the one that declares the name, and none for a typo)."""
        self.load_builtins()
        known = sorted(self._entries)
        close = difflib.get_close_matches(str(name), known, n=3)
        if close:
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?"
        elif len(known) <= _LISTED:
            hint = f" (registered: {', '.join(known) or 'none'})"
        else:
            hint = ""
        return f"unknown {self.kind} {name!r}{hint}"


def check_setting_names(owner: str, names: Iterable[str], known: Sequence[str]) -> None:
    """Raise EinspaceError for the first of `names` not in `known`, suggesting the closest known one
    (a typo in an experiment file should stop the run, not silently leave a default in place)."""
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known) or 'none'})"
            raise EinspaceError(f"unknown setting {name!r} for {owner}{hint}")


def _check_settings(
    owner: str, signature: inspect.Signature, settings: Any, args: tuple[Any, ...], given: dict[str, Any]
) -> None:
    """Settings must be a mapping of names the signature takes and the caller does not pass itself
    (a signature with **kwargs takes any name: its class checks them)."""
    if not isinstance(settings, Mapping):
        raise EinspaceError(f"the settings of {owner} must be a mapping, got {settings!r}")
    passed = set(given) | set(list(signature.parameters)[: len(args)])
    for key in settings:
        if key in passed:
            raise EinspaceError(f"{key!r} is not a setting of {owner}: einspace passes it itself")
    parameters = signature.parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        takes = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        check_setting_names(owner, settings, [n for n in takes if n not in passed])
