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
import hashlib
from typing import TYPE_CHECKING

from harness.store import Store

if TYPE_CHECKING:
    from harness.config.schema import Experiment
    from harness.workflow.grid import Grid


@dataclasses.dataclass(frozen=True)
class Decision:
    """One candidate task: each teacher's accuracy (None until its select cell is complete),
    the spread in points, and whether the task goes on (None: not decided yet)."""

    task: str
    accuracies: dict[str, float | None]
    min_points: float
    split: str
    run_gated: float = 0.0

    @property
    def sampled(self) -> bool:
        """Among the gated tasks run anyway (`select.run_gated`): a hash of the task's name below
        the share, so each task's draw is fixed and independent of the others'."""
        digest = hashlib.sha256(f"run_gated/{self.task}".encode()).hexdigest()
        return int(digest[:8], 16) / 2**32 < self.run_gated

    @property
    def runs(self) -> bool | None:
        """Whether the task's cells run: it passed, or it is gated and sampled to run anyway."""
        return None if self.passed is None else self.passed or self.sampled

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
        anyway = (
            "; run anyway, in the select.run_gated sample" if self.runs and not self.passed else ""
        )
        return (
            f"teacher spread {self.spread:.1f} pts on the {self.split} split {verb} "
            f"select.min_points {self.min_points:g}{anyway}"
        )


def decide(exp: Experiment, grid: Grid, store: Store) -> dict[str, Decision]:
    """Every candidate task's decision (empty without `select:`)."""
    if exp.select is None:
        return {}
    out: dict[str, Decision] = {}
    for (task, teacher), cell in grid.candidates.items():
        manifest = store.manifest("eval", cell.key)
        acc = (manifest or {}).get("summary", {}).get("accuracy") if manifest else None
        d = out.setdefault(
            task,
            Decision(task, {}, exp.select.min_points, exp.select.split, exp.select.run_gated),
        )
        d.accuracies[teacher] = acc
    return out


def gates(grid: Grid) -> dict[str, tuple[str, ...]]:
    """The select cells each task's other cells wait for, by task."""
    out: dict[str, tuple[str, ...]] = {}
    for (task, _), cell in grid.candidates.items():
        out[task] = (*out.get(task, ()), cell.key)
    return out
