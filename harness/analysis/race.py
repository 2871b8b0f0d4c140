"""The race of `train.race` as a grid runs it: replayed from the cached eval cells, its decisions
and what it saved against the uniform design (the cells of its rounds: harness/workflow/race.py).

    cotgap run configs/my-race.yaml        # rounds until every group is decided or at its maximum

The statistics are harness/stats/racing.py's; this module maps them onto the grid. A teacher's
replicate unit is a trace draw (with every training seed it is trained with), taken in the order
of `generate.seeds`; a draw counts once all its adapters are scored, and only the draws before
the first incomplete one count, so the race reads the same replicates however a run was killed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.config.schema import Experiment
from harness.stats import racing, teacher_level
from harness.workflow import grid as grids
from harness.workflow.race import adapters_per_draw, race_plan


def draws_in_order(exp: Experiment, reps: list[Any]) -> list[np.ndarray]:
    """A teacher's complete trace draws as (training seeds, items) arrays, in generate.seeds
    order, up to the first draw that is not complete (`reps`: its analyze.Replicate rows)."""
    by_draw: dict[Any, list[np.ndarray]] = {}
    for r in reps:
        by_draw.setdefault(r.trace_seed, []).append(r.correct)
    out = []
    for seed in exp.generate.trace_seeds:
        got = by_draw.get(seed, [])
        if len(got) < adapters_per_draw(exp):
            break
        out.append(np.stack(got))
    return out


def group_keys(grid: grids.Grid) -> set[tuple]:
    """The (task, student, regime) groups of the grid's distilled rows, as analyze keys them."""
    return {(task, d.eval.model, d.eval.regime) for (task, *_), d in grid.distilled.items()}


def run(
    exp: Experiment,
    groups: Mapping[Any, tuple[np.ndarray, Mapping[str, list[Any]]]],
    expected: set[Any],
) -> dict[Any, racing.Race]:
    """Every group's race over its cached replicates (`groups`: analyze's baseline vector and,
    per teacher, its Replicate rows). Empty until every `expected` group has a scored baseline:
    the first look reads every group at once (the replicate variance is borrowed across them),
    so a race never starts on part of the grid."""
    plan = race_plan(exp)
    assert plan is not None
    if not expected <= set(groups):
        return {}
    draws = {
        key: (base, {t: draws_in_order(exp, reps) for t, reps in teachers.items()})
        for key, (base, teachers) in groups.items()
    }
    a = exp.analysis
    return racing.race_groups(
        draws, plan, a.effect_of_interest / 100, a.min_replicates, teacher_level.other_task
    )


def summary(exp: Experiment, race: racing.Race, teachers: list[str]) -> dict[str, Any]:
    """What answers.csv, analysis.json and the report say of one group's race: the trace draws
    each teacher got, the look at which each stopped, and the adapters against the uniform
    design (every teacher at max_replicates)."""
    plan = race_plan(exp)
    assert plan is not None
    per = adapters_per_draw(exp)
    adapters = per * sum(race.replicates.get(t, 0) for t in teachers)
    uniform = per * racing.uniform_adapters(len(teachers), plan)
    return {
        "replicates": {t: race.replicates.get(t, 0) for t in teachers},
        "stopped_at_look": dict(race.stopped_at),
        "looks": len(race.looks),
        "done": race.done,
        "adapters": adapters,
        "uniform_adapters": uniform,
        "adapters_saved": uniform - adapters,
        "levels": list(plan.levels),
        "running": list(race.running),
        "next_replicates": race.next_replicates,
    }


def beyond(exp: Experiment, grid: grids.Grid, races: Mapping[Any, racing.Race]) -> set[str]:
    """Keys of the cells a finished race did not need (their teacher stopped, or the group was
    decided): the distilled rows' evals, adapters and training sets, and the traces no raced row
    read. Skipped by design, never "not computed yet"."""
    order = {s: i for i, s in enumerate(exp.generate.trace_seeds)}
    out, used = set(), set()
    for (task, _, teacher, _, draw, _), d in grid.distilled.items():
        race = races.get((task, d.eval.model, d.eval.regime))
        shared = {d.dataset.key} | ({d.traces.key} if d.traces is not None else set())
        if race is None or (not race.done and teacher in race.running):
            used |= shared
        elif order[draw] >= race.replicates.get(teacher, 0):
            out |= {d.eval.key, d.adapter.key} | shared
        else:
            used |= shared
    return out - used
