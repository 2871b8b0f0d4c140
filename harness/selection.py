"""Task pre-selection (`select:`): which candidate tasks go on to traces, training and evaluation,
decided from the teachers' select evals (phase 0) by the teacher accuracy spread.

    cotgap plan configs/paper-study.yaml     # each task's decision, once its select cells ran

The grid holds every candidate's cells (grid.expand stays pure); the scheduler holds a task's
other cells until its select cells are done, then skips them with the reason when the task is
gated. Selection reads the `select.split` items only: train by default, since choosing tasks on
the test items that later score the students is a leak.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harness.store import Store

if TYPE_CHECKING:
    from harness.config import Experiment
    from harness.grid import Grid


@dataclasses.dataclass(frozen=True)
class Decision:
    """One candidate task: each teacher's accuracy (None until its select cell is complete),
    the spread in points, and whether the task goes on (None: not decided yet)."""

    task: str
    accuracies: dict[str, float | None]
    min_points: float
    split: str

    @property
    def spread(self) -> float | None:
        accs = list(self.accuracies.values())
        if not accs or any(a is None for a in accs):
            return None
        return 100 * (max(accs) - min(accs))  # type: ignore[type-var, operator]

    @property
    def passed(self) -> bool | None:
        spread = self.spread
        return None if spread is None else spread >= self.min_points

    @property
    def reason(self) -> str:
        if self.passed is None:
            return "not decided: its select cells are not computed yet"
        verb = "reaches" if self.passed else "is below"
        return (
            f"teacher spread {self.spread:.1f} pts on the {self.split} split {verb} "
            f"select.min_points {self.min_points:g}"
        )


def decide(exp: Experiment, grid: Grid, store: Store) -> dict[str, Decision]:
    """Every candidate task's decision (empty without `select:`)."""
    if exp.select is None:
        return {}
    out: dict[str, Decision] = {}
    for (task, teacher), cell in grid.candidates.items():
        manifest = store.manifest("eval", cell.key)
        acc = (manifest or {}).get("summary", {}).get("accuracy") if manifest else None
        d = out.setdefault(task, Decision(task, {}, exp.select.min_points, exp.select.split))
        d.accuracies[teacher] = acc
    return out


def gates(grid: Grid) -> dict[str, tuple[str, ...]]:
    """The select cells each task's other cells wait for, by task."""
    out: dict[str, tuple[str, ...]] = {}
    for (task, _), cell in grid.candidates.items():
        out[task] = (*out.get(task, ()), cell.key)
    return out
