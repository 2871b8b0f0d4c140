"""analyze + report on a hand-made store: every number is recomputed here from the 0/1 vectors.

    .venv/bin/pytest tests/test_analyze.py

Cells are written at the keys `grid.expand` gives (local model directories made here, real task
names), through the real Store API. Gains, McNemar p-values (binomial sums with math.comb),
Bonett-Price intervals of paired differences (scipy's Student t only), Spearman (hand ranks) and
ΔLarge are computed independently of harness. The main store has one training seed: every group
is exploratory, and the report must say so rather than name a teacher; the teacher-level verdicts
are checked with replicates (two seeds and analysis.min_replicates 2 end to end, three replicates
through `analyze.compare_teachers`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from harness.analysis import analyze
from harness.config.schema import AnalysisConfig, Experiment
from harness.errors import UserError
from harness.stats import teacher_level
from harness.store import Store
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

N = 20
IDS = [f"q{i:02d}" for i in range(N)]
TEACHERS = {"t_small": 1e8, "t_mid": 1e9, "t_large": 7e9}
STUDENTS = {"s_a": 5e7, "s_b": 1e8}
# Real task names (their YAML gives the cell keys; no data is read). OTHER has teacher evals and
# baselines only: its distilled cells are missing.
TASK, OTHER = "gsm8k", "svamp"
TEACHER_CORRECT = {
    TASK: {"t_small": 6, "t_mid": 12, "t_large": 18},
    OTHER: {"t_small": 10, "t_mid": 11, "t_large": 12},
}
YIELD = {"t_small": 0.4, "t_mid": 0.7, "t_large": 0.95}
BASE_CORRECT = {"s_a": 10, "s_b": 6}
# (wins, losses) of each distilled student against its baseline: items flipped 0->1 and 1->0.
FLIPS = {
    ("s_a", "per_teacher"): {"t_small": (4, 1), "t_mid": (2, 2), "t_large": (0, 8)},
    ("s_b", "per_teacher"): {"t_small": (2, 1), "t_mid": (6, 0), "t_large": (3, 1)},
    ("s_a", "intersection"): {"t_small": (0, 2), "t_mid": (3, 0), "t_large": (1, 5)},
    ("s_b", "intersection"): {"t_small": (1, 0), "t_mid": (2, 2), "t_large": (0, 2)},
}
N_EXAMPLES = {"t_small": 40, "t_mid": 70, "t_large": 95}

TEACHER_COLUMNS = ["teacher_gain", "teacher_gain_low", "teacher_gain_high", "verdict"]
TEACHER_COLUMNS += ["in_best_set", "n_replicates"]


def _experiment(tmp_path: Path, seeds: tuple[int, ...] = (0,), **analysis: object) -> Experiment:
    def spec(name: str, size: float) -> dict:
        d = tmp_path / "models" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "name": name}))
        return {"name": name, "path": str(d), "size": size}

    return Experiment.model_validate(
        {
            "name": "toy",
            "results_dir": str(tmp_path / "results"),
            "teachers": [spec(n, s) for n, s in TEACHERS.items()],
            "students": [spec(n, s) for n, s in STUDENTS.items()],
            "tasks": [TASK, OTHER],
            "train": {
                "max_steps": 10,
                "regimes": ["per_teacher", "intersection"],
                "seeds": list(seeds),
            },
            "analysis": {"bootstrap_samples": 1000, "seed": 3, **analysis},
        }
    )


def _base_vector(student: str) -> np.ndarray:
    v = np.zeros(N, dtype=bool)
    v[: BASE_CORRECT[student]] = True
    return v


def _post_vector(student: str, wins: int, losses: int) -> np.ndarray:
    v = _base_vector(student).copy()
    k = BASE_CORRECT[student]
    v[:losses] = False  # the first correct items are lost
    v[k : k + wins] = True  # the first wrong items are won
    return v


def _write(store: Store, cell: Cell, summary: dict, files: dict | None = None) -> None:
    with store.open_cell(cell.kind, cell.key, cell.config, cell.upstream) as c:
        for name, obj in (files or {}).items():
            if name.endswith(".jsonl"):
                w = c.jsonl(name)
                for rec in obj:
                    w.write(rec)
            else:
                c.write_json(name, obj)
        c.finish(summary)


def _write_eval(store: Store, cell: Cell, correct: np.ndarray, ids=IDS) -> None:
    preds = [
        {"id": i, "completion": "...", "correct": bool(x)}
        for i, x in zip(ids, correct, strict=True)
    ]
    metrics = {"n": len(ids), "accuracy": float(np.mean(correct)), "format_failure_rate": 0.05}
    metrics["truncation_rate"] = 0.1
    _write(
        store,
        cell,
        {"accuracy": metrics["accuracy"]},
        {"predictions.jsonl": preds, "metrics.json": metrics},
    )


def _populate(exp: Experiment, store: Store, flips: dict = FLIPS, skip: set = frozenset()) -> None:
    """Every cell of the grid but `skip`; each training seed of a distilled student gets the same
    vector."""
    for c in grids.expand(exp):
        role = getattr(c, "role", None)
        if store.complete(c.kind, c.key) or c.key in skip:  # written by the test itself
            continue
        if c.kind == "traces":
            _write(store, c, {"yield": YIELD[c.model], "n_items": 50})
        elif c.kind == "eval" and role == "teacher":
            v = np.arange(N) < TEACHER_CORRECT[c.task][c.model]
            _write_eval(store, c, v)
        elif c.kind == "eval" and role == "baseline":
            _write_eval(store, c, _base_vector(c.model))
        elif c.task == OTHER:
            continue
        elif c.kind == "dataset":
            n = N_EXAMPLES[c.teacher]
            _write(store, c, {"n_examples": n, "train_tokens": 30 * n, "mean_trace_tokens": 30.0})
        elif c.kind == "adapter":
            _write(store, c, {"steps": 10, "effective_batch": 8, "final_loss": 0.5})
        else:
            wins, losses = flips[c.student, c.regime][c.teacher]
            _write_eval(store, c, _post_vector(c.student, wins, losses))


# --- independent re-computations -----------------------------------------------------------------


def mcnemar_by_hand(wins: int, losses: int) -> float:
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def family_level(base: np.ndarray, posts: list[np.ndarray]) -> float:
    """The per-comparison level of a group's max-t family (its teachers' gains and pairs), from
    `teacher_level.simultaneous_tail` (its own frequency properties: tests/test_inference.py);
    here it must lie between Bonferroni's over the family and Bonferroni's over the pairs."""
    from harness.stats import teacher_level

    m = len(posts)
    units = [np.atleast_2d(p).astype(float) for p in posts]
    cov = teacher_level.arm_covariance(base.astype(float), units, teacher_level.pool(units))
    family = [(i, None) for i in range(m)] + [(j, i) for i in range(m) for j in range(i + 1, m)]
    tail = teacher_level.simultaneous_tail(teacher_level._weights(m, family), cov, 0.05)
    assert 0.05 / len(family) <= tail <= 0.05 / max(m * (m - 1) / 2, 1)
    return 1 - tail


def naming_level(base: np.ndarray, posts: list[np.ndarray]) -> float:
    """The two-sided level of the interval a named teacher's answer row quotes in a grid of one
    task (no leader: the best-set route at all of alpha): its lower bound is the one-sided
    max-t test over the m gains, whose tail lies between alpha / m and alpha."""
    from harness.stats import teacher_level

    m = len(posts)
    units = [np.atleast_2d(p).astype(float) for p in posts]
    cov = teacher_level.arm_covariance(base.astype(float), units, teacher_level.pool(units))
    gains = teacher_level._weights(m, [(i, None) for i in range(m)])
    tail = teacher_level.simultaneous_tail(gains, cov, 0.05, two_sided=False)
    assert 0.05 / m <= tail <= 0.05
    return 1 - 2 * tail


def group_level(student: str, regime: str, flips: dict | None = None) -> float:
    return family_level(
        _base_vector(student), list(_vectors(student, regime, flips or FLIPS).values())
    )


def interval_by_hand(
    a: np.ndarray, b: np.ndarray, level: float, replicates: int = 1
) -> tuple[float, float]:
    """Bonett-Price interval of mean(a) - mean(b) for two paired 0/1 vectors (one replicate each,
    or `replicates` identical ones): one pseudo-item discordant each way on one adapter's scale
    (weight 1/replicates), Student's t on n - 1 degrees of freedom, clipped to [-1, 1] and widened
    to hold the point estimate."""
    n, w = len(a), 1 / replicates
    wins, losses = int((a & ~b).sum()), int((~a & b).sum())
    centre = (wins - losses) / (n + 2 * w)
    var = ((wins + losses + 2 * w) / (n + 2 * w) - centre**2) / (n + 2 * w)
    half = float(sps.t.ppf(0.5 + level / 2, n - 1)) * math.sqrt(var)
    point = (wins - losses) / n
    return min(max(-1.0, centre - half), point), max(min(1.0, centre + half), point)


def ranks(x: list[float]) -> list[float]:
    out = []
    for v in x:
        below, equal = sum(u < v for u in x), sum(u == v for u in x)
        out.append(below + (equal + 1) / 2)
    return out


def spearman_by_hand(x: list[float], y: list[float]) -> float:
    rx, ry = np.array(ranks(x)), np.array(ranks(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / math.sqrt((rx**2).sum() * (ry**2).sum()))


def expected_rows() -> list[dict]:
    rows = []
    for (student, regime), by_teacher in FLIPS.items():
        for teacher, (wins, losses) in by_teacher.items():
            base = BASE_CORRECT[student] / N
            post = (BASE_CORRECT[student] + wins - losses) / N
            low, high = interval_by_hand(
                _post_vector(student, wins, losses), _base_vector(student),
                group_level(student, regime),
            )  # fmt: skip
            rows.append(
                {"student": student, "regime": regime, "teacher": teacher, "base": base,
                 "post": post, "gain": post - base, "p": mcnemar_by_hand(wins, losses),
                 "low": low, "high": high}
            )  # fmt: skip
    return rows


def signed(x: float) -> str:
    """A fraction as signed points, as the report writes it."""
    return f"{round(100 * x, 1) + 0.0:+.1f}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """One store and one analysis shared by the read-only tests below."""
    exp = _experiment(tmp_path_factory.mktemp("built"))
    store = Store(exp.root)
    _populate(exp, store)
    logs: list[str] = []
    out = analyze.run(exp, store, log=logs.append)
    return exp, store, out, logs


def _board(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "leaderboard.csv", keep_default_na=True)


def _section(report: str, title: str) -> str:
    """The section whose heading starts with `title`, up to the next heading of its level or
    above."""
    m = re.search(rf"^(#+) {re.escape(title)}", report, flags=re.M)
    assert m, title
    end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", flags=re.M).search(report, m.end())
    return report[m.start() : end.start() if end else None]


def _answer_row(report: str, student: str, regime: str) -> str:
    lines = _section(report, "Answers").splitlines()
    return next(x for x in lines if x.startswith(f"| {TASK} | {student} | {regime} |"))


def _group(result: dict, student: str, regime: str) -> dict:
    return next(
        g
        for g in result["groups"]
        if (g["task"], g["student"], g["regime"]) == (TASK, student, regime)
    )


# --- the leaderboard -----------------------------------------------------------------------------


def test_leaderboard_reproduces_hand_numbers(built) -> None:
    exp, _, out, _ = built
    board = _board(out)
    assert list(board.columns) == list(analyze.COLUMNS)
    assert not {"p_holm", "p_best", "rank_ci"} & set(board.columns)
    per_task = len(TEACHERS) + len(STUDENTS) + len(STUDENTS) * len(TEACHERS) * 2
    assert len(board) == 2 * per_task
    dist = board[(board.row_type == "distilled") & (board.task == TASK)]
    for exp_row in expected_rows():
        row = dist[
            (dist.student == exp_row["student"])
            & (dist.regime == exp_row["regime"])
            & (dist.teacher == exp_row["teacher"])
        ]
        assert len(row) == 1
        r = row.iloc[0]
        assert r.base_acc == pytest.approx(exp_row["base"])
        assert r.post_acc == pytest.approx(exp_row["post"])
        assert r.gain == pytest.approx(exp_row["gain"])
        assert r.mcnemar_p == pytest.approx(exp_row["p"], rel=1e-9)
        assert bool(r.degraded) == (exp_row["gain"] < 0)
        assert r.n_test == N and r.seed == 0 and r.trace_seed == exp.generate.seed
        assert r.teacher_acc == pytest.approx(TEACHER_CORRECT[TASK][r.teacher] / N)
        assert r.teacher_train_acc == pytest.approx(YIELD[r.teacher])
        assert r.n_train_examples == N_EXAMPLES[r.teacher]
        assert r.train_tokens == 30 * N_EXAMPLES[r.teacher]
        assert r.teacher_size == TEACHERS[r.teacher] and r.student_size == STUDENTS[r.student]
        assert r.format_fail_rate == pytest.approx(0.05)
        # the teacher-level columns: with one replicate the teacher's gain is its one adapter's,
        # its interval the Bonett-Price one, and no verdict but inconclusive (exploratory)
        assert r.teacher_gain == pytest.approx(exp_row["gain"])
        assert r.teacher_gain_low == pytest.approx(exp_row["low"])
        assert r.teacher_gain_high == pytest.approx(exp_row["high"])
        assert r.verdict == "inconclusive" and r.n_replicates == 1
        assert str(r.in_best_set) == "True"  # nothing separates the teachers
    others = board[board.row_type != "distilled"]
    assert others[TEACHER_COLUMNS].isna().all().all()


def test_gain_ci_is_a_paired_bootstrap_interval(built) -> None:
    _, _, out, _ = built
    dist = _board(out).query("row_type == 'distilled' and task == @TASK")
    for r in dist.itertuples():
        assert r.gain_ci_low <= r.gain <= r.gain_ci_high
        wins, losses = FLIPS[r.student, r.regime][r.teacher]
        d = np.array([1] * wins + [-1] * losses + [0] * (N - wins - losses))
        normal = 2 * 1.96 * d.std() / math.sqrt(N)  # the width a normal approximation gives
        assert r.gain_ci_high - r.gain_ci_low == pytest.approx(normal, rel=0.5, abs=0.02)
    lost_eight = dist.query("student == 's_a' and regime == 'per_teacher' and teacher == 't_large'")
    # 8 losses, no wins: this one adapter's items-only CI is below 0, and so is the teacher's
    # interval; but one replicate says nothing about what the teacher does: no verdict
    assert lost_eight.gain_ci_high.iloc[0] < 0 and lost_eight.teacher_gain_high.iloc[0] < 0
    assert lost_eight.verdict.iloc[0] == "inconclusive"


def test_keys_point_at_the_cells_of_the_plan(built) -> None:
    exp, _, out, _ = built
    board = _board(out)
    cells = grids.expand(exp)
    base = cells.select(role="baseline", model="s_b", task=TASK)[0]
    row = board.query(
        "row_type == 'distilled' and task == @TASK and student == 's_b' and teacher == 't_mid' "
        "and regime == 'intersection'"
    ).iloc[0]
    ev = next(c for c in cells if c.key == row.eval_key)
    assert ev.teacher == "t_mid" and ev.regime == "intersection"
    assert row.adapter_key == ev.upstream[0] and row.baseline_key == base.key
    traces = cells.select(role="teacher", model="t_mid", task=TASK)
    assert row.traces_key in {c.key for c in traces if c.kind == "traces"}


def test_missing_cells_leave_nan_rows_and_a_count(built) -> None:
    _, _, out, logs = built
    board = _board(out)
    other = board.query("row_type == 'distilled' and task == @OTHER")
    assert len(other) == 12 and other.post_acc.isna().all() and other.gain.isna().all()
    assert other.base_acc.notna().all() and other.teacher_acc.notna().all()
    result = json.loads((out / "analysis.json").read_text())
    assert result["missing_cells"] == {"eval": 12, "adapter": 12, "dataset": 12}
    assert other[TEACHER_COLUMNS].isna().all().all()  # no decision without scored students
    answers = pd.read_csv(out / "answers.csv")
    assert set(answers["task"]) == {TASK} and len(answers) == 4
    assert len(logs) == 1 and "36 cell(s)" in logs[0]
    assert "36 cell(s) are not computed yet" in (out / "report.md").read_text()


def test_different_item_ids_are_an_error(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    store = Store(exp.root)
    _populate(exp, store)
    cell = grids.expand(exp).select(role="distilled", student="s_a", teacher="t_mid", task=TASK)
    target = next(c for c in cell if c.kind == "eval" and c.regime == "per_teacher")
    shutil.rmtree(store.cell_dir("eval", target.key))
    _write_eval(store, target, _base_vector("s_a"), ids=[*IDS[:-1], "q99"])
    with pytest.raises(UserError, match=rf"{target.key}.*different test items.*q19.*q99"):
        analyze.run(exp, store, log=lambda _: None)


# --- the groups and the capacity gap -------------------------------------------------------------


def _vectors(student: str, regime: str, flips: dict = FLIPS) -> dict[str, np.ndarray]:
    return {t: _post_vector(student, *wl) for t, wl in flips[student, regime].items()}


def test_group_numbers_by_hand(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    rows = expected_rows()
    g = _group(result, "s_a", "per_teacher")
    # the ranking is by mean post, a description; the verdicts and the best set are the decision's
    assert [t["teacher"] for t in g["ranking"]] == ["t_small", "t_mid", "t_large"]
    assert g["strongest_teachers"] == ["t_large"]
    assert not {"best_teachers", "best_is_strongest", "verdict", "comparison"} & set(g)
    d = g["decision"]
    assert d["exploratory"] and g["answer"] == d["answer"] == "inconclusive"
    assert d["distill"] == "inconclusive"
    # one replicate: no pairwise verdict, so every teacher stays in the best set
    assert d["best_set"] == ["t_small", "t_mid", "t_large"] and g["strongest_in_best_set"] is True
    assert [(t["verdict"], t["in_best_set"]) for t in g["ranking"]] == [("inconclusive", True)] * 3
    assert {q["verdict"] for q in d["pairs"]} == {"inconclusive"}
    assert g["degraded"] == {
        "n_cells": 3, "n_degraded": 1, "share_degraded": pytest.approx(1 / 3),
        "n_teachers": 3, "n_worse": 0, "worse": [],
    }  # fmt: skip
    # within-group correlations: gain against each teacher property only, exact, too few points
    mine = [r for r in rows if (r["student"], r["regime"]) == ("s_a", "per_teacher")]
    gains = [r["gain"] for r in mine]
    accs = [TEACHER_CORRECT[TASK][r["teacher"]] / N for r in mine]
    assert set(g["correlations"]) == {"gain~teacher_acc", "gain~teacher_size", "gain~gap"}
    c = g["correlations"]["gain~teacher_acc"]
    assert c["rho"] == pytest.approx(spearman_by_hand(accs, gains))
    assert c["too_few"] and c["smallest_p"] == pytest.approx(1 / 3)


def test_delta_large_carries_the_pairwise_interval_and_verdict(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    rows = expected_rows()
    for student, regime in FLIPS:
        mine = {r["teacher"]: r for r in rows if (r["student"], r["regime"]) == (student, regime)}
        v = _vectors(student, regime)
        d = _group(result, student, regime)["delta_large"]
        assert (d["large"], d["small"], d["by"]) == ("t_large", "t_small", "teacher_size")
        assert d["delta"] == pytest.approx(mine["t_large"]["post"] - mine["t_small"]["post"])
        assert d["gain_large"] == pytest.approx(mine["t_large"]["gain"])
        assert d["gain_small"] == pytest.approx(mine["t_small"]["gain"])
        # oriented large - small, whichever order the group's pair was stored in
        low, high = interval_by_hand(v["t_large"], v["t_small"], group_level(student, regime))
        assert (d["low"], d["high"]) == (pytest.approx(low), pytest.approx(high))
        # one replicate: inconclusive even where the interval excludes 0 (s_a per_teacher)
        assert d["verdict"] == d["large_vs_base"] == d["small_vs_base"] == "inconclusive"
        assert "preferred" not in d and "agree" not in d
    assert _group(result, "s_a", "per_teacher")["delta_large"]["high"] < 0


def test_overall_and_capacity_gap_numbers(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    rows = expected_rows()
    for regime in ("per_teacher", "intersection"):
        o = result["overall"][regime]
        assert o["n_decided"] == o["n_exploratory"] == 2
        assert o["answers"] == {"inconclusive": 2} and o["distill"] == {"inconclusive": 2}
        assert o["n_strongest_in_best_set"] == 2 and "within_group" not in o
        mine = [r for r in rows if r["regime"] == regime]
        # pooled Spearman of post vs teacher accuracy and vs the gap, by hand (descriptive)
        post = [r["post"] for r in mine]
        acc = [TEACHER_CORRECT[TASK][r["teacher"]] / N for r in mine]
        gap = [a - r["base"] for a, r in zip(acc, mine, strict=True)]
        c = o["pooled_correlations"]
        assert c["post_acc~teacher_acc"]["rho"] == pytest.approx(spearman_by_hand(acc, post))
        assert c["post_acc~gap"]["rho"] == pytest.approx(spearman_by_hand(gap, post))
        assert c["post_acc~teacher_acc"]["n"] == 6
        assert c["post_acc~gap"]["low"] <= c["post_acc~gap"]["rho"] <= c["post_acc~gap"]["high"]
        # the teacher-level test: the mean of the two students' within-group rhos, with all 3!
        # orders of the task's teachers as its null: p can never reach 0.05
        rhos = []
        for student in STUDENTS:
            r = [x for x in mine if x["student"] == student]
            rhos.append(
                spearman_by_hand([TEACHER_CORRECT[TASK][x["teacher"]] for x in r],
                                 [x["gain"] for x in r])
            )  # fmt: skip
        cg = o["capacity_gap"]
        t = cg["gain~teacher_acc"]
        assert t["rho"] == pytest.approx(np.mean(rhos)) and t["n_groups"] == 2
        assert t["n_permutations"] == 6 and t["too_few"] and t["smallest_p"] > 0.05
        assert cg["collinear"] is True  # accuracy and size order gsm8k's teachers alike
        deg = o["degraded"]
        assert deg["n_cells"] == 6 and deg["n_degraded"] == sum(r["gain"] < 0 for r in mine)
        assert deg["n_worse"] == 0 and deg["n_teachers"] == 6
    overall = result["degraded"]
    n_deg = sum(r["gain"] < 0 for r in rows)
    assert (overall["n_cells"], overall["n_degraded"], overall["n_worse"]) == (12, n_deg, 0)


def test_regimes_and_task_spread(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    rows = expected_rows()
    comp = result["regimes"]
    assert comp["n_pairs"] == 6 and comp["reference"] == "per_teacher"
    assert "best" not in comp  # a description: no regime is called best
    post = {(r["regime"], r["student"], r["teacher"]): r["post"] for r in rows}
    for reg in ("per_teacher", "intersection"):
        m = np.mean([r["post"] for r in rows if r["regime"] == reg])
        assert comp["per_regime"][reg]["mean_post"] == pytest.approx(m)
    diffs = [
        post["intersection", s, t] - post["per_teacher", s, t] for s in STUDENTS for t in TEACHERS
    ]
    inter = comp["per_regime"]["intersection"]
    assert inter["mean_diff_post"] == pytest.approx(np.mean(diffs))
    won = sum(x > 1e-12 for x in diffs), sum(abs(x) <= 1e-12 for x in diffs)
    assert (inter["wins"], inter["ties"], inter["losses"]) == (*won, 6 - sum(won))

    board = _board(out)
    assert [t["task"] for t in result["task_spread"]] == [TASK, OTHER]
    assert result["task_spread"][0]["spread"] == pytest.approx(60.0)
    assert result["task_spread"][1]["spread"] == pytest.approx(10.0)
    assert result["selected_tasks"] == [TASK]  # default threshold: 30 points
    assert analyze.select_tasks_by_spread(board, threshold=5) == [TASK, OTHER]
    assert analyze.select_tasks_by_spread(board, threshold=70) == []


# --- the report ----------------------------------------------------------------------------------


def _largest_gain(student: str, regime: str) -> dict:
    mine = [r for r in expected_rows() if (r["student"], r["regime"]) == (student, regime)]
    return max(mine, key=lambda r: r["gain"])


def test_report_states_what_the_data_say(built) -> None:
    """One training seed: every group is exploratory, and the report says so instead of naming
    a teacher, though one adapter's items-only CI is far from 0."""
    _, _, out, _ = built
    report = (out / "report.md").read_text()
    answers = _section(report, "Answers")
    assert "fewer than 3 replicates per teacher (analysis.min_replicates): nothing is claimed" in (
        answers
    )
    assert re.search(
        r"covers test items and replicates at 9[0-9.]+(–9[0-9.]+% per comparison|%), "
        r"simultaneous over the group's comparisons \(each teacher against the baseline and "
        r"against each other, one max-t family; family-wise 5%\)",
        answers,
    )
    for student, regime in FLIPS:
        top = _largest_gain(student, regime)
        row = _answer_row(report, student, regime)
        base = f"{100 * BASE_CORRECT[student] / N:.1f}"
        assert row == (
            f"| {TASK} | {student} | {regime} | {base} | inconclusive (exploratory) | "
            f"inconclusive | {top['teacher']} | {signed(top['gain'])} | [{signed(top['low'])}, "
            f"{signed(top['high'])}] | inconclusive | t_small, t_mid, t_large | 1 |"
        )
    assert "| t_large | yes |" not in answers and "p_best" not in report and "Holm" not in report

    evidence = _section(report, "Evidence per group")
    lost = next(r for r in expected_rows() if (r["student"], r["teacher"], r["regime"]) ==
                ("s_a", "t_large", "per_teacher"))  # fmt: skip
    interval = f"[{signed(lost['low'])}, {signed(lost['high'])}]"
    assert f"| t_large | 10.0 | -40.0 | {interval} | 1 | – | inconclusive | yes |" in evidence
    n_deg = sum(r["gain"] < 0 for r in expected_rows())
    degraded = _section(report, "Degraded")
    assert "0 of 12 (teacher, group) comparisons find the distilled student worse" in degraded
    assert f"{n_deg} of 12 single adapters" in degraded
    gap = _section(report, "Capacity gap")
    assert "the strongest teacher (by accuracy) is in the best set in 2 of 2 groups" in gap
    assert "too few teachers (3: the smallest possible p is 0.333; it needs ≥ 5" in gap
    assert "one relation, not two" in gap
    assert "a relation" not in gap.replace("one relation", "")
    v = _vectors("s_a", "per_teacher")
    low, high = interval_by_hand(v["t_large"], v["t_small"], group_level("s_a", "per_teacher"))
    assert (
        f"| {TASK} | s_a | per_teacher | t_large / t_small | -55.0 | [{signed(low)}, "
        f"{signed(high)}] | inconclusive | 50.0 | -40.0 (inconclusive) | +15.0 (inconclusive) |"
    ) in _section(report, "ΔLarge")
    regimes = _section(report, "Regimes")
    assert "no regime is called better here" in regimes and "**" not in regimes

    assert "max_steps 10" in report and "effective batch 8" in report and "lr 0.0002" in report
    assert "temperature=0.0" in report  # the eval config is stated
    assert "No task pre-selection is configured (`select:`): every task ran" in report
    assert f"1 of 2 tasks: {TASK} have a spread over analysis.spread_threshold" in report
    assert "are selected" not in report  # nothing was selected: both tasks ran
    formats = _section(report, "Answer formats").splitlines()
    board = _board(out)
    for x in board[board["row_type"].isin(["teacher", "baseline"])].itertuples():
        model = x.teacher if x.row_type == "teacher" else x.student
        assert any(f"| {x.task} | {x.row_type} | {model} |" in line and "| 5.0 | 10.0 |" in line
                   for line in formats), (x.task, model)  # fmt: skip
    for png in sorted(out.glob("*.png")):
        assert png.stat().st_size > 10_000
    names = {p.name for p in out.glob("*.png")}
    # one figure per question, however many tasks, students and regimes
    assert names == {"gains.png", "post_vs_teacher.png", "capacity_gap.png"}
    for name in names:
        assert f"({name})" in _section(report, "Figures")
        svg = (out / name).with_suffix(".svg").read_text()
        assert svg.startswith("<?xml") and "<svg" in svg
    # the two capacity-gap panels of a regime say what each plots (matplotlib keeps a text's
    # string as a comment beside its glyphs)
    titles = re.findall(
        r"<!-- (per_teacher: gain vs [^>]*?) -->", (out / "capacity_gap.svg").read_text()
    )
    assert sorted(titles) == [
        "per_teacher: gain vs teacher accuracy",
        "per_teacher: gain vs teacher parameters",
    ]


def test_answers_csv_is_the_reports_first_table_and_the_plots_agree(built) -> None:
    _, _, out, _ = built
    answers = pd.read_csv(out / "answers.csv")
    assert list(answers.columns) == list(analyze.ANSWER_COLUMNS)
    assert sorted(tuple(x) for x in answers[["task", "student", "regime"]].to_numpy()) == sorted(
        (TASK, s, r) for s, r in FLIPS
    )
    report = (out / "report.md").read_text()
    first_table = next(x for x in report.splitlines() if x.startswith("| "))
    assert first_table.startswith("| task | student | regime | base | answer | distill? |")
    for a in answers.itertuples():
        top = _largest_gain(a.student, a.regime)
        assert (a.answer, a.distill, a.quoted_teacher, a.verdict) == (
            "inconclusive",
            "inconclusive",
            top["teacher"],
            "inconclusive",
        )
        assert pd.isna(a.teacher)  # quoted, not recommended: the teacher column stays empty
        # points, rounded as the report prints them: one unit, no float noise
        assert (a.gain, a.gain_low, a.gain_high) == (
            round(100 * top["gain"], 1),
            round(100 * top["low"], 1),
            round(100 * top["high"], 1),
        )
        assert a.best_set == "t_small;t_mid;t_large" and a.n_replicates == 1
        assert (a.exploratory, a.action) == ("yes", "add_replicates")
        assert a.n_items == N
        assert a.level == round(100 * group_level(a.student, a.regime), 2)
        assert a.effect_of_interest == 3.0
        assert _answer_row(report, a.student, a.regime).startswith(
            f"| {a.task} | {a.student} | {a.regime} | {a.base_acc:.1f} | {a.answer} "
            f"(exploratory) | {a.distill} | {a.quoted_teacher} | {a.gain:+.1f} |"
        )
    text = (out / "answers.csv").read_text()
    assert not re.search(r"\d\.\d{5,}", text), text  # 0.024999999999999998 and the like
    # the plots draw the teacher-level numbers of the leaderboard, verdicts included
    plot = pd.read_csv(out / "plot_data.csv")
    board = _board(out).query("row_type == 'distilled' and task == @TASK")
    merged = plot.merge(board, on=["task", "student", "regime", "teacher"])
    assert len(merged) == len(plot) == 12
    assert merged["gain_x"].to_numpy() == pytest.approx(merged["teacher_gain"].to_numpy())
    assert merged["gain_low"].to_numpy() == pytest.approx(merged["teacher_gain_low"].to_numpy())
    assert (merged["verdict_x"] == merged["verdict_y"]).all()


def test_the_report_answers_first_and_says_each_section_once(built) -> None:
    """The demo's shape (3 teachers, 2 students, 2 tasks, 2 regimes): the answers come within the
    first lines, everything else sits under one Appendices heading that lists it, no heading is
    there twice, and nothing before the appendices repeats the answers table row by row."""
    _, _, out, _ = built
    lines = (out / "report.md").read_text().splitlines()
    heads = [x for x in lines if x.startswith("#")]
    assert len(heads) == len(set(heads)), [h for h in heads if heads.count(h) > 1]
    assert [x for x in heads if re.match(r"#{1,2} ", x)] == [
        "# cotgap report: toy", "## Setup", "## Answers", "## Appendices"
    ]  # fmt: skip
    answers, appendix = lines.index("## Answers"), lines.index("## Appendices")
    assert answers < 15 and appendix <= 100
    listed = lines[appendix + 2].removeprefix("The evidence behind the answers: ").rstrip(".")
    assert [f"### {t}" for t in listed.split("; ")] == [x for x in heads if x.startswith("### ")]
    front = lines[:appendix]
    for word in ("**a teacher**", "**none**", "**inconclusive**", "**exploratory**"):
        assert sum(word in x for x in front) == 1, word
    setup = "\n".join(front[:answers])
    assert "=None" not in setup and "=[]" not in setup and "temperature=0.0" in setup
    assert sum(x.startswith(f"| {TASK} |") for x in front) == len(FLIPS)
    assert not [x for x in front if x.startswith("- ") and f" on {TASK} " in x]
    assert "## Warnings" not in lines  # no cell of this store is unusable


def test_a_teacher_without_a_correct_trace_is_a_warning_in_the_report(tmp_path: Path) -> None:
    """The same lines `cotgap run` prints (harness/analysis/health.py), read from the cells' manifests at
    analyze time: between the answers and the appendices, with the number and what to change."""
    exp = _experiment(tmp_path)
    store = Store(exp.root)
    empty = [c for c in grids.expand(exp).unique() if c.kind == "traces" and c.model == "t_small"]
    for c in empty:
        _write(store, c, {"yield": 0.0, "n_items": 50, "n_samples": 100})
    _populate(exp, store)
    report = (analyze.run(exp, store, log=lambda _: None) / "report.md").read_text()
    assert report.index("## Answers") < report.index("## Warnings") < report.index("## Appendices")
    warnings = _section(report, "Warnings").strip().splitlines()[2:]
    # one traces cell per task; the same problem with the same advice is one line, advice once
    assert len(empty) == 2 and len(warnings) == 1
    (line,) = warnings
    for c in empty:
        assert f"{c.label}: 0 of 50 questions have a correct trace (100 samples)" in line
    assert line.count("raise generate.n or generate.max_tokens") == 1


def test_empty_training_sets_are_skipped_not_incomplete_and_a_tiny_one_warns(
    tmp_path: Path,
) -> None:
    """Every training set of the other task is empty (its teachers wrote no correct trace): its
    adapters and evals are skipped on purpose, never "not computed yet", and the warning blames
    the teacher, not train.max_length. An adapter that saw its one example 160 times warns."""
    exp = _experiment(tmp_path)
    store = Store(exp.root)
    cells = grids.expand(exp).unique()
    empty = [c for c in cells if c.kind == "dataset" and c.task == OTHER]
    for c in empty:
        _write(store, c, {"n_examples": 0, "n_dropped_overlong": 0, "train_tokens": 0})
    tiny = next(c for c in cells if c.kind == "adapter" and c.task == TASK)
    _write(store, tiny, {"examples": 1, "steps": 10, "effective_batch": 16, "epochs": 160.0})
    _populate(exp, store)
    out = analyze.run(exp, store, log=lambda _: None)
    report = (out / "report.md").read_text()
    assert json.loads((out / "analysis.json").read_text())["missing_cells"] == {}
    assert "Incomplete" not in report and "not computed yet" not in report
    warnings = _section(report, "Warnings").strip().splitlines()[2:]
    # the empty sets share one line (one advice); the tiny adapter has its own
    (line,) = [x for x in warnings if "0 training examples" in x]
    for c in empty:
        assert f"{c.label}: 0 training examples" in line
    assert line.count(": its teacher wrote no correct trace") == 1
    assert "train.max_length" not in line
    (line,) = [x for x in warnings if x.startswith(f"- {tiny.label}: ")]
    assert "1 training example(s) seen 160 times each (10 steps, batch 16)" in line
    assert len(warnings) == 2


def test_a_set_that_dropped_over_long_examples_warns() -> None:
    """A training set that kept 2 of 3 correct traces (one longer than train.max_length) warns
    with the numbers: the shorter traces are kept, which biases a comparison of teachers; under
    the threshold it says nothing."""
    from harness.analysis import health

    exp = _experiment(Path("/nonexistent"))
    cell = next(c for c in grids.expand(exp).unique() if c.kind == "dataset")
    ((fact, advice),) = health._dataset(exp, cell, {"n_examples": 2, "n_dropped_overlong": 1})
    assert (
        fact
        == f"{cell.label}: 1 of 3 examples dropped as longer than train.max_length {exp.train.max_length}"
    )
    assert "raise train.max_length" in advice
    assert health._dataset(exp, cell, {"n_examples": 100, "n_dropped_overlong": 1}) == []


def test_a_cell_without_answers_says_which_file_explain_reads() -> None:
    """Completions that hold no answer warn with the command that shows why, and where its file
    is: the options it names are `cotgap score`'s own."""
    from harness.analysis import health

    exp = _experiment(Path("/nonexistent"))
    cell = next(c for c in grids.expand(exp).unique() if c.kind == "eval")
    ((fact, advice),) = health._rates(cell, {"format_failure_rate": 1.0}, 12, "evaluate", 64)
    assert fact == f"{cell.label}: 100% of 12 completions hold no answer the task's extractor reads"
    assert "`cotgap score --explain --task TASK --predictions P`" in advice
    assert "predictions.jsonl, linked under by-name/eval/" in advice
    out = subprocess.run([sys.executable, "-m", "harness", "score", "--help"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert all(opt in out.stdout for opt in ("--explain", "--task", "--predictions")), out.stdout


def test_report_follows_the_data(tmp_path: Path) -> None:
    """Two seeds and analysis.min_replicates 2, and the large teacher wins 8 items and loses none
    for s_a: it is better than the baseline and than each other teacher, so the report names it;
    nothing stale stays."""
    exp = _experiment(tmp_path, seeds=(0, 1), min_replicates=2)
    store = Store(exp.root)
    flips = dict(FLIPS)
    flips["s_a", "per_teacher"] = {"t_small": (0, 8), "t_mid": (2, 2), "t_large": (8, 0)}
    _populate(exp, store, flips)
    (store.root / "analysis").mkdir(parents=True)
    (store.root / "analysis" / "stale.png").write_bytes(b"old")
    out = analyze.run(exp, store, log=lambda _: None)
    report = (out / "report.md").read_text()
    v, base = _vectors("s_a", "per_teacher", flips), _base_vector("s_a")
    # both seeds score the same items: no replicate spread, the interval is Bonett-Price's
    level = group_level("s_a", "per_teacher", flips)
    assert interval_by_hand(v["t_large"], base, level, replicates=2)[0] > 0  # the rule: better
    for other in ("t_small", "t_mid"):
        assert interval_by_hand(v["t_large"], v[other], level, replicates=2)[0] > 0
    # the answer row quotes the test that named it (one task: the best set's route)
    low, high = interval_by_hand(
        v["t_large"], base, naming_level(base, list(v.values())), replicates=2
    )
    assert _answer_row(report, "s_a", "per_teacher") == (
        f"| {TASK} | s_a | per_teacher | 50.0 | t_large | yes | t_large | +40.0 | "
        f"[{signed(low)}, {signed(high)}] | {'yes' if low > 0.03 else 'inconclusive'} | "
        "t_large | 2 |"
    )
    assert "**Two replicates:** 4 group(s) rest on 2 replicates" in _section(report, "Answers")
    result = json.loads((out / "analysis.json").read_text())
    d = _group(result, "s_a", "per_teacher")["decision"]
    verdicts = {t["teacher"]: t["verdict"] for t in d["teachers"]}
    assert verdicts["t_large"] == "better" and verdicts["t_small"] == "worse"  # 8 losses
    assert d["best_set"] == ["t_large"] and d["distill"] == "yes"
    board = _board(out).query("row_type == 'distilled' and student == 's_a' and task == @TASK")
    mine = board.query("regime == 'per_teacher'")
    assert set(mine.loc[mine.teacher == "t_large", "verdict"]) == {"better"}
    assert mine.in_best_set.astype(str).tolist() == [str(t == "t_large") for t in mine.teacher]
    assert not (out / "stale.png").exists()
    assert not list(store.root.glob(".analysis*"))
    assert "the best set in 2 of 2 groups" in _section(report, "Capacity gap")


def test_rebuild_is_deterministic(built) -> None:
    exp, store, out, _ = built
    kept = (".csv", ".json", ".md", ".svg")
    first = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in kept}
    analyze.run(exp, store, log=lambda _: None)
    second = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in kept}
    assert first == second


def test_a_damaged_metrics_file_names_itself_and_the_fix(tmp_path):
    from harness.errors import UserError

    d = tmp_path / "cells" / "eval" / "k1"
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text('{"id": "a", "correct": true}\n')
    (d / "metrics.json").write_text('{"accuracy": 0.5, "engi')  # cut short by a full disk
    with pytest.raises(UserError, match=r"metrics\.json: damaged .*delete .*k1 and re-run"):
        analyze._read_eval(d, "k1")


# --- decisions: which teacher, how sure --------------------------------------------------------


def _replicates(vectors: list[np.ndarray], trace_seed: int | None = None) -> list:
    """One teacher's adapters on one trace draw, training seeds 0, 1, ..."""
    return [analyze.Replicate(trace_seed, seed, np.asarray(v)) for seed, v in enumerate(vectors)]


def test_a_clearly_better_teacher_is_the_answer() -> None:
    a = AnalysisConfig()  # min_replicates 3
    rng = np.random.default_rng(8)
    base = rng.random(200) < 0.3
    strong = [rng.random(200) < 0.65 for _ in range(3)]
    weak = [rng.random(200) < 0.3 for _ in range(3)]
    c = analyze.compare_teachers(
        a, base, {"weak": _replicates(weak), "strong": _replicates(strong)}
    )
    t = {x["teacher"]: x for x in c["teachers"]}
    assert t["strong"]["gain"] == pytest.approx(np.mean(strong) - base.mean())
    assert t["strong"]["n_replicates"] == 3 and not c["exploratory"]
    assert t["strong"]["verdict"] == "better" and t["weak"]["verdict"] != "better"
    (pair,) = c["pairs"]
    assert (pair["a"], pair["b"], pair["verdict"]) == ("weak", "strong", "better")
    assert pair["diff"] == pytest.approx(np.mean(strong) - np.mean(weak))
    assert c["best_set"] == ["strong"] and c["answer"] == "strong" and c["distill"] == "yes"
    assert c["headline"]["teacher"] == "strong"
    mde = c["mde"]
    assert mde["replicates"] == 3 and mde["rep_sd_source"] == "measured"
    assert 0 < mde["gain"] < 1 and 0 < mde["difference"] < 1

    # the same adapters with two replicates each: below analysis.min_replicates, exploratory
    two = {"weak": _replicates(weak[:2]), "strong": _replicates(strong[:2])}
    c = analyze.compare_teachers(a, base, two)
    assert c["exploratory"] and c["answer"] == c["distill"] == "inconclusive"
    assert {x["verdict"] for x in c["teachers"] + c["pairs"]} == {"inconclusive"}
    assert c["best_set"] == ["weak", "strong"]
    # ... unless the config allows two (the smallest minimum it accepts): decided, but on one
    # degree of freedom per teacher the interval is far wider than three replicates give
    three = {x["teacher"]: x["gain_high"] - x["gain_low"] for x in t.values()}
    c = analyze.compare_teachers(AnalysisConfig(min_replicates=2), base, two)
    assert not c["exploratory"] and c["best_set"] == ["strong"]
    (strong2,) = [x for x in c["teachers"] if x["teacher"] == "strong"]
    assert strong2["gain_high"] - strong2["gain_low"] > 2 * three["strong"]
    with pytest.raises(ValueError, match="min_replicates"):
        AnalysisConfig(min_replicates=1)


def test_equal_teachers_give_no_better_and_hand_intervals() -> None:
    """Two teachers whose three replicates all score the same items: no replicate spread, so each
    gain interval is Bonett-Price's at the level of the group's family (2 gains and 1 pair), and
    the pair is equivalent, never better."""
    rng = np.random.default_rng(9)
    base = rng.random(200) < 0.3
    post = rng.random(200) < 0.6
    c = analyze.compare_teachers(
        AnalysisConfig(), base, {"ta": _replicates([post] * 3), "tb": _replicates([post] * 3)}
    )
    low, high = interval_by_hand(post, base, family_level(base, [post, post]), replicates=3)
    for t in c["teachers"]:
        assert (t["gain_low"], t["gain_high"]) == (pytest.approx(low), pytest.approx(high))
        assert t["verdict"] == "better" and t["rep_sd"] == 0
    (pair,) = c["pairs"]
    assert pair["diff"] == 0 and pair["verdict"] == "equivalent"
    assert c["best_set"] == ["ta", "tb"]
    # distilling helps, but which teacher is best the data cannot tell
    assert c["answer"] == "inconclusive" and c["distill"] == "yes"

    # equal in truth, replicates drawn independently: still no teacher better than the other
    same = {k: _replicates([rng.random(200) < 0.6 for _ in range(3)]) for k in ("tc", "td")}
    c = analyze.compare_teachers(AnalysisConfig(), base, same)
    assert c["pairs"][0]["verdict"] not in ("better", "worse")
    assert c["best_set"] == ["tc", "td"] and c["answer"] == "inconclusive"


def test_replicates_that_disagree_widen_the_interval() -> None:
    """One erratic teacher next to two steady ones: its own replicate variance widens its
    interval, and the group's typical (median) one keeps it out of the steady teachers'."""
    rng = np.random.default_rng(2)
    base = rng.random(300) < 0.4
    steady = [rng.random(300) < 0.55 for _ in range(3)]
    other = [rng.random(300) < 0.55 for _ in range(3)]
    erratic = [rng.random(300) < p for p in (0.35, 0.75, 0.55)]
    c = analyze.compare_teachers(
        AnalysisConfig(),
        base,
        {
            "steady": _replicates(steady),
            "other": _replicates(other),
            "erratic": _replicates(erratic),
        },
    )
    t = {x["teacher"]: x for x in c["teachers"]}
    # the erratic teacher's replicates disagree by 40 points: its gain interval is much wider
    width = {k: v["gain_high"] - v["gain_low"] for k, v in t.items()}
    assert width["erratic"] > 4 * width["steady"]
    assert t["erratic"]["rep_sd"] > 5 * t["steady"]["rep_sd"]
    assert t["steady"]["verdict"] == t["other"]["verdict"] == "better"
    assert t["erratic"]["verdict"] == "inconclusive"


def test_trace_draws_are_the_replicate_units() -> None:
    """Two trace draws with two training seeds each: the unit is the draw (its seeds averaged),
    so four adapters are two replicates, not four."""
    rng = np.random.default_rng(4)
    base = rng.random(100) < 0.4
    reps = [
        analyze.Replicate(draw, seed, rng.random(100) < 0.6) for draw in (3, 8) for seed in (0, 1)
    ]
    c = analyze.compare_teachers(AnalysisConfig(), base, {"t": reps})
    (t,) = c["teachers"]
    assert t["n_replicates"] == 2 and t["exploratory"] and c["exploratory"]
    assert t["post_acc"] == pytest.approx(np.mean([r.correct for r in reps]))


# --- the capacity gap at the teacher level ------------------------------------------------------


def _confounded_means(rng: np.random.Generator, tasks: int = 6, teachers: int = 4) -> pd.DataFrame:
    """Tasks of different difficulty: on an easier one the teachers are stronger and every
    student gains more, but inside a task the gain does not depend on the teacher."""
    rows = []
    for c in range(tasks):
        level = 0.1 + 0.6 * c / (tasks - 1)
        acc = level + rng.uniform(0.05, 0.2, teachers)
        for s in ("s0", "s1"):
            for t in range(teachers):
                gain = 0.4 * level + rng.normal(0, 0.01)
                rows.append(
                    {"task": f"task{c}", "student": s, "regime": "per_teacher",
                     "teacher": f"t{t}", "teacher_acc": acc[t],
                     "teacher_size": 1e8 * 10 ** (3 * acc[t]),  # size follows accuracy
                     "base_acc": level, "gain": gain, "post_acc": level + gain,
                     "gap": acc[t] - level}
                )  # fmt: skip
    return pd.DataFrame(rows)


def test_capacity_gap_ignores_a_planted_confounder() -> None:
    a = AnalysisConfig()
    means = _confounded_means(np.random.default_rng(1), teachers=6)
    pooled = analyze.correlations(a, means)
    assert pooled["gain~teacher_acc"]["p"] < 0.001 and pooled["gain~teacher_acc"]["low"] > 0.5
    gap = analyze.capacity_gap(a, means)
    assert gap["gain~teacher_acc"]["p"] > 0.05 and gap["gain~teacher_acc"]["n_groups"] == 12
    assert not gap["gain~teacher_acc"]["too_few"]
    assert gap["collinear"] is True  # size follows accuracy on every task: one relation
    # a real within-task relation is found
    planted = means.assign(gain=means["gain"] + 0.5 * means["teacher_acc"])
    assert analyze.capacity_gap(a, planted)["gain~teacher_acc"]["p"] < 0.01
    # sizes unrelated to accuracy: two relations, reported apart
    shuffled = means.assign(teacher_size=means["teacher"].map({"t0": 3e9, "t1": 1e8, "t2": 7e9,
                                                                "t3": 1e9, "t4": 5e8,
                                                                "t5": 2e9}))  # fmt: skip
    assert analyze.capacity_gap(a, shuffled)["collinear"] is False
    # four teachers: 4! orders of their labels over the whole grid cannot reach 0.05
    four = analyze.capacity_gap(a, planted[planted["teacher"].isin(["t0", "t1", "t2", "t3"])])
    assert four["gain~teacher_acc"]["too_few"] and four["gain~teacher_acc"]["needed"] == 5
    assert not four["gain~teacher_acc"]["rejects"]


def test_seed_sd_is_the_noise_floor_of_teacher_means() -> None:
    rows = []
    for teacher, posts in {"ta": (0.50, 0.60), "tb": (0.54, 0.58), "tc": (0.30, 0.31)}.items():
        for seed, post in enumerate(posts):
            rows.append({"task": "t", "student": "s", "regime": "per_teacher", "teacher": teacher,
                         "seed": seed, "post_acc": post, "gain": post - 0.4, "base_acc": 0.4,
                         "teacher_acc": 0.7, "teacher_size": 1e9})  # fmt: skip
    means = analyze.teacher_means(pd.DataFrame(rows)).set_index("teacher")
    assert means.loc["tb", "seed_sd"] == pytest.approx(np.std([0.54, 0.58], ddof=1))
    assert means.loc["ta", "post_acc"] == pytest.approx(0.55)
    assert means.loc["tc", "gain"] == pytest.approx(0.305 - 0.4)
    assert means["n_seeds"].tolist() == [2, 2, 2]


def test_two_seeds_end_to_end(tmp_path: Path) -> None:
    """Seed 1 wins two more items than seed 0 for every teacher: seed_sd is 1/sqrt(2) * 2 items,
    the teacher-level gains are the decision's on these very vectors, and with two replicates
    (below analysis.min_replicates 3) every group is exploratory and the report says so."""
    exp = _experiment(tmp_path, seeds=(0, 1))
    store = Store(exp.root)
    for c in grids.expand(exp):
        if c.kind == "eval" and getattr(c, "role", None) == "distilled" and c.task == TASK:
            wins, losses = FLIPS[c.student, c.regime][c.teacher]
            _write_eval(store, c, _post_vector(c.student, wins + 2 * c.seed, losses))
    _populate(exp, store)  # every other cell; the distilled evals above are complete already
    out = analyze.run(exp, store, log=lambda _: None)
    board = _board(out)
    dist = board[(board["row_type"] == "distilled") & (board["task"] == TASK)]
    assert dist["seed_sd"].to_numpy() == pytest.approx(np.full(len(dist), np.std([0, 0.1], ddof=1)))
    assert (dist["n_replicates"] == 2).all() and (dist["verdict"] == "inconclusive").all()
    base = _base_vector("s_b")
    reps = {
        t: _replicates([_post_vector("s_b", won + 2 * s, lost) for s in (0, 1)], exp.generate.seed)
        for t, (won, lost) in FLIPS["s_b", "per_teacher"].items()
    }
    c = analyze.compare_teachers(exp.analysis, base, reps)
    mine = dist.query("student == 's_b' and regime == 'per_teacher'")
    for t in c["teachers"]:
        rows = mine[mine["teacher"] == t["teacher"]]
        assert rows["teacher_gain"].to_numpy() == pytest.approx([t["gain"]] * 2)
        assert rows["teacher_gain"].iloc[0] == pytest.approx(rows["gain"].mean())
        # one interval per teacher, holding its gain; not the group-alone interval of
        # `compare_teachers`: the analysis borrows the replicate variance across its groups
        low, high = rows["teacher_gain_low"], rows["teacher_gain_high"]
        assert low.nunique() == 1 and high.nunique() == 1
        assert low.iloc[0] <= t["gain"] <= high.iloc[0]
    t_mid = next(t for t in c["teachers"] if t["teacher"] == "t_mid")
    assert t_mid["post_acc"] == pytest.approx(0.65) and t_mid["rep_sd"] > 0
    report = (out / "report.md").read_text()
    for student, regime in FLIPS:
        row = _answer_row(report, student, regime)
        assert "| inconclusive (exploratory) | inconclusive |" in row and row.endswith(" | 2 |")
    assert "**Exploratory:** 2 replicate(s) per teacher, and the rule needs 3" in report


def test_trace_draws_are_replicates_of_the_leaderboard_and_the_comparisons(tmp_path: Path) -> None:
    """Two trace draws paired with two training seeds: every distilled row names its draw, its
    draw's traces and yield; a teacher row's yield is the mean over its draws; the comparisons
    read each teacher's replicates as (trace seed, training seed, vector)."""
    one = _experiment(tmp_path)
    exp = one.model_copy(
        update={
            "generate": one.generate.model_copy(update={"seeds": (3, 8)}),
            "train": one.train.model_copy(update={"seeds": (0, 1), "replicates": "paired"}),
        }
    )
    store, g = Store(exp.root), grids.expand(exp)
    for c in g:
        if c.kind == "traces":  # draw 8 yields 0.1 more
            _write(store, c, {"yield": YIELD[c.model] + (0.1 if c.trace_seed == 8 else 0.0)})
        if c.kind == "eval" and getattr(c, "role", None) == "distilled" and c.task == TASK:
            wins, losses = FLIPS[c.student, c.regime][c.teacher]  # draw 8: two more items won
            _write_eval(
                store, c, _post_vector(c.student, wins + (2 if c.trace_seed == 8 else 0), losses)
            )
    _populate(exp, store)
    board, _, _, decisions = analyze.leaderboard(exp, store)
    dist = board[board["row_type"] == "distilled"]
    assert len(dist) == 2 * len(one.students) * 2 * len(TEACHERS) * 2  # tasks x ... x replicates
    assert list(board.columns[board.columns.get_loc("seed") :][:2]) == ["seed", "trace_seed"]
    assert set(zip(dist["trace_seed"], dist["seed"], strict=True)) == {(3, 0), (8, 1)}
    for r in dist.itertuples():
        assert r.traces_key == g.traces[r.task, r.teacher, r.trace_seed].key
        assert r.teacher_train_acc == pytest.approx(YIELD[r.teacher] + 0.1 * (r.trace_seed == 8))
    teachers = board[board["row_type"] == "teacher"]
    assert teachers["teacher_train_acc"].to_numpy() == pytest.approx(
        [YIELD[t] + 0.05 for t in teachers["teacher"]]
    )
    assert teachers["trace_seed"].isna().all()
    arms = dict(analyze._group_arms(analyze._Reader(store), board))
    base, reps = arms[TASK, "s_b", "per_teacher"]
    assert list(base) == list(_base_vector("s_b"))
    wins, losses = FLIPS["s_b", "per_teacher"]["t_mid"]
    assert all(isinstance(r, analyze.Replicate) for r in reps["t_mid"])
    assert [(r.trace_seed, r.train_seed) for r in reps["t_mid"]] == [(3, 0), (8, 1)]
    assert list(reps["t_mid"][0].correct) == list(_post_vector("s_b", wins, losses))
    assert list(reps["t_mid"][1].correct) == list(_post_vector("s_b", wins + 2, losses))
    t = {x["teacher"]: x for x in decisions[TASK, "s_b", "per_teacher"]["teachers"]}
    # one unit per trace draw
    assert t["t_mid"]["n_replicates"] == 2 and t["t_mid"]["post_acc"] == pytest.approx(0.65)


def test_the_second_answer_pass_is_its_own_column_never_the_headline() -> None:
    """evaluate.answer_pass: the leaderboard shows its accuracy as two_pass_acc beside the
    one-pass accuracy, which stays the verdicts' own; off, the column is empty."""
    correct = {"a": True, "b": False, "c": False, "d": False}
    on = analyze.EvalResult("k", correct, {"two_pass_accuracy": 0.75, "format_failure_rate": 0.5})
    assert on.accuracy == 0.25 and analyze._rates(on)["two_pass_acc"] == 0.75
    assert math.isnan(analyze._rates(analyze.EvalResult("k", correct, {}))["two_pass_acc"])
    assert "two_pass_acc" in analyze.COLUMNS


def test_a_group_whose_training_sets_are_empty_still_has_its_answer(tmp_path: Path) -> None:
    """Every teacher left an empty training set in one regime: no adapter trains there, so each
    distilled student is its baseline (a gain of exactly 0); the group keeps its answers.csv row,
    and the cells never run are not counted as missing."""
    exp = _experiment(tmp_path / "empty")
    store = Store(exp.root)
    never = set()
    for c in grids.expand(exp).unique():
        if c.task == TASK and getattr(c, "regime", None) == "intersection":
            if c.kind == "dataset":
                _write(store, c, {"n_examples": 0, "train_tokens": 0, "mean_trace_tokens": 0.0})
            else:
                never.add(c.key)
    _populate(exp, store, skip=never)
    board, missing, _, decisions = analyze.leaderboard(exp, store)
    # the leaderboard says what the decision counts: the student as it is, and why
    empty = board[(board["task"] == TASK) & (board["regime"] == "intersection")]
    empty = empty[empty["row_type"] == "distilled"]
    assert len(empty) > 0 and (empty["n_train_examples"] == 0).all()
    assert (empty["post_acc"] == empty["base_acc"]).all() and (empty["gain"] == 0).all()
    for s in STUDENTS:
        assert sorted(decisions[TASK, s, "intersection"]["untrained"]) == sorted(TEACHERS)
        assert decisions[TASK, s, "per_teacher"]["untrained"] == []
    full = _experiment(tmp_path / "full")
    _populate(full, Store(full.root))
    assert missing == analyze.leaderboard(full, Store(full.root))[1]  # OTHER's cells only
    answers = pd.read_csv(analyze.run(exp, store, log=lambda _: None) / "answers.csv")
    rows = answers[(answers["task"] == TASK) & (answers["regime"] == "intersection")]
    assert sorted(rows["student"]) == sorted(STUDENTS)
    assert (rows["gain"] == 0).all() and (rows["gain_low"] <= 0).all()
    assert (rows["gain_high"] >= 0).all()
    report = (exp.root / "analysis" / "report.md").read_text()
    assert "gave no usable training example: nothing was trained" in report


def _decision(base_rate: float, posts: dict[str, float], n: int = 400, reps: int = 3) -> dict:
    """A group decided by the real rule on synthetic 0/1 vectors: the baseline right on the first
    base_rate share of items, each teacher's replicates on the first `post` share (ties between
    replicates: no replicate spread)."""
    base = (np.arange(n) < base_rate * n).astype(float)
    draws = {t: [(np.arange(n) < p * n).astype(float)] * reps for t, p in posts.items()}
    return teacher_level.decide_group(base, draws, effect=0.03).as_dict()


def test_answers_rows_say_what_to_do_with_empty_teacher_for_none() -> None:
    groups = {
        "one": _decision(0.5, {"t_a": 0.8, "t_b": 0.5}),  # t_a beats everything: the answer
        "none": _decision(0.5, {"t_a": 0.48, "t_b": 0.45}),  # below the baseline: none
        "any": _decision(0.5, {"t_a": 0.8, "t_b": 0.8}),  # both better, neither best
        "unclear": _decision(0.5, {"t_a": 0.53, "t_b": 0.5}, n=60),  # too few items to tell
        "explore": _decision(0.5, {"t_a": 0.8, "t_b": 0.5}, reps=1),
    }
    table = analyze.answers_table(
        None,  # type: ignore[arg-type]  (not read)
        [
            {"task": k, "student": "s", "regime": "per_teacher", "decision": d}
            for k, d in groups.items()
        ],  # fmt: skip
    )
    rows = {r["task"]: r for r in table.to_dict("records")}
    assert (rows["one"]["answer"], rows["one"]["teacher"], rows["one"]["action"]) == (
        "t_a", "t_a", "use_teacher"
    )  # fmt: skip
    none = rows["none"]
    assert (none["answer"], none["distill"], none["action"]) == ("none", "no", "keep_baseline")
    assert none["teacher"] == "" and none["best_set"] == ""  # nothing is recommended
    assert none["gain"] == round(100 * groups["none"]["headline"]["gain"], 1) < 0
    assert (rows["any"]["answer"], rows["any"]["distill"]) == ("inconclusive", "yes")
    assert rows["any"]["action"] == "use_any_of_best_set"
    assert rows["any"]["best_set"] == "t_a;t_b"
    # teacher names only a recommended teacher: none of a tied best set, nor an unclear leader;
    # the teacher whose gain a row quotes is named apart
    assert rows["one"]["quoted_teacher"] == "t_a"
    assert {rows[k]["teacher"] for k in ("any", "unclear", "explore")} == {""}
    assert rows["any"]["quoted_teacher"] in ("t_a", "t_b")
    assert rows["unclear"]["quoted_teacher"] == rows["explore"]["quoted_teacher"] == "t_a"
    assert none["quoted_teacher"] == ""
    assert (rows["unclear"]["distill"], rows["unclear"]["action"]) == (
        "inconclusive", "need_more_data"
    )  # fmt: skip
    assert (rows["explore"]["exploratory"], rows["explore"]["action"]) == ("yes", "add_replicates")
    assert {r["exploratory"] for k, r in rows.items() if k != "explore"} == {"no"}
    assert set(table["action"]) <= set(analyze.ACTIONS)
    # one unit: points, rounded (base 50%, effect 3 points)
    assert set(table["base_acc"]) == {50.0} and set(table["effect_of_interest"]) == {3.0}
    assert rows["one"]["gain"] == 30.0


def test_an_undecided_group_whose_students_write_no_answer_asks_to_fix_the_setup() -> None:
    """More data cannot decide a group whose distilled students hold no answer in most
    completions: its action is fix_setup, not need_more_data. A decided group keeps its action."""
    rows = pd.DataFrame({"format_fail_rate": [1.0, 0.9, 0.75]})
    assert analyze._no_answers(rows)
    assert not analyze._no_answers(rows.assign(format_fail_rate=[1.0, 0.9, 0.2]))  # one answers
    assert not analyze._no_answers(pd.DataFrame({"format_fail_rate": [math.nan]}))  # unknown
    unclear = _decision(0.5, {"t_a": 0.53, "t_b": 0.5}, n=60)
    decided = _decision(0.5, {"t_a": 0.8, "t_b": 0.5})
    table = analyze.answers_table(
        None,  # type: ignore[arg-type]  (not read)
        [{"task": "unclear", "student": "s", "regime": "per_teacher", "decision": unclear,
          "no_answers": True},
         {"task": "decided", "student": "s", "regime": "per_teacher", "decision": decided,
          "no_answers": True},
         {"task": "plain", "student": "s", "regime": "per_teacher", "decision": unclear}],
    )  # fmt: skip
    actions = dict(zip(table["task"], table["action"], strict=True))
    assert actions == {"unclear": "fix_setup", "decided": "use_teacher", "plain": "need_more_data"}
    assert "fix_setup" in analyze.ANSWER_COLUMNS["action"]  # the CSV's own docs define it


def test_the_terminal_summary_prints_answers_csv_in_its_own_words(tmp_path: Path, capsys) -> None:
    from harness import cli

    groups = {"one": _decision(0.5, {"t_a": 0.8, "t_b": 0.5}),
              "none": _decision(0.5, {"t_a": 0.48, "t_b": 0.45}),
              "any": _decision(0.5, {"t_a": 0.8, "t_b": 0.8})}  # fmt: skip
    table = analyze.answers_table(
        None,  # type: ignore[arg-type]  (not read)
        [
            {"task": k, "student": "s", "regime": "per_teacher", "decision": d}
            for k, d in groups.items()
        ],  # fmt: skip
    )
    table.to_csv(tmp_path / "answers.csv", index=False)
    cli._print_summary(tmp_path / "answers.csv")
    out = capsys.readouterr().out
    lines = {x.split("│")[1].strip(): x for x in out.splitlines()
             if x.count("│") > 3 and x.split("│")[1].strip() in groups}  # fmt: skip
    assert "use_teacher" in lines["one"] and "t_a +30.0 [" in lines["one"]
    assert "keep_baseline" in lines["none"] and "t_a" not in lines["none"]
    # a tied best set: both named as the set, the quoted gain under its own header
    assert "use_any_of_best_set" in lines["any"] and "t_a, t_b" in lines["any"]
    header = " ".join(out.split("t_a +30.0")[0].split())
    assert "quoted" in header and "[interval]" in header  # whose gain, and what the [..] holds
