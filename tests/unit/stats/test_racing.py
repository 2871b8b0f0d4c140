"""The race (harness/stats/racing.py): its spending and boundaries against independent
computations, who stops and who runs on, a replay that a kill and resume cannot change, and a
quick calibration of its error rates (the full sweep: benchmarks/racing.py).

    python -m pytest tests/unit/stats/test_racing.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from benchmarks import racing as bench
from harness.stats import racing
from harness.stats import teacher_level as tl

# --- spending and boundaries ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", racing.SPENDING)
def test_spending_reaches_alpha_at_the_last_look_and_grows(kind):
    ts = np.linspace(0.1, 1.0, 10)
    spent = [racing.spent(float(t), 0.05, kind) for t in ts]
    assert spent[-1] == pytest.approx(0.05)
    assert all(b > a for a, b in zip(spent, spent[1:], strict=False))


def test_obrien_fleming_spends_little_early():
    # 2 - 2 Phi(1.96 / sqrt(0.25)) = 2 Phi(-3.92)
    assert racing.spent(0.25, 0.05) == pytest.approx(2 * stats.norm.sf(3.919927969), rel=1e-6)
    with pytest.raises(ValueError, match="valid: obrien_fleming, pocock"):
        racing.spent(0.5, 0.05, "linear")


def test_one_look_is_the_fixed_design():
    assert racing.nominal_levels((1.0,), 0.05) == (0.05,)
    assert racing.plan(3, 3).levels == (0.05,)


@pytest.mark.parametrize("kind", racing.SPENDING)
def test_boundaries_cross_with_probability_alpha(kind):
    """The chance that one contrast crosses some look's boundary, computed independently of the
    Monte Carlo paths by scipy's multivariate normal (looks correlated sqrt(t_i / t_j)), is the
    alpha spent in all."""
    p = racing.plan(3, 6, 0.05, kind)
    t = np.array(p.looks) / p.max_replicates
    c = stats.norm.isf(np.array(p.levels) / 2)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    inside = stats.multivariate_normal(np.zeros(len(t)), cov).cdf(
        c, lower_limit=-c, rng=np.random.default_rng(0)
    )
    assert 1 - inside == pytest.approx(0.05, abs=0.002)
    # the looks share data, so the nominal levels add up to more than alpha, each below it
    assert sum(p.levels) > 0.05 and max(p.levels) < 0.05


def test_a_plan_refuses_a_minimum_above_its_maximum():
    with pytest.raises(ValueError, match="min 5 <= max 3"):
        racing.plan(5, 3)


# --- who runs on ---------------------------------------------------------------------------------


def _decision(best_set, rows):
    return tl.GroupDecision(
        [{"teacher": t, "verdict": v, "gain_upper": u} for t, v, u in rows],
        [], best_set, tl.INCONCLUSIVE, tl.INCONCLUSIVE, False, 0.3, 0.2, 0.4, 200, 0.05, 0.03,
    )  # fmt: skip


def test_the_best_set_runs_on_and_a_teacher_that_can_block_none_too():
    d = _decision(["a"], [("a", "inconclusive", 0.08), ("b", "inconclusive", 0.05),
                          ("c", "inconclusive", 0.01)])  # fmt: skip
    assert racing.needed(d, 0.03) == ["a", "b"]  # c can neither win nor keep "none" away


def test_once_a_teacher_beats_the_baseline_only_the_best_set_runs_on():
    d = _decision(["a", "b"], [("a", "better", 0.2), ("b", "inconclusive", 0.15),
                               ("c", "inconclusive", 0.1)])  # fmt: skip
    assert racing.needed(d, 0.03) == ["a", "b"]


# --- the race over replicates --------------------------------------------------------------------


def _group(seed: int, gains, r_max: int = 6, sd: float = 0.02):
    rng = np.random.default_rng(seed)
    base, arms = tl.simulate(rng, 1, 200, 0.3, [0.3 + g for g in gains], r_max, sd, 0.5)
    return base[0], {f"t{k}": list(a[0]) for k, a in enumerate(arms)}


def test_a_clear_loser_stops_at_the_first_look_and_the_winner_is_named():
    base, teachers = _group(1, [0.20, 0.0, -0.05])
    p = racing.plan(3, 6)
    race = racing.race_groups({"g": (base, teachers)}, p)["g"]
    assert race.done and race.decision is not None
    assert race.decision.answer == "t0"
    assert race.stopped_at["t2"] == 0 and race.replicates["t2"] == 3
    assert race.adapters() < racing.uniform_adapters(3, p)
    # the decision at each look is the rule at that look's nominal level
    assert [d.alpha for d in race.looks] == list(p.levels[: len(race.looks)])


def test_equal_teachers_run_to_the_maximum():
    base, teachers = _group(2, [0.05, 0.05, 0.05], sd=0.03)
    race = racing.race_groups({"g": (base, teachers)}, racing.plan(3, 5))["g"]
    assert race.done and len(race.looks) == 3 and race.needs == {}


def test_a_killed_and_resumed_race_asks_for_and_decides_the_same():
    """Replicates arrive only as the race asks for them (a run killed after every round and
    resumed from what is cached): the same replicates, looks and answers as a replay over all
    the replicates at once, for two groups that borrow each other's variance."""
    p = racing.plan(3, 6)
    full = {"g1": _group(3, [0.12, 0.02, 0.0]), "g2": _group(4, [0.04, 0.04, -0.06])}
    have = {g: (b, {t: d[: p.looks[0]] for t, d in ts.items()}) for g, (b, ts) in full.items()}
    for _ in range(len(p.looks) + 1):
        races = racing.race_groups(have, p)
        for g, race in races.items():
            for t, r in race.needs.items():
                have[g][1][t] = full[g][1][t][:r]
    once = racing.race_groups(full, p)
    for g in full:
        assert races[g].replicates == once[g].replicates
        assert [d.answer for d in races[g].looks] == [d.answer for d in once[g].looks]
        assert [d.best_set for d in races[g].looks] == [d.best_set for d in once[g].looks]
        assert races[g].done


def test_a_look_waits_for_every_open_group():
    p = racing.plan(3, 5)
    full = {"g1": _group(5, [0.05, 0.05]), "g2": _group(6, [0.05, 0.05])}
    partial = dict(full)
    partial["g2"] = (full["g2"][0], {t: d[:3] for t, d in full["g2"][1].items()})
    races = racing.race_groups(partial, p)
    assert len(races["g1"].looks) == 1 and races["g2"].needs == {"t0": 4, "t1": 4}


# --- calibration (the sweep: python -m benchmarks.racing) ----------------------------------------


def test_racing_keeps_the_error_rates_under_the_null():
    """Equal teachers, no gain: the race says a false better/worse, or names a teacher, in at
    most alpha of groups (plus 2.5 binomial SEs at this many runs)."""
    runs = 120
    r = bench.compare(np.random.default_rng(7), runs, (0, 0, 0), 3.5, racing.plan(3, 5))
    bound = 0.05 + 2.5 * math.sqrt(0.05 * 0.95 / runs)
    assert r["race_error"] <= bound and r["race_false"] <= bound
    assert r["race_adapters"] <= r["max_adapters"]


def test_racing_saves_adapters_where_teachers_differ():
    r = bench.compare(np.random.default_rng(8), 40, (15, 0, -5), 2.0, racing.plan(3, 6))
    assert r["saved"] >= 0.3 and r["race_named"] >= r["max_named"] - 0.1
    assert r["race_false"] == 0.0


def test_the_expected_adapters_lie_between_the_first_look_and_the_maximum():
    p = racing.plan(3, 6)
    spread = racing.expected_adapters(4, 200, p, 0.03, spread=0.15, runs=8)
    assert 4 * 3 <= spread <= 4 * 6
    # a teacher 15 points ahead of teachers at the baseline is found early
    clear = racing.expected_adapters(2, 200, p, 0.02, spread=0.15, runs=8)
    assert clear < 2 * 6
