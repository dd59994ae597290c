"""Errors cross process boundaries (a search's worker process, a Ray task) by pickling: each of
einspace's own must arrive with the same class, message and attributes."""

from __future__ import annotations

import pickle

import pytest

from einspace.errors import LocatedError, Location, SeedFitError, TreeError
from einspace.evaluators.base import EvaluationFailed

ERRORS = [
    SeedFitError("resnet_small", "col[32x4]", "at node S > M#0: R1 cannot derive these", about=" (a ResNet)"),
    TreeError("no rule derives this", "S > M#1"),
    TreeError("no path at all", None),
    LocatedError("expected ')'", Location("g.pcfg", 3, 7), "start S\nS -> a\nS -> (b\n"),
    EvaluationFailed("time budget of 40 s exceeded in epoch 18 of 20"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_pickle_with_their_message_and_attributes(error):
    error.note = "kept"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
