"""The grid: every cell of an experiment, built once from the config and read by everything else.

    cotgap plan configs/sandbox.yaml

`expand(exp)` is pure: it reads model and task identities, never the store or a stage. Per task,
one traces and one eval cell per teacher; one baseline eval per student, shared by every teacher;
per (student, regime, teacher) one dataset (with a `screen:` section, a screen cell of it), and per
seed an adapter and its eval. A cell shared by
two rows (a baseline is in every distilled row of its student) is one cell. The lookups name each
row's cells, so the analysis reads the grid instead of rebuilding it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from harness import models
from harness.cells import (
    SCREEN_DIRECTION,
    Adapter,
    Cell,
    Dataset,
    Eval,
    Screen,
    Traces,
    model_identities,
    task_identity,
)
from harness.config import Experiment, ScreenConfig
from harness.errors import UserError


@dataclasses.dataclass(frozen=True)
class Distilled:
    """The cells of one distilled row: its eval, adapter, dataset, and its student's baseline."""

    eval: Eval
    adapter: Adapter
    dataset: Dataset
    baseline: Eval
    traces: Traces


@dataclasses.dataclass(frozen=True)
class Gate:
    """`train.teachers_per_student: top_k`: an adapter is trained only if its dataset's screen
    (`screen`) is among the `k` best by `signal` of its (task, student, regime) group (`group`,
    every teacher's screen key in grid order). The scheduler waits for the group's screens and
    skips the others' adapters with the reason; expansion stays pure."""

    screen: str
    group: tuple[str, ...]
    k: int
    signal: str

    def chosen(self, summaries: dict[str, dict]) -> list[str]:
        """The group's screens in screened order, best first (ties: grid order); `summaries` are
        the screen cells' manifest summaries by key. An unscreenable set (no examples) is last."""

        def score(key: str) -> float:
            value = summaries[key].get(self.signal)
            if value is None or value != value or not summaries[key].get("n_examples"):
                return -math.inf
            return SCREEN_DIRECTION[self.signal] * value

        return sorted(self.group, key=lambda key: -score(key))

    def reason(self, summaries: dict[str, dict]) -> str | None:
        """Why the adapter is not trained, or None when it is among the k best."""
        order = self.chosen(summaries)
        if self.screen in order[: self.k]:
            return None
        rank = order.index(self.screen) + 1
        return f"screened out: {self.signal} rank {rank} of {len(order)}, top {self.k} trained"


@dataclasses.dataclass(frozen=True)
class Grid:
    """`cells`: every cell, each after its inputs; the dicts name them by row, in report order."""

    cells: tuple[Cell, ...]
    traces: dict[tuple[str, str], Traces]  # (task, teacher)
    teachers: dict[tuple[str, str], Eval]  # (task, teacher)
    baselines: dict[tuple[str, str], Eval]  # (task, student)
    distilled: dict[
        tuple[str, str, str, str, int], Distilled
    ]  # (task, student, teacher, regime, seed)
    screens: dict[tuple[str, str, str, str], Screen] = dataclasses.field(
        default_factory=dict
    )  # (task, student, teacher, regime); empty without a `screen:` section
    gates: dict[str, Gate] = dataclasses.field(default_factory=dict)  # adapter key -> its gate

    def __iter__(self) -> Iterator[Cell]:
        return iter(self.cells)

    def __len__(self) -> int:
        return len(self.cells)

    def unique(self) -> list[Cell]:
        """One cell per key (the work to do), in order."""
        seen: dict[str, Cell] = {}
        for c in self.cells:
            seen.setdefault(c.key, c)
        return list(seen.values())

    def select(self, **names: object) -> list[Cell]:
        """Cells whose names match every given one (None = any): `grid.select(kind="eval",
        role="baseline", task="gsm8k")`."""
        return [
            c
            for c in self.cells
            if all(v is None or getattr(c, k, None) == v for k, v in names.items())
        ]

    def by_key(self) -> dict[str, Cell]:
        return {c.key: c for c in self.cells}


def expand(exp: Experiment) -> Grid:
    """Every cell of the experiment's grid."""
    ids = model_identities(exp)
    cells: list[Cell] = []
    traces_of, teachers, baselines, distilled, screens = {}, {}, {}, {}, {}
    top_k = exp.train.teachers_per_student == "top_k"
    screening = exp.screen is not None or top_k
    signal = (exp.screen or ScreenConfig()).signal
    for task in (t.name for t in exp.tasks):
        traces = {t.name: Traces.of(exp, ids[t.name], t.name, task) for t in exp.teachers}
        cells.extend(traces.values())
        traces_of.update({(task, t): c for t, c in traces.items()})
        for t in exp.teachers:
            teachers[task, t.name] = Eval.of(exp, ids[t.name], t.name, task, role="teacher")
            cells.append(teachers[task, t.name])
        for s in exp.students:
            base = baselines[task, s.name] = Eval.of(exp, ids[s.name], s.name, task)
            cells.append(base)
            for regime in exp.train.regimes:
                for t in exp.teachers:
                    d = Dataset.of(exp, ids[s.name], s.name, t.name, task, regime, traces)
                    cells.append(d)
                    if screening:
                        screen = Screen.of(exp, ids[s.name], d)
                        screens[task, s.name, t.name, regime] = screen
                        cells.append(screen)
                    for seed in exp.train.seeds:
                        a = Adapter.of(exp, ids[s.name], d, seed)
                        names = {"teacher": t.name, "regime": regime, "seed": seed}
                        e = Eval.of(exp, ids[s.name], s.name, task, a, role="distilled", **names)
                        cells.extend((a, e))
                        row = (task, s.name, t.name, regime, seed)
                        distilled[row] = Distilled(e, a, d, base, traces[t.name])
    gates = {}
    if top_k:
        for (task, student, teacher, regime, _), d in distilled.items():
            group = tuple(
                c.key for (t, s, _, r), c in screens.items() if (t, s, r) == (task, student, regime)
            )
            mine = screens[task, student, teacher, regime].key
            gates[d.adapter.key] = Gate(mine, group, exp.train.top_k, signal)
    return Grid(tuple(cells), traces_of, teachers, baselines, distilled, screens, gates)


def check(exp: Experiment) -> list[str]:
    """Every problem `expand` would stop at, all at once, without planning: a model that cannot be
    identified (a missing local path, an unknown zoo model), a task file that does not load (no
    `version`, an unknown extractor). `cotgap validate` reports them."""
    problems = []
    for m in (*exp.teachers, *exp.students):
        try:
            models.identity(m)
        except UserError as e:
            problems.append(str(e))
    for t in exp.tasks:
        try:
            task_identity(exp, t.name, "test")
        except UserError as e:
            problems.append(str(e))
    if not problems:
        try:
            expand(exp)
        except UserError as e:
            problems.append(str(e))
    return problems
