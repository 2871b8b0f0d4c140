"""Capacity-gap analysis: leaderboard.csv and analysis.json, rebuilt from the cells every time.

    cotgap analyze configs/sandbox.yaml

Reads only the complete cells of the grid (`grid.expand(exp)`); a cell not computed yet leaves NaN in its
row and is counted, never fatal. Each distilled student is paired item by item (by id) with its
own baseline (same student, task and eval config): gain with a paired bootstrap CI, exact McNemar
p, Holm across every distilled row of the grid. Inside each (task, student, regime) group every
teacher is compared with every other on the same items (`compare_teachers`: p_best, rank interval,
Holm-adjusted sign tests) and the capacity gap is measured within groups (`within_group`).
Writes `<results>/<experiment>/analysis/`
(leaderboard.csv, analysis.json, report.md, plots) as one directory swapped in whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import answers, models, regimes, scoring, screening, selection, stats
from harness import grid as grids
from harness.cells import Eval, Traces
from harness.config import AnalysisConfig, Experiment, canonical
from harness.errors import UserError
from harness.store import Store, atomic_write_json, atomic_write_text, read_json, read_jsonl

COLUMNS: dict[str, str] = {
    "row_type": "teacher | baseline | distilled: what the row scores",
    "task": "task name",
    "student": "student model (baseline and distilled rows)",
    "teacher": "teacher model (teacher and distilled rows)",
    "regime": "training-set regime: per_teacher | intersection | matched | mix, with @align when "
    "the budget is aligned (distilled rows)",
    "seed": "training seed (distilled rows)",
    "base_acc": "student's test accuracy without distillation, a fraction in [0, 1]",
    "post_acc": "distilled student's test accuracy, a fraction in [0, 1]",
    "gain": "post_acc - base_acc on the same test items, a fraction in [-1, 1]",
    "gain_ci_low": "lower end of gain's paired bootstrap CI over test items (analysis.ci)",
    "gain_ci_high": "upper end of gain's paired bootstrap CI over test items (analysis.ci)",
    "mcnemar_p": "exact two-sided McNemar p-value, post vs base",
    "p_holm": "mcnemar_p Holm-adjusted across all distilled rows of the grid",
    "degraded": "gain < 0: distillation made the student worse",
    "teacher_acc": "teacher's test accuracy under the same eval config, a fraction in [0, 1]",
    "teacher_train_acc": "teacher's train-split yield: share of questions with a correct trace, in [0, 1]",
    "n_test": "test items scored (for distilled rows: items paired with the baseline)",
    "n_train_examples": "examples in the distilled row's training set",
    "train_tokens": "tokens in the distilled row's training set",
    "mean_trace_tokens": "mean tokens of a training trace",
    "format_fail_rate": "share of the row's test completions with no extractable answer, in [0, 1]",
    "truncation_rate": "share of the row's test completions cut at max_tokens, in [0, 1]",
    "engine": "engine that wrote the row's test completions: vllm | hf",
    "student_size": "student parameters (the config's size, else counted in its local safetensors; empty if unknown)",
    "teacher_size": "teacher parameters (the config's size, else counted in its local safetensors; empty if unknown)",
    "eval_key": "eval cell the row scores",
    "adapter_key": "adapter cell of a distilled row",
    "traces_key": "traces cell of the row's teacher on this task",
    "baseline_key": "baseline eval cell of the row's student on this task",
    "p_best": "probability this teacher is the best for its (task, student, regime): share of joint "
    "bootstrap resamples of test items (and training seeds) in which its mean post is highest",
    "rank_ci": "interval of the teacher's rank by mean post in its group over the same resamples "
    "(1 = best), e.g. 1-2",
    "seed_sd": "SD of post_acc across training seeds of this (task, student, teacher, regime) "
    "(empty with one seed): the seed-to-seed noise floor",
    "screened_out": "why a distilled row was not trained: its teacher screened out by train.teachers_per_student: top_k (empty: trained)",
}
_DTYPES = {
    "seed": "Int64",
    "n_test": "Int64",
    "n_train_examples": "Int64",
    "train_tokens": "Int64",
    "degraded": "boolean",
}
NAN = math.nan


def run(exp: Experiment, store: Store, log: Callable[[str], None] = print) -> Path:
    """Rebuild `<store.root>/analysis/` (= `<exp.root>/analysis/`) from the cells; returns it."""
    from harness import report

    board, missing, rescored, decisions = leaderboard(exp, store)
    result = analyse(exp, board, decisions)
    result["missing_cells"] = missing
    result["rescored_cells"] = rescored
    result["budget"] = training_budget(exp, store, board)
    result["adapter_budgets"] = adapter_budgets(store, board)
    result["selection"] = [
        {"task": d.task, "accuracies": d.accuracies, "spread": d.spread, "passed": d.passed,
         "reason": d.reason, "split": d.split, "min_points": d.min_points}
        for d in selection.decide(exp, grids.expand(exp), store).values()
    ]  # fmt: skip
    result["eval_config"] = canonical(exp.evaluate)
    out = store.root / "analysis"
    # what a killed analysis left (the results-directory lock says no other one is running)
    for stale in [*out.parent.glob(".analysis.tmp-*"), *out.parent.glob(".analysis.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.with_name(f".analysis.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        atomic_write_text(tmp / "leaderboard.csv", board.to_csv(index=False))
        result["screening"] = screening.write(tmp, exp, store, board)
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
        from harness.generate import summarize

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
    exp: Experiment, store: Store
) -> tuple[pd.DataFrame, dict[str, int], dict[str, int], dict[tuple, dict]]:
    """Rows of every teacher, baseline and distilled cell of the grid, the missing-cell counts,
    the counts of cells re-scored with the current extractor (by kind: eval, traces), and the
    teacher comparisons of each (task, student, regime) group (`compare_teachers`)."""
    grid, reader, rows = grids.expand(exp), _Reader(store, exp.data_dir), []
    sizes = {m.name: m.size or models.param_count(m) for m in (*exp.teachers, *exp.students)}
    teachers = {}
    for (task, teacher), ev in grid.teachers.items():
        teachers[task, teacher] = _teacher_row(reader, ev, grid.traces[task, teacher])
    for task in (t.name for t in exp.tasks):
        rows.extend(row for (t, _), row in teachers.items() if t == task)
        for (t, student), base in grid.baselines.items():
            if t != task:
                continue
            rows.append(_baseline_row(reader, base))
            for (t, s, teacher, _, _), d in grid.distilled.items():
                if (t, s) == (task, student):
                    row = _distilled_row(exp.analysis, reader, d)
                    # a mix row has no teacher row of its own (regimes.MIX_TEACHER)
                    of = teachers.get((task, teacher), {"task": task, "teacher": teacher})
                    rows.append({**_teacher_columns(of), **row})
    board = pd.DataFrame(rows)
    board["screened_out"] = board["adapter_key"].map(screening.screened_out(grid, store))
    board["student_size"] = board["student"].map(sizes)
    board["teacher_size"] = board["teacher"].map(sizes)
    board = board.reindex(columns=list(COLUMNS)).astype(_DTYPES)
    board = board.astype({c: float for c in board.columns if c.endswith(("_acc", "_size"))})
    dist = board["row_type"] == "distilled"
    board.loc[dist, "p_holm"] = stats.holm(board.loc[dist, "mcnemar_p"].to_numpy(dtype=float))
    decisions = {
        key: compare_teachers(exp.analysis, *arms) for key, arms in _group_arms(reader, board)
    }
    _decision_columns(board, decisions)
    rescored = Counter(kind for kind, _ in reader.rescored)
    skipped = _skipped_by_design(exp, grid, store, board)
    missing = Counter(kind for kind, key in reader.absent if key not in skipped)
    return board, dict(missing), dict(rescored), decisions


def _skipped_by_design(exp: Experiment, grid: grids.Grid, store: Store, board: pd.DataFrame) -> set:
    """Keys of cells the run skips on purpose, which are not "not computed yet": the adapters and
    evals of screened-out rows (top_k) and every cell of a task pre-selection gated."""
    out = set(board.loc[board["screened_out"].notna(), ["adapter_key", "eval_key"]].stack())
    gated = {t for t, d in selection.decide(exp, grid, store).items() if d.passed is False}
    return out | {
        c.key for c in grid.cells if c.task in gated and getattr(c, "role", None) != "select"
    }


def _group_arms(
    reader: _Reader, board: pd.DataFrame
) -> Iterator[tuple[tuple, tuple[np.ndarray, dict[str, np.ndarray]]]]:
    """Per (task, student, regime) group with a scored baseline: its 0/1 vector and, per teacher,
    a (seeds, items) array of its distilled students' vectors over the same items."""
    dist = board[board["row_type"] == "distilled"]
    for key, rows in dist.groupby(_GROUP, sort=False):
        base = reader.eval(rows["baseline_key"].iloc[0])
        if base is None:
            continue
        teachers: dict[str, np.ndarray] = {}
        for teacher, mine in rows.groupby("teacher", sort=False):
            posts = [reader.eval(k) for k in mine["eval_key"]]
            vectors = [paired(base, post)[1] for post in posts if post is not None]
            if vectors:
                teachers[teacher] = np.stack(vectors)
        if teachers:  # the baseline's vector in the item order `paired` gives every post
            yield key, (paired(base, base)[0], teachers)


def compare_teachers(a: AnalysisConfig, base: np.ndarray, teachers: dict[str, np.ndarray]) -> dict:
    """Every teacher against the baseline and against every other teacher on the same items.

    Accuracies are means over seeds; intervals come from one joint bootstrap of items (and seeds),
    p-values from the exact sign test (McNemar with one seed), Holm-adjusted within the group:
    once over the teacher-vs-baseline tests, once over the teacher pairs.
    """
    names, arms = list(teachers), list(teachers.values())
    est, boot = stats.bootstrap_accuracies([base, *arms], a.bootstrap_samples, a.seed)
    best, ranks = stats.p_best(boot[:, 1:]), stats.rank_interval(boot[:, 1:], a.ci)
    rows = []
    tail = (1 - a.ci) / 2
    post_low, post_high = np.quantile(boot, [tail, 1 - tail], axis=0)
    for k, name in enumerate(names, 1):
        low, high = stats.difference_ci(boot, 0, k, a.ci)
        rows.append(
            {"teacher": name, "post_acc": est[k], "post_low": post_low[k],
             "post_high": post_high[k], "gain": est[k] - est[0], "gain_low": low,
             "gain_high": high, "p": stats.sign_test(base, arms[k - 1]), "p_best": best[k - 1],
             "rank_low": ranks[k - 1][0], "rank_high": ranks[k - 1][1],
             "n_seeds": len(arms[k - 1])}
        )  # fmt: skip
    for row, adj in zip(rows, stats.holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adj
    pairs = []
    for i, j in itertools.combinations(range(len(names)), 2):
        low, high = stats.difference_ci(boot, i + 1, j + 1, a.ci)
        pairs.append(
            {"a": names[i], "b": names[j], "diff": est[j + 1] - est[i + 1], "low": low,
             "high": high, "p": stats.sign_test(arms[i], arms[j])}
        )  # fmt: skip
    for pair, adj in zip(pairs, stats.holm([q["p"] for q in pairs]), strict=True):
        pair["p_holm"] = adj
    mde = stats.minimum_detectable_gain(len(base), float(est[0]), 1 - a.ci)
    return {"n_items": len(base), "base_acc": est[0], "mde": mde, "teachers": rows, "pairs": pairs}


def _decision_columns(board: pd.DataFrame, decisions: dict[tuple, dict]) -> None:
    """p_best, rank_ci and seed_sd on the distilled rows, in place."""
    dist = board["row_type"] == "distilled"
    keys = [*_GROUP, "teacher"]
    by_teacher = {(*key, t["teacher"]): t for key, d in decisions.items() for t in d["teachers"]}
    mine = [by_teacher.get(k) for k in board.loc[dist, keys].itertuples(index=False, name=None)]
    board.loc[dist, "p_best"] = [NAN if t is None else t["p_best"] for t in mine]
    board["rank_ci"] = board["rank_ci"].astype(object)
    board.loc[dist, "rank_ci"] = [
        None if t is None else f"{t['rank_low']}-{t['rank_high']}" for t in mine
    ]
    sd = board[dist].groupby(keys, sort=False)["post_acc"].transform("std")
    board.loc[dist, "seed_sd"] = sd


def _teacher_row(reader: _Reader, ev_cell: Eval, traces: Traces) -> dict:
    ev = reader.eval(ev_cell.key)
    return {
        "row_type": "teacher",
        "task": ev_cell.task,
        "teacher": ev_cell.model,
        "teacher_acc": ev.accuracy if ev else NAN,
        "teacher_train_acc": reader.traces_yield(traces.key),
        "n_test": len(ev.correct) if ev else None,
        **_rates(ev),
        "eval_key": ev_cell.key,
        "traces_key": traces.key,
    }


def _teacher_columns(teacher_row: dict) -> dict:
    keys = ("task", "teacher", "teacher_acc", "teacher_train_acc", "traces_key")
    return {k: teacher_row.get(k) for k in keys}


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
        "engine": (ev.metrics.get("engine") or {}).get("name") if ev else None,
    }


def _distilled_row(a: AnalysisConfig, reader: _Reader, d: grids.Distilled) -> dict:
    """The distilled student's columns; the teacher's come from its teacher row."""
    cell, baseline_key = d.eval, d.baseline.key
    reader.summary("adapter", d.adapter.key)  # counted when absent; read by training_budget
    dataset = reader.summary("dataset", d.dataset.key)
    base, post = reader.eval(baseline_key), reader.eval(cell.key)
    row = {
        "row_type": "distilled",
        "student": cell.model,
        "regime": cell.regime,
        "seed": cell.seed,
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
    gain = stats.paired_bootstrap(base, post, a.ci, a.bootstrap_samples, a.seed)
    return {
        "gain": gain.estimate,
        "gain_ci_low": gain.low,
        "gain_ci_high": gain.high,
        "mcnemar_p": stats.mcnemar_exact(base, post),
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
        },
        "analysis_config": canonical(a),
        "groups": groups,
        "overall": {
            r: _overall(a, means[means["regime"] == r], dist[dist["regime"] == r], groups, r)
            for r in regimes.row_regimes(exp.train)
        },
        "degraded": _degraded(dist),
        # per-teacher regimes pair by teacher; a mix row (no teacher of its own) is compared in
        # the budget table instead
        "regimes": regime_comparison(
            dist, [r for r in regimes.row_regimes(exp.train) if not r.startswith("mix")]
        ),
        "task_spread": spread.to_dict("records"),
        "spread_threshold": a.spread_threshold,
        "min_teachers": stats.min_points(0.05),
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
    a: AnalysisConfig, g: pd.DataFrame, rows: pd.DataFrame, key: dict, comparison: dict | None
) -> dict[str, Any]:
    ranked = g.sort_values("post_acc", ascending=False, na_position="last", kind="stable")
    have = g.dropna(subset=["post_acc"])
    best = have.loc[have["post_acc"] == have["post_acc"].max(), "teacher"].tolist()
    strongest = g.loc[g["teacher_acc"] == g["teacher_acc"].max(), "teacher"].tolist()
    columns = ["teacher", "post_acc", "gain", "teacher_acc", "teacher_size", "seed_sd"]
    return {
        **key,
        "base_acc": float(g["base_acc"].max()) if g["base_acc"].notna().any() else NAN,
        "ranking": _within_noise(ranked[columns].to_dict("records")),
        "best_teachers": best,
        "strongest_teachers": strongest,
        "best_is_strongest": bool(set(best) & set(strongest)) if best and strongest else None,
        "verdict": _verdict(rows, best),
        "comparison": comparison,
        "decision": decide(a, comparison) if comparison else None,
        "correlations": exact_correlations(g),
        "degraded": _degraded(rows),
        "delta_large": delta_large(g),
    }


def _within_noise(ranking: list[dict]) -> list[dict]:
    """Mark each ranked teacher whose post is within the seed-to-seed SD of the next one's
    (`within_seed_noise_of_next`; None with one seed): that step of the ranking is noise."""
    for this, nxt in itertools.pairwise(ranking):
        sds = [x for x in (this["seed_sd"], nxt["seed_sd"]) if not math.isnan(x)]
        step = abs(this["post_acc"] - nxt["post_acc"])
        this["within_seed_noise_of_next"] = bool(step < max(sds)) if sds else None
    if ranking:
        ranking[-1]["within_seed_noise_of_next"] = None
    return ranking


def decide(a: AnalysisConfig, comparison: dict) -> dict[str, Any]:
    """Which teacher, how sure, and could the data tell: the teacher most often best in the
    bootstrap, every other teacher against it, and the teachers that beat (or lose to) the
    baseline. A difference counts when its Holm p is at most 1 - ci and its CI excludes 0."""
    alpha = 1 - a.ci
    ts = comparison["teachers"]
    best = max(ts, key=lambda t: (t["p_best"], t["post_acc"]))
    name = best["teacher"]
    versus = []
    for q in comparison["pairs"]:
        if name not in (q["a"], q["b"]):
            continue
        sign = 1 if q["b"] == name else -1  # orient as best minus other
        low, high = sorted((sign * q["low"], sign * q["high"]))
        other = q["a"] if sign == 1 else q["b"]
        diff = sign * q["diff"]
        versus.append(
            {"teacher": other, "diff": diff, "low": low, "high": high, "p_holm": q["p_holm"],
             "separated": bool(q["p_holm"] <= alpha and low > 0)}
        )  # fmt: skip

    def significant(t: dict, sign: int) -> bool:
        return t["p_holm"] <= alpha and (t["gain_low"] > 0 if sign > 0 else t["gain_high"] < 0)

    return {
        "best": name,
        "p_best": best["p_best"],
        "versus": versus,
        "separable": bool(versus) and all(v["separated"] for v in versus),
        "beats_baseline": [t["teacher"] for t in ts if significant(t, 1)],
        "worse_than_baseline": [t["teacher"] for t in ts if significant(t, -1)],
        "alpha": alpha,
    }


def exact_correlations(means: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Spearman of post and gain against each teacher property inside one group, with an exact
    permutation p-value; `too_few` below the fewest teachers a two-sided test needs to reach
    alpha 0.05 (stats.min_points: 5), where no test on this many points can say anything."""
    out = {}
    for y in ("post_acc", "gain"):
        for x in _PROPERTIES:
            c = stats.spearman_exact(means[x], means[y])
            n = int((means[x].notna() & means[y].notna()).sum())
            out[f"{y}~{x}"] = {
                **c._asdict(),
                "n": n,
                "smallest_p": stats.smallest_exact_p(n),
                "too_few": n < stats.min_points(0.05),
            }
    return out


def _verdict(rows: pd.DataFrame, best: list[str]) -> str | None:
    """significant_gain | gain_not_significant | no_gain: does the best teacher beat the baseline?"""
    if not best:
        return None
    mine = rows[rows["teacher"] == best[0]].dropna(subset=["gain"])
    if mine.empty:
        return None
    if mine["gain"].mean() <= 0:
        return "no_gain"
    return "significant_gain" if (mine["gain_ci_low"] > 0).all() else "gain_not_significant"


def correlations(a: AnalysisConfig, means: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Spearman of post and of gain against each teacher property, with bootstrap CIs."""
    out = {}
    for y in ("post_acc", "gain"):
        for x in _PROPERTIES:
            c = stats.spearman(means[x], means[y], a.ci, a.bootstrap_samples, a.seed)
            n = int((means[x].notna() & means[y].notna()).sum())
            out[f"{y}~{x}"] = {**c._asdict(), "n": n}
    return out


def within_group(a: AnalysisConfig, means: pd.DataFrame) -> dict[str, Any]:
    """Capacity-gap statistics that differences between groups cannot drive.

    Inside a group the baseline is one number, so post and gain rank alike and so do teacher
    accuracy and the gap: two relations are left, gain against teacher accuracy and against
    teacher size. For each: the mean of the within-group Spearman rhos (bootstrap over groups,
    sign-flip p) and the OLS slope with one intercept per group (size as log10 parameters).
    """
    keyed = means.assign(
        group=means[_GROUP].astype(str).agg("/".join, axis=1),
        log10_size=np.log10(means["teacher_size"].astype(float)),
    )
    parts = [g for _, g in keyed.groupby("group", sort=False)]
    out = {}
    for x, fe_x in (("teacher_acc", "teacher_acc"), ("teacher_size", "log10_size")):
        rhos = stats.mean_within_spearman(
            [(g[x], g["gain"]) for g in parts], a.ci, a.bootstrap_samples, a.seed
        )
        slope = stats.fixed_effects_slope(keyed["gain"], keyed[fe_x], keyed["group"], a.ci)
        out[f"gain~{x}"] = {"spearman": rhos, "fixed_effects": {**slope, "x": fe_x}}
    return out


def _degraded(rows: pd.DataFrame) -> dict[str, Any]:
    """Degraded (gain < 0) and significantly degraded (whole CI below 0) distilled cells."""
    scored = rows.dropna(subset=["gain"])
    n = len(scored)
    n_deg = int((scored["gain"] < 0).sum())
    n_sig = int((scored["gain_ci_high"] < 0).sum())
    return {
        "n_cells": n,
        "n_degraded": n_deg,
        "share_degraded": n_deg / n if n else NAN,
        "n_significant": n_sig,
        "share_significant": n_sig / n if n else NAN,
    }


def delta_large(means: pd.DataFrame) -> dict[str, Any]:
    """Li et al.'s ΔLarge = post(largest teacher) - post(smallest), next to both gains.

    Largest by size; by teacher accuracy when a size is missing or all sizes are equal. The two
    stories agree when the teacher ΔLarge prefers also beats the student's own baseline.
    """
    have = means.dropna(subset=["post_acc"])
    sizes = have["teacher_size"]
    by = "teacher_size" if sizes.notna().all() and sizes.nunique() > 1 else "teacher_acc"
    have = have.dropna(subset=[by])
    if len(have) < 2 or have[by].nunique() < 2:
        return {"by": by, "delta": NAN, "agree": None}
    large, small = have.loc[have[by].idxmax()], have.loc[have[by].idxmin()]
    delta = float(large["post_acc"] - small["post_acc"])
    preferred = "large" if delta > 0 else "small" if delta < 0 else None
    pref_gain = float({"large": large["gain"], "small": small["gain"]}.get(preferred, NAN))
    return {
        "by": by,
        "large": large["teacher"],
        "small": small["teacher"],
        "delta": delta,
        "post_large": float(large["post_acc"]),
        "post_small": float(small["post_acc"]),
        "base_acc": float(large["base_acc"]),
        "gain_large": float(large["gain"]),
        "gain_small": float(small["gain"]),
        "preferred": preferred,
        "agree": None if preferred is None or math.isnan(pref_gain) else bool(pref_gain > 0),
    }


def _overall(
    a: AnalysisConfig, means: pd.DataFrame, rows: pd.DataFrame, groups: list[dict], regime: str
) -> dict[str, Any]:
    mine = [g for g in groups if g["regime"] == regime]
    judged = [g for g in mine if g["best_is_strongest"] is not None]
    verdicts = [g["delta_large"]["agree"] for g in mine if g["delta_large"]["agree"] is not None]
    return {
        "n_groups": len(mine),
        "n_best_judged": len(judged),
        "n_best_is_strongest": sum(g["best_is_strongest"] for g in judged),
        "mean_post": float(means["post_acc"].mean()) if len(means) else NAN,
        "mean_gain": float(means["gain"].mean()) if len(means) else NAN,
        "n_separable": sum(bool(g["decision"] and g["decision"]["separable"]) for g in mine),
        "n_decided": sum(g["decision"] is not None for g in mine),
        "pooled_correlations": correlations(a, means),
        "within_group": within_group(a, means),
        "degraded": _degraded(rows),
        "n_delta_large": len(verdicts),
        "n_agree": sum(verdicts),
        "verdicts": dict(Counter(g["verdict"] for g in mine if g["verdict"])),
    }


def regime_comparison(dist: pd.DataFrame, regimes: list[str]) -> dict[str, Any]:
    """Mean post and gain per regime over the (task, student, teacher, seed) cells complete in all."""
    keys = ["task", "student", "teacher", "seed"]
    scored = dist[dist["regime"].isin(regimes)].dropna(subset=["post_acc", "gain"])
    wide = scored.pivot_table(index=keys, columns="regime", values=["post_acc", "gain"])
    wide = wide.dropna() if wide.columns.get_level_values(1).nunique() == len(regimes) else wide[:0]
    reference = "per_teacher" if "per_teacher" in regimes else (regimes or [None])[0]
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
    means = {
        r: v["mean_post"] for r, v in out["per_regime"].items() if not math.isnan(v["mean_post"])
    }
    out["best"] = max(means, key=means.get) if means else None
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
    """Per complete adapter: its regime (with the budget alignment), teacher (or mix), seed, the
    optimizer updates, effective batch, examples and tokens it trained on, the realised mix of a
    mix set, and its post accuracy and gain; one row per adapter, in leaderboard order."""
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
                "seed": r.seed,
                "align": b.get("align", "none"),
                "updates": s.get("steps"),
                "effective_batch": s.get("effective_batch"),
                "examples": b.get("examples"),
                "tokens": s.get("tokens"),
                "planned_updates": b.get("updates"),
                "reference_updates": (b.get("reference") or {}).get("updates"),
                "mix": ((dataset or {}).get("summary") or {}).get("mix"),
                "post_acc": r.post_acc,
                "gain": r.gain,
            }
        )
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
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(x) else float(x)
    if x is pd.NA:
        return None
    return x
