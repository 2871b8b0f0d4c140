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
method of moments of the balanced two-way (replicates x items) layout, (MS_rep - MS_res) / n,
kept signed; the item part already holds the item-by-replicate noise, so nothing is counted
twice: the sum is the textbook variance of a grand mean in a crossed random-effects design
(items, replicates, residual). The mean squares are pooled over the group's teachers unless
Bartlett's test says their spreads differ (`_total` has the reason).

Near 0% and 100% a Wald interval collapses (an accuracy of 1/50 has an item variance estimate of
almost nothing), so the item part is taken after the Bonett-Price adjustment: one pseudo-item
discordant each way for a difference, two correct and two wrong pseudo-items for one accuracy
(Agresti-Coull), each of weight 1/R on the means of R replicates; with a single replicate and
0/1 data these are exactly the Bonett-Price and Agresti-Coull intervals. The critical value is
Student's t with Satterthwaite degrees of freedom of the whole sum.

Every comparison ends in one word. The multiplicity family is the decision group: with `alpha`
and the group's m teachers, all m teacher-vs-baseline and m(m-1)/2 teacher-vs-teacher intervals
are Bonferroni-adjusted to 1 - alpha / (m + m(m-1)/2); a comparison is

    better / worse   the adjusted interval excludes 0,
    equivalent       the adjusted interval lies inside +-effect (the effect of interest),
    inconclusive     otherwise, and always when an arm has fewer replicates than
                     analysis.min_replicates (exploratory).

The confidence set for the best teacher holds every teacher that no other teacher is `better`
than; it misses the true best only when a pairwise interval errs (at most alpha).
Hand-written rather than statsmodels' MixedLM: the balanced crossed layout has this closed form
(microseconds for thousands of items), while a likelihood fit of crossed random effects on 0/1
outcomes is slow, often fails to converge at the boundary (sigma2_rep = 0, the usual case with
few replicates), and gives no small-sample correction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

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
    """Mean squares pooled over a group's replicated arms (same student, task and regime), and
    whether the arms' replicate spreads are compatible with one variance (elementwise)."""

    ms_rep: Any
    ms_res: Any
    df_rep: Any
    df_res: Any
    homogeneous: Any = True


def pool(arms_units: Sequence[np.ndarray]) -> Pooled | None:
    """Pool the mean squares of the arms with at least 2 replicates, each (..., R_t, n), with
    Bartlett's test of equal MS_rep across them (see `_total`)."""
    rep = [np.asarray(u, dtype=float) for u in arms_units if u.shape[-2] > 1]
    if not rep:
        return None
    n = rep[0].shape[-1]
    ms = [mean_squares(u) for u in rep]
    dfs = [u.shape[-2] - 1 for u in rep]
    df_rep = sum(dfs)
    ms_rep = sum(d * m for d, (m, _) in zip(dfs, ms, strict=True)) / df_rep
    ms_res = sum(d * r for d, (_, r) in zip(dfs, ms, strict=True)) / df_rep
    homogeneous = _bartlett_accepts([m for m, _ in ms], dfs, ms_rep)
    return Pooled(ms_rep, ms_res, df_rep, df_rep * (n - 1), homogeneous)


def _bartlett_accepts(variances: Sequence[Any], dfs: Sequence[int], pooled: Any) -> Any:
    """Bartlett's test of equal variances from the variances and their degrees of freedom
    (scipy's `bartlett` takes raw samples, not mean squares): True where it does not reject at
    5%. A variance of exactly 0 next to a positive one rejects."""
    k = len(variances)
    if k < 2:
        return np.ones(np.shape(pooled), dtype=bool)
    total = sum(dfs)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = [np.log(np.asarray(v, dtype=float)) for v in variances]
        stat = total * np.log(pooled) - sum(d * lg for d, lg in zip(dfs, logs, strict=True))
    stat = stat / (1 + (sum(1 / d for d in dfs) - 1 / total) / (3 * (k - 1)))
    all_zero = np.asarray(pooled) <= 0
    stat = np.where(all_zero, 0.0, np.nan_to_num(stat, nan=np.inf, posinf=np.inf))
    return stat <= stats.chi2.ppf(0.95, k - 1)


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


def contrast(
    d: np.ndarray, rep_units: Sequence[np.ndarray], pooled: Pooled | None, level: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rule's interval for a difference, vectorised over leading axes (the simulations).

    `d`: per-item differences (..., n) of the arms' replicate-averaged scores; `rep_units`: the
    replicate units (..., R, n) of each arm that has replicates; `pooled`: the group's mean
    squares. Returns centre, se, df and the half-width.

    The item part is taken after the Bonett-Price adjustment: one pseudo-item discordant each way
    on the scale of one adapter's 0/1 scores, so of weight 1/R on replicate means. It already
    holds the item-by-replicate noise of the means, so the replicate part is the between-replicate
    variance only (see `replicate_parts`)."""
    n = d.shape[-1]
    w = 1.0 / max([u.shape[-2] for u in rep_units], default=1)
    m = n + 2 * w
    centre = d.sum(axis=-1) / m
    item_var = np.maximum(((d * d).sum(axis=-1) + 2 * w) / m - centre * centre, 0.0) / m
    var, df = _total([(item_var, n - 1)], rep_units, pooled)
    se = np.sqrt(var)
    q = stats.t.ppf(0.5 + np.asarray(level) / 2, df)
    return centre, se, df, q * se


def _total(
    parts: list[tuple[Any, Any]], rep_units: Sequence[np.ndarray], pooled: Pooled | None
) -> tuple[Any, Any]:
    """(variance, Satterthwaite df) of the item part plus the replicated arms' parts.

    Pooling the teachers of a group (same student, task and regime) gives the between-replicate
    variance sum(R_t - 1) degrees of freedom instead of R - 1: a 2-df estimate from three
    replicates is small in a share of runs, and Bonferroni-adjusted intervals built on it give
    5-9% family-wise error where the pooled one stays near 4% (benchmarks/README.md). Pooling
    assumes one replicate variance for the group, so it is checked first (Bartlett's test of
    the arms' MS_rep): where the spreads differ, every arm keeps its own estimate, and a teacher
    whose replicates disagree is never made to look as steady as its neighbours, nor a steady
    one as erratic.

    Arms on the pooled estimate share one component (their weights summed), not one each: they
    are one estimate, not independent ones. Elementwise over the simulations' leading axes."""
    out = list(parts)
    use = np.asarray(False if pooled is None else pooled.homogeneous, dtype=bool)
    if pooled is not None and rep_units:
        weight = sum(1 / u.shape[-2] for u in rep_units) * use
        out += replicate_parts(pooled, weight, rep_units[0].shape[-1])
    for units in rep_units:
        own = pool([units])
        out += replicate_parts(own, (1 / units.shape[-2]) * ~use, units.shape[-1])
    return np.maximum(sum(v for v, _ in out), 0.0), satterthwaite(out)


def replicate_parts(pooled: Pooled | None, weight: Any, n: int) -> list[tuple[Any, Any]]:
    """weight * s2_rep as two signed variance components, weight * MS_rep / n and
    -weight * MS_res / n, with their degrees of freedom (weight: 1/R, or the sum of 1/R of the
    arms sharing one estimate; 0 where it is not the one used). Kept signed: truncating an estimate from a few replicates at 0
    biases the variance up, and the interval over-covers; the Satterthwaite degrees of freedom
    of the whole sum account for the negative part."""
    if pooled is None or np.all(np.asarray(weight) == 0):
        return []
    return [
        (weight * pooled.ms_rep / n, pooled.df_rep),
        (-weight * pooled.ms_res / n, pooled.df_res),
    ]


def difference(a: Arm, b: Arm, level: float = 0.95, pooled: Pooled | None = None) -> Estimate:
    """Accuracy of arm `a` minus arm `b` on the same items, with the rule's interval at `level`;
    `pooled`: the group's mean squares (default: pooled over `a` and `b`)."""
    n = a.units.shape[1]
    if b.units.shape[1] != n:
        raise ValueError(f"arms must score the same items: {n} and {b.units.shape[1]}")
    d = a.units.mean(axis=0) - b.units.mean(axis=0)
    reps = [x for x in (a, b) if not x.fixed and x.n_replicates > 1]
    if pooled is None:
        pooled = pool([x.units for x in reps])
    centre, se, df, half = (float(v) for v in contrast(d, [x.units for x in reps], pooled, level))
    est = _estimate(a.accuracy - b.accuracy, centre, half, level, se, df, (-1.0, 1.0))
    # the interval excludes 0 exactly when p < 1 - level (same centre, se and t)
    p = float(2 * stats.t.sf(abs(centre) / se, df)) if se > 0 else float(centre == 0)
    return replace(est, p=p)


def accuracy(a: Arm, level: float = 0.95, pooled: Pooled | None = None) -> Estimate:
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
    var, df = (float(v) for v in _total([(item_var, n - 1)], reps, pooled))
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
        }


def decide_group(
    base: ArrayLike,
    teachers: Mapping[str, Sequence[ArrayLike]],
    alpha: float = 0.05,
    effect: float = 0.03,
    min_replicates: int = 3,
    level: float | None = None,
) -> GroupDecision:
    """The answer for one group: every teacher against the baseline and against every other.

    `base`: the baseline's 0/1 vector; `teachers`: per teacher, its draws (see `replicate_units`);
    `effect`: the effect of interest as a fraction (analysis.effect_of_interest / 100); a teacher
    with fewer than `min_replicates` replicate units is exploratory. `level`: the level of every
    comparison's interval; by default Bonferroni over the group (`family_size`), see
    `decide_groups` for the grid-wide alternative."""
    b = baseline_arm(base)
    arms = {t: arm(d, min_replicates) for t, d in teachers.items()}
    m = len(arms)
    names = list(arms)
    pooled = pool([a.units for a in arms.values()])
    level = 1 - alpha / family_size(m) if level is None else level
    base_est = accuracy(b, 1 - alpha)
    rows = []
    for t in names:
        g = difference(arms[t], b, level, pooled)
        acc = accuracy(arms[t], level, pooled)
        rows.append(
            {"teacher": t, "post_acc": acc.estimate, "post_low": acc.low, "post_high": acc.high,
             "gain": g.estimate, "gain_low": g.low, "gain_high": g.high, "gain_se": g.se,
             "gain_p": g.p, "level": g.level, "n_replicates": arms[t].n_replicates,
             "rep_sd": math.sqrt(arms[t].rep_var), "exploratory": arms[t].exploratory,
             "verdict": verdict(g, effect, arms[t].exploratory)}
        )  # fmt: skip
    pairs = []
    for i, j in itertools.combinations(range(m), 2):
        x, y = arms[names[i]], arms[names[j]]
        d = difference(y, x, level, pooled)
        pairs.append(
            {"a": names[i], "b": names[j], "diff": d.estimate, "low": d.low, "high": d.high,
             "p": d.p, "level": d.level, "verdict": verdict(d, effect, x.exploratory or y.exploratory)}
        )  # fmt: skip
    beaten = set()
    for q in pairs:  # verdict of b - a: "better" means b beats a
        if q["verdict"] == "better":
            beaten.add(q["a"])
        elif q["verdict"] == "worse":
            beaten.add(q["b"])
    best_set = [t for t in names if t not in beaten]
    exploratory = any(a.exploratory for a in arms.values())
    answer, distill, headline = _answer(rows, best_set, effect, exploratory)
    return GroupDecision(
        rows, pairs, best_set, answer, distill, exploratory, base_est.estimate, base_est.low,
        base_est.high, int(b.units.shape[1]), alpha, effect, headline,
    )  # fmt: skip


MULTIPLICITY = ("group", "grid_fdr")


def decide_groups(
    groups: Mapping[Any, tuple[ArrayLike, Mapping[str, Sequence[ArrayLike]]]],
    alpha: float = 0.05,
    effect: float = 0.03,
    min_replicates: int = 3,
    multiplicity: str = "group",
) -> tuple[dict[Any, GroupDecision], dict[str, Any]]:
    """Every group's decision under one multiplicity rule, and the rule's record.

    `groups`: key -> (baseline vector, teachers' draws). "group": Bonferroni within each group
    (`decide_group`), the chance of any false better/worse in a group is at most alpha.
    "grid_fdr": the false-discovery rate over the whole grid. Benjamini-Hochberg at q = alpha
    selects among every comparison of every group that is not exploratory; each interval is then
    taken at the false-coverage-rate level 1 - R q / M of Benjamini and Yekutieli (2005), with R
    selected of M, so that "better"/"worse" (the interval excludes 0) holds for exactly the
    selected comparisons, and the expected share of false ones among them is at most q. More
    power where a grid holds many true effects; no per-group guarantee."""
    if multiplicity not in MULTIPLICITY:
        raise ValueError(f"multiplicity must be one of {MULTIPLICITY}, not {multiplicity!r}")
    decide = {
        key: decide_group(base, teachers, alpha, effect, min_replicates)
        for key, (base, teachers) in groups.items()
    }
    record: dict[str, Any] = {"rule": multiplicity, "alpha": alpha}
    if multiplicity == "group":
        return decide, record
    p = [
        x[k]
        for d in decide.values()
        for x, k in [*((t, "gain_p") for t in d.teachers), *((q, "p") for q in d.pairs)]
        if not d.exploratory
    ]
    selected = _benjamini_hochberg(np.asarray(p, dtype=float), alpha)
    m, r = len(p), int(selected.sum())
    level = 1 - max(r, 1) * alpha / max(m, 1)
    record.update({"level": level, "comparisons": m, "selected": r})
    return {
        key: decide_group(base, teachers, alpha, effect, min_replicates, level)
        for key, (base, teachers) in groups.items()
    }, record


def _benjamini_hochberg(p: np.ndarray, q: float) -> np.ndarray:
    """Which p-values Benjamini-Hochberg selects at false-discovery rate q (statsmodels)."""
    if p.size == 0:
        return np.zeros(0, dtype=bool)
    from statsmodels.stats.multitest import multipletests

    return multipletests(p, alpha=q, method="fdr_bh")[0]


def family_size(m: int) -> int:
    """The comparisons of a decision group of m teachers, one multiplicity family: m against the
    baseline and m(m-1)/2 between teachers. Bonferroni over all of them bounds the chance of any
    false better/worse in the group by alpha."""
    return m + m * (m - 1) // 2


def _answer(
    rows: list[dict], best_set: list[str], effect: float, exploratory: bool
) -> tuple[str, str, dict]:
    """(answer, distill, the row the answer line quotes).

    answer: a teacher when it beats the baseline and is the only member of the best set; "none"
    when no teacher can beat the baseline by the effect of interest (every gain interval below
    +effect); "inconclusive" otherwise. distill: yes (some teacher beats the baseline), no, or
    inconclusive."""
    by_name = {r["teacher"]: r for r in rows}
    point_best = max(rows, key=lambda r: r["gain"])
    if exploratory:
        return INCONCLUSIVE, INCONCLUSIVE, point_best
    winners = [r for r in rows if r["verdict"] == "better"]
    if not winners:
        if all(r["gain_high"] < effect for r in rows):
            return ANSWERS_NONE, "no", point_best
        return INCONCLUSIVE, INCONCLUSIVE, point_best
    if len(best_set) == 1 and by_name[best_set[0]]["verdict"] == "better":
        return best_set[0], "yes", by_name[best_set[0]]
    return INCONCLUSIVE, "yes", max(winners, key=lambda r: r["gain"])


# --- planning: power of the rule itself, by simulation ------------------------------------------


def simulate(
    rng: np.random.Generator,
    sims: int,
    n: int,
    base_acc: float,
    accs: Sequence[float],
    replicates: int,
    rep_sd: float,
    concordance: float = 0.5,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Synthetic groups with known truth: a baseline (sims, n) and per teacher (sims, R, n) 0/1.

    Item i has a latent u_i; the baseline is right when u_i < base_acc. A replicate of a teacher
    of accuracy p draws its own accuracy p_r = clip(p + N(0, rep_sd)), and is right on item i
    when w_ri < p_r, where w_ri is u_i with probability `concordance` (the student keeps that
    share of the baseline's item difficulty) and a fresh uniform otherwise."""
    u = rng.random((sims, 1, n))
    base = u[:, 0, :] < base_acc
    arms = []
    for p in accs:
        p_r = np.clip(p + rng.normal(0.0, rep_sd, (sims, replicates, 1)), 0.0, 1.0)
        w = np.where(
            rng.random((sims, replicates, n)) < concordance, u, rng.random((sims, replicates, n))
        )
        arms.append(w < p_r)
    return base, arms


def rule_calls_better(
    a: np.ndarray, b: np.ndarray | None, base: np.ndarray | None, others: Sequence[np.ndarray],
    level: float,
) -> np.ndarray:  # fmt: skip
    """Per simulation: does the rule call arm `a` (sims, R, n) better than arm `b` (sims, R, n),
    or than the fixed baseline `base` (sims, n)? `others`: the group's other teachers, whose
    replicates are pooled with those of `a` and `b` as `decide_group` pools them."""
    arms = [a] if b is None else [a, b]
    other = base.astype(float) if b is None else b.mean(axis=1)
    d = a.mean(axis=1) - other
    reps = [x.astype(float) for x in arms if x.shape[-2] > 1]
    pooled = pool([*arms, *others])
    centre, _, _, half = contrast(d, reps, pooled, level)
    return (centre - half) > 0


def gain_power(
    n: int, base_acc: float, gain: float, replicates: int, rep_sd: float, m: int = 1,
    alpha: float = 0.05, concordance: float = 0.5, sims: int = 2000, seed: int = 0,
) -> float:  # fmt: skip
    """Share of simulated groups of m teachers of true gain `gain` in which the report's rule
    calls the first better than the baseline (one Bonferroni family per group, see
    `family_size`; replicates pooled over the group; >= 2 replicates)."""
    if replicates < 2:
        return 0.0  # exploratory: never "better" (below analysis.min_replicates likewise)
    rng = np.random.default_rng(seed)
    base, arms = simulate(
        rng, sims, n, base_acc, [base_acc + gain] * m, replicates, rep_sd, concordance
    )
    level = 1 - alpha / family_size(m)
    return float(rule_calls_better(arms[0], None, base, arms[1:], level).mean())


def difference_power(
    n: int, acc: float, diff: float, replicates: int, rep_sd: float, m: int,
    alpha: float = 0.05, concordance: float = 0.5, sims: int = 2000, seed: int = 0,
) -> float:  # fmt: skip
    """Share of simulated groups of m teachers in which the rule calls the better of two
    teachers `diff` apart better (the other m - 2 teachers at the lower accuracy)."""
    if replicates < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    accs = [acc + diff] + [acc] * max(m - 1, 1)
    _, arms = simulate(rng, sims, n, acc, accs, replicates, rep_sd, concordance)
    level = 1 - alpha / family_size(max(m, 2))
    return float(rule_calls_better(arms[0], arms[1], None, arms[2:], level).mean())


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
    power: float = 0.8, concordance: float = 0.5, sims: int = 2000,
) -> float:  # fmt: skip
    """Smallest gain (a fraction) the report's rule calls `better` with `power`; NaN if none."""
    return _smallest(
        lambda g: gain_power(n, base_acc, g, replicates, rep_sd, m, alpha, concordance, sims),
        1.0 - base_acc,
        power,
    )


def minimum_detectable_difference(
    n: int, acc: float, replicates: int, rep_sd: float, m: int, alpha: float = 0.05,
    power: float = 0.8, concordance: float = 0.5, sims: int = 2000,
) -> float:  # fmt: skip
    """Smallest difference between two teachers the rule calls `better` with `power`."""
    if m < 2:
        return math.nan
    return _smallest(
        lambda d: difference_power(n, acc, d, replicates, rep_sd, m, alpha, concordance, sims),
        1.0 - acc,
        power,
    )


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
        pooled = pool([a.units for a in arms])
        g = difference(arms[0], baseline_arm(base[s]), 0.95, pooled)
        d = difference(arms[0], arms[1], 0.95, pooled)
        p = accuracy(arms[0], 0.95, pooled)
        hits += [
            g.low <= truth[0] - acc <= g.high,
            d.low <= truth[0] - truth[1] <= d.high,
            p.low <= truth[0] <= p.high,
        ]
    return tuple(float(h) for h in hits / runs)
