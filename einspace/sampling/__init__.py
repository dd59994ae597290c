"""Sampling modes: which sampler draws trees (`paper`: backtracking, the default; `exact`: the PCFG
conditioned on validity). One name, `sampling`, in the API, the CLI and experiment files."""

from __future__ import annotations

import random

from einspace.errors import EinspaceError
from einspace.exact_sampler import ExactSampler
from einspace.grammar.model import Grammar
from einspace.sampler import Limits, Sampler
from einspace.state import FeatureState, Signal

__all__ = ["SAMPLING_MODES", "make_sampler"]

#: Mode name -> sampler class; both take (grammar, input, limits, random_seed, rng) and have `sample()`.
SAMPLING_MODES: dict[str, type[Sampler] | type[ExactSampler]] = {"paper": Sampler, "exact": ExactSampler}


def make_sampler(
    grammar: Grammar,
    input: FeatureState | Signal,
    limits: Limits | None = None,
    sampling: str = "paper",
    random_seed: int | None = None,
    rng: random.Random | None = None,
) -> Sampler | ExactSampler:
    """A sampler of the given mode; an unknown mode is an error that lists the known ones."""
    try:
        cls = SAMPLING_MODES[sampling]
    except (KeyError, TypeError):
        raise EinspaceError(
            f"unknown sampling mode {sampling!r} (known: {', '.join(SAMPLING_MODES)})"
        ) from None
    return cls(grammar, input, limits, random_seed=random_seed, rng=rng)
