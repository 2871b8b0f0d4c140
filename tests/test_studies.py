"""The study analyses (harness/analysis/studies.py) on synthetic grids with known truth: each finds an
effect planted in it, and on a null grid claims one no more often than its stated error rate
allows (a one-sided binomial check at 0.001 against alpha 0.05, over a few dozen runs; the
calibrated figures over 1,000 runs are in benchmarks/README.md, from benchmarks/studies.py).
The nulls carry teacher effects that every student of a task shares.

    python -m pytest tests/test_studies.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import sandbox_grid
from scipy import stats

from benchmarks import studies as bench
from harness.analysis import studies as st
from harness.config.schema import Experiment
from harness.stats import teacher_level
from harness.workflow import selection
from harness.workflow.grid import expand


def not_above_alpha(rate: float, runs: int, alpha: float = 0.05) -> bool:
    """A null rate consistent with alpha: P(X >= observed | runs, alpha) above 0.001."""
    k = round(rate * runs)
    return k == 0 or stats.binom.sf(k - 1, runs, alpha) > 0.001


@pytest.mark.parametrize(
    ("name", "null_runs", "planted_runs", "grid"),
    [
        ("capacity gap (report): gain vs teacher accuracy", 40, 10, {}),
        ("stronger vs weaker teacher: win-rate trend", 40, 10, {"teachers": 7}),
        ("stronger vs weaker teacher: any win-rate bin", 40, 10, {}),
        ("quantity vs quality: examples term", 80, 10, {}),
        ("quantity vs quality: accuracy term", 80, 10, {}),
        ("capacity gap: student size x teacher accuracy", 60, 10, {}),
        ("capacity gap: inverted U (two lines)", 80, 10, {}),
        ("task pre-selection: selected − gated", 100, 10, {}),
        ("regime flips: change of A − B", 300, 30, {}),
        ("family average: gain", 300, 30, {}),
        ("mix against its parts (any of 2)", 300, 30, {}),
    ],
)
def test_finds_a_planted_effect_and_keeps_its_error_rate(name, null_runs, planted_runs, grid):
    assert bench.rate(name, True, planted_runs, seed=2, **grid) >= 0.8
    null = bench.rate(name, False, null_runs, seed=1, **grid)
    assert not_above_alpha(null, null_runs), f"{name}: {null:.3f} of {null_runs} null runs"


# --- the pieces ----------------------------------------------------------------------------------


def test_family_of_reads_the_config_then_the_name():
    fams = {"reasoning": ("bbh_logical_*", "math")}
    assert st.family_of("bbh_logical_deduction_three_objects", fams) == "reasoning"
    assert st.family_of("math", fams) == "reasoning"
    assert st.family_of("bbh_navigate", fams) == "bbh"
    assert st.family_of("gsm8k", {}) == "gsm8k"


def test_pair_of_gives_a_minus_b_with_the_groups_verdict():
    rng = np.random.default_rng(3)
    base, (lo, hi) = teacher_level.simulate(rng, 1, 300, 0.3, [0.3, 0.6], 3, 0.01)
    d = teacher_level.decide_group(base[0], {"weak": list(lo[0]), "strong": list(hi[0])}).as_dict()
    fwd, back = st.pair_of(d, "strong", "weak"), st.pair_of(d, "weak", "strong")
    assert fwd["verdict"] == "better" and back["verdict"] == "worse"
    assert fwd["estimate"].estimate == pytest.approx(-back["estimate"].estimate)
    assert fwd["estimate"].low == pytest.approx(-back["estimate"].high)
    assert st.pair_of(d, "strong", "absent") is None


def _decision(answer: str) -> dict:
    teachers = [{"teacher": "A", "post_acc": 0.6}, {"teacher": "B", "post_acc": 0.4}]
    return {"answer": answer, "teachers": teachers, "pairs": []}


@pytest.mark.parametrize(
    ("ref", "other", "status"),
    [("A", "B", "flip"), ("A", "A", "same"), ("none", "none", "same"),
     ("A", "inconclusive", "inconclusive"), ("inconclusive", "inconclusive", "inconclusive"),
     ("A", "none", "inconclusive")],
)  # fmt: skip
def test_a_flip_counts_only_where_both_answers_are_shown(ref, other, status):
    got = st.flip(_decision(ref), _decision(other), {}, ("t", "s"), "intersection", 0.05)
    assert got["status"] == status


def test_a_flip_row_never_contrasts_a_teacher_with_itself():
    """A is point-best in both regimes: there is no pair A − B to contrast, and the row says so."""
    got = st.flip(_decision("A"), _decision("A"), {}, ("t", "s"), "intersection", 0.05)
    assert got["pair"] == "A point-best in both" and got["interaction"] is None


def test_win_rate_bins_cover_every_pair_and_say_too_few_with_three_teachers():
    frame = bench.teacher_grid(np.random.default_rng(0), lambda a, s, n: 0.3 * a, tasks=1)
    pairs = st.teacher_pairs(frame)
    assert len(pairs) == 3 * 10  # 3 students x C(5, 2) pairs of distinct accuracies
    assert (pairs["gap"] > 0).all()
    fit = st.win_rate_fit(frame, 0.05, (0, 20, 40, 100))
    assert sum(b["n_pairs"] for b in fit["bins"]) == fit["n_pairs"] == len(pairs)
    wins = pairs.assign(w=pairs["win"]).groupby(pd.cut(pairs["gap"], [0, 20, 40, 100]))["w"]
    assert [b["win_rate"] for b in fit["bins"]] == pytest.approx(wins.mean().tolist())
    # one task, five teachers: the trend is testable (5! orders) though a single task
    assert fit["test"]["n_permutations"] == 120 and not fit["test"]["too_few"]
    three = st.win_rate_fit(frame[frame["teacher"].isin(["t0", "t2", "t4"])], 0.05, (0, 100))
    assert three["trend"].startswith("too few teachers (3") and "needs ≥ 5" in three["trend"]
    assert three["bins"][0]["reading"].startswith(st.TOO_FEW)


def test_inverted_u_needs_teachers_on_both_sides_of_the_peak():
    rng = np.random.default_rng(0)
    hump = bench.teacher_grid(rng, lambda a, s, n: -0.8 * (a - 0.55) ** 2, teachers=8)
    got = st.inverted_u(hump, 0.05)
    assert got["status"] == "inverted U"
    assert got["rising"]["statistic"] > 0 > got["falling"]["statistic"]
    # two teachers a group: at most one on a side of a peak inside their range
    few = hump[hump["teacher"].isin(["t0", "t7"])]
    assert st.inverted_u(few, 0.05)["status"] in (st.TOO_FEW, "no inverted U")
    # three teachers: 3! orders cannot reach a one-sided 5%
    three = st.inverted_u(hump[hump["teacher"].isin(["t0", "t3", "t7"])], 0.05)
    assert three["status"] in (st.TOO_FEW, "no inverted U")


def test_size_interaction_takes_the_student_as_its_unit():
    frame = bench.teacher_grid(np.random.default_rng(0), lambda a, s, n: 0.1 * a)
    one = frame[frame["student_size"] == frame["student_size"].min()]
    got = st.size_interaction(one, 0.05)
    assert got["estimate"] is None and got["n_students"] == 1
    three = st.size_interaction(frame, 0.05, "teacher_size")
    assert three["estimate"] is not None and three["smallest_p"] == pytest.approx(1 / 3)
    word, reading = st._interaction_words(three, 0.05)
    assert word.startswith("too few students (3") and "needs ≥ 5" in word
    assert "student-level p = " in reading
    # the estimate is the two-way within regression's coefficient, computed by hand
    df = frame.assign(z=np.log10(frame["teacher_size"]) * np.log10(frame["student_size"]),
                      y=100 * frame["gain"])  # fmt: skip
    w = df[["y", "z"]]
    for _ in range(20):
        w = w - w.groupby([df["task"], df["student"]]).transform("mean")
        w = w - w.groupby([df["task"], df["teacher"]]).transform("mean")
    assert three["estimate"] == pytest.approx((w["y"] * w["z"]).sum() / (w["z"] ** 2).sum())


def test_a_teacher_by_student_effect_is_not_a_size_interaction():
    """Teacher x student effects unrelated to size (the same on every task), five students:
    the student-level test keeps its level."""
    runs = 60
    claims = [bench.rate("capacity gap: student size x teacher accuracy", False, 1, seed=s,
                         teacher_student_sd=0.05) for s in range(runs)]  # fmt: skip
    assert not_above_alpha(float(np.mean(claims)), runs)


def test_quantity_and_quality_are_one_relation_when_they_move_together():
    frame = bench.teacher_grid(np.random.default_rng(0), lambda a, s, n: 0.1 * a)
    frame["n_examples"] = 2 ** (4 + 8 * frame["teacher_acc"])  # size follows accuracy exactly
    _, r = st.size_and_accuracy(frame, 0.05)
    assert r > 0.99


def test_selection_effect_is_too_few_with_one_task_a_side():
    frame = bench.teacher_grid(np.random.default_rng(0), lambda a, s, n: 0 * a, tasks=2)
    sel = [{"task": "task0", "passed": True}, {"task": "task1", "passed": False}]
    (c,) = st.selection_effect(frame, sel, 0.05)["contrasts"]
    assert c["estimate"] is None and c["reading"] == st.TOO_FEW


def test_family_average_is_the_mean_of_task_gains():
    rng = np.random.default_rng(5)
    arms = {}
    for k, acc in enumerate((0.5, 0.7)):
        base, (a,) = teacher_level.simulate(rng, 1, 100, 0.4, [acc], 3, 0.02)
        arms[(f"bbh_{k}", "stu", "per_teacher")] = (base[0], {"T": list(a[0])})
    (got,) = st.family_averages(arms, {}, 0.05, 0.03)["averages"]
    gains = [teacher_level.difference(teacher_level.arm(t["T"]), teacher_level.baseline_arm(b)).estimate
             for b, t in arms.values()]  # fmt: skip
    assert got["gain"].estimate == pytest.approx(np.mean(gains))
    assert got["gain"].low < got["gain"].estimate < got["gain"].high


# --- configuration: pairs, families, the batch-aligned mix and the gated sample -----------------


def _exp(tmp_path, **over) -> Experiment:
    data = sandbox_grid("s", tmp_path)
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v}
    return Experiment.model_validate(data)


def test_delta_pairs_must_name_teachers(tmp_path):
    ok = _exp(tmp_path, analysis={"delta_large": ["t-large", "t-small"]})
    assert ok.analysis.delta_large == ("t-large", "t-small")
    with pytest.raises(ValueError, match="analysis.delta_large / analysis.delta_long"):
        _exp(tmp_path, analysis={"delta_long": ["t-large", "qwq"]})
    with pytest.raises(ValueError, match="gap_bins must increase"):
        _exp(tmp_path, analysis={"gap_bins": [0, 20, 10]})


def test_the_batch_aligned_mix_trains_at_the_training_batch(tmp_path):
    exp = _exp(tmp_path, train={
        "regimes": ["per_teacher", "mix"],
        "mix": [{"teacher": "t-large", "weight": 1}, {"teacher": "t-small", "weight": 4}],
        "mix_batch": {"per_device_batch_size": 5, "grad_accum": 4},
        "budget": {"align": ["none", "batch"], "regimes": ["mix"]},
    })  # fmt: skip
    adapters = {d.adapter.regime: d.adapter for d in expand(exp).distilled.values()}
    assert set(adapters) == {"per_teacher", "mix", "mix@batch"}  # batch aligns the mix only
    assert adapters["mix"].train.per_device_batch_size == 5
    assert adapters["mix@batch"].train.per_device_batch_size == 8  # the training's own
    assert adapters["mix@batch"].train.grad_accum == 1
    assert adapters["mix@batch"].upstream == adapters["mix"].upstream  # no reference set
    assert adapters["mix@batch"].key != adapters["mix"].key


def test_run_gated_samples_gated_tasks_by_name():
    def decision(task: str, share: float) -> selection.Decision:
        return selection.Decision(task, {"a": 0.5, "b": 0.55}, 30, "train", share)

    tasks = [f"task{i}" for i in range(400)]
    assert not any(decision(t, 0.0).runs for t in tasks)
    assert all(decision(t, 1.0).runs for t in tasks)
    half = [decision(t, 0.5).runs for t in tasks]
    assert 0.4 < np.mean(half) < 0.6
    assert half == [decision(t, 0.5).runs for t in tasks]  # fixed by the name
    assert decision("task0", 1.0).passed is False and "run anyway" in decision("task0", 1.0).reason


def test_teacher_frame_reads_groups_and_board():
    board = pd.DataFrame(
        [{"row_type": "distilled", "task": "bbh_x", "student": "s", "regime": "per_teacher",
          "teacher": t, "n_train_examples": n, "student_size": 1e9} for t, n in (("A", 10), ("A", 20), ("B", 5))]
    )  # fmt: skip
    teachers = [{"teacher": t, "post_acc": 0.5, "gain": 0.1, "gain_low": 0.0, "gain_high": 0.2,
                 "verdict": "inconclusive"} for t in ("A", "B")]  # fmt: skip
    result = {"groups": [{"task": "bbh_x", "student": "s", "regime": "per_teacher",
                          "decision": {"teachers": teachers, "base_acc": 0.4},
                          "ranking": [{"teacher": "A", "teacher_acc": 0.7, "teacher_size": 7e9},
                                      {"teacher": "B", "teacher_acc": 0.3, "teacher_size": 1e9}]}]}  # fmt: skip
    frame = st.teacher_frame(result, board, {})
    assert frame.set_index("teacher")["n_examples"].to_dict() == {"A": 15.0, "B": 5.0}
    assert set(frame["family"]) == {"bbh"} and (frame["student_size"] == 1e9).all()


def test_delta_large_takes_the_configured_pair_over_the_largest():
    from harness.analysis.analyze import delta_large

    rng = np.random.default_rng(4)
    base, arms = teacher_level.simulate(rng, 1, 200, 0.3, [0.3, 0.5, 0.6], 3, 0.01)
    names = ["small", "mid", "large"]
    d = teacher_level.decide_group(
        base[0], {n: list(a[0]) for n, a in zip(names, arms, strict=True)}
    ).as_dict()
    means = pd.DataFrame(
        [{"teacher": t["teacher"], "post_acc": t["post_acc"], "gain": t["gain"],
          "base_acc": d["base_acc"], "teacher_size": size, "teacher_acc": 0.5}
         for t, size in zip(d["teachers"], (3e9, 3.2e10, 7.2e10), strict=True)]
    )  # fmt: skip
    assert delta_large(means, d)["large"] == "large"
    got = delta_large(means, d, ("mid", "small"))
    assert (got["by"], got["large"], got["small"]) == ("configured", "mid", "small")
    assert got["delta"] == pytest.approx(st.pair_of(d, "mid", "small")["estimate"].estimate)
    assert got["verdict"] == st.pair_of(d, "mid", "small")["verdict"]
    assert np.isnan(delta_large(means, d, ("mid", "absent"))["delta"])


def test_a_batch_alignment_without_a_mix_is_a_problem(tmp_path):
    from harness.workflow import checks

    exp = _exp(tmp_path, train={"budget": {"align": ["none", "batch"]}})
    assert any("align: batch trains the mix" in p for p in checks.problems(exp))


def _demo_like_frame() -> pd.DataFrame:
    """The shipped demo's shape (configs/sandbox.yaml: 3 teachers, 2 students, 2 tasks) in the
    intersection regime, with what its report read as a trend: on both tasks the stronger of two
    close teachers scores a little higher and the strongest of all a little lower, by fractions
    of a point (differences its group decisions call equivalent)."""
    rows = []
    for task, accs in (("sandbox_addition", (0.35, 0.62, 0.91)),
                       ("sandbox_coin_flip", (0.52, 0.60, 0.80))):  # fmt: skip
        for student, base in (("student-xs", 0.30), ("student-s", 0.40)):
            for teacher, acc, post in zip(("teacher-s", "teacher-m", "teacher-l"), accs,
                                          (0.500, 0.503, 0.498), strict=True):  # fmt: skip
                rows.append({"task": task, "student": student, "regime": "intersection",
                             "teacher": teacher, "post_acc": base + post, "gain": post,
                             "teacher_acc": acc, "teacher_size": {"teacher-s": 1, "teacher-m": 2,
                             "teacher-l": 4}[teacher] * 1e6, "student_size": 1e5 * (1 + base),
                             "n_examples": 100.0, "family": "sandbox", "base_acc": base})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_demo_shape_no_longer_reads_a_trend(tmp_path):
    """On the demo's shape the win-rate trend rests on two tasks: errors clustered by task
    (statsmodels CR1, what the study used) call the slope significant; the teacher-level test
    says 'too few' (3 teachers), in the study, the report and the viewer."""
    import json

    import statsmodels.api as sm

    from harness.analysis import analyze, report
    from harness.present import view

    frame = _demo_like_frame()
    pairs = st.teacher_pairs(frame)
    assert len(pairs) == 12 and pairs["task"].nunique() == 2
    x = np.column_stack([np.ones(len(pairs)), pairs["gap"] / 10])
    cr1 = sm.GLM(pairs["win"], x, family=sm.families.Binomial()).fit(
        cov_type="cluster", cov_kwds={"groups": pd.factorize(pairs["task"])[0]}
    )
    assert cr1.params.iloc[1] < 0 and cr1.pvalues.iloc[1] < 0.05  # the false finding
    study = st.stronger_teacher(frame, 0.05, (0, 10, 20, 40, 100))
    (reading,) = study["readings"]
    assert "12 teacher pairs from 3 teachers on 2 task(s)" in reading
    assert reading.endswith("too few teachers (3: no teacher-level test can reach p ≤ 0.05; it "
                            "needs ≥ 5)")  # fmt: skip
    text = report._studies({"studies": {"stronger_teacher": study}})
    assert "wins less often" not in text and "wins more often" not in text
    assert "too few teachers (3" in text
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(analyze.jsonable({"studies": {"stronger_teacher": study}})))
    shown = view._studies(path)["stronger_teacher"]
    assert shown["readings"] == study["readings"]
    assert all(r[-1].startswith(st.TOO_FEW) for r in shown["tables"][0]["rows"])
    for part in (st.quantity_quality(frame, {}, 0.05, 0.1)["readings"][0],
                 *st.capacity_gap(frame, 0.05)["readings"]):  # fmt: skip
        assert "too few" in part, part
