"""Simulation checks of the decision statistics (harness.stats): item-level data with a known truth.

.venv/bin/pytest tests/test_decisions.py -q

Each test draws many synthetic grids, applies the statistic the report uses and checks its
frequency properties: CI coverage, family-wise error under Holm, p_best calibration, the MDE's
power, and that group-wise capacity-gap statistics ignore a planted confounder that fools pooling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.stats import (
    bootstrap_accuracies,
    difference_ci,
    fixed_effects_slope,
    holm,
    mcnemar_counts,
    mcnemar_exact,
    mcnemar_power,
    mean_within_spearman,
    min_points,
    minimum_detectable_gain,
    p_best,
    rank_interval,
    sign_test,
    spearman,
    spearman_exact,
)


def test_joint_bootstrap_difference_ci_covers_the_truth_93_to_97_percent():
    rng = np.random.default_rng(11)
    n_items, true = 200, (0.55, 0.62)  # two teachers' students, independent errors
    runs, covered = 1000, 0
    for _ in range(runs):
        a, b = (rng.random(n_items) < p for p in true)
        _, boot = bootstrap_accuracies([a, b], n_resamples=1000, seed=int(rng.integers(1 << 30)))
        low, high = difference_ci(boot, 0, 1)
        covered += low <= true[1] - true[0] <= high
    assert 0.93 <= covered / runs <= 0.97


def test_seed_resampling_covers_the_seed_averaged_truth():
    # 3 training seeds per teacher, each seed shifts the accuracy by N(0, 0.03): the item-only
    # bootstrap would under-cover the expected difference, the item-and-seed one should not.
    rng = np.random.default_rng(12)
    n_items, seeds, runs, covered = 300, 3, 400, 0
    for _ in range(runs):
        arms = [
            rng.random((seeds, n_items)) < np.clip(p + rng.normal(0, 0.03, (seeds, 1)), 0, 1)
            for p in (0.5, 0.55)
        ]
        _, boot = bootstrap_accuracies(arms, n_resamples=400, seed=int(rng.integers(1 << 30)))
        low, high = difference_ci(boot, 0, 1)
        covered += low <= 0.05 <= high
    assert 0.92 <= covered / runs <= 0.985  # measured: 0.9675


def test_holm_keeps_the_family_wise_error_under_5_percent():
    rng = np.random.default_rng(13)
    families, teachers, n_items = 3000, 4, 200
    correct = rng.random((families, teachers, n_items)) < 0.5  # all teachers equal: the null
    i, j = np.triu_indices(teachers, 1)
    losses = (correct[:, i] & ~correct[:, j]).sum(-1)
    wins = (~correct[:, i] & correct[:, j]).sum(-1)
    p = mcnemar_counts(losses, wins)
    any_raw = (p <= 0.05).any(axis=1).mean()
    any_holm = np.mean([(holm(row) <= 0.05).any() for row in p])
    assert any_holm <= 0.05
    assert any_raw > 0.08  # six tests uncorrected: the correction is what keeps it down


def test_p_best_is_calibrated():
    rng = np.random.default_rng(14)
    groups, teachers, n_items = 3000, 3, 200
    truth = rng.uniform(0.35, 0.65, (groups, teachers))
    given, hit = [], []
    for g in range(groups):
        arms = rng.random((teachers, n_items)) < truth[g][:, None]
        _, boot = bootstrap_accuracies(list(arms), n_resamples=400, seed=g)
        given.extend(p_best(boot))
        hit.extend(truth[g] == truth[g].max())
    given, hit = np.array(given), np.array(hit)
    for low, high in ((0.7, 0.9), (0.4, 0.6), (0.1, 0.3)):
        mine = (given >= low) & (given < high)
        assert mine.sum() > 150
        assert abs(hit[mine].mean() - given[mine].mean()) < 0.06, (low, high)


def test_mde_has_the_power_it_claims():
    rng = np.random.default_rng(15)
    for n_items, base in ((200, 0.3), (500, 0.6)):
        gain = minimum_detectable_gain(n_items, base)
        b = rng.random((4000, n_items)) < base
        p = rng.random((4000, n_items)) < base + gain
        power = (mcnemar_counts((b & ~p).sum(1), (~b & p).sum(1)) <= 0.05).mean()
        assert abs(power - 0.8) < 0.03, (n_items, base, gain, power)


def test_mde_shrinks_with_items_and_is_nan_when_out_of_reach():
    assert minimum_detectable_gain(2000, 0.5) < minimum_detectable_gain(200, 0.5)
    assert math.isnan(minimum_detectable_gain(5, 0.9))
    assert mcnemar_power(200, 0.5, 0.5) < 0.05  # the size of the test under the null


def test_mcnemar_counts_is_scipys_binomtest():
    for losses, wins in ((0, 0), (0, 5), (3, 9), (10, 10), (40, 17)):
        n = losses + wins
        want = 1.0 if n == 0 else sps.binomtest(losses, n, 0.5).pvalue
        assert mcnemar_counts(losses, wins) == pytest.approx(want)


def test_sign_test_is_mcnemar_with_one_seed_and_averages_seeds():
    rng = np.random.default_rng(3)
    a, b = rng.random(80) < 0.4, rng.random(80) < 0.6
    assert sign_test(a, b) == pytest.approx(mcnemar_exact(a, b))
    # two seeds: an item counts for b when b's mean over seeds is ahead of a's
    a2 = np.array([[1, 1, 0, 0], [1, 0, 0, 0]])
    b2 = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    assert sign_test(a2, b2) == pytest.approx(sps.binomtest(3, 3, 0.5).pvalue)


def test_bootstrap_accuracies_estimates_p_best_and_ranks():
    rng = np.random.default_rng(4)
    strong, weak = rng.random(400) < 0.8, rng.random(400) < 0.3
    est, boot = bootstrap_accuracies([weak, strong, strong.copy()], n_resamples=500)
    assert est.tolist() == [weak.mean(), strong.mean(), strong.mean()]
    best = p_best(boot)
    assert best.sum() == pytest.approx(1.0)
    assert best[0] == 0 and best[1] == best[2] == 0.5  # identical arms tie in every resample
    assert rank_interval(boot) == [(3, 3), (1, 1), (1, 1)]
    with pytest.raises(ValueError, match="same items"):
        bootstrap_accuracies([weak, strong[:10]])


def test_three_points_cannot_reach_5_percent():
    res = spearman_exact([1, 2, 3], [3, 2, 1])
    assert res.rho == pytest.approx(-1) and res.p == pytest.approx(1 / 3)
    assert math.isnan(res.low) and math.isnan(res.high)
    assert spearman_exact([1, 2, 3, 4, 5], [2, 4, 6, 8, 10]).p == pytest.approx(2 / 120)
    assert min_points(0.05) == 5 and min_points(0.1) == 4


def _confounded(rng: np.random.Generator):
    """Groups whose baselines differ; inside each, gain does not depend on teacher accuracy."""
    groups, teachers = 12, 4
    level = np.linspace(0.1, 0.8, groups)  # the student's baseline, different per group
    acc = level[:, None] + rng.uniform(0.05, 0.15, (groups, teachers))  # stronger with the level
    gain = 0.5 * level[:, None] + rng.normal(0, 0.01, (groups, teachers))  # no within-group effect
    label = np.repeat(np.arange(groups), teachers)
    return acc, gain, label


def test_group_wise_statistics_ignore_a_planted_confounder():
    acc, gain, label = _confounded(np.random.default_rng(0))
    pooled = spearman(acc.ravel(), gain.ravel())
    assert pooled.p < 0.001 and pooled.low > 0.5  # pooling finds a strong effect
    within = mean_within_spearman(list(zip(acc, gain, strict=True)))
    assert within["p"] > 0.05 and abs(within["mean_rho"]) < 0.3
    fe = fixed_effects_slope(gain.ravel(), acc.ravel(), label)
    assert fe["p"] > 0.05 and fe["low"] < 0 < fe["high"]


def test_within_group_false_positives_stay_near_alpha():
    rng = np.random.default_rng(7)
    p = [
        mean_within_spearman(list(zip(*_confounded(rng)[:2], strict=True)))["p"] for _ in range(60)
    ]
    assert np.mean(np.array(p) <= 0.05) <= 0.12


def test_fixed_effects_slope_is_ols_with_group_dummies():
    rng = np.random.default_rng(6)
    label = np.repeat(np.arange(5), 4)
    x = rng.random(20)
    y = 0.7 * x + label * 0.3 + rng.normal(0, 0.05, 20)
    design = np.column_stack([x, np.eye(5)[label]])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    fe = fixed_effects_slope(y, x, label)
    assert fe["slope"] == pytest.approx(coef[0])
    assert fe["low"] < 0.7 < fe["high"] and fe["p"] < 0.001
    assert math.isnan(fixed_effects_slope([1.0, 2.0], [1.0, 2.0], ["a", "b"])["slope"])


def test_plan_prints_the_mde_and_warns_against_the_effect_of_interest(tmp_path):
    import json

    from harness import plan
    from harness.config import Experiment
    from harness.store import Store

    def spec(name: str) -> dict:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
        return {"name": name, "path": str(d), "size": 1e8}

    def experiment(limit: int, effect: float) -> Experiment:
        return Experiment.model_validate(
            {"name": "p", "results_dir": str(tmp_path / "r"), "teachers": [spec(f"t{limit}")],
             "students": [spec(f"s{limit}")], "tasks": [{"name": "gsm8k", "test_limit": limit}],
             "train": {"max_steps": 1}, "analysis": {"effect_of_interest": effect}}
        )  # fmt: skip

    small = plan.detectable_gains(experiment(200, 3.0), Store(tmp_path / "r1"))
    mde = 100 * minimum_detectable_gain(200, 0.5)
    assert (
        f"gsm8k / s200: 200 test items, baseline 50.0% (not measured yet, assumed): MDE {mde:.1f} pts"
        in small[1]
    )
    assert "the test set cannot detect the effect of interest" in small[1]
    big = plan.detectable_gains(experiment(1000, 10.0), Store(tmp_path / "r2"))
    assert "cannot detect" not in big[1] and "effect of interest 10 pts" in big[0]


def test_verdict_words_follow_the_evidence():
    from harness import analyze, report
    from harness.config import AnalysisConfig

    a = AnalysisConfig(bootstrap_samples=500)
    rng = np.random.default_rng(8)
    base = rng.random(400) < 0.3
    strong, weak, twin = (rng.random(400) < p for p in (0.6, 0.3, 0.6))
    c = analyze.compare_teachers(a, base, {"t-l": weak, "t-m": strong, "t-s": twin})
    d = analyze.decide(a, c)
    text = report.decision_text(d, c)
    assert d["best"] in ("t-m", "t-s") and not d["separable"]
    other = "t-s" if d["best"] == "t-m" else "t-m"
    assert text.startswith(f"{d['best']} (p_best {d['p_best']:.2f}) beats t-l (+")
    assert f"{other} is indistinguishable from {d['best']}" in text
    assert "beats the baseline: t-m (+" in text and "Holm p <0.001" in text

    alone = analyze.compare_teachers(a, base, {"t-x": base.copy()})
    words = report.decision_text(analyze.decide(a, alone), alone)
    assert words.startswith("t-x is the only teacher scored")
    assert "no teacher beats the baseline (400 test items detect a gain of" in words
