"""Racing teachers: replicates in rounds, spent only where a group's answer is still open.

    .venv/bin/python -c "from harness.stats import racing; print(racing.plan(3, 8))"
    .venv/bin/pytest tests/unit/stats/test_racing.py
    .venv/bin/python -m benchmarks.racing --runs 200

A group-sequential design over the rule of `teacher_level.decide_group`. Every teacher of a group
starts with `min_replicates` replicates; after each round (a *look*) the group is decided with
the rule at that look's nominal level. A teacher stops when it is out of the best set and no
longer needed for the comparison with the baseline; the others (the contenders) get one more
replicate each, until the answer is a teacher or "none", or the last look (`max_replicates`) is
reached. A stopped teacher keeps the replicates it has; it is still in every later decision.

Error rates over the repeated looks: the alpha of the fixed design is spent over the planned
looks with a Lan-DeMets spending function (`spent`), O'Brien-Fleming-like by default: little at
the early looks, so the last look's level stays close to the fixed design's and power is kept.
Each look's nominal level is the tail of the exact group-sequential boundary of one
standardised contrast whose information grows with the replicates (`nominal_levels`, Monte
Carlo paths with a fixed seed): the looks of one contrast are strongly correlated, so the levels
add up to more than alpha (a Bonferroni split over looks would sum to alpha and lose the power
the race saves). The information fraction is taken as replicates / max replicates, a lower
bound of the true one, as the test items (a fixed part of every contrast's variance) are the
same at every look: the looks are more correlated than assumed, which makes the boundary
conservative. The whole rule (max-t family, Hsu's best set, the intersection-union "none") is
run at each look's level; that this keeps the group's errors at or below alpha across the looks
is checked by simulation (benchmarks/racing.py, tests/unit/stats/test_racing.py), not derived.

Everything here is a pure function of the replicates at hand, taken in their order (replicate 0,
1, ...): `race_groups` replays the race from the start over whatever is cached, so a race that
is killed and resumed, or rerun, takes the same decisions and asks for the same replicates.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from harness.stats import teacher_level as tl

SPENDING = ("obrien_fleming", "pocock")
_PATHS = 400_000  # boundary paths: Monte Carlo error of a 1% look level about 2% of it


def spent(t: float, alpha: float, kind: str = "obrien_fleming") -> float:
    """Alpha spent by information fraction t in (0, 1] (Lan & DeMets 1983): O'Brien-Fleming-like
    2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)), or Pocock-like alpha ln(1 + (e - 1) t)."""
    if kind == "obrien_fleming":
        return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t)))
    if kind == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"unknown spending function {kind!r}; valid: {', '.join(SPENDING)}")


@functools.lru_cache(maxsize=64)
def nominal_levels(
    fractions: tuple[float, ...], alpha: float, kind: str = "obrien_fleming"
) -> tuple[float, ...]:
    """Each look's two-sided nominal level: the tail of the group-sequential boundary c_k of a
    standardised contrast Z_k = W(t_k) / sqrt(t_k) (W a Brownian motion in information), such
    that the chance of first crossing at look k is the alpha spent between t_{k-1} and t_k.
    One look: alpha itself. Monte Carlo over `_PATHS` paths with a fixed seed (the same levels on
    every call); no closed form exists beyond one look."""
    if len(fractions) == 1:
        return (alpha,)
    t = np.asarray(fractions, dtype=float)
    rng = np.random.default_rng(20261)
    steps = rng.standard_normal((_PATHS, len(t))) * np.sqrt(np.diff(t, prepend=0.0))
    z = np.abs(np.cumsum(steps, axis=1) / np.sqrt(t))
    alive: np.ndarray = np.ones(_PATHS, dtype=bool)
    levels, before = [], 0.0
    for k, tk in enumerate(t):
        now = spent(float(tk), alpha, kind)
        cross = int(round((now - before) * _PATHS))
        before = now
        live = np.sort(z[alive, k])[::-1]
        c = float(live[cross - 1]) if 0 < cross <= live.size else math.inf
        levels.append(float(2 * stats.norm.sf(c)))
        alive &= z[:, k] < c
    return tuple(levels)


@dataclass(frozen=True)
class Plan:
    """A race's looks: the replicates every running teacher has at each look, and each look's
    nominal level."""

    looks: tuple[int, ...]
    levels: tuple[float, ...]
    alpha: float
    spending: str

    @property
    def max_replicates(self) -> int:
        return self.looks[-1]


def plan(
    min_replicates: int, max_replicates: int, alpha: float = 0.05, spending: str = "obrien_fleming"
) -> Plan:
    """One look after every round of one replicate, from `min_replicates` to `max_replicates`."""
    if not 1 <= min_replicates <= max_replicates:
        raise ValueError(f"need 1 <= min {min_replicates} <= max {max_replicates}")
    looks = tuple(range(min_replicates, max_replicates + 1))
    fractions = tuple(r / max_replicates for r in looks)
    return Plan(looks, nominal_levels(fractions, alpha, spending), alpha, spending)


@dataclass
class Race:
    """One group's race so far: the decision at each look taken, who runs on, and what is next."""

    looks: list[tl.GroupDecision] = field(default_factory=list)
    replicates: dict[str, int] = field(default_factory=dict)  # per teacher, used so far
    stopped_at: dict[str, int] = field(default_factory=dict)  # teacher -> look it stopped at
    running: list[str] = field(default_factory=list)  # teachers that get the next round
    done: bool = False  # decided, or at the last look: nothing more to train
    next_replicates: int = 0  # replicates of the next look (0 when done)

    @property
    def decision(self) -> tl.GroupDecision | None:
        """The race's answer so far: the decision at its last look taken."""
        return self.looks[-1] if self.looks else None

    @property
    def needs(self) -> dict[str, int]:
        """Replicates each running teacher needs for the next look (empty when done)."""
        return {} if self.done else dict.fromkeys(self.running, self.next_replicates)

    def adapters(self) -> int:
        return sum(self.replicates.values())


def needed(decision: tl.GroupDecision, effect: float) -> list[str]:
    """The teachers a decision still needs replicates of: the best set, and, while no teacher
    beats the baseline ("none" still possible), every teacher whose one-sided upper bound of gain
    reaches the effect of interest (it alone can keep the answer from "none")."""
    rows = decision.teachers
    some_better = any(r["verdict"] == "better" for r in rows)
    keep = set(decision.best_set)
    if not some_better:
        keep |= {r["teacher"] for r in rows if r["gain_upper"] >= effect}
    return [r["teacher"] for r in rows if r["teacher"] in keep]


def race_groups(
    groups: Mapping[Any, tuple[ArrayLike, Mapping[str, Sequence[ArrayLike]]]],
    race_plan: Plan,
    effect: float = 0.03,
    min_replicates: int = 3,
    borrow: Callable[[Any, Any], bool] | None = None,
) -> dict[Any, Race]:
    """Replay every group's race over the replicates at hand, all groups in step (one look per
    round, as the grid trains its rounds), each look decided as `teacher_level.decide_groups`
    decides a grid (each teacher's replicate variance borrowed across its groups) at the look's
    nominal level. `groups`: key -> (baseline 0/1, teacher -> its draws in replicate order); a
    teacher may have more draws than the race uses (they are ignored). A look is taken only when
    every open group's running teachers have its replicates, since the borrowed variance reads
    every group: the race then stops there and `Race.needs` says what to train next. `borrow`: as
    `teacher_level.decide_groups` takes it, each look's leaders from the replicates used so far."""
    races = {g: Race(running=list(teachers)) for g, (_, teachers) in groups.items()}
    for k, r in enumerate(race_plan.looks):
        open_ = [g for g, race in races.items() if not race.done]
        if not open_ or any(len(groups[g][1][t]) < r for g in open_ for t in races[g].running):
            break  # a look is taken for every open group at once, or for none (see above)
        for g in open_:
            for t in races[g].running:
                races[g].replicates[t] = r
        arms: dict[str, list[np.ndarray]] = {}
        for g, (_, teachers) in groups.items():
            for t, n_used in races[g].replicates.items():
                arms.setdefault(t, []).append(tl.replicate_units(teachers[t][:n_used]))
        prior = tl.teacher_priors(arms)
        used = {
            g: (base, {t: teachers[t][: races[g].replicates[t]] for t in teachers})
            for g, (base, teachers) in groups.items()
        }
        lead = tl.leaders(used, borrow) if borrow is not None else {}
        level = race_plan.levels[k]
        for g in open_:
            base, teachers = groups[g]
            race = races[g]
            d = tl.decide_group(base, used[g][1], level, effect, min_replicates, prior, lead.get(g))
            race.looks.append(d)
            keep = set(needed(d, effect))
            for t in race.running:
                if t not in keep:
                    race.stopped_at[t] = k
            race.running = [t for t in race.running if t in keep]
            last = k == len(race_plan.looks) - 1
            race.done = last or not race.running or d.answer != tl.INCONCLUSIVE
    for race in races.values():
        race.next_replicates = 0 if race.done else race_plan.looks[len(race.looks)]
    return races


def uniform_adapters(n_teachers: int, race_plan: Plan) -> int:
    """Adapters of the uniform design the race replaces: every teacher at the race's maximum."""
    return n_teachers * race_plan.max_replicates


def expected_adapters(
    m: int, n: int, race_plan: Plan, rep_sd: float, spread: float = 0.15, runs: int = 24,
    effect: float = 0.03, min_replicates: int = 3, seed: int = 0,
) -> float:  # fmt: skip
    """Mean adapters (replicate units) of the race of one group of m teachers on n test items, by
    simulation (`teacher_level.simulate`, a fixed seed): true gains spread evenly from `spread`
    down to 0 over a 30% baseline, replicate SD `rep_sd`, no item concordance (the least
    power, so the most adapters). What `cotgap plan` states before anything runs."""
    gains = np.linspace(spread, 0.0, m) if m > 1 else np.array([spread])
    rng = np.random.default_rng(seed)
    base, arms = tl.simulate(
        rng, runs, n, 0.3, list(0.3 + gains), race_plan.max_replicates, rep_sd, 0.0
    )
    total = 0
    for s in range(runs):
        teachers = {f"t{k}": list(a[s]) for k, a in enumerate(arms)}
        total += race_groups({0: (base[s], teachers)}, race_plan, effect, min_replicates)[
            0
        ].adapters()
    return total / runs
