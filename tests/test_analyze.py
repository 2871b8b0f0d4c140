"""analyze + report on a hand-made store: every number is recomputed here from the 0/1 vectors.

    .venv/bin/pytest tests/test_analyze.py

Cells are written at the keys `grid.expand` gives (local model directories made here, real task
names), through the real Store API. Gains, McNemar p-values (binomial sums with math.comb), Holm,
Spearman (hand ranks) and the ΔLarge verdicts are computed independently of harness.stats; the
report must name whichever teacher the data favour.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness import analyze
from harness import grid as grids
from harness.cells import Cell
from harness.config import Experiment
from harness.errors import UserError
from harness.store import Store

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
OVERALL_PT = (
    "**per_teacher, over all (student, task) groups:** the best teacher by post is the strongest "
    "by teacher accuracy"
)


def _experiment(tmp_path: Path) -> Experiment:
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
            "train": {"max_steps": 10, "regimes": ["per_teacher", "intersection"], "seeds": [0]},
            "analysis": {"bootstrap_samples": 1000, "seed": 3},
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


def _populate(exp: Experiment, store: Store, flips: dict = FLIPS) -> None:
    for c in grids.expand(exp):
        role = getattr(c, "role", None)
        if store.complete(c.kind, c.key):  # written by the test itself
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


def holm_by_hand(p: list[float]) -> list[float]:
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p) - rank) * p[i])
        out[i] = min(1.0, running)
    return out


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
            rows.append(
                {"student": student, "regime": regime, "teacher": teacher, "base": base,
                 "post": post, "gain": post - base, "p": mcnemar_by_hand(wins, losses)}
            )  # fmt: skip
    for row, q in zip(rows, holm_by_hand([r["p"] for r in rows]), strict=True):
        row["p_holm"] = q
    return rows


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
    start = report.index(f"## {title}")
    end = report.find("\n## ", start + 3)
    return report[start : end if end > 0 else None]


def _answer_line(report: str, student: str, regime: str) -> str:
    lines = _section(report, "Which teacher").splitlines()
    return next(x for x in lines if x.startswith(f"| {TASK} | {student} | {regime} |"))


# --- the leaderboard -----------------------------------------------------------------------------


def test_leaderboard_reproduces_hand_numbers(built) -> None:
    exp, _, out, _ = built
    board = _board(out)
    assert list(board.columns) == list(analyze.COLUMNS)
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
        assert r.p_holm == pytest.approx(exp_row["p_holm"], rel=1e-9)
        assert bool(r.degraded) == (exp_row["gain"] < 0)
        assert r.n_test == N and r.seed == 0
        assert r.teacher_acc == pytest.approx(TEACHER_CORRECT[TASK][r.teacher] / N)
        assert r.teacher_train_acc == pytest.approx(YIELD[r.teacher])
        assert r.n_train_examples == N_EXAMPLES[r.teacher]
        assert r.train_tokens == 30 * N_EXAMPLES[r.teacher]
        assert r.teacher_size == TEACHERS[r.teacher] and r.student_size == STUDENTS[r.student]
        assert r.format_fail_rate == pytest.approx(0.05)


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
    assert lost_eight.gain_ci_high.iloc[0] < 0  # 8 losses, no wins: significantly degraded


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


# --- the capacity-gap analysis -------------------------------------------------------------------


def _group(result: dict, student: str, regime: str) -> dict:
    return next(
        g
        for g in result["groups"]
        if (g["task"], g["student"], g["regime"]) == (TASK, student, regime)
    )


def test_capacity_gap_numbers(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    rows = expected_rows()
    g = _group(result, "s_a", "per_teacher")
    assert [t["teacher"] for t in g["ranking"]] == ["t_small", "t_mid", "t_large"]
    assert g["best_teachers"] == ["t_small"] and g["strongest_teachers"] == ["t_large"]
    assert g["best_is_strongest"] is False
    assert g["degraded"] == {
        "n_cells": 3, "n_degraded": 1, "share_degraded": pytest.approx(1 / 3),
        "n_significant": 1, "share_significant": pytest.approx(1 / 3),
    }  # fmt: skip
    assert _group(result, "s_b", "per_teacher")["best_teachers"] == ["t_mid"]

    # ΔLarge against both gains, and whether the two stories agree, by hand
    agree = 0
    for student, regime in FLIPS:
        mine = {r["teacher"]: r for r in rows if (r["student"], r["regime"]) == (student, regime)}
        d = _group(result, student, regime)["delta_large"]
        delta = mine["t_large"]["post"] - mine["t_small"]["post"]
        preferred = "t_large" if delta > 0 else "t_small"
        assert (d["large"], d["small"], d["by"]) == ("t_large", "t_small", "teacher_size")
        assert d["delta"] == pytest.approx(delta)
        assert d["gain_large"] == pytest.approx(mine["t_large"]["gain"])
        assert d["agree"] == (mine[preferred]["gain"] > 0)
        agree += d["agree"]
    assert agree == 3  # s_a intersection: the small teacher wins but still loses to the baseline

    # pooled Spearman of post vs teacher accuracy and vs the gap, per regime, by hand
    for regime in ("per_teacher", "intersection"):
        mine = [r for r in rows if r["regime"] == regime]
        post = [r["post"] for r in mine]
        acc = [TEACHER_CORRECT[TASK][r["teacher"]] / N for r in mine]
        gap = [a - r["base"] for a, r in zip(acc, mine, strict=True)]
        c = result["overall"][regime]["pooled_correlations"]
        assert c["post_acc~teacher_acc"]["rho"] == pytest.approx(spearman_by_hand(acc, post))
        assert c["post_acc~gap"]["rho"] == pytest.approx(spearman_by_hand(gap, post))
        assert c["post_acc~teacher_acc"]["n"] == 6
        assert c["post_acc~gap"]["low"] <= c["post_acc~gap"]["rho"] <= c["post_acc~gap"]["high"]

    overall = result["degraded"]
    n_deg = sum(r["gain"] < 0 for r in rows)
    assert (overall["n_cells"], overall["n_degraded"]) == (12, n_deg)


def test_regimes_and_task_spread(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    rows = expected_rows()
    comp = result["regimes"]
    assert comp["n_pairs"] == 6 and comp["reference"] == "per_teacher"
    means = {
        reg: np.mean([r["post"] for r in rows if r["regime"] == reg])
        for reg in ("per_teacher", "intersection")
    }
    for reg, m in means.items():
        assert comp["per_regime"][reg]["mean_post"] == pytest.approx(m)
    assert comp["best"] == max(means, key=means.get)

    board = _board(out)
    assert [t["task"] for t in result["task_spread"]] == [TASK, OTHER]
    assert result["task_spread"][0]["spread"] == pytest.approx(60.0)
    assert result["task_spread"][1]["spread"] == pytest.approx(10.0)
    assert result["selected_tasks"] == [TASK]  # default threshold: 30 points
    assert analyze.select_tasks_by_spread(board, threshold=5) == [TASK, OTHER]
    assert analyze.select_tasks_by_spread(board, threshold=70) == []


# --- the report ----------------------------------------------------------------------------------


def test_report_states_what_the_data_say(built) -> None:
    _, _, out, _ = built
    report = (out / "report.md").read_text()
    line = _answer_line(report, "s_a", "per_teacher")
    assert "| t_small (65.0) | +15.0 | t_large | no |" in line
    assert "t_small beats the baseline" in line or "distill from t_small" in line
    assert "no teacher beats the baseline" not in line
    assert "agree in 3 of 4 groups" in report
    assert "the stories disagree" in _section(report, "ΔLarge")
    assert "max_steps 10" in report and "effective batch 8" in report and "lr 0.0002" in report
    assert "temperature=0.0" in report  # the eval config is stated
    assert f"1 of 2 tasks are selected: {TASK}" in report
    n_deg = sum(r["gain"] < 0 for r in expected_rows())
    assert f"{n_deg} of 12 distilled cells" in _section(report, "Degraded")
    gap = _section(report, "Capacity gap")
    assert f"{OVERALL_PT} in 0 of 2 groups" in gap
    assert "- gain vs teacher accuracy: mean within-group Spearman" in gap
    assert "slope with group fixed effects" in gap and "- pooled" not in gap
    formats = _section(report, "Answer formats").splitlines()
    board = _board(out)
    for x in board[board["row_type"].isin(["teacher", "baseline"])].itertuples():
        model = x.teacher if x.row_type == "teacher" else x.student
        assert any(f"| {x.task} | {x.row_type} | {model} |" in line and "| 5.0 | 10.0 |" in line
                   for line in formats), (x.task, model)  # fmt: skip
    for png in sorted(out.glob("*.png")):
        assert png.stat().st_size > 10_000
    names = {p.name for p in out.glob("*.png")}
    regimes = ("per_teacher", "intersection")
    assert names == {f"{kind}_{TASK}_{r}.png" for kind in ("gain", "post_vs_teacher")
                     for r in regimes} | {f"capacity_gap_{s}_{r}.png" for s in STUDENTS
                                          for r in regimes}  # fmt: skip
    for name in names:
        assert f"({name})" in report
        svg = (out / name).with_suffix(".svg").read_text()
        assert svg.startswith("<?xml") and "<svg" in svg


def test_report_follows_the_data(tmp_path: Path) -> None:
    """Swap the vectors so the large teacher wins: the report must name it, and nothing stale stays."""
    exp = _experiment(tmp_path)
    store = Store(exp.root)
    flips = dict(FLIPS)
    flips["s_a", "per_teacher"] = {"t_small": (0, 8), "t_mid": (2, 2), "t_large": (4, 1)}
    _populate(exp, store, flips)
    (store.root / "analysis").mkdir(parents=True)
    (store.root / "analysis" / "stale.png").write_bytes(b"old")
    out = analyze.run(exp, store, log=lambda _: None)
    report = (out / "report.md").read_text()
    line = _answer_line(report, "s_a", "per_teacher")
    assert "| t_large (65.0) | +15.0 | t_large | yes |" in line
    assert "t_large beats the baseline" in line or "distill from t_large" in line
    assert not (out / "stale.png").exists()
    assert not list(store.root.glob(".analysis*"))
    # per_teacher: now s_a's best teacher is the strongest; s_b's (t_mid) still is not
    assert f"{OVERALL_PT} in 1 of 2 groups" in _section(report, "Capacity gap")


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


def test_teacher_comparisons_by_hand(built) -> None:
    _, _, out, _ = built
    result = json.loads((out / "analysis.json").read_text())
    g = _group(result, "s_b", "per_teacher")
    pairs = {(q["a"], q["b"]): q for q in g["comparison"]["pairs"]}
    # t_mid is right on items 0-11; t_small on 1-7; t_large on 1-8 (see _post_vector)
    raw = [mcnemar_by_hand(5, 0), mcnemar_by_hand(1, 0), mcnemar_by_hand(0, 4)]
    keys = [("t_small", "t_mid"), ("t_small", "t_large"), ("t_mid", "t_large")]
    assert [pairs[k]["p"] for k in keys] == pytest.approx(raw)
    assert [pairs[k]["p_holm"] for k in keys] == pytest.approx(holm_by_hand(raw))
    assert pairs["t_small", "t_mid"]["diff"] == pytest.approx(0.25)
    d = g["decision"]
    assert d["best"] == "t_mid" and d["p_best"] > 0.8
    assert d["separable"] is False  # 5 of 5 discordant items: p 0.0625 before Holm
    # vs the baseline, raw p: t_mid 6-0 = 0.031, but Holm over three teachers lifts it past 0.05
    assert d["beats_baseline"] == []
    teachers = {t["teacher"]: t for t in g["comparison"]["teachers"]}
    assert teachers["t_mid"]["p"] == pytest.approx(mcnemar_by_hand(6, 0))
    assert sum(t["p_best"] for t in teachers.values()) == pytest.approx(1.0)
    for t in teachers.values():  # the error bars of the plots
        assert t["post_low"] <= t["post_acc"] <= t["post_high"]
        assert t["gain_low"] <= t["gain"] <= t["gain_high"]
    assert _group(result, "s_a", "per_teacher")["decision"]["worse_than_baseline"] == ["t_large"]

    board = _board(out)
    mine = board[(board["row_type"] == "distilled") & (board["student"] == "s_b")]
    mine = mine[(mine["regime"] == "per_teacher") & (mine["task"] == TASK)].set_index("teacher")
    assert mine.loc["t_mid", "p_best"] == pytest.approx(teachers["t_mid"]["p_best"])
    assert mine.loc["t_mid", "rank_ci"] == "1-1"
    assert mine["seed_sd"].isna().all()  # one seed: no noise floor to show
    assert board.loc[board["row_type"] != "distilled", "p_best"].isna().all()

    report = (out / "report.md").read_text()
    line = next(
        x
        for x in _section(report, "Which teacher").splitlines()
        if "- s_b on gsm8k (per_teacher)" in x
    )
    assert line.startswith("- s_b on gsm8k (per_teacher): t_mid (p_best")
    assert "is ahead by its point estimate" in line and "no teacher beats the baseline" in line
    assert "t_small is indistinguishable from t_mid (+25.0 pts" in line
    assert "too few teachers to tell (smallest possible p 0.33)" in _section(report, "Capacity gap")


def _synthetic_means(rng: np.random.Generator, groups: int = 12, teachers: int = 4) -> pd.DataFrame:
    """Groups with different baselines whose stronger teachers come with the higher baseline;
    inside a group, gain does not depend on the teacher."""
    level = np.repeat(np.linspace(0.1, 0.7, groups), teachers)
    acc = level + rng.uniform(0.05, 0.2, level.size)
    gain = 0.4 * level + rng.normal(0, 0.01, level.size)
    return pd.DataFrame(
        {
            "task": "t",
            "student": np.repeat([f"s{i}" for i in range(groups)], teachers),
            "regime": "per_teacher",
            "teacher": np.tile([f"t{i}" for i in range(teachers)], groups),
            "teacher_acc": acc,
            "teacher_size": 1e8 * 10 ** (acc * 3),  # size follows accuracy
            "base_acc": level,
            "gain": gain,
            "post_acc": level + gain,
            "gap": acc - level,
        }
    )


def test_within_group_statistics_ignore_a_planted_confounder() -> None:
    a = Experiment.model_fields["analysis"].default
    means = _synthetic_means(np.random.default_rng(1))
    pooled = analyze.correlations(a, means)
    assert pooled["gain~teacher_acc"]["p"] < 0.001 and pooled["gain~teacher_acc"]["low"] > 0.5
    assert pooled["gain~teacher_size"]["p"] < 0.001
    within = analyze.within_group(a, means)
    for key in ("gain~teacher_acc", "gain~teacher_size"):
        assert within[key]["spearman"]["p"] > 0.05, key
        fe = within[key]["fixed_effects"]
        assert fe["p"] > 0.05 and fe["low"] < 0 < fe["high"], key
    # and a real within-group effect is found
    means["gain"] += 0.5 * means["teacher_acc"]
    planted = analyze.within_group(a, means)["gain~teacher_acc"]
    assert planted["fixed_effects"]["low"] > 0.3 and planted["spearman"]["p"] < 0.01


def test_seeds_give_a_noise_floor_and_enter_the_bootstrap() -> None:
    rows = []
    for teacher, posts in {"ta": (0.50, 0.60), "tb": (0.54, 0.58), "tc": (0.30, 0.31)}.items():
        for seed, post in enumerate(posts):
            rows.append({"task": "t", "student": "s", "regime": "per_teacher", "teacher": teacher,
                         "seed": seed, "post_acc": post, "gain": post - 0.4, "base_acc": 0.4,
                         "teacher_acc": 0.7, "teacher_size": 1e9})  # fmt: skip
    means = analyze.teacher_means(pd.DataFrame(rows))
    ranking = analyze._within_noise(
        means.sort_values("post_acc", ascending=False).to_dict("records")
    )
    assert [t["teacher"] for t in ranking] == ["tb", "ta", "tc"]
    assert ranking[0]["seed_sd"] == pytest.approx(np.std([0.54, 0.58], ddof=1))
    assert [t["within_seed_noise_of_next"] for t in ranking] == [True, False, None]

    rng = np.random.default_rng(2)
    base = rng.random(300) < 0.4
    steady = np.stack([rng.random(300) < 0.55 for _ in range(2)])
    erratic = np.stack([rng.random(300) < p for p in (0.35, 0.75)])
    a = Experiment.model_fields["analysis"].default
    c = analyze.compare_teachers(a, base, {"steady": steady, "erratic": erratic})
    t = {x["teacher"]: x for x in c["teachers"]}
    assert t["steady"]["n_seeds"] == 2
    # the erratic teacher's seeds disagree by 40 points: its gain interval is much wider
    width = {k: v["gain_high"] - v["gain_low"] for k, v in t.items()}
    assert width["erratic"] > 2 * width["steady"]


def test_two_seeds_end_to_end(tmp_path: Path) -> None:
    """Seed 1 wins two more items than seed 0 for every teacher: seed_sd is 1/sqrt(2) * 2 items,
    the comparisons average the seeds, and ranking steps within the seed SD are marked."""
    one = _experiment(tmp_path)
    exp = one.model_copy(update={"train": one.train.model_copy(update={"seeds": (0, 1)})})
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
    result = json.loads((out / "analysis.json").read_text())
    g = _group(result, "s_b", "per_teacher")
    t = {x["teacher"]: x for x in g["comparison"]["teachers"]}
    assert t["t_mid"]["n_seeds"] == 2 and t["t_mid"]["post_acc"] == pytest.approx(0.65)
    # t_large (45.0) and t_small (40.0) are 5 points apart: within the 7.1-point seed SD
    ranking = {x["teacher"]: x for x in g["ranking"]}
    assert ranking["t_large"]["within_seed_noise_of_next"] is True
    assert ranking["t_mid"]["within_seed_noise_of_next"] is False
    assert "t_large 45.0 (seed SD 7.1) ≈ t_small 40.0" in (out / "report.md").read_text()


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
    assert t["t_mid"]["n_seeds"] == 2 and t["t_mid"]["post_acc"] == pytest.approx(0.65)
