"""Asynchronous successive halving (ASHA; Li et al., "A System for Massively Parallel Hyperparameter
Tuning", MLSys 2020) around any strategy: cheap first looks at many architectures, full training
for the few that earn it.

Every architecture the wrapped strategy proposes is first trained at the lowest rung (its fewest
epochs). Whenever a slot is free, the scheduler looks from the top rung down for a result in the
best 1/eta of its rung that has not been promoted, and trains that tree at the next rung; only
when there is none does it ask the wrapped strategy for a new architecture. No rung waits to fill
up, so every worker stays busy (the asynchronous rule of ASHA, Algorithm 2 of the paper).

A lowest rung at fidelity 0 (the training evaluator's 0 epochs: the untrained network, its head
fitted in closed form, `einspace.evaluators.head_fit`) screens architectures before any training;
a promotion from it trains from scratch, as there is no state to go on from.

Seeds (architectures the user trusts) are not screened: a seed that trains at the lowest rung is
promoted up to the top whatever its rank, so the run knows how it does at full fidelity.

What the wrapped strategy hears (`strategy_fitness`): by default (`lowest_rung`) the lowest rung's
result of each architecture it proposed, a fitness all its architectures share, so regularised
evolution's tournaments compare like with like. With `highest_rung` it also hears each promotion's
result (`Strategy.hear_promotion`), so that it can prefer what earned more training: where the
lowest rung is only a look at the untrained network, the architectures that went on to train well.
Higher rungs decide what the run reports as its best (`einspace.search.compute.incumbent`).

`eta` may be a list, one per rung below the top: each rung promotes its own share. Looks at 0
epochs are cheap and coarse, so a run may promote the best sixth of them and then the best third
of each trained rung, whose fidelities grow threefold: with one eta of 6 over four rungs the
first tree reaches the top after 6 x 6 x 6 looks at the earliest, with [6, 3, 3] after 6 x 3 x 3.

A result is ranked against every result its rung ever held, so under a strategy that improves (the
children of regularised evolution beat its first random trees) far more than 1/eta of a rung is
promoted; `einspace report` shows the share each rung promoted. A larger eta over the same
explicit rungs brings it down, and so does a `window`: each result is then ranked once, when it
comes, against its rung's last `window` results, so a result is promoted for beating its
contemporaries, not the rung's first random trees (`_Rung`).

Every rung's result is its own evaluation in the store (origin "promotion", the lower rung's
evaluation as its parent), so a killed run resumes with nothing lost; promotions are part of the
checkpoint, so none is made twice. Where the evaluator can (`Evaluator.continues`; multi_fidelity
`promotion: continue`, the default), a promoted tree trains on from the state its lower rung saved,
every rung following the top rung's schedule, so promotion costs only the epochs between rungs;
`live_states` says which saved states may still be needed. A result scored before reaching its
rung's fidelity (a time budget stopped it: `partial`) is never promoted, since more epochs would
not fit either, and a tree's repeated proposals count once per rung.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from einspace.errors import EinspaceError
from einspace.search.strategy import Candidate, Strategy

__all__ = [
    "PROMOTION",
    "STRATEGY_FITNESS",
    "SuccessiveHalving",
    "default_rungs",
    "eta_problem",
    "rung_etas",
    "rungs_problem",
]

#: The origin of an evaluation that trains an earlier one's tree at the next rung.
PROMOTION = "promotion"

#: What the wrapped strategy hears of an architecture: its lowest rung's result only, or also
#: each result of its promotions.
STRATEGY_FITNESS = ("lowest_rung", "highest_rung")


def default_rungs(min_fidelity: int, max_fidelity: int, eta: int) -> list[int]:
    """min, min·eta, min·eta², ... below max, then max (Hyperband's geometric rungs); from 0:
    0, then 1, eta, ... (0 epochs is a look at the untrained network)."""
    if min_fidelity == 0:
        return [0, *default_rungs(1, max_fidelity, eta)] if max_fidelity > 0 else [0]
    rungs, fidelity = [], min_fidelity
    while fidelity < max_fidelity:
        rungs.append(fidelity)
        fidelity *= eta
    return rungs + [max_fidelity]


def rungs_problem(rungs: Sequence[int]) -> str | None:
    """What keeps `rungs` from being successive halving's rungs (None: nothing)."""
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rungs):
        return "integers >= 0"
    if len(rungs) < 2 or any(b <= a for a, b in zip(rungs, rungs[1:], strict=False)):
        return "two or more strictly increasing fidelities"
    return None


def eta_problem(eta: int | Sequence[int], rungs: Sequence[int] | None) -> str | None:
    """What keeps `eta` from being successive halving's promotion rate (None: nothing): an integer
    >= 2, or a list of them, one per rung below the top of `rungs` (None: the rungs are not given
    but worked out from min_fidelity and eta, so a list has no rungs to match)."""

    def valid(e: object) -> bool:
        return isinstance(e, int) and not isinstance(e, bool) and e >= 2

    is_list = isinstance(eta, Sequence) and not isinstance(eta, str)
    if not ((len(eta) > 0 and all(map(valid, eta))) if is_list else valid(eta)):
        return "an integer >= 2 or a list of them, one per rung below the top"
    if is_list:
        if rungs is None:
            return "one integer where the rungs are not given (a list needs explicit multi_fidelity.rungs)"
        if len(eta) != len(rungs) - 1:
            return f"one integer per rung below the top ({len(rungs) - 1} for rungs {list(rungs)})"
    return None


def rung_etas(eta: int | Sequence[int], rungs: Sequence[int]) -> list[int]:
    """The promotion rate of each rung below the top (`eta` checked by `eta_problem`)."""
    return [eta] * (len(rungs) - 1) if isinstance(eta, int) else list(eta)


class _Rung:
    """The finished results at one fidelity below the top: job id -> (tree, hash, fitness) in the
    order they came, first per tree only, which of them were promoted, and which are `favoured`
    (seeds, and their promotions: promoted whatever their rank). A result that may not be promoted
    (failed or partial) counts towards the rung's size with fitness -inf and without its tree,
    which keeps the checkpoint small.

    Which results may be promoted: without a `window`, those in the top 1/eta of the whole rung,
    re-ranked as it grows (ASHA). With one, those that ranked in the top 1/eta of the rung's last
    `window` results (itself included) when they came, a rank that later results do not change:
    a strategy whose results improve slowly then has about 1/eta of them promoted, as one that does
    not (one that improves fast still has most new bests promoted).
    As in ASHA, n results give at most floor(n / eta) places, so the first eta results are ranked
    together when the eta-th comes (the best of them is eligible), and none before."""

    def __init__(self, eta: int, window: int | None = None) -> None:
        self.eta, self.window = eta, window
        self.results: dict[int, tuple[str, str, float]] = {}
        self.hashes: set[str] = set()
        self.promoted: set[int] = set()
        self.favoured: set[int] = set()
        self.eligible: set[int] = set()  # with a window: ranked in its top 1/eta when it came

    def add(self, job: int, tree: str, hash: str, fitness: float, promotable: bool, favoured: bool) -> None:
        if hash in self.hashes:
            return  # a repeated tree (its result came from the cache): one entry per tree
        self.hashes.add(hash)
        self.results[job] = (tree, hash, fitness) if promotable else ("", hash, float("-inf"))
        if favoured and promotable:
            self.favoured.add(job)
        if self.window and len(self.results) == self.eta:  # the first eta, ranked together
            self._rank(list(self.results), list(self.results))
        elif self.window and len(self.results) > self.eta:  # among the last `window`, itself included
            self._rank([job], list(islice(reversed(self.results), self.window))[::-1])

    def _rank(self, jobs: list[int], among: list[int]) -> None:
        """Make those of `jobs` eligible that are among the best floor(len(among) / eta) of `among`
        (results in the order they came; ties go to the earlier one); failures never are."""
        order = {other: i for i, other in enumerate(among)}
        for job in jobs:
            fitness = self.results[job][2]
            if fitness == float("-inf"):
                continue
            scores = ((self.results[other][2], order[other]) for other in among)
            better = sum(f > fitness or (f == fitness and i < order[job]) for f, i in scores)
            if (better + 1) * self.eta <= len(among):
                self.eligible.add(job)

    def next_favoured(self) -> int | None:
        """The earliest favoured job not yet promoted, or None."""
        return min(self.favoured - self.promoted, default=None)

    def _ranked(self, jobs: Iterable[int]) -> list[int]:
        """`jobs` best first (ties: the earliest)."""
        return sorted(jobs, key=lambda job: (-self.results[job][2], job))

    def next_promotion(self) -> int | None:
        """The best job (ties: the earliest) that may be promoted and was not yet, or None."""
        if self.window:
            return next(iter(self._ranked(self.eligible - self.promoted)), None)
        ranked = self._ranked(self.results)
        best = [job for job in ranked[: len(ranked) // self.eta] if self.results[job][2] != float("-inf")]
        return next((job for job in best if job not in self.promoted), None)

    def worth_keeping(self) -> set[int]:
        """Results not promoted yet that a promotion may still pick: with a window, the eligible
        ones; without, those within the best 2/eta of the rung, twice the share promoted (one
        ranked lower reaches the top 1/eta only if the rung grows with many worse results)."""
        if self.window:
            best = set(self.eligible)
        else:
            ranked = self._ranked(self.results)
            best = set(ranked[: math.ceil(2 * len(ranked) / self.eta)])
        return (best | self.favoured) - self.promoted

    def to_json(self) -> dict[str, Any]:
        results = [[job, t, h, None if f == float("-inf") else f] for job, (t, h, f) in self.results.items()]
        return {"results": results, "promoted": sorted(self.promoted), "favoured": sorted(self.favoured)}

    @staticmethod
    def from_json(data: dict[str, Any], eta: int, window: int | None) -> _Rung:
        """The rung as saved; which results are eligible is worked out again from their order."""
        rung = _Rung(eta, window)
        for job, tree, hash, fitness in data["results"]:
            promotable = fitness is not None
            rung.add(int(job), tree, hash, float(fitness) if promotable else float("-inf"), promotable, False)
        rung.promoted = {int(job) for job in data["promoted"]}
        rung.favoured = {int(job) for job in data.get("favoured", [])}  # absent before seeds were favoured
        return rung


class SuccessiveHalving(Strategy):
    """ASHA over `base`: rungs are increasing fidelities (the evaluator's `fidelity_setting`,
    epochs for training), eta >= 2 the promotion rate (or one per rung below the top). Candidate
    ids are this scheduler's own (one per evaluation, every rung); `evaluations` stays the
    wrapped strategy's budget of new architectures, and promotions come on top of it."""

    name = "successive_halving"

    def __init__(
        self,
        base: Strategy,
        rungs: Sequence[int],
        eta: int | Sequence[int] = 3,
        strategy_fitness: str = "lowest_rung",
        window: int | None = None,
    ):
        if (problem := rungs_problem(rungs)) is not None:
            raise EinspaceError(f"successive halving needs rungs that are {problem}, got {list(rungs)}")
        if (problem := eta_problem(eta, rungs)) is not None:
            raise EinspaceError(f"successive halving needs an eta that is {problem}, got {eta!r}")
        most = max(rung_etas(eta, rungs))
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < most):
            raise EinspaceError(
                f"successive halving needs a window of at least eta ({most}) results, got {window!r}"
            )
        if strategy_fitness not in STRATEGY_FITNESS:
            known = " or ".join(map(repr, STRATEGY_FITNESS))
            raise EinspaceError(
                f"successive halving's strategy_fitness must be {known}, got {strategy_fitness!r}"
            )
        self.base, self.rungs, self.window = base, list(rungs), window
        self.eta = eta if isinstance(eta, int) else list(eta)  # as given: the checkpoint says which
        self.strategy_fitness = strategy_fitness
        self.space, self.evaluations = base.space, base.evaluations
        self.reports_mean = base.reports_mean
        self.next_id = 0
        self._pending: dict[int, Candidate] = {}
        self._trees = {}
        self._reset()

    def _reset(self) -> None:
        self._levels = [_Rung(eta, self.window) for eta in self._etas()]
        self._job_of_base: dict[int, int] = {}  # the wrapped strategy's id -> the job at the lowest rung
        # job -> the wrapped strategy's id of its tree: jobs in flight, and (highest_rung) results
        # not promoted yet
        self._base_of_job: dict[int, int] = {}

    def _etas(self) -> list[int]:
        """The promotion rate of every rung (the top rung's is never used: nothing is promoted from it)."""
        etas = rung_etas(self.eta, self.rungs)
        return [*etas, etas[-1]]

    # ---------------------------------------------------------------- the contract
    def ask(self) -> Candidate | None:
        promotion = self._promotion()
        if promotion is not None:
            level, job = promotion
            self._levels[level].promoted.add(job)
            tree, hash, _ = self._levels[level].results[job]
            continues = job if self.rungs[level] > 0 else None  # 0 epochs leave no state to go on from
            candidate = self._issue(tree, hash, PROMOTION, (job,), self.rungs[level + 1], continues=continues)
            if (base_id := self._base_of_job.pop(job, None)) is not None:  # promoted once: moves on
                self._base_of_job[candidate.id] = base_id
            return candidate
        proposal = self.base.ask()
        if proposal is None:
            return None
        parents = tuple(self._job_of_base[p] for p in proposal.parents)
        candidate = self._issue(proposal.tree, proposal.hash, proposal.origin, parents, self.rungs[0])
        self._job_of_base[proposal.id] = candidate.id
        self._base_of_job[candidate.id] = proposal.id
        return candidate

    def _promotion(self) -> tuple[int, int] | None:
        """(rung index, job) of the next promotion: favoured ones first, then by rank; from the top
        rung down (finish the nearly done first)."""
        for pick in (_Rung.next_favoured, _Rung.next_promotion):
            for level in range(len(self.rungs) - 2, -1, -1):
                job = pick(self._levels[level])
                if job is not None:
                    return level, job
        return None

    def _issue(
        self,
        tree: str,
        hash: str,
        origin: str,
        parents: tuple[int, ...],
        fidelity: int,
        continues: int | None = None,
    ) -> Candidate:
        candidate = Candidate(self.next_id, tree, hash, origin, parents, fidelity, continues)
        self.next_id += 1
        self._pending[candidate.id] = candidate
        return candidate

    def tell(
        self, candidate_id: int, fitness: float, partial: bool = False, seconds: float | None = None
    ) -> None:
        candidate = self._take_pending(candidate_id)
        level = self.rungs.index(candidate.fidelity)  # type: ignore[arg-type]
        if level + 1 < len(self.rungs):  # the top rung's results are never promoted: not kept
            promotable = not partial and math.isfinite(fitness)
            favoured = candidate.origin.startswith("seed:") or (
                candidate.origin == PROMOTION and candidate.parents[0] in self._levels[level - 1].favoured
            )
            rung = self._levels[level]
            rung.add(candidate.id, candidate.tree, candidate.hash, float(fitness), promotable, favoured)
        base_id = self._base_of_job.pop(candidate.id, None)
        if self.strategy_fitness == "highest_rung" and base_id is not None and level + 1 < len(self.rungs):
            self._base_of_job[candidate.id] = base_id  # its promotion's result goes to the same id
        if candidate.origin != PROMOTION:
            self.base.tell(base_id, fitness, partial=partial, seconds=seconds)  # type: ignore[arg-type]
        elif base_id is not None and not partial and math.isfinite(fitness):
            self.base.hear_promotion(base_id, level, float(fitness))

    @property
    def done(self) -> bool:
        return self.base.done and not self._pending and self._promotion() is None

    def live_states(self) -> set[int]:
        """The evaluations whose trained state a promotion may still go on from: those below the
        top rung in flight, the sources of promotions in flight, and each lower rung's
        `worth_keeping`. A promotion whose source state is gone trains from scratch."""
        top = self.rungs[-1]
        live = {c.id for c in self._pending.values() if c.fidelity != top}
        live |= {c.continues for c in self._pending.values() if c.continues is not None}
        for level in self._levels[:-1]:
            live |= level.worth_keeping()
        return live

    def live_parents(self) -> set[int]:
        """The wrapped strategy's live parents, as the evaluations at the lowest rung that the
        variations name (their trees' weights come from the highest rung each reached)."""
        return {self._job_of_base[i] for i in self.base.live_parents() if i in self._job_of_base}

    def promotions(self) -> int:
        """Promotions issued so far."""
        return sum(len(level.promoted) for level in self._levels)

    def state_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "version": self.state_version,
            "rungs": self.rungs,
            "eta": self.eta,
            "window": self.window,
            "strategy_fitness": self.strategy_fitness,
            "next_id": self.next_id,
            "pending": [c.to_json() for c in self.pending()],
            "levels": [level.to_json() for level in self._levels],
            "base_of_job": [[job, base] for job, base in sorted(self._base_of_job.items())],
            "job_of_base": [[base, job] for base, job in sorted(self._job_of_base.items())],
            "base": self.base.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("strategy") != self.name or state.get("version") != self.state_version:
            raise EinspaceError(
                f"checkpoint is for strategy {state.get('strategy')!r} version {state.get('version')}, "
                f"not {self.name!r} version {self.state_version} (was successive halving switched on?)"
            )
        saved = (
            state["rungs"],
            state["eta"],
            state.get("window"),
            state.get("strategy_fitness", "lowest_rung"),
        )
        rungs, eta, window, strategy_fitness = saved  # an eta of 3 and one of [3, 3] promote alike
        if (rungs, rung_etas(eta, rungs), window, strategy_fitness) != (
            self.rungs,
            rung_etas(self.eta, self.rungs),
            self.window,
            self.strategy_fitness,
        ):
            raise EinspaceError(
                "checkpoint has rungs {}, eta {}, window {} and strategy_fitness {!r}, "
                "not {}, {}, {} and {!r}".format(
                    *saved, self.rungs, self.eta, self.window, self.strategy_fitness
                )
            )
        self.base.load_state_dict(state["base"])
        self.next_id = int(state["next_id"])
        self._pending = {c.id: c for c in map(Candidate.from_json, state["pending"])}
        self._reset()
        self._levels = [
            _Rung.from_json(level, eta, self.window)
            for level, eta in zip(state["levels"], self._etas(), strict=True)
        ]
        self._base_of_job = {int(job): int(base) for job, base in state["base_of_job"]}
        self._job_of_base = {int(base): int(job) for base, job in state["job_of_base"]}

    def _propose(self) -> None:  # pragma: no cover - `ask` is overridden whole
        """Never called: candidates come from `ask`, as promotions or the wrapped strategy's proposals."""
        raise NotImplementedError("SuccessiveHalving issues candidates in ask()")
