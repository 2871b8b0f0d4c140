"""harness.stats.adapters: coverage by simulation, hand-worked values, edge cases, properties.

.venv/bin/pytest tests/unit/stats/test_adapters.py -q
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from harness.stats.adapters import (
    _mean_ci,
    discordant_pairs,
    majority_vote,
    mcnemar_exact,
    paired_bootstrap,
    spearman,
)

# Joint distribution of (base correct, post correct) per item: P(1,1), P(1,0), P(0,1), P(0,0).
# Base accuracy 0.60, post accuracy 0.70, true gain 0.10; 20% of items discordant.
JOINT = (0.55, 0.05, 0.15, 0.25)
TRUE_GAIN = 0.1
TRUE_POST_ACC = 0.7


def _simulate(n_runs: int, n_items: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    cell = np.random.default_rng(seed).choice(4, size=(n_runs, n_items), p=JOINT)
    base = (cell == 0) | (cell == 1)
    post = (cell == 0) | (cell == 2)
    return base, post


def _mcnemar_by_hand(losses: int, wins: int) -> float:
    n = losses + wins
    tail = sum(math.comb(n, k) for k in range(min(losses, wins) + 1)) / 2**n
    return min(1.0, 2 * tail)


bool_vectors = st.lists(st.booleans(), min_size=1, max_size=60)


@st.composite
def paired_vectors(draw):
    n = draw(st.integers(1, 60))
    base = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    post = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return np.array(base), np.array(post)


# --- coverage by simulation --------------------------------------------------------------------


def test_paired_bootstrap_covers_true_gain_95_percent_of_the_time():
    runs = 2000
    base, post = _simulate(runs, n_items=200, seed=20240601)
    covered = 0
    for i in range(runs):
        _, low, high = paired_bootstrap(base[i], post[i], n_resamples=1000, seed=i)
        covered += low <= TRUE_GAIN <= high
    coverage = covered / runs
    assert 0.93 <= coverage <= 0.97, f"paired bootstrap 95% CI coverage {coverage:.4f}"


# --- bootstrap CIs -------------------------------------------------------------------------------


@pytest.mark.parametrize("ci", [0.5, 0.8, 0.95])
def test_paired_bootstrap_has_scipys_bootstrap_distribution(ci):
    # Our draws are the resamples' counts, scipy's are item indices: the random streams differ, the
    # distribution must not. With 20,000 resamples each, the endpoints agree to the grid of
    # possible means (1/n); a wrong multinomial (e.g. unpaired, or counts of the wrong values)
    # moves them by several grid steps.
    base, post = _simulate(1, n_items=300, seed=3)
    ours = paired_bootstrap(base[0], post[0], ci=ci, n_resamples=20_000, seed=11)
    ref = sps.bootstrap(
        (base[0], post[0]),
        lambda b, p, axis: p.mean(axis=axis) - b.mean(axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=20_000,
        confidence_level=ci,
        method="percentile",
        rng=np.random.default_rng(11),
    ).confidence_interval
    assert ours.low == pytest.approx(ref.low, abs=1 / 300 + 1e-9)
    assert ours.high == pytest.approx(ref.high, abs=1 / 300 + 1e-9)
    assert ours.low < ours.estimate < ours.high


def test_a_vector_of_many_values_is_scipys_bootstrap_exactly():
    # rank correlations: not a few distinct values, so scipy resamples them, draw for draw
    r = np.random.default_rng(5).uniform(-1, 1, size=40)
    ours = _mean_ci(r, 0.9, 700, 3)
    ref = sps.bootstrap(
        (r,),
        np.mean,
        vectorized=True,
        n_resamples=700,
        confidence_level=0.9,
        method="percentile",
        rng=np.random.default_rng(3),
    ).confidence_interval
    assert (ours.low, ours.high) == (
        pytest.approx(ref.low, abs=1e-12),
        pytest.approx(ref.high, abs=1e-12),
    )


def test_pairing_narrows_the_interval():
    rng = np.random.default_rng(0)
    base = rng.random(1000) < 0.5
    post = base.copy()
    post[np.flatnonzero(~base)[:30]] = True  # 30 items fixed, none broken: a sure +3 points
    paired = paired_bootstrap(base, post)
    unpaired = sps.bootstrap(
        (post.astype(float), base.astype(float)),
        lambda p, b, axis: p.mean(axis=axis) - b.mean(axis=axis),
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert paired.estimate == pytest.approx(0.03)
    assert paired.low > 0  # every discordant pair is a win
    assert (paired.high - paired.low) < 0.5 * (unpaired.high - unpaired.low)


def test_paired_bootstrap_is_deterministic_per_seed():
    base, post = _simulate(1, n_items=5000, seed=5)
    runs = [paired_bootstrap(base[0], post[0], n_resamples=200, seed=s) for s in (1, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len(set(runs[1:])) == 3


def test_identical_vectors_have_zero_gain_and_p_one():
    base = np.array([1, 0, 1, 1, 0, 0, 1], dtype=bool)
    assert paired_bootstrap(base, base) == (0.0, 0.0, 0.0)
    assert mcnemar_exact(base, base) == 1.0


# --- McNemar ---------------------------------------------------------------------------------------


def _pairs(n11: int, n10: int, n01: int, n00: int) -> tuple[np.ndarray, np.ndarray]:
    base = [1] * n11 + [1] * n10 + [0] * n01 + [0] * n00
    post = [1] * n11 + [0] * n10 + [1] * n01 + [0] * n00
    return np.array(base), np.array(post)


def test_mcnemar_textbook_examples():
    # Fagerland, Lydersen & Laake (2013), BMC Med Res Methodol 13:91, Table 1 (Bentur et al.):
    # 1 and 7 discordant pairs, exact conditional p = 2 * 9 / 256 = 0.0703.
    assert mcnemar_exact(*_pairs(1, 1, 7, 12)) == pytest.approx(0.0703, abs=5e-5)
    # Armitage & Berry (1994, p. 127), two culture media: 12 and 2 discordant, exact p = 0.0129.
    assert mcnemar_exact(*_pairs(20, 12, 2, 16)) == pytest.approx(0.0129, abs=5e-5)


@pytest.mark.parametrize(("losses", "wins"), [(0, 1), (3, 3), (4, 9), (17, 5), (0, 40), (60, 71)])
def test_mcnemar_matches_binomial_sums(losses, wins):
    base, post = _pairs(13, losses, wins, 8)
    assert discordant_pairs(base, post) == (losses, wins)
    assert mcnemar_exact(base, post) == pytest.approx(_mcnemar_by_hand(losses, wins), rel=1e-9)


def test_mcnemar_no_discordant_pairs():
    assert mcnemar_exact([1, 1, 0], [1, 1, 0]) == 1.0
    assert mcnemar_exact([0, 0], [0, 0]) == 1.0


@pytest.mark.parametrize("fn", [paired_bootstrap, mcnemar_exact, discordant_pairs])
def test_length_mismatch_is_a_clear_error(fn):
    with pytest.raises(ValueError, match=r"same test items.*len\(base\)=3, len\(post\)=2"):
        fn([1, 0, 1], [1, 0])


@pytest.mark.parametrize(
    ("bad", "match"),
    [([0, 2, 1], "booleans or 0/1, found 2 at item 1"), ([], "empty"), ([[0, 1]], "1-D")],
)
def test_correctness_vectors_are_validated(bad, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(bad, bad)


def test_ci_level_is_validated():
    with pytest.raises(ValueError, match="ci must lie strictly between 0 and 1"):
        paired_bootstrap([0, 1], [0, 1], ci=95)


# --- rank correlations -------------------------------------------------------------------------


def test_spearman_hand_computed():
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    # sum d^2 = 4: rho = 1 - 6 * 4 / (5 * 24) = 0.8.
    rho = spearman(x, y)
    assert rho.rho == pytest.approx(0.8)
    assert 0 < rho.p < 1
    assert -1 <= rho.low <= rho.high <= 1


def test_spearman_with_ties_uses_average_ranks():
    # Ranks x = (1, 2.5, 2.5, 4), y = (1, 3, 2, 4): Pearson of ranks = 4.5 / sqrt(4.5 * 5).
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]).rho == pytest.approx(math.sqrt(0.9))


def test_perfect_monotone_relation_has_a_point_interval():
    x = np.arange(8.0)
    for y, sign in [(x**3, 1.0), (-np.exp(x), -1.0)]:
        rho, _, low, high = spearman(x, y)
        assert (rho, low, high) == pytest.approx((sign, sign, sign))


@pytest.mark.parametrize("fn", [spearman])
@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([], []),
        ([1.0], [2.0]),
        ([1, 2], [2, 1]),
        ([3, 3, 3, 3], [1, 2, 3, 4]),
        ([1, 2, 3], [5, 5, 5]),
        ([1, np.nan, 2, 3], [1, 2, np.nan, 3]),
    ],
)
def test_correlations_are_nan_safe(fn, x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = fn(x, y)
    assert all(math.isnan(v) for v in result)


@pytest.mark.parametrize("fn", [spearman])
def test_correlations_drop_nan_pairs(fn):
    x, y = [1, 2, np.nan, 3, 4, 5], [2, 1, 7, 4, 3, 5]
    assert fn(x, y) == fn([1, 2, 3, 4, 5], [2, 1, 4, 3, 5])


@pytest.mark.parametrize("fn", [spearman])
def test_correlation_bootstrap_survives_few_points(fn):
    # n = 4: about 1 resample in 64 is constant; the interval comes from the defined ones.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = fn([1, 2, 3, 4], [1, 3, 2, 4], n_resamples=4000, seed=3)
    assert -1 <= r.low <= r.high <= 1
    assert fn([1, 2, 3, 4], [1, 3, 2, 4], seed=3) == fn([1, 2, 3, 4], [1, 3, 2, 4], seed=3)


@pytest.mark.parametrize("fn", [spearman])
def test_correlation_length_mismatch(fn):
    with pytest.raises(ValueError, match=r"len\(x\)=3, len\(y\)=2"):
        fn([1, 2, 3], [1, 2])


# --- properties of the bootstrap -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(paired_vectors(), st.integers(0, 2**32 - 1))
def test_paired_bootstrap_properties(pair, seed):
    base, post = pair
    diff, low, high = paired_bootstrap(base, post, n_resamples=300, seed=seed)
    assert diff == pytest.approx(post.mean() - base.mean(), abs=1e-12)
    assert -1 <= low <= diff <= high <= 1


# --- majority vote -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["3", "4", "4"], "4"),
        (["4", "3", "3", "4"], "4"),  # tie: first seen wins
        ([None, None, "7", "8"], "7"),  # None ignored
        ([None, "5", None, None], "5"),
        ([None, None], None),
        ([], None),
    ],
)
def test_majority_vote(answers, expected):
    assert majority_vote(answers) == expected
