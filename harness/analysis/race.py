"""The race of `train.race` as a grid runs it: replayed from the cached eval cells, its decisions
and what it saved against the uniform design (the cells of its rounds: harness/workflow/race.py).

    cotgap run configs/my-race.yaml        # rounds until every group is decided or at its maximum

The statistics are harness/stats/racing.py's; this module maps them onto the grid. A teacher's
replicate unit is a trace draw (with every training seed it is trained with), taken in the order
of `generate.seeds`; a draw counts once all its adapters are scored, and only the draws before
the first incomplete one count, so the race reads the same replicates however a run was killed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.config.schema import Experiment
from harness.stats import racing, teacher_level
from harness.store import Store
from harness.workflow import grid as grids
from harness.workflow.cells import SCREEN_DIRECTION
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


def summary(
    exp: Experiment,
    race: racing.Race,
    teachers: list[str],
    screened: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What answers.csv, analysis.json and the report say of one group's race: the trace draws
    each teacher got, the look at which each stopped, the teachers its prior screened out
    (`screened`: teacher -> its prior value, rank and why), and the adapters against the
    uniform design (every teacher of `teachers` at max_replicates)."""
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
        "screened_out": dict(screened or {}),
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


def prior_ranks(
    exp: Experiment, grid: grids.Grid, store: Store
) -> dict[tuple, list[tuple[str, float]]]:
    """Under train.race.prior: each (task, student, regime) group's teachers, best first, with
    their prior value: the screen signal of the teacher's first trace draw for that student and
    regime, or the teacher's own test accuracy (teacher_acc). Only the groups whose every value
    is computed (a task that pre-selection gated never is). Ties keep the config's teacher
    order; an unscreenable set (no examples) ranks last."""
    race_cfg = exp.train.race
    assert race_cfg is not None and race_cfg.prior is not None
    prior, first = race_cfg.prior, exp.generate.trace_seeds[0]
    direction = 1 if prior == "teacher_acc" else SCREEN_DIRECTION[prior]
    values: dict[tuple, dict[str, float]] = {}
    waiting: set[tuple] = set()
    for (task, _, teacher, regime, draw, _), d in grid.distilled.items():
        group = (task, d.eval.model, d.eval.regime)
        if draw != first or teacher in values.get(group, {}) or group in waiting:
            continue
        if prior == "teacher_acc":
            cell: Any = grid.teachers.get((task, teacher))
            kind = "eval"
        else:
            cell, kind = grid.screens.get((task, d.eval.model, teacher, regime, draw)), "screen"
        manifest = store.manifest(kind, cell.key) if cell is not None else None
        if manifest is None:
            waiting.add(group)
            continue
        summary = manifest.get("summary") or {}
        value = summary.get("accuracy" if prior == "teacher_acc" else prior)
        if value is None or (kind == "screen" and not summary.get("n_examples")):
            value = math.nan
        values.setdefault(group, {})[teacher] = float(value)

    def order(v: float) -> float:  # best first; NaN (nothing to rank by) last
        return -direction * v if v == v else math.inf

    # a stable sort: ties keep the config's teacher order
    return {
        group: sorted(by_teacher.items(), key=lambda tv: order(tv[1]))
        for group, by_teacher in values.items()
        if group not in waiting
    }


def entrants(exp: Experiment, grid: grids.Grid, store: Store) -> dict[tuple, list[str]] | None:
    """Each group's teachers that race under train.race.prior (the `start` best-ranked, or all,
    best first), for the groups whose prior is computed; None without a prior."""
    race_cfg = exp.train.race
    if race_cfg is None or race_cfg.prior is None:
        return None
    ranks = prior_ranks(exp, grid, store)
    k = race_cfg.start or len(exp.teachers)
    return {g: [t for t, _ in r[:k]] for g, r in ranks.items()}


def screened_out(
    exp: Experiment, grid: grids.Grid, store: Store
) -> dict[tuple, dict[str, dict[str, Any]]]:
    """Per group, each teacher the prior left out of the race: its prior value, its rank, and
    why it did not race (`why`, the board's `screened_out`)."""
    race_cfg = exp.train.race
    if race_cfg is None or race_cfg.prior is None or race_cfg.start is None:
        return {}
    ranks = prior_ranks(exp, grid, store)
    out: dict[tuple, dict[str, dict[str, Any]]] = {}
    for group, ranked in ranks.items():
        for r, (teacher, value) in enumerate(ranked[race_cfg.start :], start=race_cfg.start + 1):
            why = (
                f"screened out by train.race.prior: {race_cfg.prior} {value:.4g}, rank {r} of "
                f"{len(ranked)}, the best {race_cfg.start} raced"
            )
            entry = {"signal": race_cfg.prior, "value": value, "rank": r, "why": why}
            out.setdefault(group, {})[teacher] = entry
    return out
