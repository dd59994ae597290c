"""Sampling: draw derivation trees that are valid by construction, and vary them. No torch.

Modes decide which sampler draws trees (`paper`: backtracking, the default, `paper.py`; `exact`:
the PCFG conditioned on validity, `exact.py` with its inside tables in `inside.py`). One name,
`sampling`, in the API, the CLI and experiment files. `base.py` holds what the modes share
(`Limits`, `SamplerBase`), `variation.py` mutation and crossover, `rejection.py` the textbook
sampler the exact mode is tested against.
"""

from __future__ import annotations

import random

from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.sampling.base import Limits
from einspace.sampling.exact import ExactSampler
from einspace.sampling.paper import Sampler
from einspace.state import FeatureState, Signal
from einspace.tree import Node

__all__ = ["SAMPLING_MODES", "ExactSampler", "Limits", "Sampler", "make_sampler", "sample_tree"]

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


def sample_tree(
    grammar: Grammar,
    input: FeatureState | Signal,
    random_seed: int | None = None,
    limits: Limits | None = None,
    sampling: str = "paper",
) -> Node:
    """One tree from a sampler of the given mode (`paper` or `exact`)."""
    return make_sampler(grammar, input, limits, sampling, random_seed).sample()
