"""The grid-level permutation (harness/stats/grid_level.py) on small arrays, each against a
computation by hand: the design's smallest p, exact and sampled p-values, the statistics, and the
teacher variance components.

    python -m pytest tests/unit/stats/test_grid_level.py
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.stats import grid_level as gl

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
