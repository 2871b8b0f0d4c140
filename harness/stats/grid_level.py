"""Grid-level inference: claims made across a grid's groups, with the teacher (or the student) as
the unit, by permuting its labels over the whole grid.

    .venv/bin/python -c "from harness.stats import grid_level; help(grid_level.permutation_test)"
    .venv/bin/pytest tests/unit/stats/test_grid_level.py tests/test_cross_group.py

A grid holds the same few teachers on every task and student. A teacher that is good on one task
is usually good on the others, and every student of a task learns from the same traces, so the
groups of a grid are not independent repeats of a comparison between teachers: a relation
between gain and teacher accuracy seen on twelve tasks may be one coincidence between four
teachers' qualities and their accuracies, seen twelve times. The test therefore permutes the
teachers' labels: one permutation, applied on every task, student and regime, moves each
teacher's whole profile (its effect on every task, its teacher × task and teacher × student
effects, the correlation between them) onto another teacher's properties. Under the null (the
outcome is unrelated to the teachers' property: teachers are exchangeable) every permutation is
as likely as the observed labelling, so the test is exact for any number of tasks and whatever
the teacher × task and teacher × student variation is; that variation is carried by the data,
not assumed away. With T teachers there are only T! labellings, so the smallest p a two-sided
test can reach is about 2 / T! (the reversed order gives the mirror statistic when teachers keep
their order on every task): 0.083 with four teachers, 0.017 with five. Below that the claim is
"too few", whatever the data.

A claim about students (the student-size interaction) permutes the students' labels the same way.

Why a permutation rather than a crossed mixed model (statsmodels MixedLM with teacher, student
and task variance components): with the three to eight teachers of a grid the teacher variance
component is estimated from a handful of values and sits at its boundary (zero) in much of the
sampling distribution; the Wald test of a teacher-level slope then needs a Kenneth-Roger or
Satterthwaite correction statsmodels does not offer, and its level is not guaranteed at these
sizes. The permutation test has the level it states at every size, says when the design cannot
reach it, and costs a few thousand closed-form evaluations (every statistic below is a
within-group least-squares or rank quantity whose permutations are one matrix product).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

TWO_SIDED, GREATER, LESS = "two-sided", "greater", "less"


# --- the design: how small a p the units allow ----------------------------------------------------


def smallest_p(n_units: int, alternative: str = TWO_SIDED) -> float:
    """The smallest p a permutation test over `n_units` labels can reach when the units keep
    their order on every task (the usual case, and the one a plan must assume): 2 / n! two-sided
    (the order and its reverse), 1 / n! one-sided."""
    if n_units < 2:
        return 1.0
    return min(1.0, (2 if alternative == TWO_SIDED else 1) / math.factorial(n_units))


def units_needed(alpha: float, alternative: str = TWO_SIDED, most: int = 20) -> int:
    """The fewest units whose permutations can reach p <= alpha."""
    for n in range(2, most + 1):
        if smallest_p(n, alternative) <= alpha:
            return n
    return most + 1


def block(
    frame: pd.DataFrame, columns: Sequence[str], by: Sequence[str] = ("task", "student")
) -> tuple[pd.DataFrame, list[str], dict[str, np.ndarray]]:
    """The frame as groups (rows, one per `by` value) x teachers (columns, in the same order in
    every row), one array per column: what a permutation of teacher labels over the whole grid
    acts on. A group that lacks a teacher some other group has is left out (every group must
    hold the same teachers for one permutation to apply to all)."""
    df = frame.dropna(subset=list(columns))
    if df.empty:
        return pd.DataFrame(columns=list(by)), [], {c: np.empty((0, 0)) for c in columns}
    teachers = sorted(df["teacher"].unique(), key=str)
    means = df.groupby([*by, "teacher"], sort=True)[list(columns)].mean().unstack("teacher")
    keep = means.notna().all(axis=1).to_numpy()
    keys = means.index[keep].to_frame(index=False)
    wide = {c: means[c].reindex(columns=teachers).to_numpy(dtype=float)[keep] for c in columns}
    return keys, teachers, wide


def cube(keys: pd.DataFrame, values: np.ndarray) -> tuple[list, list, np.ndarray]:
    """`block`'s (task, student) rows as a balanced (tasks x students x ...) array: the tasks
    that hold every student (each with every teacher), and the students."""
    students = sorted(keys["student"].unique(), key=str)
    full = keys.groupby("task")["student"].nunique() == len(students)
    tasks = sorted(full[full].index, key=str)
    where = {(t, s): i for i, (t, s) in enumerate(zip(keys["task"], keys["student"], strict=True))}
    rows = np.array([[where[t, s] for s in students] for t in tasks], dtype=int)
    return tasks, students, values[rows.reshape(len(tasks), len(students))]


# --- the test ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Permutation:
    """A grid-level permutation test's result. `smallest_p`: the least p this design allows,
    the larger of its permutation distribution's (1 / (draws + 1) when sampled) and
    `smallest_p(n_units)`; `too_few` when it is above `alpha` (the test then never claims), and
    `needed` the units a design needs to reach alpha."""

    statistic: float
    p: float
    smallest_p: float
    alpha: float
    alternative: str
    n_units: int
    n_permutations: int
    exact: bool
    needed: int

    @property
    def too_few(self) -> bool:
        return self.smallest_p > self.alpha + 1e-12

    @property
    def rejects(self) -> bool:
        return not self.too_few and self.p <= self.alpha + 1e-12

    def as_dict(self) -> dict:
        return {**asdict(self), "too_few": self.too_few, "rejects": self.rejects}


@functools.lru_cache(maxsize=32)
def label_permutations(
    n: int, max_exact: int = 5040, draws: int = 1999, seed: int = 0
) -> tuple[np.ndarray, bool]:
    """All n! orders of n labels (the identity first) up to `max_exact`, else the identity and
    `draws` random ones; and whether the set is exact. Cached and read-only: the tests of one
    grid share one array, which lets a statistic reuse its work across them (`pair_wins`)."""
    if math.factorial(n) <= max_exact:
        perms = np.array(list(itertools.permutations(range(n))), dtype=int)
        exact = True
    else:
        rng = np.random.default_rng(seed)
        drawn = np.array([rng.permutation(n) for _ in range(draws)], dtype=int)
        perms, exact = np.vstack([np.arange(n), drawn]), False
    perms.flags.writeable = False
    return perms, exact


def permutation_test(
    statistic: Callable[[np.ndarray], np.ndarray],
    n_units: int,
    alpha: float,
    alternative: str = TWO_SIDED,
    max_exact: int = 5040,
    draws: int = 1999,
    seed: int = 0,
) -> Permutation:
    """Permute the labels of `n_units` units over the whole grid. `statistic(perms)` gets the
    permutations as a (P, n_units) index array (row 0 the identity: unit i takes the properties
    of unit perms[p, i]) and returns the statistic under each, shape (P,). Exact over all n!
    permutations up to `max_exact`, else Monte Carlo with `draws` (p = (hits + 1) / (draws + 1))."""
    needed = units_needed(alpha, alternative)
    if n_units < 2:
        return Permutation(math.nan, math.nan, 1.0, alpha, alternative, n_units, 1, True, needed)
    perms, exact = label_permutations(n_units, max_exact, draws, seed)
    values = np.asarray(statistic(perms), dtype=float)
    observed = float(values[0])
    if not np.isfinite(observed):
        return Permutation(math.nan, math.nan, 1.0, alpha, alternative, n_units, len(perms), exact,
                           needed)  # fmt: skip
    null = np.nan_to_num(values, nan=0.0)
    signed = {TWO_SIDED: np.abs(null), GREATER: null, LESS: -null}[alternative]
    tol = 1e-9 * max(1.0, float(np.abs(null).max()))
    p = float(np.mean(signed >= signed[0] - tol))
    # the design's bound as well as this draw's: a continuous statistic can leave its mirror
    # order untied (p = 1 / n! two-sided), but a plan made before the data cannot count on it
    least = float(np.mean(signed >= signed.max() - tol)) if exact else 1 / len(perms)
    least = max(least, smallest_p(n_units, alternative))
    return Permutation(observed, p, least, alpha, alternative, n_units, len(perms), exact, needed)


# --- statistics: each evaluated under a batch of permutations -------------------------------------


def spread(a: np.ndarray) -> np.ndarray:
    """Per row (group): whether its values differ."""
    return np.ptp(a, axis=1) > 0 if a.size else np.zeros(len(a), dtype=bool)


def _standard_ranks(a: np.ndarray) -> np.ndarray:
    """Each row's ranks, centred and scaled to unit length (zero for a row without spread), so
    that the dot product of two rows is Spearman's rho."""
    from scipy import stats

    r = stats.rankdata(a, axis=1)
    r = r - r.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(r, axis=1, keepdims=True)
    return np.divide(r, norm, out=np.zeros_like(r), where=norm > 0)


def mean_rank_correlation(outcome: np.ndarray, prop: np.ndarray) -> Callable:
    """The mean over groups (rows) of the within-group Spearman rho of outcome and the teachers'
    property (columns: teachers, in the same order in every row), as a statistic of the teacher
    permutation. Rows where either has no spread are left out."""
    keep = spread(outcome) & spread(prop)
    if not keep.any():
        return lambda perms: np.full(len(perms), math.nan)
    ry, rx = _standard_ranks(outcome[keep]), _standard_ranks(prop[keep])

    def stat(perms: np.ndarray) -> np.ndarray:
        return np.einsum("gpt,gt->p", rx[:, perms], ry) / keep.sum()

    return stat


def within_slopes(outcome: np.ndarray, regressors: np.ndarray) -> Callable:
    """Least-squares coefficients of outcome (G groups x T teachers) on the teachers' regressors
    (G x T x K), each group with its own intercept, as a statistic of the teacher permutation:
    returns a function of perms giving (P, K). A permutation only reorders a group's regressor
    rows, so X'X is the same under every one and only X'y is recomputed."""
    y = outcome - outcome.mean(axis=1, keepdims=True)
    x = regressors - regressors.mean(axis=1, keepdims=True)
    xtx = np.einsum("gtk,gtl->kl", x, x)
    full_rank = np.linalg.matrix_rank(xtx) == xtx.shape[0]
    inv = np.linalg.pinv(xtx)

    def coefs(perms: np.ndarray) -> np.ndarray:
        if not full_rank:
            return np.full((len(perms), x.shape[2]), math.nan)
        return np.einsum("gptk,gt->pk", x[:, perms, :], y) @ inv

    return coefs


def column(coefs: Callable, k: int) -> Callable:
    """One coefficient of a `within_slopes` statistic."""
    return lambda perms: coefs(perms)[:, k]


def pair_wins(outcome: np.ndarray, prop: np.ndarray) -> Callable:
    """For every pair of teachers of every group (row): the property gap |a - b| and whether the
    teacher with the higher property has the higher outcome (1, 0, a tie 0.5); pairs with equal
    property are left out (NaN gap). Returns a function of perms giving (gap, win), each
    (P, pairs)."""
    i, j = np.triu_indices(outcome.shape[1], k=1)
    order = np.sign(outcome[:, i] - outcome[:, j])  # (G, pairs): +1 when i scored higher
    last: list = [None, None]  # the latest perms and their result: the bins and trend share them

    def at(perms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if last[0] is perms:
            return last[1]
        xp = prop[:, perms]  # (G, P, T)
        diff = xp[:, :, i] - xp[:, :, j]  # (G, P, pairs)
        win = (1 + np.sign(diff) * order[:, None, :]) / 2
        gap = np.where(diff != 0, np.abs(diff), np.nan)
        move = (1, 0, 2)
        g = np.transpose(gap, move).reshape(len(perms), -1)
        last[:] = perms, (g, np.transpose(win, move).reshape(len(perms), -1))
        return last[1]

    return at


def win_slope(wins: Callable) -> Callable:
    """The least-squares slope of win (0/1) on the gap over every pair pooled."""

    def stat(perms: np.ndarray) -> np.ndarray:
        gap, win = wins(perms)
        ok = ~np.isnan(gap)
        n = ok.sum(axis=1)
        gm = np.where(ok, gap, 0).sum(axis=1) / np.maximum(n, 1)
        wm = np.where(ok, win, 0).sum(axis=1) / np.maximum(n, 1)
        dg = np.where(ok, gap - gm[:, None], 0)
        sxx = (dg**2).sum(axis=1)
        sxy = (dg * np.where(ok, win - wm[:, None], 0)).sum(axis=1)
        return np.divide(sxy, sxx, out=np.full(len(perms), math.nan), where=sxx > 0)

    return stat


def win_rate_in(wins: Callable, low: float, high: float, closed: bool) -> Callable:
    """The win rate of the teacher with the higher property, less one half, among the pairs whose
    gap is in [low, high) ([low, high] when `closed`)."""

    def stat(perms: np.ndarray) -> np.ndarray:
        gap, win = wins(perms)
        inside = (gap >= low) & ((gap <= high) if closed else (gap < high))
        n = inside.sum(axis=1)
        total = np.where(inside, win, 0).sum(axis=1)
        return np.divide(total, n, out=np.full(len(perms), 0.5), where=n > 0) - 0.5

    return stat


def student_interaction(outcome: np.ndarray, prop: np.ndarray, size: np.ndarray) -> Callable:
    """gain ~ teacher property x student size in a balanced block (tasks x students x teachers),
    every (task, student) and every (task, teacher) its own effect: the least-squares coefficient
    of the product, as a statistic of the student permutation (each student's whole profile moves
    to another student's size). `prop`: (tasks x teachers); `size`: (students,)."""
    y = outcome - outcome.mean(axis=2, keepdims=True)  # less (task, student) effects
    y = y - y.mean(axis=1, keepdims=True)  # less (task, teacher) effects (balanced: exact)
    pc = prop - prop.mean(axis=1, keepdims=True)
    sc = size - size.mean()
    weight = np.einsum("kst,kt->s", y, pc)  # each student's slope of gain on the property
    den = float((pc**2).sum() * (sc**2).sum())

    def stat(perms: np.ndarray) -> np.ndarray:
        if den <= 0:
            return np.full(len(perms), math.nan)
        return sc[perms] @ weight / den

    return stat


# --- what a design can claim, before any data -----------------------------------------------------

# (claim, unit, alternative, least units besides the test's own need)
CLAIMS: tuple[tuple[str, str, str, int], ...] = (
    ("capacity gap: gain vs teacher accuracy and vs size", "teachers", TWO_SIDED, 3),
    ("stronger vs weaker teacher: win-rate trend", "teachers", TWO_SIDED, 3),
    ("stronger vs weaker teacher: each gap bin", "teachers", TWO_SIDED, 3),
    ("quantity vs quality: each term", "teachers", TWO_SIDED, 3),
    ("inverted U (two lines, one-sided)", "teachers", GREATER, 4),
    ("student size x teacher property", "students", TWO_SIDED, 2),
)


def design(n_teachers: int, n_students: int, alpha: float, n_bins: int = 1) -> list[dict]:
    """Per cross-group claim of the studies: its unit, how many the grid has, the smallest p
    that many can reach (teachers keeping their order on every task), and how many it needs
    to reach its level (alpha, or alpha / n_bins for each gap bin). The inverted U also needs
    two teachers on each side of its peak; a correlation, three."""
    out = []
    for claim, unit, alternative, least in CLAIMS:
        level = alpha / n_bins if "bin" in claim else alpha
        n = n_teachers if unit == "teachers" else n_students
        needed = max(least, units_needed(level, alternative))
        out.append({"claim": claim, "unit": unit, "n": n, "level": level, "needed": needed,
                    "smallest_p": smallest_p(n, alternative), "supported": n >= needed})  # fmt: skip
    return out


# --- how much of the gain is the teacher's, everywhere or per task / student ----------------------


def teacher_components(gain: np.ndarray) -> dict[str, float]:
    """Variance components of the gains of a balanced block (tasks x students x teachers, one
    value per cell), the (task, student) groups' own levels removed: the SD of a teacher's
    effect shared by every task and student (`teacher`), of its teacher x task and teacher x
    student effects, and what is left (teacher x task x student, with the replicate noise).
    Method of moments on the mean squares of the three-way layout (each expected mean square a
    known sum of the components: MS_T = KS s2_T + S s2_TK + K s2_TS + s2_e, MS_TK = S s2_TK +
    s2_e, MS_TS = K s2_TS + s2_e), a negative estimate read as 0. Written out rather than a
    likelihood fit: one value per cell gives these closed forms exactly, while MixedLM's crossed
    fit of a handful of teachers stalls at the zero boundary. Descriptive: the permutation
    tests above need none of it."""
    k, s, t = gain.shape
    nan = {"teacher": math.nan, "teacher_x_task": math.nan, "teacher_x_student": math.nan,
           "residual": math.nan}  # fmt: skip
    if min(k, s, t) < 2:
        return nan
    y = gain - gain.mean(axis=2, keepdims=True)  # teacher deviations within each group
    m_t = y.mean(axis=(0, 1))  # (t,)
    m_kt = y.mean(axis=1) - m_t  # (k, t)
    m_st = y.mean(axis=0) - m_t  # (s, t)
    e = y - m_t - m_kt[:, None, :] - m_st[None, :, :]
    ms_t = k * s * (m_t**2).sum() / (t - 1)
    ms_kt = s * (m_kt**2).sum() / ((k - 1) * (t - 1))
    ms_st = k * (m_st**2).sum() / ((s - 1) * (t - 1))
    ms_e = (e**2).sum() / ((k - 1) * (s - 1) * (t - 1))
    var = {"teacher": (ms_t - ms_kt - ms_st + ms_e) / (k * s),
           "teacher_x_task": (ms_kt - ms_e) / s, "teacher_x_student": (ms_st - ms_e) / k,
           "residual": ms_e}  # fmt: skip
    return {name: math.sqrt(max(v, 0.0)) for name, v in var.items()}
