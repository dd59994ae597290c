"""Successive halving's promotion window (`multi_fidelity.window`): a result may be promoted only if
it ranked in the top 1/eta of its rung's last `window` results when it came. ASHA ranks it against
the whole rung instead, re-ranked as the rung grows, so under a strategy whose results drift upwards
(evolution's children beat its first random trees) it promotes far more than 1/eta."""

from __future__ import annotations

import math
import random

import pytest
from test_successive_halving import drive, fitness, wrapped

from einspace.errors import EinspaceError
from einspace.search.successive_halving import _Rung


def fill(rung: _Rung, scores: list[float]) -> None:
    for job, score in enumerate(scores):
        rung.add(job, f"t{job}", f"h{job}", score, math.isfinite(score), False)


def promote_all(rung: _Rung) -> list[int]:
    """Promote as ASHA's scheduler would with free slots, until nothing is left to promote."""
    order = []
    while (job := rung.next_promotion()) is not None:
        rung.promoted.add(job)
        order.append(job)
    return order


def drifting(n: int, drift: float, seed: int = 0) -> list[float]:
    """Scores whose spread is 1 and whose mean rises by `drift` per result."""
    rng = random.Random(seed)
    return [rng.random() + drift * i for i in range(n)]


@pytest.mark.parametrize("eta", [3, 6])
def test_the_share_promoted_stays_near_1_over_eta_when_results_improve(eta):
    scores = drifting(600, drift=0.002)
    asha, windowed = _Rung(eta), _Rung(eta, window=36)
    shares = []
    for rung in (asha, windowed):
        for job, score in enumerate(scores):  # promoted as they come, as with free slots
            rung.add(job, f"t{job}", f"h{job}", score, True, False)
            promote_all(rung)
        shares.append(len(rung.promoted) / len(scores))
    assert shares[0] > 1.7 / eta  # ASHA: the late results beat the early ones (0.61 and 0.42)
    assert 0.8 / eta < shares[1] < 1.3 / eta  # 0.38 and 0.20


def test_without_drift_the_window_promotes_about_what_asha_does():
    scores = drifting(600, drift=0.0, seed=1)
    shares = []
    for rung in (_Rung(3), _Rung(3, window=36)):
        for job, score in enumerate(scores):
            rung.add(job, f"t{job}", f"h{job}", score, True, False)
            promote_all(rung)
        shares.append(len(rung.promoted) / len(scores))
    assert shares[1] == pytest.approx(shares[0], abs=0.05)
    assert shares[1] == pytest.approx(1 / 3, abs=0.05)


def test_a_result_is_ranked_when_it_comes_and_later_results_do_not_change_it():
    """0.5 came second of two behind 0.9: not in the top half of its window. Worse results after
    it would lift it into ASHA's top half of the rung, but not into the window's."""
    scores = [0.9, 0.5, 0.1, 0.2, 0.05, 0.3]
    asha, windowed = _Rung(2), _Rung(2, window=4)
    fill(asha, scores)
    fill(windowed, scores)
    assert promote_all(asha) == [0, 1, 5]  # the top 3 of 6
    # 0.9: first; 0.3 beats 0.1, 0.2 and 0.05 among the last four; 0.1, 0.2, 0.05 ranked low
    assert promote_all(windowed) == [0, 5]
    assert windowed.eligible == {0, 5}


@pytest.mark.parametrize("eta", [2, 3, 6])
def test_a_rung_s_first_eta_results_are_ranked_together_when_the_eta_th_comes(eta):
    """As in ASHA, n results leave floor(n / eta) places: rising results (each the best so far) are
    not all promoted while the rung is young; the best of the first eta is, once they are in."""
    rung = _Rung(eta, window=36)
    fill(rung, [0.1 * (i + 1) for i in range(eta - 1)])
    assert rung.eligible == set() and promote_all(rung) == []
    rung.add(eta - 1, "t", "h", 0.05, True, False)  # the eta-th, worse than all before it
    assert rung.eligible == {eta - 2} and promote_all(rung) == [eta - 2]
    # from then on each is ranked when it comes: the best so far is in the top floor(n / eta)
    rung.add(eta, "u", "hu", 9.0, True, False)
    assert rung.eligible == {eta - 2, eta}
    # failures count towards the eta: the first success is ranked when it is the eta-th result
    young = _Rung(eta, window=eta)
    fill(young, [-math.inf] * (eta - 1))
    assert young.eligible == set()
    young.add(eta - 1, "t", "h", 0.7, True, False)
    assert young.eligible == {eta - 1}


@pytest.mark.parametrize("window", [1, 4])
def test_ties_go_to_the_earlier_result(window):
    rung = _Rung(2, window=window + 1)
    fill(rung, [0.5] * (window + 1))
    assert rung.eligible == {0}  # each later 0.5 has an equal, earlier one beside it


def test_failed_results_count_towards_the_window_and_are_never_promoted():
    rung = _Rung(3, window=3)
    fill(rung, [-math.inf, -math.inf, 0.1, -math.inf])
    assert rung.eligible == {2}  # a failure first in its window is not eligible; 0.1 first of 3
    assert promote_all(rung) == [2]
    rung = _Rung(2, window=2)
    fill(rung, [0.5, -math.inf, 0.4])
    assert rung.eligible == {0, 2}  # 0.4's window is the failure and itself, not 0.5


def test_only_results_that_may_be_promoted_are_worth_keeping():
    rung = _Rung(2, window=4)
    fill(rung, [0.9, 0.5, 0.1, 0.2, 0.05, 0.3])
    rung.favoured.add(3)  # a seed: kept whatever its rank
    assert rung.worth_keeping() == {0, 3, 5}
    rung.promoted.add(0)
    assert rung.worth_keeping() == {3, 5}


@pytest.mark.parametrize("name", ["regularised_evolution", "random_search"])
def test_each_promotion_ranked_in_the_window_s_top_when_it_came_and_none_is_left_behind(name):
    """Driven by a search with three evaluations in flight: every promotion's source was, when its
    result came, in the top 1/eta of its rung's last `window` results (counted from the results
    told, a repeated tree once), and when the run is done every such result has been promoted."""
    s = wrapped(name, window=6)
    asked = drive(s)
    told = {c.id: fitness(c.tree, c.fidelity) for c in asked}
    eligible: dict[int, set[int]] = {}
    for low in s.rungs[:-1]:
        order, seen = [], set()  # as told: drive() tells the oldest first, so in the order asked
        for c in asked:
            if c.fidelity == low and c.tree not in seen:
                seen.add(c.tree)
                order.append(c.id)
        eligible[low] = set()
        for i, job in enumerate(order):
            # the first eta together, once the eta-th came; later ones among the last 6 up to them
            recent = order[: s.eta] if i < s.eta else order[max(0, i - 5) : i + 1]
            if i < s.eta and len(order) < s.eta:
                continue  # the rung never held eta results: none of them was ranked
            at = recent.index(job)
            better = sum(
                told[other] > told[job] or (told[other] == told[job] and k < at)
                for k, other in enumerate(recent)
            )
            if math.isfinite(told[job]) and (better + 1) * s.eta <= len(recent):
                eligible[low].add(job)
    promotions = [c for c in asked if c.origin == "promotion"]
    by_job = {c.id: c for c in asked}
    assert promotions
    for c in promotions:
        (parent,) = c.parents
        assert parent in eligible[by_job[parent].fidelity]
    promoted = {c.parents[0] for c in promotions}
    assert set().union(*eligible.values()) == promoted


@pytest.mark.parametrize("window", [2, True, 6.0])
def test_a_window_below_eta_or_not_an_integer_is_refused(window):
    with pytest.raises(EinspaceError, match="a window of at least eta"):
        wrapped(eta=3, window=window)
    assert wrapped(eta=3, window=3).window == 3  # eta itself is the least
