"""Grid-level inference (harness/stats/grid_level.py): the permutation of teacher (student) labels
over the whole grid, what a design can claim before any compute (`cotgap plan`), and the
simulation suite in seconds: under nulls where a teacher's quality is shared by every task and
student (with teacher x task and teacher x student effects), no cross-group reading of the
studies claims a direction more often than its level allows, and with four or fewer teachers
every teacher-level reading says "too few". The full runs: `python -m benchmarks.studies --grid`.

    python -m pytest tests/test_grid_level.py
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from benchmarks import studies as bench
from harness.analysis import studies as st
from harness.config.schema import load_experiment
from harness.execution import plan
from harness.stats import grid_level as gl

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def not_above(claims: int, runs: int, alpha: float = 0.05) -> bool:
    """A count of claims consistent with a rate of at most alpha (one-sided binomial, 0.001)."""
    return claims == 0 or stats.binom.sf(claims - 1, runs, alpha) > 0.001


# --- the design ----------------------------------------------------------------------------------


def test_the_fewest_units_a_level_needs():
    assert gl.smallest_p(4) == pytest.approx(2 / 24) and gl.smallest_p(5) == pytest.approx(2 / 120)
    assert gl.units_needed(0.05) == 5  # 2 / 4! = 0.083 > 0.05
    assert gl.units_needed(0.05, gl.GREATER) == 4  # 1 / 4! = 0.042
    assert gl.units_needed(0.05 / 4) == 6  # a bin of four: 2 / 5! = 0.017 > 0.0125
    assert gl.smallest_p(1) == 1.0 and gl.smallest_p(2) == 1.0


# --- the test ------------------------------------------------------------------------------------


def test_exact_p_counts_every_order_as_extreme_as_the_observed():
    w = np.array([0.3, -0.1, 0.5, 0.2])
    x = np.array([1.0, 2.0, 3.0, 5.0])

    def stat(perms: np.ndarray) -> np.ndarray:
        return x[perms] @ w

    got = gl.permutation_test(stat, 4, alpha=0.1)
    every = [x[list(p)] @ w for p in itertools.permutations(range(4))]
    assert got.statistic == pytest.approx(x @ w) and got.exact and got.n_permutations == 24
    assert got.p == pytest.approx(np.mean(np.abs(every) >= abs(x @ w) - 1e-12))
    one = gl.permutation_test(stat, 4, alpha=0.1, alternative=gl.LESS)
    assert one.p == pytest.approx(np.mean(np.array(every) <= x @ w + 1e-12))
    # the design's bound: with 4 units p never goes below 2 / 4! two-sided
    assert got.smallest_p >= 2 / 24 and not got.too_few and got.needed == 4
    assert gl.permutation_test(stat, 4, alpha=0.05).too_few


def test_many_units_are_sampled_and_the_sample_counts_the_observed():
    w = np.linspace(-1, 1, 9)

    def stat(perms: np.ndarray) -> np.ndarray:
        return np.arange(9.0)[perms] @ w

    got = gl.permutation_test(stat, 9, alpha=0.05)
    perms, exact = gl.label_permutations(9)
    assert not got.exact and not exact and got.n_permutations == len(perms) == 2000
    values = np.abs(stat(perms))
    assert got.p == pytest.approx(np.mean(values >= values[0] - 1e-9))
    assert got.p <= 3 / 2000 and got.rejects  # the identity is the most extreme order


def test_block_keeps_groups_that_hold_every_teacher():
    frame = pd.DataFrame(
        {"task": ["a"] * 3 + ["b"] * 2, "student": ["s"] * 5, "teacher": ["x", "y", "z", "x", "y"],
         "gain": [1.0, 2.0, 3.0, 4.0, 5.0]}
    )  # fmt: skip
    keys, teachers, arr = gl.block(frame, ["gain"])
    assert teachers == ["x", "y", "z"] and keys["task"].tolist() == ["a"]
    assert arr["gain"].tolist() == [[1.0, 2.0, 3.0]]


def test_the_rank_statistic_is_the_mean_within_group_spearman():
    rng = np.random.default_rng(4)
    y, x = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    got = gl.mean_rank_correlation(y, x)(np.arange(5)[None])[0]
    rhos = [stats.spearmanr(a, b).statistic for a, b in zip(y, x, strict=True)]
    assert got == pytest.approx(np.mean(rhos))


def test_within_slopes_is_least_squares_with_group_intercepts():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4, 6, 2))
    y = x @ np.array([1.5, -0.5]) + rng.normal(size=(4, 1)) + rng.normal(0, 0.1, (4, 6))
    perm = np.array([[2, 0, 1, 5, 4, 3]])
    got = gl.within_slopes(y, x)(perm)[0]
    xp = x[:, perm[0], :]  # teacher t takes teacher perm[t]'s regressors
    dummies = np.kron(np.eye(4), np.ones((6, 1)))
    design = np.column_stack([xp.reshape(-1, 2), dummies])
    want = np.linalg.lstsq(design, y.ravel(), rcond=None)[0][:2]
    assert got == pytest.approx(want)


def test_teacher_components_recover_the_planted_spreads():
    """Shared, teacher x task, teacher x student and residual SDs of 3, 2, 1.5 and 1 points,
    with a large (task, student) level that must not leak in: the mean estimates over 30
    grids of 40 tasks, 10 students and 12 teachers come within three Monte Carlo errors (the
    shared SD rests on 12 teachers a grid: about 0.12 points of error over 30 grids)."""
    rng = np.random.default_rng(6)
    k, s, t = 40, 10, 12
    got = []
    for _ in range(30):
        y = (rng.normal(0, 3, t) + rng.normal(0, 2, (k, 1, t)) + rng.normal(0, 1.5, (1, s, t))
             + rng.normal(0, 1, (k, s, t)) + rng.normal(0, 5, (k, s, 1)))  # fmt: skip
        got.append(list(gl.teacher_components(y).values()))
    mean = np.mean(got, axis=0)
    assert mean[0] == pytest.approx(3, abs=0.4)
    assert mean[1:] == pytest.approx([2, 1.5, 1], abs=0.1)
    assert math.isnan(gl.teacher_components(np.zeros((1, 3, 4)))["teacher"])


# --- the simulation suite, in seconds ------------------------------------------------------------


@pytest.mark.parametrize(
    ("null", "shape", "runs"),
    [("shared quality", (5, 2, 4), 40),
     ("shared quality + teacher x task", (6, 2, 12), 30),
     ("shared quality + teacher x student", (6, 4, 6), 30),
     ("shared quality + teacher x task", (5, 3, 8), 30)],
)  # fmt: skip
def test_no_cross_group_reading_claims_more_than_its_level(null, shape, runs):
    """Teacher quality shared across tasks and students (unrelated to accuracy or size): the
    naive test that permutes within tasks claims a relation often; every reading does not."""
    (row,) = bench.null_rates(runs, {null: bench.NULLS[null]}, [shape], seed=sum(shape))
    for name, rate in row["claims"].items():
        assert not_above(round(rate * runs), runs), f"{name}: {rate:.3f} of {runs}"
    assert row["naive"] > 0.1  # what the grid-level permutation replaces


@pytest.mark.parametrize("teachers", [2, 3, 4])
def test_four_or_fewer_teachers_are_too_few_for_every_teacher_level_claim(teachers):
    rng = np.random.default_rng(teachers)
    planted = bench.teacher_grid(rng, lambda a, s, n: 0.5 * a, tasks=12, teachers=teachers,
                                 students=4)  # fmt: skip
    words = bench.readings(planted)
    two_sided = [c for c, unit, alt, _ in gl.CLAIMS if unit == "teachers" and alt == gl.TWO_SIDED]
    for claim in two_sided:
        assert words[claim] and all(w.startswith(st.TOO_FEW) for w in words[claim]), claim
    # the report's line names how many it needs
    assert (
        f"too few teachers ({teachers}: no teacher-level test can reach p ≤ 0.05; it needs ≥ 5)"
        in (st.win_rate_fit(planted, 0.05, bench.BINS)["trend"])
    )


def test_a_planted_relation_is_found_at_the_teacher_level():
    """Power at a realistic effect: 2.5 points of gain per 10 points of teacher accuracy, over
    a shared teacher quality of SD 2 points, 6 teachers, 2 students, 6 tasks."""
    found = 0
    for seed in range(10):
        frame = bench.teacher_grid(np.random.default_rng(seed), lambda a, s, n: 0.25 * a,
                                   tasks=6, teachers=6, students=2, quality_sd=0.02)  # fmt: skip
        found += bench.readings(frame)["capacity gap: gain vs teacher accuracy and vs size"][0] == (
            "claim"
        )
    assert found >= 8


# --- what plan says, and that the report agrees ----------------------------------------------------


def test_plan_says_too_few_before_any_compute_with_how_many_are_needed():
    exp = load_experiment(CONFIGS[0].parent / "sandbox.yaml")
    lines = plan.claim_lines(exp)
    assert "3 teacher(s), 2 student(s)" in lines[0]
    text = "\n".join(lines)
    assert "capacity gap: gain vs teacher accuracy and vs size: [yellow]too few: needs ≥ 5 " \
           "teachers[/] (has 3: p can reach 0.333 at best" in text  # fmt: skip
    assert "each gap bin: [yellow]too few: needs ≥ 6 teachers" in text
    assert "student size x teacher property: [yellow]too few: needs ≥ 5 students" in text


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_reads_too_few_where_plan_says_so(config):
    """On a grid of each shipped config's teachers and students (synthetic gains with a strong
    planted relation), each claim `plan` calls too few reads 'too few' in the studies, and
    each it calls testable does not."""
    exp = load_experiment(config)
    n_t, n_s = len(exp.teachers), len(exp.students)
    frame = bench.teacher_grid(np.random.default_rng(0), lambda a, s, n: 0.5 * a, tasks=3,
                               teachers=n_t, students=max(n_s, 1))  # fmt: skip
    words = bench.readings(frame)
    bins = max(1, len(bench.BINS) - 1)
    for c in gl.design(n_t, n_s, 1 - exp.analysis.ci, bins):
        few = [w.startswith(st.TOO_FEW) for w in words[c["claim"]]]
        if not c["supported"]:
            assert all(few), (c["claim"], words[c["claim"]])
        elif c["claim"] != "inverted U (two lines, one-sided)":  # it may find no peak at all
            assert not any(few), (c["claim"], words[c["claim"]])
