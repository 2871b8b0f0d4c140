"""Teacher-level inference: what a group of teachers' distilled students let a user conclude.

    .venv/bin/python -c "from harness import inference; help(inference.decide_group)"
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
method of moments of the balanced two-way (replicates x items) layout: (MS_rep - MS_res) / n,
truncated at 0. Together the two parts are the textbook variance of a grand mean in a crossed
random-effects design (items, replicates, residual), so nothing is counted twice.

Near 0% and 100% a Wald interval collapses (an accuracy of 1/50 has an item variance estimate of
almost nothing), so the item part is taken after the Bonett-Price adjustment: one pseudo-item
discordant each way for a difference, two correct and two wrong pseudo-items for one accuracy
(Agresti-Coull); with a single replicate and 0/1 data these are exactly the Bonett-Price and
Wilson intervals. The critical value is Student's t with Satterthwaite degrees of freedom, so
that a replicate variance estimated from three replicates widens the interval as it should.

Every comparison ends in one word. With `alpha` and the group's m teachers, teacher-vs-baseline
intervals are Bonferroni-adjusted over the m teachers, teacher-vs-teacher intervals over the
m(m-1)/2 pairs; a comparison is

    better / worse   the adjusted interval excludes 0,
    equivalent       the adjusted interval lies inside +-effect (the effect of interest),
    inconclusive     otherwise, and always when an arm has fewer than 2 replicates
                     (exploratory: the spread between replicates is unknown).

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
from dataclasses import dataclass, field
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


def replicate_variance(units: np.ndarray) -> float:
    """Between-replicate variance of an arm's accuracy (method of moments, truncated at 0).

    Two-way layout without repetition: MS_rep = n * var(replicate means), MS_res the residual
    mean square after removing replicate and item means; E[MS_rep] = s2_res + n * s2_rep."""
    r, n = units.shape
    if r < 2:
        return 0.0
    rep_means = units.mean(axis=1)
    item_means = units.mean(axis=0)
    grand = units.mean()
    ms_rep = n * float(np.var(rep_means, ddof=1))
    resid = units - rep_means[:, None] - item_means[None, :] + grand
    dof_res = (r - 1) * (n - 1)
    ms_res = float((resid**2).sum() / dof_res) if dof_res > 0 else 0.0
    return max(0.0, (ms_rep - ms_res) / n)


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
        return 0.0 if self.fixed else replicate_variance(self.units)


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


def satterthwaite(parts: Sequence[tuple[Any, Any]]) -> Any:
    """Welch-Satterthwaite degrees of freedom of a sum of variance components (value, df);
    elementwise over arrays of values (inf where every component is 0)."""
    total = sum(np.asarray(v, dtype=float) for v, _ in parts)
    denom = sum(
        np.where((np.asarray(v) > 0) & (d > 0), np.asarray(v, dtype=float) ** 2 / max(d, 1), 0.0)
        for v, d in parts
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, total * total / np.where(denom > 0, denom, 1.0), np.inf)


def contrast(
    d: np.ndarray, rep_accs: Sequence[np.ndarray], level: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rule's interval for a difference, vectorised over leading axes (the simulations).

    `d`: per-item differences (..., n) of the arms' replicate-averaged scores; `rep_accs`: for
    each arm that has replicates, its replicate accuracies (..., R). Returns centre, se, df and
    the half-width. The item part is taken after the Bonett-Price adjustment (one pseudo-item
    discordant each way); each replicated arm adds var(replicate accuracies) / R, which holds
    the between-replicate variance and the item-by-replicate noise a new replicate would show
    (slightly conservative: that noise is also in the item part)."""
    n = d.shape[-1]
    m = n + 2
    centre = d.sum(axis=-1) / m
    item_var = np.maximum(((d * d).sum(axis=-1) + 2) / m - centre * centre, 0.0) / m
    parts = [(item_var, n - 1)]
    for acc in rep_accs:
        r = acc.shape[-1]
        parts.append((acc.var(axis=-1, ddof=1) / r, r - 1))
    var = sum(v for v, _ in parts)
    df = satterthwaite(parts)
    se = np.sqrt(var)
    q = stats.t.ppf(0.5 + np.asarray(level) / 2, df)
    return centre, se, df, q * se


def difference(a: Arm, b: Arm, level: float = 0.95) -> Estimate:
    """Accuracy of arm `a` minus arm `b` on the same items, with the rule's interval at `level`."""
    n = a.units.shape[1]
    if b.units.shape[1] != n:
        raise ValueError(f"arms must score the same items: {n} and {b.units.shape[1]}")
    d = a.units.mean(axis=0) - b.units.mean(axis=0)
    reps = [x.units.mean(axis=1) for x in (a, b) if not x.fixed and x.n_replicates > 1]
    centre, se, df, half = (float(v) for v in contrast(d, reps, level))
    return _estimate(a.accuracy - b.accuracy, centre, half, level, se, df, (-1.0, 1.0))


def accuracy(a: Arm, level: float = 0.95) -> Estimate:
    """An arm's accuracy with its interval: Jeffreys for one 0/1 replicate (good coverage near 0
    and 1, Brown, Cai & DasGupta 2001), else Agresti-Coull's pseudo-items (two right, two wrong)
    plus the replicates' variance, as `contrast` does."""
    x = a.units.mean(axis=0)
    n = x.size
    p = float(x.mean())
    if a.n_replicates == 1 and np.isin(x, (0.0, 1.0)).all():
        k, tail = float(x.sum()), (1 - level) / 2
        low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k + 0.5, n - k + 0.5))
        high = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 0.5, n - k + 0.5))
        return Estimate(p, min(low, p), max(high, p), level, math.sqrt(p * (1 - p) / n), math.inf)
    m = n + 4
    centre = float((x.sum() + 2) / m)
    item_var = max(float(((x * x).sum() + 2) / m - centre * centre), 0.0) / m
    parts = [(item_var, n - 1)]
    if a.n_replicates > 1:
        reps = a.units.mean(axis=1)
        parts.append((float(reps.var(ddof=1)) / a.n_replicates, a.n_replicates - 1))
    se = math.sqrt(sum(v for v, _ in parts))
    df = float(satterthwaite(parts))
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
) -> GroupDecision:
    """The answer for one group: every teacher against the baseline and against every other.

    `base`: the baseline's 0/1 vector; `teachers`: per teacher, its draws (see `replicate_units`);
    `effect`: the effect of interest as a fraction (analysis.effect_of_interest / 100); a teacher
    with fewer than `min_replicates` replicate units is exploratory."""
    b = baseline_arm(base)
    arms = {t: arm(d, min_replicates) for t, d in teachers.items()}
    m = len(arms)
    names = list(arms)
    base_est = accuracy(b, 1 - alpha)
    rows = []
    for t in names:
        g = difference(arms[t], b, 1 - alpha / m)
        acc = accuracy(arms[t], 1 - alpha / m)
        rows.append(
            {"teacher": t, "post_acc": acc.estimate, "post_low": acc.low, "post_high": acc.high,
             "gain": g.estimate, "gain_low": g.low, "gain_high": g.high, "gain_se": g.se,
             "level": g.level, "n_replicates": arms[t].n_replicates,
             "rep_sd": math.sqrt(arms[t].rep_var), "exploratory": arms[t].exploratory,
             "verdict": verdict(g, effect, arms[t].exploratory)}
        )  # fmt: skip
    pairs = []
    n_pairs = max(1, m * (m - 1) // 2)
    for i, j in itertools.combinations(range(m), 2):
        x, y = arms[names[i]], arms[names[j]]
        d = difference(y, x, 1 - alpha / n_pairs)
        pairs.append(
            {"a": names[i], "b": names[j], "diff": d.estimate, "low": d.low, "high": d.high,
             "level": d.level, "verdict": verdict(d, effect, x.exploratory or y.exploratory)}
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


# --- relations across groups: teacher-level permutation ------------------------------------------


def teacher_permutation_test(
    values: Mapping[tuple[str, str], float],
    prop: Mapping[tuple[str, str], float],
    clusters: Mapping[str, str],
    alpha: float = 0.05,
    max_exact: int = 50000,
    n_resamples: int = 9999,
    seed: int = 0,
) -> dict[str, Any]:
    """Is a teacher property related to the distilled outcome, with teachers as the unit?

    `values`: (group, teacher) -> outcome (a gain); `prop`: (cluster, teacher) -> the property
    (teacher accuracy on the cluster's task, or log size); `clusters`: group -> the cluster whose
    traces the group's students share (the task). The statistic is the mean over groups of the
    within-group Spearman rho of outcome and property. Under the null the property is
    exchangeable between a cluster's teachers: the test permutes it among the teachers of each
    cluster, the SAME permutation for every group of that cluster, so an effect a teacher has on
    every student of a task (shared traces) is never mistaken for a relation, as it is when
    groups are treated as independent. Exact over all permutations up to `max_exact`; the
    smallest p the design can reach comes with it (`too_few` when it cannot reach alpha)."""
    by_cluster: dict[str, list[str]] = {}
    for g, _ in values:
        c = clusters[g]
        if g not in by_cluster.setdefault(c, []):
            by_cluster[c].append(g)
    contributions, n_groups = [], 0
    for c, groups in sorted(by_cluster.items()):
        teachers = sorted({t for (g, t) in values if clusters[g] == c})
        x = np.array([prop.get((c, t), math.nan) for t in teachers], dtype=float)
        if np.isnan(x).any() or len(teachers) < 3 or np.ptp(x) == 0:
            continue
        rx = stats.rankdata(x)
        rx = (rx - rx.mean()) / np.linalg.norm(rx - rx.mean())
        perms = np.array(list(itertools.permutations(range(len(teachers)))))
        total = np.zeros(len(perms))
        for g in groups:
            y = np.array([values.get((g, t), math.nan) for t in teachers], dtype=float)
            if np.isnan(y).any() or np.ptp(y) == 0:
                continue
            ry = stats.rankdata(y)
            ry = (ry - ry.mean()) / np.linalg.norm(ry - ry.mean())
            total += rx[perms] @ ry  # Spearman's rho of the permuted property, every permutation
            n_groups += 1
        contributions.append(total)
    nan = {"rho": math.nan, "p": math.nan, "smallest_p": 1.0, "n_permutations": 0,
           "n_groups": 0, "exact": True, "too_few": True}  # fmt: skip
    if n_groups == 0:
        return nan
    sizes = [len(t) for t in contributions]
    count = math.prod(sizes)
    observed = sum(float(t[0]) for t in contributions) / n_groups  # permutation 0 = identity
    if count <= max_exact:
        null = np.zeros(1)
        for t in contributions:
            null = np.add.outer(null, t).ravel()
        exact = True
    else:
        rng = np.random.default_rng(seed)
        null = sum(t[rng.integers(0, len(t), n_resamples)] for t in contributions)
        exact = False
    null = null / n_groups
    hits = int((np.abs(null) >= abs(observed) - 1e-9).sum())
    p = hits / null.size if exact else (hits + 1) / (null.size + 1)
    # the identity and its mirror image (reversed property) are always at least as extreme
    most = np.abs(null).max()
    smallest = (
        int((np.abs(null) >= most - 1e-9).sum()) / null.size if exact else 1 / (null.size + 1)
    )
    return {
        "rho": observed,
        "p": float(p),
        "smallest_p": float(smallest),
        "n_permutations": int(count),
        "n_groups": n_groups,
        "exact": exact,
        "too_few": bool(smallest > alpha),
    }


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
    a: np.ndarray, b: np.ndarray | None, base: np.ndarray | None, level: float
) -> np.ndarray:
    """Per simulation: does the rule call arm `a` (sims, R, n) better than arm `b` (sims, R, n),
    or than the fixed baseline `base` (sims, n)?"""
    reps = [a.mean(axis=2)]
    other = base.astype(float) if b is None else b.mean(axis=1)
    if b is not None:
        reps.append(b.mean(axis=2))
    d = a.mean(axis=1) - other
    centre, _, _, half = contrast(d, [r for r in reps if r.shape[-1] > 1], level)
    return (centre - half) > 0


def gain_power(
    n: int, base_acc: float, gain: float, replicates: int, rep_sd: float, m: int = 1,
    alpha: float = 0.05, concordance: float = 0.5, sims: int = 2000, seed: int = 0,
) -> float:  # fmt: skip
    """Share of simulated groups in which the report's rule calls a teacher of true gain `gain`
    better than the baseline (interval Bonferroni-adjusted over m teachers, >= 2 replicates)."""
    if replicates < 2:
        return 0.0  # exploratory: never "better" (below analysis.min_replicates likewise)
    rng = np.random.default_rng(seed)
    base, (a,) = simulate(
        rng, sims, n, base_acc, [base_acc + gain], replicates, rep_sd, concordance
    )
    return float(rule_calls_better(a, None, base, 1 - alpha / m).mean())


def difference_power(
    n: int, acc: float, diff: float, replicates: int, rep_sd: float, m: int,
    alpha: float = 0.05, concordance: float = 0.5, sims: int = 2000, seed: int = 0,
) -> float:  # fmt: skip
    """Share of simulated groups in which the rule calls the better of two teachers `diff` apart
    better (interval Bonferroni-adjusted over the m(m-1)/2 pairs of m teachers)."""
    if replicates < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    _, (lo, hi) = simulate(rng, sims, n, acc, [acc, acc + diff], replicates, rep_sd, concordance)
    pairs = max(1, m * (m - 1) // 2)
    return float(rule_calls_better(hi, lo, None, 1 - alpha / pairs).mean())


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
    n: int, acc: float, runs: int, replicates: int = 3, rep_sd: float = 0.02, seed: int = 0
) -> tuple[float, float]:
    """Simulated coverage of the rule's gain and accuracy intervals: a teacher of true accuracy
    `acc` + 4 points (below 50%; `acc` itself above) against a fixed baseline of `acc`, its true
    mean accuracy over replicate draws taken from 400,000 draws. (gain coverage, accuracy
    coverage) over `runs` simulated groups."""
    rng = np.random.default_rng(seed)
    post = min(acc + 0.04, 0.99) if acc < 0.5 else acc
    truth = float(np.clip(post + rng.normal(0, rep_sd, 400_000), 0, 1).mean())
    base, arms = simulate(rng, runs, n, acc, [post], replicates, rep_sd)
    hit_gain = hit_acc = 0
    for s in range(runs):
        a, b = arm(list(arms[0][s])), baseline_arm(base[s])
        g, p = difference(a, b), accuracy(a)
        hit_gain += g.low <= truth - acc <= g.high
        hit_acc += p.low <= truth <= p.high
    return hit_gain / runs, hit_acc / runs
