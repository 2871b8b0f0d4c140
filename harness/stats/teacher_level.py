"""Teacher-level inference: what a group of teachers' distilled students let a user conclude.

    .venv/bin/python -c "from harness.stats import teacher_level; help(teacher_level.decide_group)"
    .venv/bin/pytest tests/test_inference.py

The unit of inference is the teacher, not one trained adapter. A teacher's *replicates* are
independent draws of what distilling from it produces: one draw of its sampled traces and the
training runs on them. Test items are crossed with replicates (every adapter is scored on the
same items), replicates are nested in teachers. For a contrast between two arms (a teacher and
the student's own baseline, or two teachers) the estimate is the difference of the arms' mean
accuracies, and its variance has an item part and a replicate part:

    Var = Var_items(mean over replicates of the per-item difference) / n
          + sigma2_rep(A) / R_A + sigma2_rep(B) / R_B

with sigma2_rep the between-replicate variance of an arm's accuracy, estimated by the
method of moments of the balanced two-way (replicates x items) layout, (MS_rep - MS_res) / n;
the item part already holds the item-by-replicate noise, so nothing is counted twice: the sum is
the textbook variance of a grand mean in a crossed random-effects design (items, replicates,
residual). Each arm's MS_rep is moderated (Smyth 2004's empirical Bayes): averaged with its
teacher's typical one over the grid's other tasks and students, on more degrees of freedom than
its own R - 1 (`_total` has the reason: power at 3 replicates, robust to one erratic teacher, no
pre-test).

Near 0% and 100% a Wald interval collapses (an accuracy of 1/50 has an item variance estimate of
almost nothing), so the item part is taken after the Bonett-Price adjustment: one pseudo-item
discordant each way for a difference, two correct and two wrong pseudo-items for one accuracy
(Agresti-Coull), each of weight 1/R on the means of R replicates; with a single replicate and
0/1 data these are exactly the Bonett-Price and Agresti-Coull intervals. The critical value is
Student's t with Satterthwaite degrees of freedom of the whole sum.

Every comparison ends in one word. The multiplicity family is the decision group: its m
teacher-vs-baseline and m(m-1)/2 teacher-vs-teacher intervals are simultaneous, one single-step
max-t family (`simultaneous_tail`: the contrasts' correlation counted, unlike Bonferroni); a
comparison is

    better / worse   the simultaneous interval excludes 0,
    equivalent       it lies inside +-effect (the effect of interest),
    inconclusive     otherwise, and always when an arm has fewer replicates than
                     analysis.min_replicates (exploratory).

The confidence set for the best teacher is Hsu's multiple comparisons with the best (`_best_set`):
it misses the true best with probability at most alpha, so a wrong teacher is named at most that
often. "none" is an intersection-union test at alpha (`_answer`). `decide_group` says which
procedure answers which question.
Hand-written rather than statsmodels' MixedLM: the balanced crossed layout has this closed form
(microseconds for thousands of items), while a likelihood fit of crossed random effects on 0/1
outcomes is slow, often fails to converge at the boundary (sigma2_rep = 0, the usual case with
few replicates), and gives no small-sample correction.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
from numpy.typing import ArrayLike
from scipy import special, stats

ANSWERS_NONE = "none"
INCONCLUSIVE = "inconclusive"


# --- an arm: one teacher's replicates (or the baseline) ------------------------------------------


def replicate_units(draws: Sequence[ArrayLike]) -> np.ndarray:
    """A teacher's replicate units as a (R, n) array of per-item scores in [0, 1].

    `draws`: one (training seeds, n) 0/1 array per trace draw (a 1-D vector is one seed). With
    several trace draws a unit is a draw, its training seeds averaged (seeds are nested in the
    draw: averaging them first keeps the units independent). With one draw the units are its
    training seeds: the spread then covers training only, not trace sampling."""
    mats = [np.atleast_2d(np.asarray(d, dtype=float)) for d in draws]
    if not mats:
        raise ValueError("an arm needs at least one replicate")
    n = mats[0].shape[1]
    if any(m.shape[1] != n for m in mats):
        raise ValueError(f"replicates must score the same items: {[m.shape[1] for m in mats]}")
    if len(mats) > 1:
        return np.stack([m.mean(axis=0) for m in mats])
    return mats[0]


def mean_squares(units: ArrayLike) -> tuple[Any, Any]:
    """(MS_rep, MS_res) of a replicates x items layout (..., R, n) without repetition: MS_rep =
    n * var(replicate means), MS_res the residual mean square after removing replicate and item
    means. E[MS_rep] = s2_res + n * s2_rep and E[MS_res] = s2_res."""
    units = np.asarray(units, dtype=float)
    r, n = units.shape[-2:]
    rep_means = units.mean(axis=-1)
    item_means = units.mean(axis=-2)
    grand = rep_means.mean(axis=-1)
    ms_rep = n * rep_means.var(axis=-1, ddof=1)
    resid = units - rep_means[..., :, None] - item_means[..., None, :] + grand[..., None, None]
    dof_res = (r - 1) * (n - 1)
    ms_res = (resid**2).sum(axis=(-2, -1)) / dof_res if dof_res > 0 else 0.0 * ms_rep
    return ms_rep, ms_res


@dataclass(frozen=True)
class Pooled:
    """A group's typical replicate mean squares (same student, task and regime): the floor under
    each arm's own replicate variance where a teacher has nothing to borrow from (`_total`), and
    an arm's mean squares as the rule uses them (`own_mean_squares`); df may be arrays."""

    ms_rep: Any
    ms_res: Any
    df_rep: Any
    df_res: Any


@dataclass(frozen=True)
class Prior:
    """An arm's prior replicate variance (Smyth 2004, limma's moderated t): its MS_rep / MS_res
    is taken as `ratio` times a chi-square draw / its df, the arm's true ratio drawn around
    `ratio` with `df` prior degrees of freedom (d0: 0 borrows nothing, large means the arms are
    alike); `df_cap`: the most degrees of freedom the moderated estimate can carry, as `ratio`
    is itself estimated (`_moderated_df`). Arrays over the simulations' leading axes."""

    ratio: Any
    df: Any
    df_cap: Any


def trigamma_inverse(x: Any) -> Any:
    """y with trigamma(y) = x, elementwise, x > 0: Newton's method on 1 / trigamma started at
    0.5 + 1 / x, as limma's trigammaInverse does (scipy has no inverse of polygamma)."""
    x = np.asarray(x, dtype=float)
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = special.polygamma(1, y)
        step = tri * (1 - tri / x) / special.polygamma(2, y)
        y = y + step
        if np.all(-step / y < 1e-8):
            break
    return np.where(x > 1e7, 1 / np.sqrt(x), np.where(x < 1e-6, 1 / x, y))


_DF_INF = 1e8  # a prior df this large is the arms being alike: every arm gets the prior variance


def fit_prior(ratios: ArrayLike, dfs: ArrayLike) -> tuple[Any, Any]:
    """(s0^2, d0) of the scaled inverse-chi-square prior of variance estimates `ratios` (..., k),
    each on `dfs` (k,) degrees of freedom, by the method of moments on their logarithms: Smyth
    (2004), "Linear models and empirical Bayes methods for assessing differential expression in
    microarray experiments", Statistical Applications in Genetics and Molecular Biology 3(1),
    article 3 (limma's fitFDist). The log of a variance on d df has mean
    log(sigma^2) + digamma(d/2) - log(d/2) and variance trigamma(d/2); the spread of the logs
    beyond what their own df explain is trigamma(d0/2). Where there is none beyond it, d0 is
    `_DF_INF` (the arms are alike); the caller caps the total df (`Prior.df_cap`)."""
    x = np.asarray(ratios, dtype=float)
    d = np.asarray(dfs, dtype=float)
    k = x.shape[-1]
    z = np.log(np.maximum(x, 1e-12))
    e = z - special.digamma(d / 2) + np.log(d / 2)
    mean = e.mean(axis=-1)
    spread = ((e - mean[..., None]) ** 2).sum(axis=-1) / (k - 1)
    excess = spread - special.polygamma(1, d / 2).mean()
    d0 = np.where(
        excess > 0, np.minimum(2 * trigamma_inverse(np.maximum(excess, 1e-12)), _DF_INF), _DF_INF
    )
    s0 = np.exp(mean + special.digamma(d0 / 2) - np.log(d0 / 2))
    return s0, d0


def _log_ratios(arms_units: Sequence[np.ndarray]) -> tuple[list[Any], list[float]]:
    """Each arm's MS_rep / MS_res (the ratio takes out the items' binomial noise, which differs
    between tasks and accuracies) and its R - 1 df; arms with one replicate, or no residual
    noise (all right or all wrong), say nothing about the replicate variance and are left out
    (an empty list where none is left)."""
    ratios, dfs = [], []
    for u in arms_units:
        u = np.asarray(u, dtype=float)
        if u.shape[-2] < 2:
            continue
        ms_rep, ms_res = mean_squares(u)
        if not np.all(np.asarray(ms_res) > 0):
            continue
        ratios.append(np.asarray(ms_rep) / np.asarray(ms_res))
        dfs.append(float(u.shape[-2] - 1))
    return ratios, dfs


def _moderated_df(d0: Any, d: float, k: float) -> Any:
    """Degrees of freedom of a moderated variance whose prior ratio is estimated from k arms of
    d df: 2 / Var(log) (a chi-square on f df has Var(log) about 2 / f), the posterior's
    2 / (d0 + d) given the prior (Smyth 2004) plus the estimated prior's share
    w^2 Var(log s0^2), w = d0 / (d0 + d) its weight and Var(log s0^2) = (trigamma(d/2) +
    trigamma(d0/2)) / k that of a mean of k log variances (the delta method). Smyth (2004)
    treats the prior as known, which is fine for thousands of genes, not for the dozens of arms
    of a grid. 2 / Var(log) gives slightly fewer df than the chi-square match
    2 trigamma^-1(Var(log)): the safe side."""
    w = d0 / (d0 + d)
    spread = special.polygamma(1, d / 2) + special.polygamma(1, d0 / 2)
    return 2 / (2 / (d0 + d) + w * w * spread / k)


def pool(arms_units: Sequence[np.ndarray]) -> Pooled | None:
    """The group's typical mean squares over the arms with at least 2 replicates, each
    (..., R_t, n): the median of their MS_rep, so one erratic arm does not move it, with
    floor(k / 2) (R - 1) degrees of freedom for k arms of R replicates (a median of k estimates
    carries about the information of half of them; fewer df is the safe side); MS_res pooled."""
    rep = [np.asarray(u, dtype=float) for u in arms_units if u.shape[-2] > 1]
    if not rep:
        return None
    n = rep[0].shape[-1]
    ms = [mean_squares(u) for u in rep]
    dfs = [u.shape[-2] - 1 for u in rep]
    ms_rep = np.median(np.stack([np.asarray(m) for m, _ in ms]), axis=0)
    ms_res = sum(d * r for d, (_, r) in zip(dfs, ms, strict=True)) / sum(dfs)
    df_rep = max(len(rep) // 2, 1) * min(dfs)
    return Pooled(ms_rep, ms_res, df_rep, sum(dfs) * (n - 1))


def teacher_priors(arms: Mapping[str, Sequence[np.ndarray]]) -> dict[str, Prior]:
    """Each teacher's prior from all its arms in the grid (`arms`: teacher -> its arms' units, one
    per group it is in): the prior df d0 from the spread of every arm's log ratio around its own
    teacher's mean (`fit_prior` with the teacher as a factor, as limma fits a prior trend on a
    covariate), the prior ratio the teacher's own, from its arms alone. One erratic teacher
    (replicates three times as spread on every task) then has its own, larger prior, and its
    steady neighbours theirs: no pre-test, nothing shared between them but d0. Teachers with
    fewer than two replicated arms have no prior of their own and are left out (`decide_group`
    gives them the group's floor, `pool`)."""
    per = {t: _log_ratios(us) for t, us in arms.items()}
    several = {t: (r, d) for t, (r, d) in per.items() if len(r) >= 2}
    out: dict[str, Prior] = {}
    if not several:
        return out
    e = {t: np.stack(r, axis=-1) for t, (r, _) in several.items()}
    shift = {t: special.digamma(np.asarray(d) / 2) - np.log(np.asarray(d) / 2)
             for t, (_, d) in several.items()}  # fmt: skip
    resid = [np.log(np.maximum(e[t], 1e-12)) - shift[t] for t in several]
    centred = np.concatenate([x - x.mean(axis=-1, keepdims=True) for x in resid], axis=-1)
    dfs = np.concatenate([np.asarray(d) for _, d in several.values()])
    spread = (centred**2).sum(axis=-1) / (centred.shape[-1] - len(several))
    excess = spread - special.polygamma(1, dfs / 2).mean()
    d0 = np.where(
        excess > 0, np.minimum(2 * trigamma_inverse(np.maximum(excess, 1e-12)), _DF_INF), _DF_INF
    )
    for x, (t, (_, d)) in zip(resid, several.items(), strict=True):
        s0 = np.exp(x.mean(axis=-1) + special.digamma(d0 / 2) - np.log(d0 / 2))
        out[t] = Prior(s0, d0, _moderated_df(d0, min(d), len(d)))
    return out


def replicate_variance(units: ArrayLike) -> Any:
    """Between-replicate variance of an arm's accuracy, (MS_rep - MS_res) / n truncated at 0
    (method of moments), elementwise over leading axes of a (..., R, n) layout."""
    units = np.asarray(units, dtype=float)
    if units.shape[-2] < 2:
        return np.zeros(units.shape[:-2]) if units.ndim > 2 else 0.0
    ms_rep, ms_res = mean_squares(units)
    out = np.maximum(0.0, (ms_rep - ms_res) / units.shape[-1])
    return float(out) if units.ndim == 2 else out


@dataclass(frozen=True)
class Arm:
    """One arm of a comparison: its replicate units (R, n) and their between-replicate variance.
    The baseline is an arm with one unit and no replicate variance (a fixed model, greedy)."""

    units: np.ndarray
    fixed: bool = False  # the baseline: one deterministic evaluation, no replicate to draw
    min_replicates: int = 3

    @property
    def n_replicates(self) -> int:
        return int(self.units.shape[0])

    @property
    def exploratory(self) -> bool:
        return not self.fixed and self.n_replicates < self.min_replicates

    @property
    def accuracy(self) -> float:
        return float(self.units.mean())

    @property
    def rep_var(self) -> float:
        return 0.0 if self.fixed else float(replicate_variance(self.units))


def arm(draws: Sequence[ArrayLike], min_replicates: int = 3) -> Arm:
    return Arm(replicate_units(draws), min_replicates=min_replicates)


def baseline_arm(correct: ArrayLike) -> Arm:
    return Arm(np.atleast_2d(np.asarray(correct, dtype=float)), fixed=True)


# --- intervals -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """An estimate with its interval at `level`, its standard error and degrees of freedom."""

    estimate: float
    low: float
    high: float
    level: float
    se: float
    df: float
    p: float = math.nan  # two-sided p of "no difference" from the same t (differences only)


def satterthwaite(parts: Sequence[tuple[Any, Any]]) -> Any:
    """Welch-Satterthwaite degrees of freedom of a sum of signed variance components (value,
    df); elementwise over arrays of values (inf where every component is 0)."""
    total = sum(np.asarray(v, dtype=float) for v, _ in parts)
    denom = sum(
        np.where(np.asarray(d) > 0, np.asarray(v, dtype=float) ** 2 / np.maximum(d, 1), 0.0)
        for v, d in parts
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, total * total / np.where(denom > 0, denom, 1.0), np.inf)


Priors = Prior | Pooled | Sequence[Prior | Pooled | None] | None  # one for all arms, or per arm


def contrast(
    d: np.ndarray, rep_units: Sequence[np.ndarray], prior: Priors, level: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rule's interval for a difference, vectorised over leading axes (the simulations).

    `d`: per-item differences (..., n) of the arms' replicate-averaged scores; `rep_units`: the
    replicate units (..., R, n) of each arm that has replicates; `prior`: the replicate variance
    prior, one for all arms or one per arm (see `_total`). Returns centre, se, df and the
    half-width.

    The item part is taken after the Bonett-Price adjustment: one pseudo-item discordant each way
    on the scale of one adapter's 0/1 scores, so of weight 1/R on replicate means. It already
    holds the item-by-replicate noise of the means, so the replicate part is the between-replicate
    variance only (see `replicate_parts`)."""
    centre, se, df = _contrast_stats(d, rep_units, prior)
    q = stats.t.ppf(0.5 + np.asarray(level) / 2, df)
    with np.errstate(invalid="ignore"):  # a simulated arm all right or all wrong: se 0
        return centre, se, df, np.where(se > 0, q * se, 0.0)


def _contrast_stats(
    d: np.ndarray, rep_units: Sequence[np.ndarray], prior: Priors
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centre, se, df) of a difference, before any critical value (see `contrast`)."""
    n = d.shape[-1]
    w = 1.0 / max([u.shape[-2] for u in rep_units], default=1)
    m = n + 2 * w
    centre = d.sum(axis=-1) / m
    item_var = np.maximum(((d * d).sum(axis=-1) + 2 * w) / m - centre * centre, 0.0) / m
    var, df = _total([(item_var, n - 1)], rep_units, prior)
    return centre, np.sqrt(var), df


def own_mean_squares(units: np.ndarray, prior: Prior | Pooled | None) -> Pooled:
    """An arm's replicate mean squares as the rule uses them. With its teacher's `Prior`,
    Smyth (2004)'s moderated variance: its MS_rep / MS_res on d = R - 1 df and the prior's ratio
    on d0 df averaged with weights d0 and d, times its own MS_res, on d0 + d df (at most
    `Prior.df_cap`). With the group's `Pooled` floor (nothing to borrow from): its own MS_rep
    (d df), or the group's typical one (with its df) where that is larger. Its own MS_res."""
    ms_rep, ms_res = mean_squares(units)
    r, n = units.shape[-2:]
    d = float(r - 1)
    df_rep = np.full(np.shape(ms_rep), d)
    if isinstance(prior, Prior):
        ok = np.asarray(ms_res) > 0  # no residual noise (all right or all wrong): its own
        ratio = np.asarray(ms_rep) / np.where(ok, ms_res, 1.0)
        d0 = np.asarray(prior.df, dtype=float)
        mod = (d0 * prior.ratio + d * ratio) / (d0 + d) * ms_res
        ms_rep = np.where(ok, mod, ms_rep)
        df_rep = np.where(ok, np.minimum(d0 + d, prior.df_cap), df_rep)
    elif prior is not None:
        use = np.asarray(prior.ms_rep) > ms_rep
        ms_rep = np.where(use, prior.ms_rep, ms_rep)
        df_rep = np.where(use, prior.df_rep, df_rep)
    return Pooled(ms_rep, ms_res, df_rep, (r - 1) * (n - 1))


def _total(
    parts: list[tuple[Any, Any]], rep_units: Sequence[np.ndarray], prior: Priors
) -> tuple[Any, Any]:
    """(variance, Welch-Satterthwaite df) of the item part plus each replicated arm's part.

    Each arm's between-replicate part is its moderated estimate (`own_mean_squares`): with 3
    replicates an arm's own has 2 df, too few for power; the moderated one borrows degrees of
    freedom from the teacher's arms on the grid's other tasks and students (`teacher_priors`).
    The prior is each teacher's own, so one erratic teacher (three times the others' seed SD)
    keeps its larger variance and its steady neighbours theirs, without a pre-test; only the
    prior df d0 is shared. A teacher with a single arm (a grid of one group) has nothing to
    borrow from: its part is the larger of its own estimate (R - 1 df) and the group's typical
    one (`pool`: the median over its arms), with the df of the one used, so the 2-df noise of
    its own cannot shrink its interval and an erratic teacher keeps its own, larger variance
    (pooling would give it a share of its steady neighbours'; the median keeps its spread out of
    theirs). `prior`: one for every arm or one per arm in
    `rep_units`' order. benchmarks/README.md measures the error rates and power. Elementwise
    over the simulations' leading axes."""
    out = list(parts)
    for units, p in zip(rep_units, _per_arm(prior, len(rep_units)), strict=True):
        out += replicate_parts(own_mean_squares(units, p), 1 / units.shape[-2], units.shape[-1])
    return np.maximum(sum(v for v, _ in out), 0.0), satterthwaite(out)


def _per_arm(prior: Priors, k: int) -> list[Prior | Pooled | None]:
    return (
        list(prior)
        if isinstance(prior, (list, tuple))
        else [cast(Prior | Pooled | None, prior)] * k
    )


def replicate_parts(ms: Pooled | None, weight: Any, n: int) -> list[tuple[Any, Any]]:
    """weight * s2_rep as two signed variance components, weight * MS_rep / n and
    -weight * MS_res / n, with their degrees of freedom (weight: 1/R of the arm); the item part
    already holds MS_res / (n R), so nothing is counted twice."""
    if ms is None or np.all(np.asarray(weight) == 0):
        return []
    return [(weight * ms.ms_rep / n, ms.df_rep), (-weight * ms.ms_res / n, ms.df_res)]


def difference(a: Arm, b: Arm, level: float = 0.95, prior: Priors = None) -> Estimate:
    """Accuracy of arm `a` minus arm `b` on the same items, with the rule's interval at `level`;
    `prior`: the replicate variance prior, one for both or (a's, b's) (default: `pool` of the
    two)."""
    centre, se, df = _difference_stats(a, b, prior)
    return _interval(a.accuracy - b.accuracy, centre, se, df, level)


def _difference_stats(a: Arm, b: Arm, prior: Priors) -> tuple[float, float, float]:
    n = a.units.shape[1]
    if b.units.shape[1] != n:
        raise ValueError(f"arms must score the same items: {n} and {b.units.shape[1]}")
    d = a.units.mean(axis=0) - b.units.mean(axis=0)
    keep = [(x.units, p) for x, p in zip((a, b), _per_arm(prior, 2), strict=True)
            if not x.fixed and x.n_replicates > 1]  # fmt: skip
    reps = [u for u, _ in keep]
    priors = pool(reps) if prior is None else [p for _, p in keep]
    centre, se, df = _contrast_stats(d, reps, priors)
    return float(centre), float(se), float(df)


def _interval(point: float, centre: float, se: float, df: float, level: float) -> Estimate:
    """The estimate of a difference with its t interval at `level` and two-sided p."""
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    est = _estimate(point, centre, half, level, se, df, (-1.0, 1.0))
    # the interval excludes 0 exactly when p < 1 - level (same centre, se and t)
    p = float(2 * stats.t.sf(abs(centre) / se, df)) if se > 0 else float(centre == 0)
    return replace(est, p=p)


def accuracy(a: Arm, level: float = 0.95, prior: Prior | Pooled | None = None) -> Estimate:
    """An arm's accuracy with its interval: Jeffreys for one 0/1 replicate (good coverage near 0
    and 1, Brown, Cai & DasGupta 2001), else Agresti-Coull's pseudo-items (two right, two wrong)
    plus the between-replicate variance, as `contrast` does."""
    x = a.units.mean(axis=0)
    n = x.size
    p = float(x.mean())
    if a.n_replicates == 1 and np.isin(x, (0.0, 1.0)).all():
        k, tail = float(x.sum()), (1 - level) / 2
        low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k + 0.5, n - k + 0.5))
        high = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 0.5, n - k + 0.5))
        return Estimate(p, min(low, p), max(high, p), level, math.sqrt(p * (1 - p) / n), math.inf)
    w = 1.0 / a.n_replicates
    m = n + 4 * w
    centre = float((x.sum() + 2 * w) / m)
    item_var = max(float(((x * x).sum() + 2 * w) / m - centre * centre), 0.0) / m
    reps = [a.units] if a.n_replicates > 1 else []
    var, df = (float(v) for v in _total([(item_var, n - 1)], reps, prior))
    se = math.sqrt(var)
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return _estimate(p, centre, half, level, se, df, (0.0, 1.0))


def _estimate(
    point: float, centre: float, half: float, level: float, se: float, df: float,
    bounds: tuple[float, float],
) -> Estimate:  # fmt: skip
    low, high = max(bounds[0], centre - half), min(bounds[1], centre + half)
    # the reported interval always holds the reported estimate
    return Estimate(point, min(low, point), max(high, point), level, se, df)


def verdict(est: Estimate, effect: float, exploratory: bool) -> str:
    """better | worse | equivalent | inconclusive for an estimate of a - b (fractions)."""
    if exploratory:
        return INCONCLUSIVE
    if est.low > 0:
        return "better"
    if est.high < 0:
        return "worse"
    if -effect < est.low and est.high < effect:
        return "equivalent"
    return INCONCLUSIVE


# --- a decision group ----------------------------------------------------------------------------


@dataclass
class GroupDecision:
    """Everything the answer to one (task, student, regime) group rests on."""

    teachers: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    best_set: list[str]
    answer: str
    distill: str
    exploratory: bool
    base_acc: float
    base_low: float
    base_high: float
    n_items: int
    alpha: float
    effect: float
    headline: dict[str, Any] = field(default_factory=dict)
    clears_effect: str = INCONCLUSIVE
    named_by: str = ""  # "leader" | "best_set": the route that named the answer (`_name`)
    leader: str | None = None  # the teacher the grid's other tasks put first (`leaders`)

    def as_dict(self) -> dict[str, Any]:
        return {
            "teachers": self.teachers,
            "pairs": self.pairs,
            "best_set": self.best_set,
            "answer": self.answer,
            "distill": self.distill,
            "exploratory": self.exploratory,
            "base_acc": self.base_acc,
            "base_low": self.base_low,
            "base_high": self.base_high,
            "n_items": self.n_items,
            "alpha": self.alpha,
            "effect": self.effect,
            "headline": self.headline,
            "clears_effect": self.clears_effect,
            "named_by": self.named_by,
            "leader": self.leader,
        }


_MC_DRAWS = 10_000  # max-t quantiles: Monte Carlo error of the 95% point about 4% of alpha


def arm_covariance(base: np.ndarray, arms: Sequence[np.ndarray], prior: Priors) -> np.ndarray:
    """Covariance (..., m + 1, m + 1) of the mean accuracies of the baseline (..., n) and the
    arms (..., R_t, n): the item part (arms share the test items) plus each arm's
    between-replicate variance / R_t as `_total` takes it (at least 0)."""
    x = np.stack([np.asarray(base, dtype=float)] + [a.mean(axis=-2) for a in arms], axis=-2)
    n = x.shape[-1]
    xc = x - x.mean(axis=-1, keepdims=True)
    cov = xc @ np.swapaxes(xc, -1, -2) / (n - 1) / n
    rep = [np.zeros(x.shape[:-2])]
    for a, p in zip(arms, _per_arm(prior, len(arms)), strict=True):
        ms = own_mean_squares(a, p) if a.shape[-2] > 1 else None
        s2 = 0.0 if ms is None else np.maximum(0.0, ms.ms_rep - ms.ms_res) / n
        rep.append(np.broadcast_to(s2 / a.shape[-2], x.shape[:-2]))
    return cov + np.stack([np.asarray(r) for r in rep], axis=-1)[..., None, :] * np.eye(len(rep))


def simultaneous_tail(
    weights: np.ndarray, cov: np.ndarray, alpha: float, two_sided: bool = True
) -> float:
    """The per-comparison tail probability of a single-step max-t family (Hothorn, Bretz &
    Westfall 2008): contrasts `weights` (K, m + 1) of arm means with covariance `cov`; the
    largest standardised contrast (in absolute value when two-sided) exceeds the returned
    per-comparison quantile with probability alpha when every contrast is 0. Each contrast
    then takes its own t quantile at that tail (its Welch-Satterthwaite df).

    The multivariate normal quantile is taken by Monte Carlo with a fixed seed (answers
    recompute exactly); the result lies between Bonferroni's alpha / K and alpha, since the
    contrasts of one group share arms and are correlated (a teacher's gain and its differences
    with the others), which Bonferroni ignores."""
    t = _standardised_draws(weights, cov)
    if t.shape[1] <= 1:
        return alpha
    stat = np.abs(t).max(axis=1) if two_sided else t.max(axis=1)
    c = float(np.quantile(stat, 1 - alpha))
    tail = float((2 if two_sided else 1) * stats.norm.sf(c))
    return min(max(tail, alpha / weights.shape[0]), alpha)


def best_tail(weights: np.ndarray, cov: np.ndarray, alpha: float, m: int) -> float:
    """The one-sided tail at which a teacher's m - 1 differences `weights` (teacher j minus it)
    leave it out of the best set: the larger critical value of two, (1) Hsu's multiple
    comparisons with the best, the one-sided max-t quantile, so the true best is left out with
    probability at most alpha; (2) when the m teachers are equal, one is named (beats all
    others) with probability at most alpha in all, alpha / m each, which (1) alone allows to
    reach 2 alpha with two teachers."""
    t = _standardised_draws(weights, cov)
    if t.shape[1] == 0:
        return alpha
    c = max(np.quantile(t.max(axis=1), 1 - alpha), np.quantile(-t.max(axis=1), 1 - alpha / m))
    return min(float(stats.norm.sf(c)), alpha)


def _standardised_draws(weights: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Monte Carlo draws (fixed seed) of the standardised contrasts with nonzero variance."""
    ccov = weights @ cov @ weights.T
    sd = np.sqrt(np.clip(np.diag(ccov), 0.0, None))
    keep = sd > 0
    vals, vecs = np.linalg.eigh(cov)
    root = vecs * np.sqrt(np.clip(vals, 0.0, None))
    return _normal_draws(cov.shape[0]) @ ((root.T @ weights[keep].T) / sd[keep])


@functools.lru_cache(maxsize=16)
def _normal_draws(k: int) -> np.ndarray:
    return np.random.default_rng(20260).standard_normal((_MC_DRAWS, k))


def _weights(m: int, contrasts: Sequence[tuple[int, int | None]]) -> np.ndarray:
    """Contrast weights over (baseline, teacher 0..m-1): (y, x) is teacher y minus teacher x,
    or minus the baseline when x is None."""
    w = np.zeros((len(contrasts), m + 1))
    for k, (y, x) in enumerate(contrasts):
        w[k, y + 1] += 1
        w[k, 0 if x is None else x + 1] -= 1
    return w


def decide_group(
    base: ArrayLike,
    teachers: Mapping[str, Sequence[ArrayLike]],
    alpha: float = 0.05,
    effect: float = 0.03,
    min_replicates: int = 3,
    prior: Mapping[str, Prior] | None = None,
    leader: str | None = None,
) -> GroupDecision:
    """The answer for one group: every teacher against the baseline and against every other.

    `base`: the baseline's 0/1 vector; `teachers`: per teacher, its draws (see `replicate_units`);
    `effect`: the effect of interest as a fraction (analysis.effect_of_interest / 100); a teacher
    with fewer than `min_replicates` replicate units is exploratory.

    Three procedures, each made for its question (docs/statistics.md):
    - verdicts (better / worse / equivalent) of the m gains and m(m-1)/2 teacher differences:
      simultaneous intervals of one single-step max-t family (`simultaneous_tail`), so the
      chance of any false better/worse in the group is at most alpha;
    - the best set: Hsu's multiple comparisons with the best, a teacher stays unless some other
      is above it by the one-sided max-t quantile of its m - 1 differences; it holds the true
      best with probability at least 1 - alpha, so a wrong teacher is named at most that often;
    - the teacher named (`_name`): `leader`, the teacher the grid's other tasks put first
      (`leaders`; data independent of this group's), when it beats every other teacher and the
      baseline one-sided at LEADER_SHARE * alpha; else the only member of the best set at the
      rest of alpha, when its gain clears a one-sided max-t over the m gains there. A wrong
      teacher (not the unique best, or not above the baseline) is named at most alpha;
    - "none": an intersection-union test, every teacher's one-sided upper bound of gain at
      level 1 - alpha below +effect (level alpha, no multiplicity penalty: every one must hold)."""
    b = baseline_arm(base)
    arms = {t: arm(d, min_replicates) for t, d in teachers.items()}
    names = list(arms)
    m = len(names)
    exploratory = any(a.exploratory for a in arms.values())
    floor = pool([a.units for a in arms.values()])
    per = {t: (prior or {}).get(t, floor) for t in names}
    cov = arm_covariance(b.units[0], [a.units for a in arms.values()], [per[t] for t in names])
    pairs_idx = list(itertools.combinations(range(m), 2))
    family = [(i, None) for i in range(m)] + [(j, i) for i, j in pairs_idx]
    tail = simultaneous_tail(_weights(m, family), cov, alpha)
    level = 1 - tail
    base_est = accuracy(b, 1 - alpha)
    rows, gain_stats = [], []
    for t in names:
        g_stats = _difference_stats(arms[t], b, [per[t], None])
        gain_stats.append(g_stats)
        g = _interval(arms[t].accuracy - b.accuracy, *g_stats, level)
        acc = accuracy(arms[t], level, per[t])
        centre, se, df = g_stats
        upper = centre + float(stats.t.ppf(1 - alpha, df)) * se
        rows.append(
            {"teacher": t, "post_acc": acc.estimate, "post_low": acc.low, "post_high": acc.high,
             "gain": g.estimate, "gain_low": g.low, "gain_high": g.high, "gain_se": g.se,
             "gain_p": g.p, "gain_upper": upper, "level": g.level,
             "n_replicates": arms[t].n_replicates, "rep_sd": math.sqrt(arms[t].rep_var),
             "exploratory": arms[t].exploratory,
             "verdict": verdict(g, effect, arms[t].exploratory),
             "clears_effect": _clears(g, effect, arms[t].exploratory)}
        )  # fmt: skip
    pairs, above = [], np.zeros((m, m))  # above[j, i]: t statistic of teacher j minus teacher i
    for i, j in pairs_idx:
        x, y = arms[names[i]], arms[names[j]]
        centre, se, df = _difference_stats(y, x, [per[names[j]], per[names[i]]])
        d = _interval(y.accuracy - x.accuracy, centre, se, df, level)
        above[j, i], above[i, j] = (centre / se, -centre / se) if se > 0 else (0.0, 0.0)
        pairs.append(
            {"a": names[i], "b": names[j], "diff": d.estimate, "low": d.low, "high": d.high,
             "p": d.p, "level": d.level, "df": df,
             "verdict": verdict(d, effect, x.exploratory or y.exploratory)}
        )  # fmt: skip
    best_set = names if exploratory else _best_set(names, above, pairs, cov, alpha)
    named, route, tail = (None, "", math.nan)
    if not exploratory:
        named, route, tail = _name(names, arms, b, per, cov, above, pairs, alpha, leader)
    if named is not None:
        best_set = [named]  # the named route's confidence set for the best (see `_name`)
    answer, distill, headline = _answer(rows, named, effect, exploratory)
    if named is not None:  # the row quotes the interval of the test that named it
        g = _interval(headline["gain"], *gain_stats[names.index(named)], 1 - 2 * tail)
        headline = {**headline, "gain_low": g.low, "gain_high": g.high, "level": g.level,
                    "verdict": verdict(g, effect, False), "clears_effect": _clears(g, effect, False)}  # fmt: skip
    clears = "no" if answer == ANSWERS_NONE else headline["clears_effect"]
    return GroupDecision(
        rows, pairs, best_set, answer, distill, exploratory, base_est.estimate, base_est.low,
        base_est.high, int(b.units.shape[1]), alpha, effect, headline, clears, route,
        leader if leader in arms else None,
    )  # fmt: skip


LEADER_SHARE = 0.8  # of alpha, for the leader the other tasks name (`_name`)


def _name(
    names: list[str], arms: Mapping[str, Arm], b: Arm, per: Mapping[str, Any], cov: np.ndarray,
    above: np.ndarray, pairs: list[dict[str, Any]], alpha: float, leader: str | None,
) -> tuple[str | None, str, float]:  # fmt: skip
    """(the teacher named or None, its route, the one-sided tail of the test that named it).

    A weighted Bonferroni split of alpha between two routes, so a wrong teacher (not the unique
    best, or not above the baseline) is named at most alpha in all:

    - "leader", at LEADER_SHARE * alpha: `leader` was chosen before this group's data were read
      (from the grid's other tasks, `leaders`), so it is one pre-set contrast, not the largest
      of m: it is named when it beats each other teacher and the baseline, each one-sided at
      that level. Either it is not the best (then the true best beats it, and it passes that
      comparison at most the level) or it is and its gain is not positive (the gain test, at
      most the level): its error is at most the level, whatever the other tasks said. A leader
      the other tasks got wrong costs power here, never error;
    - "best_set", at the rest (all of alpha without a leader): the only member of Hsu's best set
      at that level (it misses the true best at most that often) whose gain clears the
      one-sided max-t quantile of the m gains (when every gain is at most 0, some teacher's does
      at most that often).

    The measured rates (equal teachers, one erratic, t(3) replicate effects, teacher x task
    spreads, the leader's least favourable case, grids of 2-12 tasks and 2-8 teachers) are in
    benchmarks/README.md, "Borrowing across a grid" and "Grids of 2-12 tasks"."""
    m = len(names)
    rest = alpha
    if leader is not None and leader in arms and m > 1:
        share = LEADER_SHARE * alpha
        rest = alpha - share
        if all(_beats(arms[leader], arms[j], per[leader], per[j], share)
               for j in names if j != leader) and _beats(arms[leader], b, per[leader], None, share):  # fmt: skip
            return leader, "leader", share
    best = _best_set(names, above, pairs, cov, rest)
    if len(best) != 1:
        return None, "", math.nan
    tail = simultaneous_tail(_weights(m, [(i, None) for i in range(m)]), cov, rest, False)
    t = best[0]
    if _beats(arms[t], b, per[t], None, tail):
        return t, "best_set", tail
    return None, "", math.nan


def _beats(
    a: Arm, b: Arm, pa: Prior | Pooled | None, pb: Prior | Pooled | None, tail: float
) -> bool:
    """Is arm a above arm b, one-sided at `tail` (the rule's t, Satterthwaite df)?"""
    centre, se, df = _difference_stats(a, b, [pa, pb])
    return se > 0 and centre / se > float(stats.t.isf(tail, df))


def other_task(group: Any, other: Any) -> bool:
    """`borrow` for the analysis's (task, student, regime) keys: a group of another task, same
    regime (a group of the same task shares its test items and its teachers' traces)."""
    return (
        isinstance(group, tuple) and isinstance(other, tuple) and len(group) == len(other) == 3
        and group[0] != other[0] and group[2] == other[2]
    )  # fmt: skip


LEADER_Z = 1.645  # how far ahead of each rival the other tasks must put a leader (`leaders`)


def leaders(
    groups: Mapping[Any, tuple[ArrayLike, Mapping[str, Sequence[ArrayLike]]]],
    borrow: Callable[[Any, Any], bool],
) -> dict[Any, str]:
    """Each group's leader: the teacher the groups `borrow(group, other)` allows (those of the
    grid's other tasks, same regime) put ahead of each of the group's other teachers, by a
    pooled z above LEADER_Z (each other group's difference with its own variance floor, `pool`;
    the sum of differences over the root of the sum of variances). Their items, traces and
    adapters are not this group's, so the leader is chosen from data independent of the group
    and testing it there is one pre-set contrast (`_name`): the choice moves power, never
    error. Where the other tasks do not put one teacher clearly ahead (teachers alike there, a
    teacher x task spread, fewer than two teachers, no other group holding all of them) the
    group has none, and its best set keeps all of alpha."""
    stats_of: dict[Any, dict[tuple[str, str], tuple[float, float]]] = {}
    for h, (_base, ts) in groups.items():
        arms = {t: arm(d, 1) for t, d in ts.items()}
        floor = pool([a.units for a in arms.values()])
        pair = {}
        for a, b in itertools.permutations(arms, 2):
            centre, se, _ = _difference_stats(arms[a], arms[b], [floor, floor])
            pair[a, b] = (centre, se * se)
        stats_of[h] = pair
    out = {}
    for g, (_, ts) in groups.items():
        names = list(ts)
        others = [h for h in groups if h != g and borrow(g, h)
                  and all((a, b) in stats_of[h] for a, b in itertools.permutations(names, 2))]  # fmt: skip
        if len(names) < 2 or not others:
            continue
        for lead in names:
            z = []
            for j in names:
                if j == lead:
                    continue
                num = sum(stats_of[h][lead, j][0] for h in others)
                var = sum(stats_of[h][lead, j][1] for h in others)
                z.append(num / math.sqrt(var) if var > 0 else (math.inf if num > 0 else 0.0))
            if min(z) > LEADER_Z:
                out[g] = lead
                break
    return out


def _best_set(
    names: list[str], above: np.ndarray, pairs: list[dict[str, Any]], cov: np.ndarray,
    alpha: float,
) -> list[str]:  # fmt: skip
    """Hsu's confidence set for the best teacher (multiple comparisons with the best): teacher i
    stays unless some j is above it, (mean_j - mean_i) / se > the one-sided max-t quantile of
    i's m - 1 differences, each on its own t df. The true best is left out only when one of its
    m - 1 one-sided comparisons errs, at most alpha in all."""
    m = len(names)
    if m == 1:
        return list(names)
    df = np.full((m, m), np.inf)
    for (i, j), q in zip(itertools.combinations(range(m), 2), pairs, strict=True):
        df[i, j] = df[j, i] = q["df"]
    keep = []
    for i in range(m):
        others = [j for j in range(m) if j != i]
        tail = best_tail(_weights(m, [(j, i) for j in others]), cov, alpha, m)
        crit = stats.t.isf(tail, df[others, i])
        if not (above[others, i] > crit).any():
            keep.append(names[i])
    return keep


def _clears(g: Estimate, effect: float, exploratory: bool) -> str:
    """Does a gain clear the effect of interest? yes: its interval lies above +effect; no: below;
    inconclusive otherwise (or exploratory)."""
    if exploratory:
        return INCONCLUSIVE
    if g.low > effect:
        return "yes"
    if g.high < effect:
        return "no"
    return INCONCLUSIVE


def decide_groups(
    groups: Mapping[Any, tuple[ArrayLike, Mapping[str, Sequence[ArrayLike]]]],
    alpha: float = 0.05,
    effect: float = 0.03,
    min_replicates: int = 3,
    borrow: Callable[[Any, Any], bool] | None = None,
) -> tuple[dict[Any, GroupDecision], dict[str, Any]]:
    """Every group's decision (`decide_group`), and the multiplicity rule's record: one family
    per group, the chance of any false better/worse in a group at most alpha. The replicate
    variance borrows across the groups: each teacher's prior from its arms in every group
    (`teacher_priors`); a teacher in one group only gets its group's floor, so a grid of one
    group is decided as `decide_group` decides it alone. `borrow(group, other)`: may `other`
    choose `group`'s leader (`leaders`; the grid's other tasks), None for no leader."""
    arms: dict[str, list[np.ndarray]] = {}
    for _, teachers in groups.values():
        for t, d in teachers.items():
            arms.setdefault(t, []).append(replicate_units(d))
    prior = teacher_priors(arms)
    lead = leaders(groups, borrow) if borrow is not None else {}
    decide = {
        key: decide_group(base, teachers, alpha, effect, min_replicates, prior, lead.get(key))
        for key, (base, teachers) in groups.items()
    }
    return decide, {"rule": "group", "alpha": alpha, "leader_share": LEADER_SHARE}


def _answer(
    rows: list[dict], named: str | None, effect: float, exploratory: bool
) -> tuple[str, str, dict]:
    """(answer, distill, the row the answer line quotes).

    answer: the teacher `_name` names; else "none" when no teacher beats the baseline and every
    one-sided upper bound of gain lies below +effect; else "inconclusive". distill: yes (a
    teacher is named, or some teacher beats the baseline), no, or inconclusive."""
    by_name = {r["teacher"]: r for r in rows}
    point_best = max(rows, key=lambda r: r["gain"])
    if exploratory:
        return INCONCLUSIVE, INCONCLUSIVE, point_best
    if named is not None:
        return named, "yes", by_name[named]
    winners = [r for r in rows if r["verdict"] == "better"]
    if not winners:
        if all(r["gain_upper"] < effect for r in rows):
            return ANSWERS_NONE, "no", point_best
        return INCONCLUSIVE, INCONCLUSIVE, point_best
    return INCONCLUSIVE, "yes", max(winners, key=lambda r: r["gain"])


# --- planning: power of the rule itself, by simulation ------------------------------------------


def simulate(
    rng: np.random.Generator,
    sims: int,
    n: int,
    base_acc: float,
    accs: Sequence[float],
    replicates: int,
    rep_sd: float | Sequence[float],
    concordance: float = 0.5,
    rep_df: float = math.inf,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Synthetic groups with known truth: a baseline (sims, n) and per teacher (sims, R, n) 0/1.

    Item i has a latent u_i; the baseline is right when u_i < base_acc. A replicate of a teacher
    of accuracy p draws its own accuracy p_r = clip(p + e), e of SD `rep_sd` (one for all, or one
    per teacher), normal or, with `rep_df`, Student's t of that many df (heavy-tailed replicate
    effects), and is right on item i when w_ri < p_r, where w_ri is u_i with probability
    `concordance` (the student keeps that share of the baseline's item difficulty) and a fresh
    uniform otherwise."""
    u = rng.random((sims, 1, n))
    base = u[:, 0, :] < base_acc
    sds = [rep_sd] * len(accs) if np.ndim(rep_sd) == 0 else list(cast(Sequence[float], rep_sd))
    arms = []
    for p, sd in zip(accs, sds, strict=True):
        if math.isinf(rep_df):
            e = rng.normal(0.0, sd, (sims, replicates, 1))
        else:  # scaled to SD `sd` (a t of df > 2 has variance df / (df - 2))
            e = (
                sd
                * rng.standard_t(rep_df, (sims, replicates, 1))
                / math.sqrt(rep_df / (rep_df - 2))
            )
        p_r = np.clip(p + e, 0.0, 1.0)
        w = np.where(
            rng.random((sims, replicates, n)) < concordance, u, rng.random((sims, replicates, n))
        )
        arms.append(w < p_r)
    return base, arms


def concordance(base: ArrayLike, units: ArrayLike) -> float:
    """The item concordance of `simulate` measured on data: how much of the baseline's item
    difficulty a distilled student keeps. In that model the phi correlation between the
    baseline's and a replicate's 0/1 scores is the concordance times the largest phi two
    accuracies allow (same latent difficulty), so the estimate is their ratio, averaged over
    the replicates, in [0, 1]. NaN where it cannot be told (an arm all right or all wrong)."""
    b = np.asarray(base, dtype=float)
    out = []
    for r in np.atleast_2d(np.asarray(units, dtype=float)):
        p, q = sorted((b.mean(), r.mean()))
        if p <= 0 or q >= 1 or np.ptp(b) == 0 or np.ptp(r) == 0:
            continue
        phi_max = math.sqrt(p * (1 - q) / (q * (1 - p)))
        out.append(float(np.corrcoef(b, r)[0, 1]) / phi_max)
    return float(np.clip(np.mean(out), 0.0, 1.0)) if out else math.nan


def rule_calls_better(
    a: np.ndarray, b: np.ndarray | None, base: np.ndarray, others: Sequence[np.ndarray],
    alpha: float,
) -> np.ndarray:  # fmt: skip
    """Per simulation: does the rule call arm `a` (sims, R, n) better than arm `b` (sims, R, n),
    or than the fixed baseline `base` (sims, n) when `b` is None? `others`: the group's other
    teachers, which set the size and correlation of the group's max-t family. Vectorised: the
    family's tail is taken once, at the simulations' mean covariance (`decide_group` takes it
    per group)."""
    teachers = [a] if b is None else [a, b]
    teachers += list(others)
    m = len(teachers)
    units: list[np.ndarray] = [t.astype(float) for t in teachers]
    prior = pool(units)
    cov = arm_covariance(base.astype(float), units, prior).mean(axis=0)
    family = [(i, None) for i in range(m)] + [
        (j, i) for i, j in itertools.combinations(range(m), 2)
    ]
    tail = simultaneous_tail(_weights(m, family), cov, alpha)
    other = base.astype(float) if b is None else b.mean(axis=1)
    d = a.mean(axis=1) - other
    reps: list[np.ndarray] = [
        x.astype(float) for x in ([a] if b is None else [a, b]) if x.shape[-2] > 1
    ]
    centre, _, _, half = contrast(d, reps, prior, 1 - tail)
    return (centre - half) > 0


def gain_power(
    n: int, base_acc: float, gain: float, replicates: int, rep_sd: float, m: int = 1,
    alpha: float = 0.05, concordance: float = 0.0, sims: int = 2000, seed: int = 0,
) -> float:  # fmt: skip
    """Share of simulated groups of m teachers of true gain `gain` in which the report's rule
    calls the first better than the baseline (the group's max-t family; >= 2 replicates).
    `concordance` 0: the baseline and the distilled student agree on items no more than chance,
    the least favourable case for a paired test, so the power is not overstated."""
    if replicates < 2:
        return 0.0  # exploratory: never "better" (below analysis.min_replicates likewise)
    rng = np.random.default_rng(seed)
    base, arms = simulate(
        rng, sims, n, base_acc, [base_acc + gain] * m, replicates, rep_sd, concordance
    )
    return float(rule_calls_better(arms[0], None, base, arms[1:], alpha).mean())


def difference_power(
    n: int, acc: float, diff: float, replicates: int, rep_sd: float, m: int,
    alpha: float = 0.05, concordance: float = 0.0, sims: int = 2000, seed: int = 0,
) -> float:  # fmt: skip
    """Share of simulated groups of m teachers in which the rule calls the better of two
    teachers `diff` apart better (the other m - 2 teachers at the lower accuracy)."""
    if replicates < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    accs = [acc + diff] + [acc] * max(m - 1, 1)
    base, arms = simulate(rng, sims, n, acc, accs, replicates, rep_sd, concordance)
    return float(rule_calls_better(arms[0], arms[1], base, arms[2:], alpha).mean())


def _smallest(power_at: Any, top: float, power: float) -> float:
    """Smallest effect in (0, top] whose power reaches `power` (bisection; the simulations reuse
    one seed, so power is a smooth, increasing function of the effect); NaN if none does."""
    if top <= 0 or power_at(top) < power:
        return math.nan
    lo, hi = 0.0, top
    while hi - lo > 0.001:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power_at(mid) < power else (lo, mid)
    return hi


def minimum_detectable_gain(
    n: int, base_acc: float, replicates: int, rep_sd: float, m: int = 1, alpha: float = 0.05,
    power: float = 0.8, concordance: float = 0.0, sims: int = 2000,
) -> float:  # fmt: skip
    """Smallest gain (a fraction) the report's rule calls `better` with `power`, at the least
    favourable item concordance by default (`gain_power`); NaN if none."""
    return _smallest(
        lambda g: gain_power(n, base_acc, g, replicates, rep_sd, m, alpha, concordance, sims),
        1.0 - base_acc,
        power,
    )


def minimum_detectable_difference(
    n: int, acc: float, replicates: int, rep_sd: float, m: int, alpha: float = 0.05,
    power: float = 0.8, concordance: float = 0.0, sims: int = 2000,
) -> float:  # fmt: skip
    """Smallest difference between two teachers the rule calls `better` with `power`, at the
    least favourable item concordance by default."""
    if m < 2:
        return math.nan
    return _smallest(
        lambda d: difference_power(n, acc, d, replicates, rep_sd, m, alpha, concordance, sims),
        1.0 - acc,
        power,
    )


def answer_rates(
    base: np.ndarray, arms: Sequence[np.ndarray], leader: str | None = None
) -> tuple[float, float, float, float]:
    """Frequencies of the rule's claims over simulated groups (`simulate`; teachers t0, t1, ...):
    (any better/worse, a teacher named other than `leader`, `leader` named, "none")."""
    runs = base.shape[0]
    calls = np.zeros(4)
    for s in range(runs):
        d = decide_group(base[s], {f"t{k}": list(a[s]) for k, a in enumerate(arms)})
        verdicts = [t["verdict"] for t in d.teachers] + [q["verdict"] for q in d.pairs]
        calls += [
            any(v in ("better", "worse") for v in verdicts),
            d.answer not in (ANSWERS_NONE, INCONCLUSIVE, leader),
            d.answer == leader,
            d.answer == ANSWERS_NONE,
        ]
    return tuple(float(c) for c in calls / runs)  # type: ignore[return-value]


def coverage(
    n: int, acc: float, runs: int, replicates: int = 3, rep_sd: float = 0.02, m: int = 4,
    seed: int = 0,
) -> tuple[float, float, float]:  # fmt: skip
    """Simulated coverage of the rule's unadjusted 95% intervals in groups of m teachers:
    teacher 0 has true accuracy `acc` + 4 points (below 50%; `acc` itself above), the others
    `acc`, against a fixed baseline of `acc`. True mean accuracies over replicate draws come from
    400,000 draws. Returns (gain, teacher-difference, accuracy) coverage over `runs` groups."""
    rng = np.random.default_rng(seed)
    post = min(acc + 0.04, 0.99) if acc < 0.5 else acc
    truth = [float(np.clip(p + rng.normal(0, rep_sd, 400_000), 0, 1).mean()) for p in (post, acc)]
    base, sims = simulate(rng, runs, n, acc, [post] + [acc] * (m - 1), replicates, rep_sd)
    hits = np.zeros(3)
    for s in range(runs):
        arms = [arm(list(a[s])) for a in sims]
        prior = pool([a.units for a in arms])  # the group's, as `decide_group` takes it
        g = difference(arms[0], baseline_arm(base[s]), 0.95, prior)
        d = difference(arms[0], arms[1], 0.95, prior)
        p = accuracy(arms[0], 0.95, prior)
        hits += [
            g.low <= truth[0] - acc <= g.high,
            d.low <= truth[0] - truth[1] <= d.high,
            p.low <= truth[0] <= p.high,
        ]
    return cast(tuple[float, float, float], tuple(float(h) for h in hits / runs))


def grid_rates(
    rng: np.random.Generator, runs: int, accs: Sequence[float], tasks: int = 4,
    students: int = 2, base_acc: float = 0.3, replicates: int = 3,
    rep_sd: float | Sequence[float] = 0.035, rep_df: float = math.inf, task_sd: float = 0.0,
    n: int = 200, concordance: float = 0.5,
) -> dict[str, float]:  # fmt: skip
    """Frequencies of the rule's claims over simulated grids of `tasks` x `students` groups,
    each decided with `decide_groups` (the replicate variance borrowed across the grid). A
    teacher's true accuracy on a task is `accs` plus a teacher x task effect of SD `task_sd`
    that every student of the task shares; each group is otherwise `simulate`d. Per group:
    "error": any better/worse whose direction the truth does not have (a tie counts as no
    direction), "false": a teacher named that is not the unique true best or not above the
    baseline, "not_best": of those, a teacher named that is not the unique true best, "named":
    the unique true best named, "none": "none" said."""
    truth = np.asarray(accs) + rng.normal(0.0, task_sd, (tasks, len(accs)))
    truth = np.clip(truth, 0.01, 0.99)
    sims = {
        (c, s): simulate(rng, runs, n, base_acc, list(truth[c]), replicates, rep_sd,
                         concordance, rep_df)
        for c in range(tasks) for s in range(students)
    }  # fmt: skip
    names = [f"t{k}" for k in range(len(accs))]
    counts = dict.fromkeys(("error", "false", "not_best", "named", "none"), 0.0)
    for r in range(runs):
        groups = {
            g: (base[r], {t: list(a[r]) for t, a in zip(names, arms, strict=True)})
            for g, (base, arms) in sims.items()
        }
        decided, _ = decide_groups(groups, borrow=lambda g, h: g[0] != h[0])
        for (c, _s), d in decided.items():
            true = dict(zip(names, truth[c], strict=True))
            claims = [(t["teacher"], None, t["verdict"]) for t in d.teachers]
            claims += [(q["b"], q["a"], q["verdict"]) for q in d.pairs]
            wrong = False
            for y, x, v in claims:
                diff = true[y] - (base_acc if x is None else true[x])
                wrong |= (v == "better" and diff <= 0) or (v == "worse" and diff >= 0)
            top = [t for t in names if true[t] == max(true.values())]
            best = top[0] if len(top) == 1 and true[top[0]] > base_acc else None
            named = d.answer not in (ANSWERS_NONE, INCONCLUSIVE)
            counts["error"] += wrong
            counts["false"] += named and d.answer != best
            counts["not_best"] += named and (len(top) != 1 or d.answer != top[0])
            counts["named"] += named and d.answer == best
            counts["none"] += d.answer == ANSWERS_NONE
    return {k: v / (runs * tasks * students) for k, v in counts.items()}
