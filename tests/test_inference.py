"""Frequency properties of the teacher-level inference (harness/stats/teacher_level.py), end to end.

Synthetic groups with known truth (`inference.simulate`: item difficulty shared with the baseline,
a replicate-to-replicate SD of the teachers' accuracy) go through the same functions the analysis
calls (`decide_group`, `difference`, `accuracy`). Each bound below is
the stated target; the simulation sizes keep the Monte Carlo error well inside it (about ±1.5
points at 600 runs). Larger sweeps and their figures: benchmarks/inference.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.stats import teacher_level as inf

EQUAL = [0.3, 0.3, 0.3, 0.3]


@pytest.mark.parametrize("rep_sd", [0.0, 0.018, 0.035])
def test_four_equal_teachers_give_few_false_verdicts(rep_sd):
    """Four teachers equal to each other and to the baseline, 3 replicates each, 200 items: any
    'better'/'worse' (against the baseline or another teacher) is a family-wise error (<= 5%),
    and 'distill from X' must stay <= 2.5%."""
    rng = np.random.default_rng(11)
    runs, errors, distill = 250, 0, 0
    base, arms = inf.simulate(rng, runs, 200, 0.3, EQUAL, 3, rep_sd)
    for s in range(runs):
        d = inf.decide_group(base[s], {f"t{k}": list(arms[k][s]) for k in range(4)})
        wrong = [t for t in d.teachers if t["verdict"] in ("better", "worse")]
        wrong += [q for q in d.pairs if q["verdict"] in ("better", "worse")]
        errors += bool(wrong)
        distill += d.answer not in ("none", "inconclusive")
    assert errors / runs <= 0.05
    assert distill / runs <= 0.025


def test_one_replicate_is_exploratory_and_never_better():
    rng = np.random.default_rng(3)
    base, arms = inf.simulate(rng, 1, 200, 0.2, [0.6, 0.3], 1, 0.0)
    d = inf.decide_group(base[0], {"big": list(arms[0][0]), "small": list(arms[1][0])})
    assert d.exploratory and d.answer == "inconclusive" and d.distill == "inconclusive"
    assert {t["verdict"] for t in d.teachers} == {"inconclusive"}
    # the same gain with three replicates is called
    base, arms = inf.simulate(rng, 1, 200, 0.2, [0.6, 0.3], 3, 0.0)
    d = inf.decide_group(base[0], {"big": list(arms[0][0]), "small": list(arms[1][0])})
    assert d.answer == "big" and d.distill == "yes" and d.best_set == ["big"]


@pytest.mark.parametrize("n", [50, 200])
@pytest.mark.parametrize("acc", [0.02, 0.3, 0.5, 0.98])
def test_gain_difference_and_accuracy_intervals_cover(n, acc):
    """Coverage of the unadjusted 95% intervals for a teacher's gain over the fixed baseline, the
    difference between two teachers and a teacher's accuracy, in groups of four teachers with 3
    replicates at a 2-point SD. Target 93-97%, with the Monte Carlo error of 600 runs (about
    +-0.9 points) allowed twice; at 50 items and 2% or 98% the binomial is discrete (about one
    wrong or right answer per test), so only the lower bound holds there."""
    covered = inf.coverage(n, acc, runs=600, seed=int(acc * 100) + n)
    extreme = n == 50 and acc in (0.02, 0.98)
    for rate in covered:
        assert 0.912 <= rate <= (1.0 if extreme else 0.988)


def test_difference_between_teachers_covers():
    rng = np.random.default_rng(5)
    runs, sd = 400, 0.035
    truth = [float(np.clip(p + rng.normal(0, sd, 400_000), 0, 1).mean()) for p in (0.4, 0.5)]
    _, (lo, hi) = inf.simulate(rng, runs, 200, 0.4, [0.4, 0.5], 3, sd)
    hits = 0
    for s in range(runs):
        d = inf.difference(inf.arm(list(hi[s])), inf.arm(list(lo[s])))
        hits += d.low <= truth[1] - truth[0] <= d.high
    assert 0.912 <= hits / runs <= 0.988  # 93-97%, Monte Carlo error of 400 runs allowed twice


def test_power_at_the_stated_mde_is_eighty_percent():
    """The MDE `cotgap plan` states is the gain the report's own rule detects 80% of the time:
    checked on fresh simulations (another seed) at that gain."""
    n, base, reps, sd, m = 200, 0.3, 3, 0.03, 3
    mde = inf.minimum_detectable_gain(n, base, reps, sd, m)
    power = inf.gain_power(n, base, mde, reps, sd, m, sims=4000, seed=99)
    assert 0.77 <= power <= 0.83
    diff = inf.minimum_detectable_difference(n, 0.4, reps, sd, m)
    power = inf.difference_power(n, 0.4, diff, reps, sd, m, sims=4000, seed=98)
    assert 0.77 <= power <= 0.83


def test_answer_none_needs_every_gain_ruled_below_the_effect():
    rng = np.random.default_rng(2)
    base, arms = inf.simulate(rng, 1, 2000, 0.5, [0.5, 0.5], 5, 0.0, concordance=0.95)
    d = inf.decide_group(base[0], {"a": list(arms[0][0]), "b": list(arms[1][0])}, effect=0.03)
    assert d.answer == "none" and d.distill == "no"
    assert all(t["gain_high"] < 0.03 for t in d.teachers)
    # with few items the same truth cannot rule out a 3-point gain: inconclusive, not "none"
    base, arms = inf.simulate(rng, 1, 60, 0.5, [0.5, 0.5], 3, 0.0)
    d = inf.decide_group(base[0], {"a": list(arms[0][0]), "b": list(arms[1][0])}, effect=0.03)
    assert d.answer == "inconclusive"


def test_replicate_units_average_training_seeds_within_a_trace_draw():
    draw_a = np.array([[1, 0, 1, 1], [1, 1, 1, 1]])  # two training seeds on one trace draw
    draw_b = np.array([[0, 0, 1, 0]])
    units = inf.replicate_units([draw_a, draw_b])
    assert units.tolist() == [[1.0, 0.5, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]]
    # one trace draw: its training seeds are the units
    assert inf.replicate_units([draw_a]).shape == (2, 4)


def _fdr_grid(rng, groups=20, n=200, effect=0.12):
    """Half the groups have one teacher `effect` above a 30% baseline; everything else is null.
    Returns the groups for `decide_groups` and the truth of every comparison (True: a real
    difference) keyed like the verdicts."""
    grid, truth = {}, {}
    for g in range(groups):
        gain = effect if g % 2 == 0 else 0.0
        base, arms = inf.simulate(rng, 1, n, 0.3, [0.3 + gain, 0.3, 0.3], 3, 0.02)
        grid[g] = (base[0], {f"t{k}": list(arms[k][0]) for k in range(3)})
        truth.update({(g, "t0"): gain > 0, (g, "t1"): False, (g, "t2"): False})
        truth.update({(g, "t0", "t1"): gain > 0, (g, "t0", "t2"): gain > 0})
        truth[g, "t1", "t2"] = False
    return grid, truth


def _calls(decided):
    out = {}
    for g, d in decided.items():
        out.update({(g, t["teacher"]): t["verdict"] for t in d.teachers})
        out.update({(g, q["a"], q["b"]): q["verdict"] for q in d.pairs})
    return out


def test_grid_fdr_controls_false_discoveries_and_finds_more():
    """analysis.multiplicity grid_fdr: over 20 simulated grids of 16 groups (half with a real
    12-point teacher), the share of false better/worse among all better/worse stays at or below
    5% (Monte Carlo error allowed), and it finds at least as many real differences as
    Bonferroni within each group."""
    rng = np.random.default_rng(17)
    fdp, found = [], {"group": 0, "grid_fdr": 0}
    for _ in range(20):
        grid, truth = _fdr_grid(rng, groups=16)
        for rule in found:
            decided, record = inf.decide_groups(grid, multiplicity=rule)
            calls = {k: v for k, v in _calls(decided).items() if v in ("better", "worse")}
            found[rule] += sum(truth[k] for k in calls)
            if rule == "grid_fdr":
                assert record["comparisons"] == 96 and 0 < record["level"] < 1
                fdp.append(sum(not truth[k] for k in calls) / max(len(calls), 1))
    assert np.mean(fdp) <= 0.05 + 0.02
    assert found["grid_fdr"] >= found["group"] > 0


def test_grid_fdr_verdicts_are_the_benjamini_hochberg_selection():
    """Every better/worse under grid_fdr is a comparison Benjamini-Hochberg selects (statsmodels,
    recomputed here from the p-values), and no other comparison is better/worse."""
    from statsmodels.stats.multitest import multipletests

    grid, _ = _fdr_grid(np.random.default_rng(5))
    decided, record = inf.decide_groups(grid, multiplicity="grid_fdr")
    rows = [(t["gain_p"], t["verdict"]) for d in decided.values() for t in d.teachers]
    rows += [(q["p"], q["verdict"]) for d in decided.values() for q in d.pairs]
    selected = multipletests([p for p, _ in rows], alpha=0.05, method="fdr_bh")[0]
    assert record["selected"] == int(selected.sum()) > 0
    assert [v in ("better", "worse") for _, v in rows] == list(selected)
    with pytest.raises(ValueError, match="multiplicity"):
        inf.decide_groups(grid, multiplicity="holm")
