"""Which cells a race of `train.race` wants: the grid's cells but the distilled rows', and the
distilled rows of the trace draws each group's race has used or asks for next.

    .venv/bin/python -c "from harness.workflow import race; help(race.round_cells)"

The race itself (who stops, the decisions) is harness/stats/racing.py's, replayed over the cached
cells by harness/analysis/race.py; `cotgap plan` reads the first look's cells from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.config.schema import Experiment
from harness.stats import racing
from harness.workflow import grid as grids
from harness.workflow.cells import Cell


def race_plan(exp: Experiment) -> racing.Plan | None:
    """The race's looks and levels, or None without `train.race`."""
    race = exp.train.race
    if race is None:
        return None
    return racing.plan(race.min_replicates, race.max_replicates, 1 - exp.analysis.ci)


def adapters_per_draw(exp: Experiment) -> int:
    """Adapters one trace draw of one (task, student, teacher, regime) trains."""
    return 1 if exp.train.replicates == "paired" else len(exp.train.seeds)


# (task, student, regime) -> the teachers that race under train.race.prior, best first
Entrants = Mapping[Any, Sequence[str]]


def round_cells(
    exp: Experiment,
    grid: grids.Grid,
    races: Mapping[Any, Mapping[str, Any]],
    entrants: Entrants | None = None,
) -> list[Cell]:
    """The cells the race wants computed so far: every cell but the distilled rows' (teacher
    evals, baselines, selection), and the distilled evals (with their screens) of the draws each
    group's race has used or asks for next (`races`: each (task, student, regime) group's race
    summary, harness/analysis/race.py); before the race starts, every group's first look. Their
    inputs (adapters, training sets, traces) come with them.

    With `train.race.prior`, `entrants` are the teachers that race in each group whose prior is
    computed (harness/analysis/race.py `entrants`); every round holds what ranks them (the first
    trace draw's screens for a screen signal; the teacher evals, for teacher_acc, are in every
    round anyway), and a group not ranked yet trains nothing. A teacher outside its group's
    entrants is never trained."""
    plan = race_plan(exp)
    assert plan is not None
    order = {s: i for i, s in enumerate(exp.generate.trace_seeds)}
    rows = {id(c) for d in grid.distilled.values() for c in (d.eval, d.adapter, d.dataset)}
    rows |= {id(c) for c in (*grid.traces.values(), *grid.screens.values())}
    out = [c for c in grid.cells if id(c) not in rows]
    if exp.train.race is not None and exp.train.race.prior is not None:
        first = exp.generate.trace_seeds[0]
        out += [c for (*_, draw), c in grid.screens.items() if draw == first]
        entrants = entrants or {}
    for (task, _, teacher, regime, draw, _), d in grid.distilled.items():
        group = (task, d.eval.model, d.eval.regime)
        if entrants is not None and teacher not in entrants.get(group, ()):
            continue
        if order[draw] < _wanted(races.get(group), teacher, plan):
            out.append(d.eval)
            screen = grid.screens.get((task, d.eval.model, teacher, regime, draw))
            if screen is not None:
                out.append(screen)
    return list({id(c): c for c in out}.values())  # a first draw's screen is listed once


def _wanted(summary: Mapping[str, Any] | None, teacher: str, plan: racing.Plan) -> int:
    """Draws of `teacher` the race has used or asks for next."""
    if summary is None:
        return plan.looks[0]
    used = summary["replicates"].get(teacher, 0)
    return max(used, summary["next_replicates"]) if teacher in summary["running"] else used
