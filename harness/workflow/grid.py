"""The grid: every cell of an experiment, built once from the config and read by everything else.

    cotgap plan configs/sandbox.yaml

`expand(exp)` is pure: it reads model and task identities, never the store or a stage. Per task,
one traces cell per teacher and trace draw (`generate.seeds`; one draw at `generate.seed` without
it) and one eval cell per teacher; one baseline eval per student, shared by every teacher and
draw; per (student, regime, teacher, trace draw) one dataset built from that draw's traces only
(the mix regime: one per student and draw; with a `screen:` section, a screen cell of it), and
per training seed paired with the draw (`train.replicates`: crossed, every seed; paired, the
draw's own), budget alignment (train.budget.align) and distillation method (train.methods) an
adapter and its eval. A cell shared by
two rows (a baseline is in every distilled row of its student) is one cell. The lookups name each
row's cells, so the analysis reads the grid instead of rebuilding it. With `select:`, each task
first has one select eval per teacher (phase 0; harness/workflow/selection.py decides from them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from harness.config.schema import Experiment, ScreenConfig
from harness.errors import UserError
from harness.models import sources as models
from harness.workflow import regimes
from harness.workflow.cells import (
    SCREEN_DIRECTION,
    Adapter,
    Cell,
    Dataset,
    Eval,
    Screen,
    Traces,
    model_identities,
    shared_identities,
    task_identity,
)
from harness.workflow.regimes import MIX_TEACHER


@dataclasses.dataclass(frozen=True)
class Distilled:
    """The cells of one distilled row, one replicate of its (task, student, teacher, regime): its
    eval, adapter, dataset, its student's baseline, and the traces of its trace draw
    (`trace_seed`) that the adapter trained on with `train_seed`."""

    eval: Eval
    adapter: Adapter
    dataset: Dataset
    baseline: Eval
    traces: Traces | None  # None for a mix row (its traces are its dataset's inputs)
    trace_seed: int
    train_seed: int


@dataclasses.dataclass(frozen=True)
class Gate:
    """`train.teachers_per_student: top_k`: an adapter is trained only if its dataset's screen
    (`screen`) is among the `k` best by `signal` of its (task, student, regime, trace draw) group
    (`group`, every teacher's screen key of that draw, in grid order). The scheduler waits for the
    group's screens and skips the others' adapters with the reason; expansion stays pure."""

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
    traces: dict[tuple[str, str, int], Traces]  # (task, teacher, trace_seed)
    teachers: dict[tuple[str, str], Eval]  # (task, teacher)
    baselines: dict[tuple[str, str], Eval]  # (task, student)
    distilled: dict[
        tuple[str, str, str, str, int, int], Distilled
    ]  # (task, student, teacher, regime, trace_seed, train_seed)
    candidates: dict[tuple[str, str], Eval] = dataclasses.field(
        default_factory=dict
    )  # (task, teacher): select cells; empty without a `select:` section
    screens: dict[tuple[str, str, str, str, int], Screen] = dataclasses.field(
        default_factory=dict
    )  # (task, student, teacher, regime, trace_seed); empty without a `screen:` section
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
    with shared_identities():
        return _expand(exp)


def _expand(exp: Experiment) -> Grid:
    ids = model_identities(exp)
    cells: list[Cell] = []
    rows = _Rows()
    # a trace draw's cells name it (trace_seed) only where the experiment gives generate.seeds
    named = {s: (None if exp.generate.seeds is None else s) for s in exp.generate.trace_seeds}
    for task in (t.name for t in exp.tasks):
        if exp.select is not None:  # phase 0: the teachers on the candidate task
            for t in exp.teachers:
                rows.candidates[task, t.name] = Eval.selection(exp, ids[t.name], t.name, task)
                cells.append(rows.candidates[task, t.name])
        draws = {}
        for seed, name in named.items():
            draws[seed] = {
                t.name: Traces.of(exp, ids[t.name], t.name, task, name) for t in exp.teachers
            }
            cells.extend(draws[seed].values())
            rows.traces.update({(task, t, seed): c for t, c in draws[seed].items()})
        for t in exp.teachers:
            rows.teachers[task, t.name] = Eval.of(exp, ids[t.name], t.name, task, role="teacher")
            cells.append(rows.teachers[task, t.name])
        for s in exp.students:
            base = rows.baselines[task, s.name] = Eval.of(exp, ids[s.name], s.name, task)
            cells.append(base)
            for seed, traces in draws.items():
                _student_draw(exp, ids[s.name], s.name, task, base, seed, traces, cells, rows)
    return Grid(
        tuple(cells),
        rows.traces,
        rows.teachers,
        rows.baselines,
        rows.distilled,
        candidates=rows.candidates,
        screens=rows.screens,
        gates=_gates(exp, rows),
    )


@dataclasses.dataclass
class _Rows:
    """The grid's lookups while it is built."""

    traces: dict = dataclasses.field(default_factory=dict)
    teachers: dict = dataclasses.field(default_factory=dict)
    baselines: dict = dataclasses.field(default_factory=dict)
    distilled: dict = dataclasses.field(default_factory=dict)
    candidates: dict = dataclasses.field(default_factory=dict)
    screens: dict = dataclasses.field(default_factory=dict)


def _student_draw(
    exp: Experiment,
    ident: dict,
    student: str,
    task: str,
    base: Eval,
    trace_seed: int,
    traces: dict[str, Traces],
    cells: list[Cell],
    rows: _Rows,
) -> None:
    """A student's cells on one trace draw (`traces`: every teacher's traces of the draw): per
    regime and teacher a dataset (and its screen), per training seed paired with the draw and
    budget alignment an adapter and its eval."""
    screening = exp.screen is not None or exp.train.teachers_per_student == "top_k"
    train_seeds = [b for a, b in exp.replicates() if a == trace_seed]
    reference = _reference(exp, ident, student, task, traces, cells)
    sets: dict[tuple[str, str], Dataset] = {}
    for align in exp.train.budget.align:
        for regime in exp.train.regimes:
            if not regimes.aligned(exp.train, regime, align):
                continue
            names = [MIX_TEACHER] if regime == "mix" else [t.name for t in exp.teachers]
            for t in names:
                if (regime, t) not in sets:  # one set, whatever the budget
                    d = sets[regime, t] = Dataset.of(exp, ident, student, t, task, regime, traces)
                    cells.append(d)
                    if screening:
                        screen = Screen.of(exp, ident, d)
                        rows.screens[task, student, t, regime, trace_seed] = screen
                        cells.append(screen)
                d = sets[regime, t]
                for method in exp.train.methods:
                    for seed in train_seeds:
                        a = Adapter.of(exp, ident, d, seed, align, reference, method)
                        _distilled(exp, ident, a, d, base, traces.get(t), cells, rows)


def _distilled(
    exp: Experiment,
    ident: dict,
    a: Adapter,
    d: Dataset,
    base: Eval,
    traces: Traces | None,
    cells: list[Cell],
    rows: _Rows,
) -> None:
    """An adapter, its eval and its row (the row's regime names its alignment and method)."""
    names = {"teacher": d.teacher, "regime": a.regime, "seed": a.seed, "trace_seed": d.trace_seed}
    e = Eval.of(exp, ident, a.student, a.task, a, role="distilled", **names)
    cells.extend((a, e))
    draw = exp.generate.seed if d.trace_seed is None else d.trace_seed
    row = (a.task, a.student, d.teacher, a.regime, draw, a.seed)
    rows.distilled[row] = Distilled(e, a, d, base, traces, draw, a.seed)


def _gates(exp: Experiment, rows: _Rows) -> dict[str, Gate]:
    """With top_k: per adapter, the gate of its (task, student, regime of the set, trace draw)."""
    if exp.train.teachers_per_student != "top_k":
        return {}
    signal = (exp.screen or ScreenConfig()).signal
    groups: dict[tuple, list[str]] = {}
    for (task, student, _, regime, draw), c in rows.screens.items():
        groups.setdefault((task, student, regime, draw), []).append(c.key)
    gates = {}
    for (task, student, teacher, _, draw, _), d in rows.distilled.items():
        regime = d.dataset.regime
        mine = rows.screens[task, student, teacher, regime, draw].key
        group = tuple(groups[task, student, regime, draw])
        gates[d.adapter.key] = Gate(mine, group, exp.train.top_k, signal)
    return gates


def _reference(
    exp: Experiment, ident: dict, student: str, task: str, traces: dict, cells: list[Cell]
) -> Dataset | None:
    """The per_teacher set budgets align to (train.budget.reference, default the first teacher)
    of one trace draw, a cell of the grid even where per_teacher is not one of its regimes; None
    when nothing aligns."""
    if set(exp.train.budget.align) <= {"none", "batch"}:  # neither aligns to a reference
        return None
    teacher = exp.train.budget.reference or exp.teachers[0].name
    d = Dataset.of(exp, ident, student, teacher, task, "per_teacher", traces)
    cells.append(d)
    return d


def expand_problems(exp: Experiment) -> list[str]:
    """Every problem `expand` would stop at, all at once, without planning: a model that cannot be
    identified (a missing local path, an unknown zoo model), a task file that does not load (no
    `version`, an unknown extractor). `cotgap validate` reports them."""
    from harness.workflow import checks

    problems = checks.problems(exp)
    failed: set[str | None] = set()
    for m in (*exp.students, *exp.teachers):
        if m.path in failed and not m.served:  # one model in two roles (`cotgap eval`): said once
            continue
        try:
            models.identity(m)
        except UserError as e:
            problems.append(str(e))
            failed.add(m.path)
    for t in exp.tasks:
        try:
            task_identity(exp, t.name, "test")
        except UserError as e:
            problems.append(str(e))
    problems += _fewshot_problems(exp)
    if not problems:
        problems += tokenizer_problems(exp)
    if not problems:
        try:
            expand(exp)
        except UserError as e:
            problems.append(str(e))
    return problems


def _fewshot_problems(exp: Experiment) -> list[str]:
    """The tasks some stage prompts few-shot (selection, traces, evaluation) that cannot."""
    from harness.tasks import suite as tasks

    styles = [exp.generate.prompt_style, exp.evaluate.prompt_style]
    styles += [exp.select.prompt_style] if exp.select is not None else []
    if "few_shot_cot" not in styles:
        return []
    return tasks.fewshot_problems([t.name for t in exp.tasks], exp.data_dir)


def tokenizer_problems(exp: Experiment) -> list[str]:
    """With kd or on_policy in train.methods: every teacher and student must share a tokenizer
    (the losses compare next-token distributions id by id), and kd's top_k must fit in it."""
    if not {"kd", "on_policy"} & set(exp.train.methods):
        return []
    served = [t.name for t in exp.teachers if t.served]
    if served:  # neither runs on text alone: kd reads stored top-k, on_policy scores in-process
        return [
            f"train.methods: kd and on_policy need the teacher's next-token distribution, which "
            f"a served teacher ({', '.join(served)}; engine.kind: openai) does not give here; "
            f"keep only sft in train.methods for it, or run that teacher in-process."
        ]
    student = exp.students[0]
    ref, problems = model_vocab(student), []
    for m in (*exp.teachers, *exp.students[1:]):
        mine = model_vocab(m)
        if mine != ref:
            differ = sorted(set(mine.items()) ^ set(ref.items()))[:3]
            problems.append(
                f"train.methods: kd and on_policy compare the teacher's and the student's "
                f"next-token distributions id by id, so every teacher and student must share one "
                f"tokenizer; {m.name} ({len(mine)} tokens) and {student.name} ({len(ref)} tokens) "
                f"do not (e.g. {differ}). Use models of one family, or keep only sft in "
                f"train.methods."
            )
    if "kd" in exp.train.methods and exp.train.kd.top_k > len(ref):
        problems.append(
            f"train.kd.top_k: {exp.train.kd.top_k} is more than the {len(ref)} tokens of the "
            f"tokenizer; give at most {len(ref)} (all of it: kd on the full distribution)."
        )
    return problems


def model_vocab(m: Any) -> dict[str, int]:
    """A model's vocabulary (token -> id, added tokens included): from its tokenizer.json through
    `tokenizers` (no transformers import: `validate` stays fast), else through transformers."""
    from pathlib import Path

    path = Path(models.resolve(m)) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path.parent, trust_remote_code=m.trust_remote_code)
    return tok.get_vocab()
