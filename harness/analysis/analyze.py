"""Capacity-gap analysis: leaderboard.csv, answers.csv and analysis.json, rebuilt from the cells.

    cotgap analyze configs/sandbox.yaml

Reads only the complete cells of the grid (`grid.expand(exp)`); a cell not computed yet leaves NaN
in its row and is counted, never fatal. Each distilled student is paired item by item (by id) with
its own baseline (same student, task and eval config). Inside each (task, student, regime) group
the teachers, not single adapters, are compared: `teacher_level.decide_group` pools each teacher's
replicates (trace draws and training seeds) and states, once, every teacher against the baseline
and against every other (better / worse / equivalent / inconclusive), the confidence set for the
best teacher and the group's answer; the leaderboard, answers.csv, the report, the viewer and the
plots all read that one decision. Writes `<results>/<experiment>/analysis/` (leaderboard.csv,
answers.csv, analysis.json, report.md, plots) as one directory swapped in whole.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from harness.analysis import race, screening, spend
from harness.config.hashing import canonical
from harness.config.schema import AnalysisConfig, Experiment
from harness.errors import UserError
from harness.execution import schedule
from harness.models import sources as models
from harness.stats import adapters, grid_level, teacher_level
from harness.store import Store, atomic_write_json, atomic_write_text, read_json, read_jsonl
from harness.tasks import answers, scoring
from harness.workflow import grid as grids
from harness.workflow import race as race_cells
from harness.workflow import regimes, selection
from harness.workflow.cells import Cell, Eval, Traces

COLUMNS: dict[str, str] = {
    "row_type": "teacher | baseline | distilled: what the row scores",
    "task": "task name",
    "student": "student model (baseline and distilled rows)",
    "teacher": "teacher model (teacher and distilled rows)",
    "regime": "training-set regime: per_teacher | intersection | matched | mix, with @align when "
    "the budget is aligned (distilled rows)",
    "method": "distillation method: sft | kd | on_policy (distilled rows); a method other than sft "
    "also ends the regime (`+kd`), so every per-regime analysis is per method",
    "seed": "training seed (distilled rows)",
    "trace_seed": "trace-sampling seed of the traces the row's training set was drawn from: one of "
    "generate.seeds, else generate.seed (distilled rows)",
    "base_acc": "student's test accuracy without distillation, a fraction in [0, 1]",
    "post_acc": "distilled student's test accuracy, a fraction in [0, 1]; where its training set is empty (n_train_examples 0: the teacher gave no usable trace), nothing is trained and this is the baseline's",
    "gain": "post_acc - base_acc on the same test items, a fraction in [-1, 1]",
    "gain_ci_low": "lower end of this adapter's gain CI over test items alone (analysis.ci, "
    "unadjusted): describes one trained adapter, never the teacher; see teacher_gain_low",
    "gain_ci_high": "upper end of this adapter's gain CI over test items alone (see gain_ci_low)",
    "mcnemar_p": "exact two-sided McNemar p-value of this adapter against the baseline, "
    "unadjusted (one adapter; the teacher-level verdict is `verdict`)",
    "degraded": "gain < 0: this adapter scored below the baseline (a point estimate)",
    "teacher_gain": "the teacher's gain over the baseline: mean over its replicates (trace draws "
    "and training seeds) of post_acc - base_acc, a fraction (harness/stats/teacher_level.py)",
    "teacher_gain_low": "lower end of the teacher's gain interval over test items and replicates, "
    "simultaneous over the group's comparisons, a max-t family (the interval `verdict` reads)",
    "teacher_gain_high": "upper end of the teacher's gain interval (see teacher_gain_low)",
    "verdict": "the teacher against the student's baseline, one of better | worse | equivalent | "
    "inconclusive (always inconclusive below analysis.min_replicates replicates: exploratory)",
    "in_best_set": "the teacher is in the group's confidence set for the best teacher (multiple "
    "comparisons with the best: no other teacher is shown above it)",
    "n_replicates": "replicate units of this teacher in its group (trace draws, else training seeds)",
    "teacher_acc": "teacher's test accuracy under the same eval config, a fraction in [0, 1]",
    "teacher_train_acc": "teacher's train-split yield: share of questions with a correct trace, in "
    "[0, 1]; a teacher row: the mean over its trace draws, a distilled row: its own draw's",
    "n_test": "test items scored (for distilled rows: items paired with the baseline)",
    "n_train_examples": "examples in the distilled row's training set",
    "train_tokens": "tokens in the distilled row's training set",
    "mean_trace_tokens": "mean tokens of a training trace",
    "format_fail_rate": "share of the row's test completions with no extractable answer, in [0, 1]",
    "truncation_rate": "share of the row's test completions cut at max_tokens, in [0, 1]",
    "two_pass_acc": "the row's test accuracy with the second answer pass (evaluate.answer_pass: an "
    "answer trigger where a completion gave none), beside the one-pass accuracy; empty when off",
    "engine": "engine that wrote the row's test completions: vllm | hf",
    "student_size": "student parameters (the config's size, else counted in its local safetensors; empty if unknown)",
    "teacher_size": "teacher parameters (the config's size, else counted in its local safetensors; empty if unknown)",
    "eval_key": "eval cell the row scores",
    "adapter_key": "adapter cell of a distilled row",
    "traces_key": "traces cell of the row's teacher on this task: a distilled row's own trace "
    "draw, a teacher row's first",
    "baseline_key": "baseline eval cell of the row's student on this task",
    "seed_sd": "raw SD of post_acc across the replicates (trace draws x training seeds) of this "
    "(task, student, teacher, regime) (empty with one): it holds each adapter's item-level noise "
    "too, so it is larger than the report's between-replicate SD (a variance component)",
    "screened_out": "why a distilled row was not trained: its teacher screened out by train.teachers_per_student: top_k (empty: trained)",
}
COLUMNS.update(spend.COLUMNS)  # what the rows cost (harness/analysis/spend.py)
_DTYPES = {
    "seed": "Int64",
    "trace_seed": "Int64",
    "n_test": "Int64",
    "n_train_examples": "Int64",
    "train_tokens": "Int64",
    "degraded": "boolean",
    "in_best_set": "boolean",
    "n_replicates": "Int64",
}
NAN = math.nan


def run(exp: Experiment, store: Store, log: Callable[[str], None] = print) -> Path:
    """Rebuild `<store.root>/analysis/` (= `<exp.root>/analysis/`) from the cells; returns it."""
    from harness.analysis import health, report, studies

    board, missing, rescored, decisions = leaderboard(exp, store)
    result = analyse(exp, board, decisions)
    result["missing_cells"] = missing
    result["warnings"] = health.problems(exp, store, grids.expand(exp).cells)
    result["rescored_cells"] = rescored
    result["budget"] = training_budget(exp, store, board)
    result["adapter_budgets"] = adapter_budgets(store, board)
    result["teacher_topk"] = teacher_topk(store, board)
    result["selection"] = [
        {"task": d.task, "accuracies": d.accuracies, "spread": d.spread, "passed": d.passed,
         "reason": d.reason, "split": d.split, "min_points": d.min_points, "runs": d.runs}
        for d in selection.decide(exp, grids.expand(exp), store).values()
    ]  # fmt: skip
    result["eval_config"] = canonical(exp.evaluate)
    result["studies"] = studies.run(exp, board, result, group_arms(exp, store, board))
    answers_df = answers_table(exp, result["groups"])
    out = store.root / "analysis"
    # what a killed analysis left (the results-directory lock says no other one is running)
    for stale in [*out.parent.glob(".analysis.tmp-*"), *out.parent.glob(".analysis.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.with_name(f".analysis.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        atomic_write_text(tmp / "leaderboard.csv", board.to_csv(index=False))
        atomic_write_text(tmp / "answers.csv", answers_df.to_csv(index=False))
        posts = lambda: item_posts(exp, store, board)  # noqa: E731 (read only with screen cells)
        result["screening"] = screening.write(tmp, exp, store, board, posts)
        atomic_write_json(tmp / "analysis.json", jsonable(result))
        report.write(tmp, exp, board, result)
        _swap_in(tmp, out)
    except OSError as e:  # atomic_write_* report their own; report.md and the plots do not
        raise UserError(
            f"{out}: could not write the analysis ({e.strerror}); free disk space or fix "
            "permissions, then re-run `cotgap analyze` (the earlier analysis is kept)."
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a swap; removes a half-written one
    if rescored:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(rescored.items()))
        log(
            f"analysis: {sum(rescored.values())} cell(s) scored by an earlier extractor version "
            f"re-scored from their completions ({counts}); the cells are kept as they are"
        )
    if missing:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(missing.items()))
        log(
            f"analysis: {sum(missing.values())} cell(s) not computed yet ({counts}); NaN in their rows"
        )
    return out


def _swap_in(tmp: Path, out: Path) -> None:
    """Replace `out` by `tmp` whole, so no stale plot or half-written file survives a rebuild."""
    old = out.with_name(f".analysis.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


# --- reading cells -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """One complete eval cell: headline correctness by test item id, and its metrics.json."""

    key: str
    correct: dict[Any, bool]
    metrics: dict[str, Any]

    @property
    def accuracy(self) -> float:
        return scoring.accuracy(self.correct.values()) if self.correct else NAN

    def rate(self, name: str) -> float:
        value = self.metrics.get(name)
        return NAN if value is None else float(value)


class _Reader:
    """Complete cells of a store, each read once; the absent ones are remembered for the warning,
    the re-scored ones counted. `data_dir`: where re-scoring finds option texts."""

    def __init__(self, store: Store, data_dir: str | None = None):
        self.store = store
        self.data_dir = data_dir
        self.absent: set[tuple[str, str]] = set()
        self.rescored: set[tuple[str, str]] = set()
        self._evals: dict[str, EvalResult | None] = {}

    def summary(self, kind: str, key: str) -> dict[str, Any]:
        manifest = self.store.manifest(kind, key)
        if manifest is None:
            self.absent.add((kind, key))
            return {}
        return manifest.get("summary") or {}

    def eval(self, key: str) -> EvalResult | None:
        if key not in self._evals:
            if self.store.complete("eval", key):
                ev = _read_eval(self.store.cell_dir("eval", key), key, self.data_dir)
                if ev.metrics.get("rescored"):
                    self.rescored.add(("eval", key))
                self._evals[key] = ev
            else:
                self.absent.add(("eval", key))
                self._evals[key] = None
        return self._evals[key]

    def traces_yield(self, key: str) -> float:
        """The teacher's yield; from its traces re-scored when an earlier extractor version
        scored them (as the dataset stage selects them)."""
        summary = self.summary("traces", key)
        if not scoring.rescore_due(summary):
            return summary.get("yield", NAN)
        from harness.stages.generate import summarize

        records = scoring.rescore_cell(self.store.cell_dir("traces", key), self.data_dir)
        self.rescored.add(("traces", key))
        n = summary["samples_per_item"]
        return summarize(records, summary["n_items"], n, 0, 0.0)["yield"]


def _read_eval(d: Path, key: str, data_dir: str | None = None) -> EvalResult:
    """The cell's verdicts; a cell scored by an earlier version of its extractor is re-scored from
    its stored completions (`scoring.rescore_cell`, as `cotgap score --results` does), in memory, and
    its metrics' rates with it (`rescored: true`)."""
    path, metrics_path = d / "predictions.jsonl", d / "metrics.json"
    fix = f"delete {d} and re-run to recompute that cell (`cotgap check` lists damaged cells)"
    metrics = read_json(metrics_path, fix) if metrics_path.exists() else {}
    records = read_jsonl(path)
    if scoring.rescore_due(metrics):
        records = scoring.rescore_cell(d, data_dir)
        metrics = {
            **metrics,
            **scoring.rates(records, metrics["headline"]),
            "rescored": True,
            "stored_extractor_version": metrics["extractor_version"],
            "extractor_version": answers.get_extractor(metrics["extractor"]).version,
        }
    correct: dict[Any, bool] = {}
    for n, rec in enumerate(records, 1):
        item, value = rec.get("id"), rec.get("correct")
        if item in correct:
            raise UserError(f"{path}: record {n}: duplicate id {item!r}; delete {d} and re-run.")
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise UserError(
                f"{path}: record {n} (id {item!r}): correct is {value!r}, expected true or false; "
                f"delete {d} and re-run."
            )
        correct[item] = bool(value)
    return EvalResult(key, correct, metrics)


def paired(base: EvalResult, post: EvalResult) -> tuple[np.ndarray, np.ndarray]:
    """0/1 vectors of base and post over the same items; an error when the item ids differ."""
    if base.correct.keys() != post.correct.keys():
        only_base = sorted(set(base.correct) - set(post.correct), key=str)
        only_post = sorted(set(post.correct) - set(base.correct), key=str)
        raise UserError(
            f"eval cells {post.key} (distilled) and {base.key} (its baseline) score different "
            f"test items: {len(only_base)} only in the baseline (e.g. {only_base[:3]}), "
            f"{len(only_post)} only in the distilled eval (e.g. {only_post[:3]}); "
            "delete the stale cell and re-run `cotgap run`."
        )
    ids = list(base.correct)
    return (
        np.array([base.correct[i] for i in ids], dtype=bool),
        np.array([post.correct[i] for i in ids], dtype=bool),
    )


# --- the leaderboard -----------------------------------------------------------------------------


def leaderboard(
    exp: Experiment, store: Store, mde: bool = True
) -> tuple[pd.DataFrame, dict[str, int], dict[str, int], dict[tuple, dict]]:
    """Rows of every teacher, baseline and distilled cell of the grid, the missing-cell counts,
    the counts of cells re-scored with the current extractor (by kind: eval, traces), and the
    teacher comparisons of each (task, student, regime) group (`compare_teachers`); `mde`:
    with each group's minimum detectable effects (simulated: seconds a group)."""
    grid, reader = grids.expand(exp), _Reader(store, exp.data_dir)
    rows: list[dict] = []
    sizes = {m.name: m.size or models.param_count(m) for m in (*exp.teachers, *exp.students)}
    teachers = {}
    for (task, teacher), ev in grid.teachers.items():
        draws = [c for (t, name, _), c in grid.traces.items() if (t, name) == (task, teacher)]
        teachers[task, teacher] = _teacher_row(reader, ev, draws)
    for task in (t.name for t in exp.tasks):
        rows.extend(row for (t, _), row in teachers.items() if t == task)
        for (t, student), base in grid.baselines.items():
            if t != task:
                continue
            rows.append(_baseline_row(reader, base))
            for (t, s, teacher, *_), d in grid.distilled.items():
                if (t, s) == (task, student):
                    row = _distilled_row(exp.analysis, reader, d)
                    # a mix row has no teacher row of its own (regimes.MIX_TEACHER)
                    of = teachers.get((task, teacher), {"task": task, "teacher": teacher})
                    rows.append({**_teacher_columns(of), **_draw_columns(reader, d), **row})
    board = pd.DataFrame(rows)
    board["screened_out"] = board["adapter_key"].map(screening.screened_out(grid, store))
    prior_out = race.screened_out(exp, grid, store)
    if prior_out:  # train.race.prior with start: teachers that never race
        keys = zip(board["task"], board["student"], board["regime"], board["teacher"], strict=True)
        why = [prior_out.get((t, s, r), {}).get(name, {}).get("why") for t, s, r, name in keys]
        why_s = pd.Series(why, index=board.index, dtype=object)
        mark = (board["row_type"] == "distilled") & why_s.notna()
        board["screened_out"] = board["screened_out"].astype(object).mask(mark, why_s)
    board["student_size"] = board["student"].map(sizes)
    board["teacher_size"] = board["teacher"].map(sizes)
    board = board.reindex(columns=list(COLUMNS)).astype(_DTYPES)
    board = board.astype({c: float for c in board.columns if c.endswith(("_acc", "_size"))})
    groups = dict(_group_arms(reader, board))
    for key, out in prior_out.items():  # the race and its answer are among the teachers raced
        if key in groups:
            groups[key] = (
                groups[key][0],
                {t: r for t, r in groups[key][1].items() if t not in out},
            )
    gated = _gated(exp, grid, store)
    raced = {}
    if exp.train.race:  # a task gated by pre-selection has no groups to wait for
        expected = {k for k in race.group_keys(grid) if k[0] not in gated}
        raced = race.run(exp, groups, expected)
    summaries = {
        k: race.summary(exp, r, [*groups[k][1], *prior_out.get(k, {})], prior_out.get(k, {}))
        for k, r in raced.items()
    }
    decisions = compare_groups(
        exp.analysis, groups, {k: (r.decision, summaries[k]) for k, r in raced.items()}, mde
    )
    for key, rows_of in board[board["row_type"] == "distilled"].groupby(_GROUP, sort=False):
        if key in decisions:  # teachers whose every replicate had nothing to train on
            empty = rows_of.groupby("teacher", sort=False)["n_train_examples"].max() == 0
            decisions[key]["untrained"] = [str(t) for t in empty[empty].index]
    _decision_columns(board, decisions)
    spend.add_columns(exp, store, grid, board)
    rescored = Counter(kind for kind, _ in reader.rescored)
    skipped = _skipped_by_design(grid, store, board, gated) | race.beyond(exp, grid, raced)
    missing = Counter(kind for kind, key in reader.absent if key not in skipped)
    return board, dict(missing), dict(rescored), decisions


def _gated(exp: Experiment, grid: grids.Grid, store: Store) -> set[str]:
    """The tasks task pre-selection gated (they run nothing but their select evals)."""
    return {t for t, d in selection.decide(exp, grid, store).items() if d.runs is False}


def race_round(exp: Experiment, store: Store) -> list[Cell]:
    """Under train.race: the cells of the race so far and of its next round, from the cached
    cells alone (harness/analysis/race.py); `cotgap run` computes them until nothing is new.
    The race reads its decisions only: no minimum detectable effects (the report's)."""
    decisions = leaderboard(exp, store, mde=False)[3]
    summaries = {k: d["race"] for k, d in decisions.items() if "race" in d}
    grid = grids.expand(exp)
    return race_cells.round_cells(exp, grid, summaries, race.entrants(exp, grid, store))


def _skipped_by_design(grid: grids.Grid, store: Store, board: pd.DataFrame, gated: set[str]) -> set:
    """Keys of cells the run skips on purpose, which are not "not computed yet": the adapters and
    evals of screened-out rows (top_k) and of training sets left empty, and every cell of a task
    pre-selection gated (`gated`, `_gated`)."""
    out = set(board.loc[board["screened_out"].notna(), ["adapter_key", "eval_key"]].stack())
    out |= schedule.left_empty(store, grid.unique())
    return out | {
        c.key for c in grid.cells if c.task in gated and getattr(c, "role", None) != "select"
    }


def item_posts(exp: Experiment, store: Store, board: pd.DataFrame | None) -> dict:
    """(task, student, teacher, regime, trace draw) -> test item -> correct, the mean over
    training seeds, from the distilled rows' eval cells (read as the leaderboard reads them)."""
    if board is None or board.empty:
        return {}
    reader, out = _Reader(store, exp.data_dir), {}
    dist = board[board["row_type"] == "distilled"]
    for row, g in dist.groupby(screening.ROW, sort=False):
        found = [reader.eval(k) for k in g["eval_key"]]
        evals = [e.correct for e in found if e is not None]
        if evals:
            items = set.intersection(*(set(e) for e in evals))
            out[row] = {i: float(np.mean([e[i] for e in evals])) for i in items}
    return out


class Replicate(NamedTuple):
    """One distilled student of a teacher: its trace draw, training seed and 0/1 test vector."""

    trace_seed: int | None
    train_seed: int | None
    correct: np.ndarray


def _group_arms(
    reader: _Reader, board: pd.DataFrame
) -> Iterator[tuple[tuple, tuple[np.ndarray, dict[str, list[Replicate]]]]]:
    """Per (task, student, regime) group with a scored baseline: its 0/1 vector and, per teacher,
    its scored replicates (one per trace draw and training seed), in leaderboard order."""
    dist = board[board["row_type"] == "distilled"]
    for key, rows in dist.groupby(_GROUP, sort=False):
        base = reader.eval(rows["baseline_key"].iloc[0])
        if base is None:
            continue
        teachers: dict[str, list[Replicate]] = {}
        for teacher, mine in rows.groupby("teacher", sort=False):
            reps = []
            trace_seeds = mine["trace_seed"] if "trace_seed" in mine else [None] * len(mine)
            for k, trace_seed, seed, examples in zip(
                mine["eval_key"], trace_seeds, mine["seed"], mine["n_train_examples"], strict=True
            ):
                post = reader.eval(k)
                if post is None and _int(examples) == 0:  # no training set: the student as it is
                    post = base
                if post is not None:
                    reps.append(Replicate(_int(trace_seed), _int(seed), paired(base, post)[1]))
            if reps:
                teachers[teacher] = reps
        if teachers:  # the baseline's vector in the item order `paired` gives every post
            yield key, (paired(base, base)[0], teachers)


def group_arms(exp: Experiment, store: Store, board: pd.DataFrame) -> dict[tuple, tuple]:
    """Each group's baseline vector and, per teacher, its draws (what the studies contrast)."""
    reader = _Reader(store, exp.data_dir)
    return {
        key: (base, {t: draws_of(reps) for t, reps in teachers.items()})
        for key, (base, teachers) in _group_arms(reader, board)
    }


def _int(x: Any) -> int | None:
    return None if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)) else int(x)


def draws_of(reps: list[Replicate]) -> list[np.ndarray]:
    """A teacher's replicates as one (training seeds, items) array per trace draw, in draw order
    (the layout `teacher_level.replicate_units` takes)."""
    by_draw: dict[Any, list[np.ndarray]] = {}
    for r in reps:
        by_draw.setdefault(r.trace_seed, []).append(r.correct)
    return [np.stack(v) for v in by_draw.values()]


def compare_teachers(
    a: AnalysisConfig, base: np.ndarray, teachers: dict[str, list[Replicate]]
) -> dict[str, Any]:
    """One group's decision (`compare_groups` of a grid of one group)."""
    return compare_groups(a, {None: (base, teachers)})[None]


def compare_groups(
    a: AnalysisConfig,
    groups: dict[Any, tuple[np.ndarray, dict[str, list[Replicate]]]],
    raced: Mapping[Any, tuple[teacher_level.GroupDecision | None, dict[str, Any]]] | None = None,
    mde: bool = True,
) -> dict[Any, dict[str, Any]]:
    """Every group's decision (`teacher_level.decide_groups` under analysis.multiplicity): every
    teacher against the baseline and every other teacher, with intervals over test items and
    replicates, the best-teacher confidence set, and the answer. A teacher with fewer than
    analysis.min_replicates replicate units is exploratory: its comparisons stay inconclusive.
    Each decision carries the multiplicity rule's record (`multiplicity`). `raced`: under
    train.race, each group's decision at its race's last look and the race's summary
    (harness/analysis/race.py), which replace the fixed design's decision once the race has
    taken a look. `mde`: each decision's minimum detectable effects (`_group_mde`)."""
    draws = {k: (base, {t: draws_of(r) for t, r in ts.items()}) for k, (base, ts) in groups.items()}
    decided, record = teacher_level.decide_groups(
        draws, 1 - a.ci, a.effect_of_interest / 100, a.min_replicates, teacher_level.other_task
    )
    out = {}
    for key, dec in decided.items():
        at_look, summary = (raced or {}).get(key, (None, None))
        d = (at_look or dec).as_dict()
        d["multiplicity"] = record
        if summary is not None:
            d["race"] = summary
        if mde:
            d["mde"] = _group_mde(a, d, *draws[key])
        out[key] = d
    return out


def _group_mde(
    a: AnalysisConfig, d: dict[str, Any], base: np.ndarray, draws: dict[str, list]
) -> dict[str, Any]:
    """What this group's design can detect under the rule: the smallest gain over the baseline
    and the smallest teacher-vs-teacher difference, at its items and replicates, with the
    replicate SD measured here (the largest of its teachers') or analysis.replicate_sd, and the
    item concordance of baseline and distilled students measured here (the smallest of its
    teachers'; `teacher_level.concordance`)."""
    reps = min(t["n_replicates"] for t in d["teachers"])
    measured_conc = [
        teacher_level.concordance(base, teacher_level.replicate_units(x)) for x in draws.values()
    ]
    conc = min((c for c in measured_conc if not math.isnan(c)), default=0.0)
    measured = [t["rep_sd"] for t in d["teachers"] if t["n_replicates"] >= 2]
    sd = max(measured) if measured else a.replicate_sd / 100
    planned = max(reps, a.min_replicates)
    m = len(d["teachers"])
    return {
        "replicates": planned,
        "rep_sd": sd,
        "rep_sd_source": "measured" if measured else "analysis.replicate_sd",
        "concordance": conc,
        "gain": teacher_level.minimum_detectable_gain(
            d["n_items"], d["base_acc"], planned, sd, m, 1 - a.ci, concordance=conc, sims=1000
        ),
        "difference": teacher_level.minimum_detectable_difference(
            d["n_items"],
            max(t["post_acc"] for t in d["teachers"]),
            planned,
            sd,
            m,
            1 - a.ci,
            concordance=conc,
            sims=1000,
        ),
    }


def _decision_columns(board: pd.DataFrame, decisions: dict[tuple, dict]) -> None:
    """The teacher-level columns of the distilled rows, from the group decisions, in place."""
    dist = board["row_type"] == "distilled"
    keys = [*_GROUP, "teacher"]
    by_teacher = {
        (*key, t["teacher"]): (t, d) for key, d in decisions.items() for t in d["teachers"]
    }
    mine = [by_teacher.get(k) for k in board.loc[dist, keys].itertuples(index=False, name=None)]
    for column, field in (("teacher_gain", "gain"), ("teacher_gain_low", "gain_low"),
                          ("teacher_gain_high", "gain_high")):  # fmt: skip
        board.loc[dist, column] = [NAN if x is None else x[0][field] for x in mine]
    board["verdict"] = board["verdict"].astype(object)
    board.loc[dist, "verdict"] = [None if x is None else x[0]["verdict"] for x in mine]
    board.loc[dist, "in_best_set"] = [
        pd.NA if x is None else x[0]["teacher"] in x[1]["best_set"] for x in mine
    ]
    board.loc[dist, "n_replicates"] = [pd.NA if x is None else x[0]["n_replicates"] for x in mine]
    sd = board[dist].groupby(keys, sort=False)["post_acc"].transform("std")
    board.loc[dist, "seed_sd"] = sd


def _teacher_row(reader: _Reader, ev_cell: Eval, draws: list[Traces]) -> dict:
    """A teacher's row: its test accuracy, and its yield averaged over its trace draws."""
    ev = reader.eval(ev_cell.key)
    yields = [reader.traces_yield(c.key) for c in draws]
    return {
        "row_type": "teacher",
        "task": ev_cell.task,
        "teacher": ev_cell.model,
        "teacher_acc": ev.accuracy if ev else NAN,
        "teacher_train_acc": float(np.mean(yields)) if yields else NAN,
        "n_test": len(ev.correct) if ev else None,
        **_rates(ev),
        "eval_key": ev_cell.key,
        "traces_key": draws[0].key,
    }


def _teacher_columns(teacher_row: dict) -> dict:
    keys = ("task", "teacher", "teacher_acc", "teacher_train_acc", "traces_key")
    return {k: teacher_row.get(k) for k in keys}


def _draw_columns(reader: _Reader, d: grids.Distilled) -> dict:
    """A distilled row's own trace draw: its traces cell and that draw's yield (none for mix)."""
    if d.traces is None:
        return {"traces_key": None, "teacher_train_acc": NAN}
    return {"traces_key": d.traces.key, "teacher_train_acc": reader.traces_yield(d.traces.key)}


def _baseline_row(reader: _Reader, cell: Eval) -> dict:
    ev = reader.eval(cell.key)
    return {
        "row_type": "baseline",
        "task": cell.task,
        "student": cell.model,
        "base_acc": ev.accuracy if ev else NAN,
        "n_test": len(ev.correct) if ev else None,
        **_rates(ev),
        "eval_key": cell.key,
        "baseline_key": cell.key,
    }


def _rates(ev: EvalResult | None) -> dict[str, Any]:
    return {
        "format_fail_rate": ev.rate("format_failure_rate") if ev else NAN,
        "truncation_rate": ev.rate("truncation_rate") if ev else NAN,
        "two_pass_acc": ev.rate("two_pass_accuracy") if ev else NAN,
        "engine": (ev.metrics.get("engine") or {}).get("name") if ev else None,
    }


def _distilled_row(a: AnalysisConfig, reader: _Reader, d: grids.Distilled) -> dict:
    """The distilled student's columns; the teacher's come from its teacher row."""
    cell, baseline_key = d.eval, d.baseline.key
    reader.summary("adapter", d.adapter.key)  # counted when absent; read by training_budget
    dataset = reader.summary("dataset", d.dataset.key)
    base, post = reader.eval(baseline_key), reader.eval(cell.key)
    if post is None and dataset.get("n_examples") == 0:
        post = base  # no training set, nothing trained: the student as it is (as decided, below)
    row = {
        "row_type": "distilled",
        "student": cell.model,
        "regime": cell.regime,
        "method": d.adapter.method,
        "seed": d.train_seed,
        "trace_seed": d.trace_seed,
        "base_acc": base.accuracy if base else NAN,
        "post_acc": post.accuracy if post else NAN,
        "n_test": None,
        "n_train_examples": dataset.get("n_examples"),
        "train_tokens": dataset.get("train_tokens"),
        "mean_trace_tokens": dataset.get("mean_trace_tokens", NAN),
        **_rates(post),
        "eval_key": cell.key,
        "adapter_key": d.adapter.key,
        "baseline_key": baseline_key,
    }
    if base and post:
        row.update(_paired_stats(a, *paired(base, post)))
    return row


def _paired_stats(a: AnalysisConfig, base: np.ndarray, post: np.ndarray) -> dict:
    gain = adapters.paired_bootstrap(base, post, a.ci, a.bootstrap_samples, a.seed)
    return {
        "gain": gain.estimate,
        "gain_ci_low": gain.low,
        "gain_ci_high": gain.high,
        "mcnemar_p": adapters.mcnemar_exact(base, post),
        "degraded": gain.estimate < 0,
        "n_test": len(base),
    }


# --- capacity-gap analysis -----------------------------------------------------------------------

_PROPERTIES = ("teacher_acc", "teacher_size", "gap")
_GROUP = ["task", "student", "regime"]


def analyse(
    exp: Experiment, board: pd.DataFrame, decisions: dict[tuple, dict] | None = None
) -> dict[str, Any]:
    """Everything report.md states, as numbers: per (task, student, regime) group and overall.
    `decisions`: the teacher comparisons `leaderboard` returns (none: groups have no decision)."""
    a = exp.analysis
    dist = board[board["row_type"] == "distilled"]
    means = teacher_means(dist)
    rows = dict(list(dist.groupby(_GROUP, sort=False)))
    groups = [
        _group(a, g, rows[key], dict(zip(_GROUP, key, strict=True)), (decisions or {}).get(key))
        for key, g in means.groupby(_GROUP, sort=False)
    ]
    spread = task_spread(board)
    return {
        "experiment": exp.name,
        "grid": {
            "teachers": [t.name for t in exp.teachers],
            "students": [s.name for s in exp.students],
            "tasks": [t.name for t in exp.tasks],
            "regimes": regimes.row_regimes(exp.train),
            "seeds": list(exp.train.seeds),
            "trace_seeds": list(exp.generate.trace_seeds),
            "replicates": exp.train.replicates,
        },
        "analysis_config": canonical(a),
        "groups": groups,
        "overall": {
            r: _overall(a, means[means["regime"] == r], dist[dist["regime"] == r], groups, r)
            for r in regimes.row_regimes(exp.train)
        },
        "degraded": _merge_degraded([g["degraded"] for g in groups]),
        # per-teacher regimes pair by teacher; a mix row (no teacher of its own) is compared in
        # the budget table instead
        "regimes": regime_comparison(
            dist, [r for r in regimes.row_regimes(exp.train) if not r.startswith("mix")]
        ),
        "task_spread": spread.to_dict("records"),
        "spread_threshold": a.spread_threshold,
        "min_teachers": adapters.min_points(0.05),
        "selected_tasks": select_tasks_by_spread(board, a.spread_threshold),
    }


def teacher_means(dist: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, student, regime, teacher): post and gain averaged over seeds, and the gap."""
    means = (
        dist.groupby([*_GROUP, "teacher"], sort=False)
        .agg(
            post_acc=("post_acc", "mean"),
            gain=("gain", "mean"),
            base_acc=("base_acc", "first"),
            teacher_acc=("teacher_acc", "first"),
            teacher_size=("teacher_size", "first"),
            n_seeds=("post_acc", "count"),
            seed_sd=("post_acc", "std"),
        )
        .reset_index()
    )
    means["gap"] = means["teacher_acc"] - means["base_acc"]
    return means


def _group(
    a: AnalysisConfig, g: pd.DataFrame, rows: pd.DataFrame, key: dict, decision: dict | None
) -> dict[str, Any]:
    """One (task, student, regime) group: its teachers ranked by mean post (a description), the
    decision that states what the data support, and the within-group relations."""
    ranked = g.sort_values("post_acc", ascending=False, na_position="last", kind="stable")
    strongest = g.loc[g["teacher_acc"] == g["teacher_acc"].max(), "teacher"].tolist()
    columns = ["teacher", "post_acc", "gain", "teacher_acc", "teacher_size", "seed_sd"]
    ranking = ranked[columns].to_dict("records")
    verdicts = {t["teacher"]: t for t in (decision or {}).get("teachers", [])}
    for r in ranking:
        t = verdicts.get(r["teacher"], {})
        r["verdict"] = t.get("verdict")
        r["in_best_set"] = r["teacher"] in (decision or {}).get("best_set", [])
    return {
        **key,
        "base_acc": float(g["base_acc"].max()) if g["base_acc"].notna().any() else NAN,
        "ranking": ranking,
        "strongest_teachers": strongest,
        "strongest_in_best_set": (
            bool(set(strongest) & set(decision["best_set"])) if decision and strongest else None
        ),
        "decision": decision,
        "answer": decision["answer"] if decision else None,
        "correlations": exact_correlations(g),
        "degraded": _degraded(rows, decision),
        "no_answers": _no_answers(rows),
        "delta_large": delta_large(g, decision, a.delta_large),
    }


def exact_correlations(means: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Spearman of gain against each teacher property inside one group, with an exact
    permutation p-value; `too_few` below the fewest teachers a two-sided test needs to reach
    alpha 0.05 (adapters.min_points: 5), where no test on this many points can say anything."""
    out = {}
    for x in _PROPERTIES:
        c = adapters.spearman_exact(means[x], means["gain"])
        n = int((means[x].notna() & means["gain"].notna()).sum())
        out[f"gain~{x}"] = {
            **c._asdict(),
            "n": n,
            "smallest_p": adapters.smallest_exact_p(n),
            "too_few": n < adapters.min_points(0.05),
        }
    return out


def correlations(a: AnalysisConfig, means: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Spearman of post and of gain against each teacher property over every point pooled, with
    bootstrap CIs: descriptive only (groups' baselines drive it; analysis.json keeps it)."""
    out = {}
    for y in ("post_acc", "gain"):
        for x in _PROPERTIES:
            c = adapters.spearman(means[x], means[y], a.ci, a.bootstrap_samples, a.seed)
            n = int((means[x].notna() & means[y].notna()).sum())
            out[f"{y}~{x}"] = {**c._asdict(), "n": n}
    return out


def capacity_gap(a: AnalysisConfig, means: pd.DataFrame) -> dict[str, Any]:
    """Is the teachers' gain related to their accuracy, or to their size, at the teacher level?

    The statistic is the mean over groups of the within-group Spearman rho of gain and the
    property; its null is every order of the teachers' labels, one order applied on every task,
    student and regime of the grid (grid_level.permutation_test): a teacher good everywhere
    counts once, not once per task or student. Groups lacking one of the grid's teachers are
    left out. When accuracy and size order every task's teachers the same way the two are one
    relation (`collinear`), reported once."""
    have = means.dropna(subset=["gain"])
    out: dict[str, Any] = {}
    for x in ("teacher_acc", "teacher_size"):
        prop = have.assign(prop=np.log10(have[x].astype(float)) if x == "teacher_size"
                           else have[x].astype(float))  # fmt: skip
        keys, teachers, arr = grid_level.block(prop, ["gain", "prop"], by=_GROUP)
        n = len(teachers) if len(keys) else 0
        stat = grid_level.mean_rank_correlation(arr["gain"], arr["prop"])
        test = grid_level.permutation_test(stat, n, 1 - a.ci, seed=a.seed)
        used = grid_level.spread(arr["gain"]) & grid_level.spread(arr["prop"])
        out[f"gain~{x}"] = {**test.as_dict(), "rho": test.statistic, "n_teachers": n,
                            "n_groups": int(used.sum()) if n else 0}  # fmt: skip
    keys, _, arr = grid_level.block(have, ["gain"])
    out["components"] = grid_level.teacher_components(100 * grid_level.cube(keys, arr["gain"])[2])
    per_task = have.drop_duplicates(["task", "teacher"])
    rhos = [
        adapters.spearman_exact(t["teacher_acc"], t["teacher_size"]).rho
        for _, t in per_task.groupby("task", sort=False)
    ]
    out["collinear"] = (
        bool(rhos)
        and all(abs(r) > 0.999 for r in rhos if not math.isnan(r))
        and (not any(math.isnan(r) for r in rhos))
    )
    return out


def _degraded(rows: pd.DataFrame, decision: dict | None = None) -> dict[str, Any]:
    """Adapters below the baseline (point estimates, descriptive), and teachers the rule finds
    worse than the baseline (the teacher-level verdict)."""
    scored = rows.dropna(subset=["gain"])
    n = len(scored)
    n_deg = int((scored["gain"] < 0).sum())
    teachers = (decision or {}).get("teachers", [])
    worse = [t["teacher"] for t in teachers if t["verdict"] == "worse"]
    return {
        "n_cells": n,
        "n_degraded": n_deg,
        "share_degraded": n_deg / n if n else NAN,
        "n_teachers": len(teachers),
        "n_worse": len(worse),
        "worse": worse,
    }


def _merge_degraded(parts: list[dict[str, Any]]) -> dict[str, Any]:
    n = sum(p["n_cells"] for p in parts)
    deg = sum(p["n_degraded"] for p in parts)
    return {
        "n_cells": n,
        "n_degraded": deg,
        "share_degraded": deg / n if n else NAN,
        "n_teachers": sum(p["n_teachers"] for p in parts),
        "n_worse": sum(p["n_worse"] for p in parts),
    }


def delta_large(
    means: pd.DataFrame, decision: dict | None = None, pair: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Li et al.'s ΔLarge = post(large teacher) - post(small), with the rule's verdict on it.

    The pair is analysis.delta_large where set (Li et al.: 72B against 3B), else the largest and
    smallest by size (by teacher accuracy when a size is missing or all sizes are equal). The
    verdict is the group's pairwise one (large against small: better, worse, equivalent or
    inconclusive), never the sign of the point estimate."""
    have = means.dropna(subset=["post_acc"])
    sizes = have["teacher_size"]
    by = "teacher_size" if sizes.notna().all() and sizes.nunique() > 1 else "teacher_acc"
    if pair is not None:
        by, have = "configured", have.set_index("teacher", drop=False)
        if not set(pair) <= set(have.index):
            return {"by": by, "delta": NAN, "verdict": None}
        large, small = have.loc[pair[0]], have.loc[pair[1]]
    else:
        have = have.dropna(subset=[by])
        if len(have) < 2 or have[by].nunique() < 2:
            return {"by": by, "delta": NAN, "verdict": None}
        large, small = have.loc[have[by].idxmax()], have.loc[have[by].idxmin()]
    out = {
        "by": by,
        "large": large["teacher"],
        "small": small["teacher"],
        "delta": float(large["post_acc"] - small["post_acc"]),
        "post_large": float(large["post_acc"]),
        "post_small": float(small["post_acc"]),
        "base_acc": float(large["base_acc"]),
        "gain_large": float(large["gain"]),
        "gain_small": float(small["gain"]),
        "verdict": None,
        "low": NAN,
        "high": NAN,
    }
    for q in (decision or {}).get("pairs", []):
        if {q["a"], q["b"]} == {out["large"], out["small"]}:
            sign = 1 if q["b"] == out["large"] else -1  # pairs hold b - a
            low, high = sorted((sign * q["low"], sign * q["high"]))
            flip = {"better": "worse", "worse": "better"}
            v = q["verdict"] if sign == 1 else flip.get(q["verdict"], q["verdict"])
            out.update(verdict=v, low=low, high=high)
    gains = {t["teacher"]: t["verdict"] for t in (decision or {}).get("teachers", [])}
    out["large_vs_base"], out["small_vs_base"] = gains.get(out["large"]), gains.get(out["small"])
    return out


def _overall(
    a: AnalysisConfig, means: pd.DataFrame, rows: pd.DataFrame, groups: list[dict], regime: str
) -> dict[str, Any]:
    mine = [g for g in groups if g["regime"] == regime]
    decided = [g for g in mine if g["decision"]]
    return {
        "n_groups": len(mine),
        "n_decided": len(decided),
        "answers": dict(Counter(_answer_kind(g["answer"]) for g in decided)),
        "distill": dict(Counter(g["decision"]["distill"] for g in decided)),
        "n_strongest_in_best_set": sum(bool(g["strongest_in_best_set"]) for g in decided),
        "n_exploratory": sum(g["decision"]["exploratory"] for g in decided),
        "mean_post": float(means["post_acc"].mean()) if len(means) else NAN,
        "mean_gain": float(means["gain"].mean()) if len(means) else NAN,
        "pooled_correlations": correlations(a, means),
        "capacity_gap": capacity_gap(a, means),
        "degraded": _merge_degraded([g["degraded"] for g in mine]),
    }


def _answer_kind(answer: str) -> str:
    return (
        answer if answer in (teacher_level.ANSWERS_NONE, teacher_level.INCONCLUSIVE) else "teacher"
    )


def answers_table(exp: Experiment, groups: list[dict[str, Any]]) -> pd.DataFrame:
    """analysis/answers.csv: one row per decision group, the report's first table, in points
    rounded to what the intervals can tell (ANSWER_COLUMNS)."""
    rows = []
    for g in groups:
        d = g["decision"]
        if not d:
            continue
        h = d["headline"]
        none = d["answer"] == teacher_level.ANSWERS_NONE
        action = answer_action(d, bool(g.get("no_answers")))
        rows.append(
            {"task": g["task"], "student": g["student"], "regime": g["regime"],
             "method": regimes.method_of(g["regime"]), "answer": d["answer"],
             "distill": d["distill"], "action": action,
             "teacher": h["teacher"] if action == "use_teacher" else "",
             "quoted_teacher": "" if none else h["teacher"], "gain": points(h["gain"]),
             "gain_low": points(h["gain_low"]), "gain_high": points(h["gain_high"]),
             "verdict": h["verdict"], "clears_effect": d["clears_effect"],
             "base_acc": points(d["base_acc"]),
             "best_set": "" if none else ";".join(d["best_set"]),
             "n_replicates": min(t["n_replicates"] for t in d["teachers"]),
             "exploratory": "yes" if d["exploratory"] else "no", "n_items": d["n_items"],
             "level": points(h["level"], 2), "effect_of_interest": points(d["effect"]),
             "replicates": ";".join(f"{t['teacher']}:{t['n_replicates']}" for t in d["teachers"]),
             "adapters_saved": d["race"]["adapters_saved"] if "race" in d else None,
             "screened_out": _screened(d)}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=list(ANSWER_COLUMNS))


def _screened(d: dict[str, Any]) -> str:
    """answers.csv's `screened_out`: name:rank of each teacher the race's prior left out."""
    out = d.get("race", {}).get("screened_out", {})
    return ";".join(f"{t}:{entry['rank']}" for t, entry in out.items())


def points(x: float, digits: int = 1) -> float:
    """A fraction as points (percent), rounded: the unit of answers.csv, the report and the
    terminal; 0.024999999999999998 is 2.5."""
    return round(100 * x, digits) if x == x else NAN


ACTIONS: dict[str, str] = {
    "use_teacher": "distill from `teacher`",
    "use_any_of_best_set": "distill from any teacher of `best_set`: each beats the baseline and "
    "none is shown better than the others, so pick the cheapest",
    "keep_baseline": "do not distill: no teacher gains `effect_of_interest` or more",
    "add_replicates": "exploratory: add replicates (train.seeds, generate.seeds) until "
    "analysis.min_replicates; nothing is claimed yet",
    "need_more_data": "the data cannot tell: more test items or replicates (`cotgap plan` gives "
    "the smallest gain they detect), or a larger effect_of_interest",
    "fix_setup": "undecided, and most completions of every distilled eval of the group hold no "
    "answer the extractor reads, so more data will not tell: fix the prompt, the answer format, "
    "the teacher or the student first (the report's warnings say which)",
}


def answer_action(d: dict[str, Any], no_answers: bool = False) -> str:
    """What a decision asks its reader to do, one word of ACTIONS. `no_answers`: most
    completions of every distilled eval of the group hold no answer (`_no_answers`)."""
    if d["exploratory"]:
        return "add_replicates"
    if d["answer"] == teacher_level.ANSWERS_NONE:
        return "keep_baseline"
    if d["answer"] != teacher_level.INCONCLUSIVE:
        return "use_teacher"
    if d["distill"] == "yes":
        return "use_any_of_best_set"
    return "fix_setup" if no_answers else "need_more_data"


def _no_answers(rows: pd.DataFrame) -> bool:
    """Do most completions of every distilled row of a group hold no answer (format_fail_rate
    above health.MOST)? Then an undecided group is a setup problem, not a lack of data."""
    from harness.analysis.health import MOST

    if "format_fail_rate" not in rows:
        return False
    rates = pd.to_numeric(rows["format_fail_rate"], errors="coerce").dropna()
    return not rates.empty and bool((rates > MOST).all())


ANSWER_COLUMNS: dict[str, str] = {
    "task": "task name",
    "student": "student model",
    "regime": "training-set regime (with @align when budgets are aligned, +method unless sft)",
    "method": "distillation method: sft | kd | on_policy",
    "answer": "a teacher's name: distill from it (it beats the baseline and is shown the best: "
    "the leader the grid's other tasks put first, or the only member of the best set; "
    "[The teacher named](statistics.md#the-teacher-named)) | none: no teacher can beat the "
    "baseline by `effect_of_interest` (every gain interval lies below it); a smaller gain is not "
    "ruled out, and a teacher's own verdict may still be inconclusive | inconclusive: neither",
    "distill": "does distilling beat not distilling: yes (a teacher is named, or better than the "
    "baseline) "
    "| no (the answer is none) | inconclusive (no teacher is better, and one may still be)",
    "action": "what to do, for a script: " + " | ".join(f"{k}: {v}" for k, v in ACTIONS.items()),
    "teacher": "the teacher to distill from: the answer where it names one (action "
    "use_teacher); empty otherwise, where no single teacher is recommended (none, inconclusive, "
    "exploratory: see `action` and `best_set`)",
    "quoted_teacher": "the teacher whose gain, interval, verdict and clears_effect the row "
    "quotes, not a recommendation: the answer; else the teacher with the largest gain that "
    "beats the baseline; else the largest point estimate; empty when the answer is none",
    "gain": "the quoted teacher's gain over the baseline, points, mean over replicates (answer "
    "none: the largest gain of any teacher)",
    "gain_low": "lower end of its interval over test items and replicates, points: for a named "
    "teacher, the two-sided interval of the test that named it (its lower bound is that test); "
    "otherwise simultaneous over the group's comparisons (a max-t family), at the "
    "per-comparison `level`",
    "gain_high": "upper end of that interval, points",
    "verdict": "the quoted teacher against the baseline: better | worse | equivalent | inconclusive",
    "clears_effect": "does the quoted teacher's gain clear the effect of interest: yes (its interval "
    "lies above +effect_of_interest) | no (below it; always on a `none` answer) | inconclusive",
    "base_acc": "the student's own baseline accuracy, points",
    "best_set": "confidence set for the best teacher (multiple comparisons with the best), names "
    "separated by ';': every teacher no other is shown above; the named teacher alone when one "
    "is named; empty when the answer is none",
    "n_replicates": "fewest replicate units of any teacher in the group",
    "exploratory": "yes when a teacher has fewer than analysis.min_replicates replicates: "
    "nothing is claimed; else no",
    "n_items": "test items",
    "level": "confidence level of the quoted interval, percent",
    "effect_of_interest": "the effect of interest, points: the equivalence margin and the bar "
    "`none` rules out",
    "replicates": "replicate units of each teacher, name:count separated by ';' (under "
    "train.race, the trace draws the race gave it)",
    "adapters_saved": "under train.race: adapters the race did not train against the uniform "
    "design (every teacher at max_replicates); empty without a race",
    "screened_out": "under train.race.prior with start: the teachers that did not race, "
    "name:rank separated by ';'; the answer is about the teachers that raced",
}


def regime_comparison(dist: pd.DataFrame, regimes: list[str]) -> dict[str, Any]:
    """Mean post and gain per regime over the (task, student, teacher, trace_seed, seed) cells
    complete in all: a description (wins, ties, losses against the reference regime), never a
    "best" regime."""
    if not regimes:
        return {"reference": None, "n_pairs": 0, "per_regime": {}}
    keys = ["task", "student", "teacher", "trace_seed", "seed"]
    scored = dist[dist["regime"].isin(regimes)].dropna(subset=["post_acc", "gain"])
    wide = scored.pivot_table(index=keys, columns="regime", values=["post_acc", "gain"])
    wide = wide.dropna() if wide.columns.get_level_values(1).nunique() == len(regimes) else wide[:0]
    reference = "per_teacher" if "per_teacher" in regimes else regimes[0]
    out: dict[str, Any] = {"reference": reference, "n_pairs": len(wide), "per_regime": {}}
    for r in regimes:
        if len(wide) == 0:
            out["per_regime"][r] = {"mean_post": NAN, "mean_gain": NAN}
            continue
        diff = wide["post_acc", r] - wide["post_acc", reference]
        out["per_regime"][r] = {
            "mean_post": float(wide["post_acc", r].mean()),
            "mean_gain": float(wide["gain", r].mean()),
            "mean_diff_post": float(diff.mean()),
            "wins": int((diff > 0).sum()),
            "ties": int((diff == 0).sum()),
            "losses": int((diff < 0).sum()),
        }
    return out


def task_spread(board: pd.DataFrame) -> pd.DataFrame:
    """Tasks ranked by teacher accuracy spread (max - min teacher_acc, in points)."""
    t = board.dropna(subset=["teacher", "teacher_acc"]).drop_duplicates(["task", "teacher"])
    rows = []
    for task, g in t.groupby("task", sort=False):
        hi, lo = g.loc[g["teacher_acc"].idxmax()], g.loc[g["teacher_acc"].idxmin()]
        rows.append(
            {
                "task": task,
                "spread": 100 * (hi["teacher_acc"] - lo["teacher_acc"]) if len(g) > 1 else NAN,
                "strongest": hi["teacher"],
                "strongest_acc": hi["teacher_acc"],
                "weakest": lo["teacher"],
                "weakest_acc": lo["teacher_acc"],
                "n_teachers": len(g),
            }
        )
    out = pd.DataFrame(rows, columns=_SPREAD_COLUMNS)
    return out.sort_values("spread", ascending=False, na_position="last", kind="stable")


_SPREAD_COLUMNS = [
    "task",
    "spread",
    "strongest",
    "strongest_acc",
    "weakest",
    "weakest_acc",
    "n_teachers",
]


def select_tasks_by_spread(
    leaderboard_df: pd.DataFrame, threshold: float = AnalysisConfig().spread_threshold
) -> list[str]:
    """Tasks whose teacher accuracy spread is at least `threshold` points, widest first."""
    spread = task_spread(leaderboard_df)
    return spread.loc[spread["spread"] >= threshold, "task"].tolist()


def training_budget(exp: Experiment, store: Store, board: pd.DataFrame) -> dict[str, Any]:
    """The configured training budget and what the complete adapter cells report."""
    tr = exp.train
    configured = canonical(tr.model_copy(update={"accelerate_config": None}))
    configured.pop("merge")  # what is saved, not the budget
    configured["effective_batch"] = tr.per_device_batch_size * tr.grad_accum * tr.num_processes
    observed = []
    dist = board[board["row_type"] == "distilled"].dropna(subset=["adapter_key"])
    for key, n_examples in zip(dist["adapter_key"], dist["n_train_examples"], strict=True):
        manifest = store.manifest("adapter", key)
        if manifest is None:
            continue
        s = manifest.get("summary") or {}
        steps, batch = s.get("steps"), s.get("effective_batch")
        epochs = steps * batch / n_examples if steps and batch and n_examples else NAN
        observed.append({"steps": steps, "effective_batch": batch, "epochs": epochs})
    return {"configured": configured, "observed": _observed(observed)}


def adapter_budgets(store: Store, board: pd.DataFrame) -> list[dict[str, Any]]:
    """Per complete adapter: its regime (with the budget alignment), teacher (or mix), trace draw
    and training seed, the optimizer updates, effective batch, examples and tokens it trained on,
    the realised mix of a mix set, and its post accuracy and gain; one row per adapter, in
    leaderboard order."""
    out, seen = [], set()
    dist = board[board["row_type"] == "distilled"].dropna(subset=["adapter_key"])
    for r in dist.itertuples():
        manifest = store.manifest("adapter", r.adapter_key)
        if manifest is None or (r.adapter_key, r.regime) in seen:
            continue
        seen.add((r.adapter_key, r.regime))
        s, b = manifest.get("summary") or {}, (manifest.get("summary") or {}).get("budget") or {}
        dataset = (
            store.manifest("dataset", manifest["upstream"][0]) if manifest.get("upstream") else None
        )
        out.append(
            {
                "task": r.task,
                "student": r.student,
                "regime": r.regime,
                "teacher": r.teacher,
                "trace_seed": r.trace_seed,
                "seed": r.seed,
                "align": b.get("align", "none"),
                "updates": s.get("steps"),
                "effective_batch": s.get("effective_batch"),
                "examples": b.get("examples"),
                "tokens": s.get("tokens"),
                "planned_updates": b.get("updates"),
                "reference_updates": (b.get("reference") or {}).get("updates"),
                "mix": ((dataset or {}).get("summary") or {}).get("mix"),
                "method": r.method,
                "extra_cost": s.get("distillation"),  # the method's teacher / sampling cost
                "post_acc": r.post_acc,
                "gain": r.gain,
            }
        )
    return out


def teacher_topk(store: Store, board: pd.DataFrame) -> list[dict[str, Any]]:
    """Per complete traces cell that kept its teacher's top-k log-probabilities (kd): the teacher,
    k, the tokens they cover and the size of the file (bytes)."""
    out = []
    rows = board.dropna(subset=["traces_key"]).drop_duplicates("traces_key")
    for teacher, key in zip(rows["teacher"], rows["traces_key"], strict=True):
        s = (store.manifest("traces", key) or {}).get("summary") or {}
        if s.get("topk_bytes") is not None:
            out.append(
                {"teacher": teacher, "traces_key": key, "k": s["top_logprobs"],
                 "tokens": s.get("generated_tokens"), "bytes": s["topk_bytes"]}
            )  # fmt: skip
    return out


def _observed(adapters: list[dict]) -> dict[str, Any]:
    if not adapters:
        return {"n_adapters": 0}
    df = pd.DataFrame(adapters)
    return {
        "n_adapters": len(df),
        "steps": sorted(df["steps"].dropna().unique().tolist()),
        "effective_batch": sorted(df["effective_batch"].dropna().unique().tolist()),
        "epochs_min": float(df["epochs"].min()),
        "epochs_max": float(df["epochs"].max()),
    }


def jsonable(x: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN and pandas NA to null."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return jsonable(dataclasses.asdict(x))
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(x) else float(x)
    if x is pd.NA:
        return None
    return x
