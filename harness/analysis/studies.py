"""The analyses a capacity-gap study's conclusions rest on, each on the teacher-level inference
model of harness/stats/teacher_level.py (its contrasts, intervals and verdicts), each ending in a reading
that says "inconclusive" where the data cannot tell.

    cotgap analyze configs/paper-study.yaml   # analysis.json "studies"; report.md "Studies"

    stronger_teacher     win rate of the stronger teacher's student against the teachers'
                         accuracy gap: binned, and its trend (per regime, family and overall)
    quantity_quality     gain on training-set size and teacher accuracy together, within groups;
                         per_teacher against matched (same data size) where both ran
    regime_flips         does the answer or the ranking change between per_teacher and another
                         regime, and can the data tell
    capacity_gap         student size x teacher accuracy interaction, and an inverted-U test
    delta_pairs          ΔLarge and ΔLong with configured teacher pairs (analysis.delta_large,
                         analysis.delta_long)
    families             averages over a task family (analysis.families) per student, teacher
                         and regime
    mix_parts            the mix adapter against each of its component teachers, per alignment
    selection_effect     gains on tasks pre-selection passed against gated tasks run anyway

A claim across groups takes the teacher (or, for the student-size interaction, the student) as
its unit: the grid's groups share the same few teachers, and a teacher good on one task is
usually good on the others, so neither tasks nor students nor teacher pairs are independent
repeats of a teacher comparison. Each such claim is tested against every order of the teachers'
(students') labels, one order applied on the whole grid (harness/stats/grid_level.py), and says
"too few" where this many teachers (students) cannot reach the level, with how many would.
Every study returns {"title", "about", "readings", "tables"}: the
report and the viewer print these, analysis.json keeps them with the numbers.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from harness.stats import grid_level, teacher_level

Key = tuple[str, str, str]  # (task, student, regime)
Arms = Mapping[Key, tuple[np.ndarray, Mapping[str, Sequence[np.ndarray]]]]
NAN = math.nan
TOO_FEW = "too few"  # the design cannot estimate it at all


def run(exp: Any, board: pd.DataFrame, result: dict[str, Any], arms: Arms) -> dict[str, Any]:
    """Every study of the analysis, from the leaderboard, analyse()'s groups and each group's
    arms ({(task, student, regime): (baseline 0/1 vector, {teacher: its draws})})."""
    a = exp.analysis
    alpha, effect, reps = 1 - a.ci, a.effect_of_interest / 100, a.min_replicates
    families = {f.name: f.tasks for f in a.families}
    frame = teacher_frame(result, board, families)
    out = {
        "stronger_teacher": stronger_teacher(frame, alpha, a.gap_bins),
        "quantity_quality": quantity_quality(frame, arms, alpha, effect, reps),
        "regime_flips": regime_flips(result, arms, alpha),
        "capacity_gap": capacity_gap(frame, alpha),
        "delta_pairs": delta_pairs(result, a.delta_large, a.delta_long),
        "families": family_averages(arms, families, alpha, effect, reps),
        "mix_parts": mix_parts(arms, [p.teacher for p in exp.train.mix], alpha, effect, reps),
        "selection_effect": selection_effect(frame, result.get("selection") or [], alpha),
    }  # fmt: skip
    return out


# --- shared pieces -------------------------------------------------------------------------------


def family_of(task: str, families: Mapping[str, Sequence[str]]) -> str:
    """A task's family: the first of analysis.families with a matching pattern, else the task
    name up to its first underscore (bbh_navigate -> bbh)."""
    for name, patterns in families.items():
        if any(fnmatch.fnmatchcase(task, p) for p in patterns):
            return name
    return task.split("_", 1)[0]


def teacher_frame(
    result: dict[str, Any], board: pd.DataFrame, families: Mapping[str, Sequence[str]]
) -> pd.DataFrame:
    """One row per (task, student, regime, teacher) with a decision: the teacher-level gain and
    post, its interval and verdict, the teacher's accuracy and size, the student's size, the
    mean training-set size, and the task's family."""
    dist = board[board["row_type"] == "distilled"]
    examples = dist.groupby(["task", "student", "regime", "teacher"])["n_train_examples"].mean()
    student_size = dist.groupby("student")["student_size"].first()
    rows = []
    for g in result["groups"]:
        d = g["decision"]
        if not d:
            continue
        info = {r["teacher"]: r for r in g["ranking"]}
        for t in d["teachers"]:
            key = (g["task"], g["student"], g["regime"], t["teacher"])
            rows.append(
                {"task": g["task"], "student": g["student"], "regime": g["regime"],
                 "teacher": t["teacher"], "post_acc": t["post_acc"], "gain": t["gain"],
                 "gain_low": t["gain_low"], "gain_high": t["gain_high"], "verdict": t["verdict"],
                 "base_acc": d["base_acc"], "teacher_acc": info[t["teacher"]]["teacher_acc"],
                 "teacher_size": info[t["teacher"]]["teacher_size"],
                 "student_size": student_size.get(g["student"], NAN),
                 "n_examples": examples.get(key, NAN),
                 "family": family_of(g["task"], families)}
            )  # fmt: skip
    columns = ["task", "student", "regime", "teacher", "post_acc", "gain", "gain_low", "gain_high"]
    columns += ["verdict", "base_acc", "teacher_acc", "teacher_size", "student_size"]
    columns += ["n_examples", "family"]
    return pd.DataFrame(rows, columns=columns).astype(
        {c: float for c in ("teacher_acc", "teacher_size", "student_size", "n_examples")}
    )


def teacher_regimes(frame: pd.DataFrame) -> list[str]:
    """The regimes whose rows are single teachers (a mix row has no teacher of its own)."""
    return [r for r in frame["regime"].unique() if not str(r).startswith("mix")]


def teacher_test(
    stat: Any, n_units: int, alpha: float, alternative: str = grid_level.TWO_SIDED
) -> grid_level.Permutation:
    """A grid-level permutation test of `stat` over `n_units` teachers (or students)."""
    return grid_level.permutation_test(stat, n_units, alpha, alternative)


def claim(test: grid_level.Permutation | None, up: str, down: str, unit: str = "teachers") -> str:
    """A grid-level test's verdict in words: a direction only where it rejects at its level;
    "too few" where this many units can never reach it, with how many would."""
    if test is None or math.isnan(test.statistic):
        return TOO_FEW
    if test.too_few:
        return (
            f"{TOO_FEW} {unit} ({test.n_units}: no {unit[:-1]}-level test can reach p ≤ "
            f"{test.alpha:.3g}; it needs ≥ {test.needed})"
        )
    if not test.rejects:
        return teacher_level.INCONCLUSIVE
    return up if test.statistic > 0 else down


def _pval(p: float | None) -> str:
    return "–" if p is None or math.isnan(p) else f"{p:.3f}"


def _p(test: grid_level.Permutation | None) -> str:
    if test is None or math.isnan(test.p):
        return "p –"
    kind = "exact" if test.exact else "sampled"
    return f"p = {test.p:.3f} ({kind}, {test.n_permutations} orders of {test.n_units})"


def direction(est: teacher_level.Estimate | None, up: str, down: str) -> str:
    """The rule's verdict on a slope or contrast without an equivalence margin, in words."""
    if est is None:
        return TOO_FEW
    word = teacher_level.verdict(est, 0.0, False)
    return {"better": up, "worse": down}.get(word, teacher_level.INCONCLUSIVE)


def _interval(e: teacher_level.Estimate | None, scale: float = 100) -> list[Any]:
    if e is None:
        return [None, None, None]
    return [scale * e.estimate, scale * e.low, scale * e.high]


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"title": title, "columns": columns, "rows": rows}


def _study(title: str, about: str, readings: list[str], tables: list[dict], **data: Any) -> dict:
    return {"title": title, "about": about, "readings": readings, "tables": tables, **data}


def _fmt(x: Any, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.1f}" if signed else f"{x:.1f}"


def _ci(e: teacher_level.Estimate | None, scale: float = 100) -> str:
    if e is None:
        return "–"
    return f"{scale * e.estimate:+.1f} [{scale * e.low:+.1f}, {scale * e.high:+.1f}]"


def _arm(draws: Sequence[np.ndarray], min_replicates: int = 3) -> teacher_level.Arm:
    """A teacher's arm; below `min_replicates` (analysis.min_replicates) units it is exploratory
    and its comparisons stay inconclusive, as in the group decisions."""
    return teacher_level.arm(draws, min_replicates=min_replicates)


# --- 1. stronger versus weaker teacher -----------------------------------------------------------


def teacher_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """Every pair of teachers of a group with different accuracies: the accuracy gap (points),
    and whether the stronger teacher's student scored higher (1), lower (0) or the same (0.5)."""
    columns = ["task", "student", "regime", "family", "stronger", "weaker", "gap", "win"]
    out: dict[str, list] = {c: [] for c in columns}
    have = frame.dropna(subset=["teacher_acc", "post_acc"])
    keys = ["task", "student", "regime", "family"]
    accs, posts = have["teacher_acc"].to_numpy(), have["post_acc"].to_numpy()
    teachers = have["teacher"].to_numpy(dtype=object)
    for key, idx in have.groupby(keys, sort=False).indices.items():
        acc, post, names = accs[idx], posts[idx], teachers[idx]
        i, j = np.triu_indices(len(idx), k=1)
        i, j = i[acc[i] != acc[j]], j[acc[i] != acc[j]]
        strong, weak = np.where(acc[i] > acc[j], i, j), np.where(acc[i] > acc[j], j, i)
        diff = post[strong] - post[weak]
        for c, v in zip(keys, key, strict=True):
            out[c] += [v] * len(strong)
        out["stronger"] += list(names[strong])
        out["weaker"] += list(names[weak])
        out["gap"] += list(100 * (acc[strong] - acc[weak]))
        out["win"] += list(np.where(diff > 0, 1.0, np.where(diff < 0, 0.0, 0.5)))
    return pd.DataFrame(out, columns=columns)


def win_rate_fit(frame: pd.DataFrame, alpha: float, bins: Sequence[float]) -> dict[str, Any]:
    """Binned win rates of the stronger teacher (each bin tested at alpha / bins) and the trend
    of the win rate in the gap (the least-squares slope, in points of win rate per 10 points of
    gap), each against every order of the teachers' accuracies over the whole grid
    (grid_level.pair_wins): teachers, not pairs or tasks, are the unit."""
    keys, teachers, arr = grid_level.block(frame, ["post_acc", "teacher_acc"])
    n, edges = len(teachers), list(bins)
    n_bins = max(1, len(edges) - 1)
    wins = grid_level.pair_wins(arr["post_acc"], 100 * arr["teacher_acc"])
    gap, win = wins(np.arange(n)[None]) if n > 1 else (np.empty((1, 0)), np.empty((1, 0)))
    pair_task: np.ndarray = np.repeat(keys["task"].to_numpy(dtype=object), n * (n - 1) // 2)
    binned = []
    for lo, hi in itertools.pairwise(edges):
        closed = hi == edges[-1]
        inside = (gap[0] >= lo) & ((gap[0] <= hi) if closed else (gap[0] < hi))
        test = (teacher_test(grid_level.win_rate_in(wins, lo, hi, closed), n, alpha / n_bins)
                if inside.any() else None)  # fmt: skip
        binned.append({"low": lo, "high": hi, "n_pairs": int(inside.sum()),
                       "n_tasks": len(set(pair_task[inside])),
                       "win_rate": float(win[0][inside].mean()) if inside.any() else NAN,
                       "test": None if test is None else test.as_dict(),
                       "reading": claim(test, "stronger wins", "weaker wins")})  # fmt: skip
    has_pairs = bool((~np.isnan(gap[0])).sum() > 2)
    trend = teacher_test(grid_level.win_slope(wins), n, alpha) if has_pairs else None
    slope = None if trend is None or math.isnan(trend.statistic) else 1000 * trend.statistic
    return {"bins": binned, "slope": slope, "test": None if trend is None else trend.as_dict(),
            "n_pairs": int((~np.isnan(gap[0])).sum()), "n_teachers": n,
            "n_tasks": int(keys["task"].nunique()) if len(keys) else 0,
            "trend": claim(trend, "the stronger teacher wins more often as the gap grows",
                           "the stronger teacher wins less often as the gap grows"),
            "p": _p(trend)}  # fmt: skip


def stronger_teacher(frame: pd.DataFrame, alpha: float, bins: Sequence[float]) -> dict[str, Any]:
    """Win rate of the stronger teacher's student against the teachers' accuracy gap, per
    regime, overall and per task family, with the teacher as the unit: the pairs of a grid share
    its few teachers (A-B and A-C both carry A, on every task and for every student), so
    neither pairs nor tasks are independent evidence."""
    single = frame[frame["regime"].isin(teacher_regimes(frame))]
    fits, rows, readings = [], [], []
    for regime, mine in single.groupby("regime", sort=False):
        scopes = [("all", mine)] + (
            [(f, m) for f, m in mine.groupby("family", sort=False)]
            if mine["family"].nunique() > 1
            else []
        )
        for scope, part in scopes:
            f = win_rate_fit(part, alpha, bins)
            if not f["n_pairs"]:
                continue
            fits.append({"regime": regime, "scope": scope, **f})
            for b in f["bins"]:
                rows.append([regime, scope, f"{b['low']:g}–{b['high']:g}", b["n_pairs"],
                             b["n_tasks"], _fmt(100 * b["win_rate"]),
                             _pval((b["test"] or {}).get("p")), b["reading"]])  # fmt: skip
            slope = "–" if f["slope"] is None else f"{f['slope']:+.1f}"
            readings.append(
                f"{regime}, {scope}: {f['n_pairs']} teacher pairs from {f['n_teachers']} "
                f"teachers on {f['n_tasks']} task(s); the stronger teacher's win rate changes by "
                f"{slope} pts per 10 pts of gap ({f['p']}): {f['trend']}"
            )
    columns = ["regime", "scope", "gap (pts)", "pairs", "tasks", "win rate (%)", "p", "reading"]
    return _study(
        "Stronger versus weaker teacher",
        "For every pair of teachers of a group, does the stronger teacher's (higher test "
        "accuracy) student score higher (a win; a tie counts half)? Win rates by accuracy gap, "
        "and the trend of the win rate in the gap (least squares over the pairs). Teachers are "
        "the unit: each is tested against every order of the teachers' accuracies, the same "
        "order on every task and student (exact), so a teacher that is good everywhere counts "
        "once, not once per task. A bin reads 'stronger wins' or 'weaker wins' only when it "
        "rejects at alpha / bins; with too few teachers no order can, and it says 'too few'.",
        readings or ["no group has two teachers of different accuracy: nothing to compare"],
        [_table("Win rate of the stronger teacher by accuracy gap", columns, rows)],
        fits=fits,
    )


# --- 2. quantity versus quality ------------------------------------------------------------------


def size_and_accuracy(
    frame: pd.DataFrame, alpha: float
) -> tuple[dict[str, grid_level.Permutation | None], float]:
    """gain (points) ~ log2(training examples) + teacher accuracy (per 10 points), each (task,
    student) group with its own intercept, fitted together; each coefficient tested against
    every order of the teachers over the whole grid (grid_level.within_slopes: both regressors
    move with the teacher's label). The null of each test is that gain is unrelated to the
    teachers (neither term matters), so a term's rejection says the gain follows the teachers
    in a way that term describes, split from the other term by the linear model. Also the
    within-group correlation of the two regressors (near +-1: one relation, not two)."""
    df = frame[frame["n_examples"] > 0]
    _, teachers, arr = grid_level.block(df, ["gain", "teacher_acc", "n_examples"])
    none: dict[str, grid_level.Permutation | None] = {"examples": None, "accuracy": None}
    if not len(arr["gain"]) or len(teachers) < 2:
        return none, NAN
    x = np.stack([np.log2(arr["n_examples"]), 10 * arr["teacher_acc"]], axis=2)
    xw = x - x.mean(axis=1, keepdims=True)
    spread = np.abs(xw).sum(axis=(0, 1)) > 1e-9
    cols = [k for k in range(2) if spread[k]]
    r = float(np.corrcoef(xw[..., 0].ravel(), xw[..., 1].ravel())[0, 1]) if spread.all() else NAN
    if not cols:
        return none, r
    coefs = grid_level.within_slopes(100 * arr["gain"], x[..., cols])
    tests = {k: teacher_test(grid_level.column(coefs, i), len(teachers), alpha)
             for i, k in enumerate(cols)}  # fmt: skip
    names = ("examples", "accuracy")
    return {names[k]: tests.get(k) for k in range(2)}, r


def quantity_quality(
    frame: pd.DataFrame, arms: Arms, alpha: float, effect: float, min_replicates: int = 3
) -> dict[str, Any]:
    """Per regime, how much of the gain goes with training-set size and how much with teacher
    accuracy, estimated together with teachers as the unit; and where `matched` ran, each
    teacher's per_teacher gain against its matched one (the same teacher with as many examples
    as the smallest set)."""
    rows, readings, fits = [], [], []
    for regime in teacher_regimes(frame):
        tests, r = size_and_accuracy(frame[frame["regime"] == regime], alpha)
        fits.append({"regime": regime, "correlation": r,
                     **{k: None if t is None else t.as_dict() for k, t in tests.items()}})  # fmt: skip
        words = {k: claim(t, "more gain", "less gain") for k, t in tests.items()}
        for name, unit in (("examples", "per doubling of examples"),
                           ("accuracy", "per 10 pts of teacher accuracy")):  # fmt: skip
            t = tests[name]
            rows.append([regime, f"{name} ({unit})", _fmt(None if t is None else t.statistic,
                         True), _pval(None if t is None else t.p), words[name]])  # fmt: skip
        collinear = not math.isnan(r) and abs(r) > 0.9
        same_size = tests["examples"] is None and tests["accuracy"] is not None

        def coef(t: grid_level.Permutation | None) -> str:
            return "–" if t is None else f"{t.statistic:+.1f}"

        readings.append(
            f"{regime}: gain {coef(tests['examples'])} pts per doubling of the training set "
            f"({_p(tests['examples'])}: {words['examples']}), {coef(tests['accuracy'])} pts per "
            f"10 pts of teacher accuracy ({_p(tests['accuracy'])}: {words['accuracy']})"
            + (f"; the two move together within groups (r = {r:+.2f}): one relation, which "
               "the data cannot split into quantity and quality" if collinear else "")
            + ("; every teacher's set has the same size here, so the accuracy term is quality "
               "alone" if same_size else "")
        )  # fmt: skip
    matched = matched_contrasts(arms, alpha, effect, min_replicates)
    mrows = [[m["task"], m["student"], m["teacher"], *_interval(m["estimate"]), m["verdict"]]
             for m in matched]  # fmt: skip
    if matched:
        counts = pd.Series([m["verdict"] for m in matched]).value_counts().to_dict()
        readings.append(
            "per_teacher against matched (more data from the same teacher): "
            + ", ".join(f"{v} {k}" for k, v in counts.items())
        )
    tables = [_table("Gain on training-set size and teacher accuracy, together (points)",
                     ["regime", "term", "estimate", "p", "reading"], rows)]  # fmt: skip
    if mrows:
        tables.append(_table("per_teacher − matched, same teacher (points)",
                             ["task", "student", "teacher", "difference", "low", "high",
                              "verdict"], mrows))  # fmt: skip
    return _study(
        "Quantity versus quality",
        "A stronger teacher solves more questions (more examples) and writes different traces. "
        "Within each (task, student) group, the teachers' gains are regressed on log2 of their "
        "training-set size and on their accuracy together. Teachers are the unit: each term is "
        "tested against every order of the teachers, the same on every task and student, and "
        "reads 'more gain' or 'less gain' only when it rejects at alpha ('too few' where this "
        "many teachers cannot). Where the matched regime ran, each teacher's per_teacher "
        "adapter is set against its matched one (same teacher, fewer examples), paired on the "
        "test items, Bonferroni over the group's teachers.",
        readings,
        tables,
        fits=fits,
        matched=matched,
    )


def matched_contrasts(
    arms: Arms, alpha: float, effect: float, min_replicates: int = 3
) -> list[dict[str, Any]]:
    """Each teacher's per_teacher arm minus its matched arm, per (task, student)."""
    out = []
    for (task, student, regime), (_, teachers) in arms.items():
        other = arms.get((task, student, "matched"))
        if regime != "per_teacher" or other is None:
            continue
        shared = [t for t in teachers if t in other[1]]
        for t in shared:
            x, y = _arm(teachers[t], min_replicates), _arm(other[1][t], min_replicates)
            est = teacher_level.difference(x, y, 1 - alpha / len(shared))
            out.append({"task": task, "student": student, "teacher": t, "estimate": est,
                        "verdict": teacher_level.verdict(est, effect, x.exploratory or y.exploratory)})  # fmt: skip
    return out


# --- 3. regime flips -----------------------------------------------------------------------------


def regime_flips(result: dict[str, Any], arms: Arms, alpha: float) -> dict[str, Any]:
    """Per (task, student) and each regime against per_teacher: the two answers, whether the
    recommendation flips, and the change of the two point-best teachers' difference between
    the regimes (a difference of differences with the rule's interval)."""
    groups = {(g["task"], g["student"], g["regime"]): g for g in result["groups"] if g["decision"]}
    flips, rows = [], []
    for (task, student, regime), g in groups.items():
        ref = groups.get((task, student, "per_teacher"))
        if regime == "per_teacher" or regime.startswith("mix") or ref is None:
            continue
        others = sum(1 for k in groups if k[:2] == (task, student) and k[2] != "per_teacher"
                     and not k[2].startswith("mix"))  # fmt: skip
        f = flip(ref["decision"], g["decision"], arms, (task, student), regime, alpha / others)
        flips.append({"task": task, "student": student, "regime": regime, **f})
        rows.append([task, student, regime, f["answer_ref"], f["answer"], f["pair"],
                     *_interval(f["interaction"]), f["ranking_flips"], f["point_reversals"],
                     f["status"]])  # fmt: skip
    n = pd.Series([f["status"] for f in flips]).value_counts().to_dict() if flips else {}
    readings = [
        f"{sum(n.values())} (task, student, regime) comparisons with per_teacher: "
        + ", ".join(f"{v} {k}" for k, v in n.items())
    ] if flips else ["only one teacher regime ran: nothing to compare"]  # fmt: skip
    columns = ["task", "student", "regime", "answer (per_teacher)", "answer (regime)"]
    columns += ["pair (A − B)", "change of A − B", "low", "high", "ranking flips"]
    columns += ["point-order reversals", "status"]
    return _study(
        "Regime flips",
        "Does the recommended teacher change between per_teacher and another regime? 'flip': "
        "both answers name a teacher and they differ (each shown best in its own regime); "
        "'same': the same teacher, or 'none' in both; 'inconclusive': an answer is inconclusive. "
        "The change of A − B (A, B: the point-best teachers of per_teacher and of the regime) is "
        "(A − B in per_teacher) − (A − B in the regime), over items and all four arms' "
        "replicates (Bonferroni over the regimes compared). Ranking flips: teacher pairs whose "
        "verdict reverses (better in one regime, worse in the other); point-order reversals: "
        "pairs whose point estimates reverse without that.",
        readings,
        [_table("Recommendation per regime against per_teacher (points)", columns, rows)],
        flips=flips,
    )


def flip(
    ref: dict, other: dict, arms: Arms, ts: tuple[str, str], regime: str, alpha: float
) -> dict[str, Any]:
    def best(d: dict) -> str:
        return max(d["teachers"], key=lambda t: t["post_acc"])["teacher"]

    a, b = best(ref), best(other)
    named = {ref["answer"], other["answer"]} & {
        teacher_level.ANSWERS_NONE,
        teacher_level.INCONCLUSIVE,
    }
    if ref["answer"] == other["answer"] and ref["answer"] != teacher_level.INCONCLUSIVE:
        status = "same"
    elif not named:
        status = "flip"
    else:
        status = teacher_level.INCONCLUSIVE
    interaction = None
    if a != b:
        interaction = interaction_contrast(arms[(*ts, "per_teacher")][1], arms[(*ts, regime)][1],
                                           a, b, 1 - alpha)  # fmt: skip
    verdicts = {(q["a"], q["b"]): q for q in ref["pairs"]}
    ranking, reversals = 0, 0
    for q in other["pairs"]:
        p = verdicts.get((q["a"], q["b"]))
        if p is None:
            continue
        if {p["verdict"], q["verdict"]} == {"better", "worse"}:
            ranking += 1
        elif np.sign(p["diff"]) * np.sign(q["diff"]) < 0:
            reversals += 1
    pair = f"{a} − {b}" if a != b else f"{a} point-best in both"  # no pair to contrast
    return {"answer_ref": ref["answer"], "answer": other["answer"], "pair": pair,
            "interaction": interaction, "ranking_flips": ranking, "point_reversals": reversals,
            "status": status}  # fmt: skip


def interaction_contrast(
    ref: Mapping[str, Sequence[np.ndarray]],
    other: Mapping[str, Sequence[np.ndarray]],
    a: str,
    b: str,
    level: float,
) -> teacher_level.Estimate | None:
    """(A − B under ref) − (A − B under other) on the same items: teacher_level.contrast with the
    four arms' replicates."""
    if not all(t in arms_ for arms_ in (ref, other) for t in (a, b)):
        return None
    four = [_arm(ref[a]), _arm(ref[b]), _arm(other[a]), _arm(other[b])]
    items = [x.units.mean(axis=0) for x in four]
    d = items[0] - items[1] - items[2] + items[3]
    reps = [x.units for x in four if x.n_replicates > 1]
    pooled = teacher_level.pool(reps)
    centre, se, df, half = (float(v) for v in teacher_level.contrast(d, reps, pooled, level))
    point = float(d.mean())
    return teacher_level.Estimate(point, min(centre - half, point), max(centre + half, point), level,
                              se, df)  # fmt: skip


# --- 4. the capacity gap proper ------------------------------------------------------------------


PROPS = {  # teacher property of the interaction: (its scale, the unit its coefficient is per)
    "teacher_acc": (lambda x: 10 * x, "10 pts of teacher accuracy"),
    "teacher_size": (np.log10, "tenfold teacher size"),
}


def size_interaction(
    frame: pd.DataFrame, alpha: float, prop: str = "teacher_acc"
) -> dict[str, Any]:
    """gain ~ teacher property x log10(student size), with each (task, student) and each
    (task, teacher) its own effect (a teacher's effect on every student of a task is not
    evidence). The coefficient: points of gain per unit of the property (PROPS), per tenfold
    student size; positive means strong teachers pay off more for larger students (the capacity
    gap). Students are the unit: the test sets it against every order of the students' sizes,
    the same on every task (grid_level.student_interaction), so a teacher x student effect
    unrelated to size is never read as one. With S students it can reach p = 2 / S! at best:
    `smallest_p`, and `needed` the students a design needs. Uses the tasks that hold every
    student with every teacher (a balanced block)."""
    df = frame.dropna(subset=["gain", prop, "student_size"])
    df = df[(df["student_size"] > 0) & (df[prop] > 0)]
    n_students = int(df["student"].nunique())
    out: dict[str, Any] = {
        "estimate": None, "test": None, "n_students": n_students,
        "n_sizes": int(df["student_size"].nunique()), "n_tasks": int(df["task"].nunique()),
        "smallest_p": grid_level.smallest_p(n_students),
        "needed": grid_level.units_needed(alpha), "prop": prop,
    }  # fmt: skip
    if out["n_sizes"] < 2 or df["teacher"].nunique() < 2:
        return out
    keys, _, arr = grid_level.block(df, ["gain", prop, "student_size"])
    tasks, students, gain = grid_level.cube(keys, arr["gain"])
    if not tasks:
        return out
    size = np.log10(grid_level.cube(keys, arr["student_size"])[2][0, :, 0])
    scaled = PROPS[prop][0](grid_level.cube(keys, arr[prop])[2].mean(axis=1))  # (tasks, teachers)
    stat = grid_level.student_interaction(100 * gain, scaled, size)
    test = teacher_test(stat, len(students), alpha)
    out.update(n_tasks=len(tasks), smallest_p=test.smallest_p, test=test.as_dict(),
               estimate=None if math.isnan(test.statistic) else test.statistic)  # fmt: skip
    out["word"] = claim(test, "strong teachers pay off more for larger students",
                        "strong teachers pay off more for smaller students", "students")  # fmt: skip
    return out


def inverted_u(frame: pd.DataFrame, alpha: float, min_side: int = 2) -> dict[str, Any]:
    """Two-lines test (Simonsohn 2018) for an inverted U of gain in teacher accuracy: the peak of
    a quadratic fit (each group its own intercept) splits the accuracies; a line on each side
    (own intercepts per group) must rise before and fall after, each one-sided at alpha against
    every order of the teachers over the whole grid (an intersection-union test: its error is
    at most alpha). Fewer than `min_side` teachers of a group on each side, or too few teachers
    for a one-sided test to reach alpha: too few to tell."""
    out: dict[str, Any] = {"peak": NAN, "rising": None, "falling": None, "quadratic": None}
    _, teachers, arr = grid_level.block(frame, ["gain", "teacher_acc"])
    n = len(teachers)
    if not len(arr["gain"]) or np.unique(arr["teacher_acc"]).size < 3:
        return {**out, "status": TOO_FEW, "why": "fewer than 3 teacher accuracies"}
    needed = max(2 * min_side, grid_level.units_needed(alpha, grid_level.GREATER))
    if n < needed:
        return {**out, "status": TOO_FEW,
                "why": f"{n} teachers: it needs ≥ {needed} (two on each side of a peak, and a "
                       f"one-sided teacher-level test that can reach p ≤ {alpha:g})"}  # fmt: skip
    y: np.ndarray = 100 * arr["gain"]
    x: np.ndarray = 10 * arr["teacher_acc"]
    xc = x - x.mean()
    b1, b2 = grid_level.within_slopes(y, np.stack([xc, xc**2], axis=2))(np.arange(n)[None])[0]
    if math.isnan(b2):
        return {**out, "status": TOO_FEW, "why": "the quadratic cannot be fitted"}
    peak = float(x.mean() - b1 / (2 * b2)) if b2 < 0 else NAN
    out.update(quadratic=float(b2), peak=peak)
    if math.isnan(peak) or not x.min() < peak < x.max():
        return {**out, "status": "no inverted U",
                "why": "the quadratic fit has no peak inside the teachers' accuracies"}  # fmt: skip
    low = x < peak
    if min(low.sum(axis=1).max(), (~low).sum(axis=1).max()) < min_side:
        return {**out, "status": TOO_FEW,
                "why": f"no group has {min_side} teachers on each side of the peak"}  # fmt: skip
    lines = np.stack([np.where(low, x - peak, 0.0), np.where(low, 0.0, x - peak),
                      (~low).astype(float)], axis=2)  # fmt: skip
    two = grid_level.within_slopes(y, lines)
    rising = teacher_test(grid_level.column(two, 0), n, alpha, grid_level.GREATER)
    falling = teacher_test(grid_level.column(two, 1), n, alpha, grid_level.LESS)
    out.update(rising=rising.as_dict(), falling=falling.as_dict())
    if rising.too_few or falling.too_few:
        return {**out, "status": TOO_FEW,
                "why": f"{n} teachers: no one-sided teacher-level test reaches p ≤ {alpha:g} "
                       f"(it needs ≥ {rising.needed})"}  # fmt: skip
    shown = rising.rejects and falling.rejects
    return {**out, "status": "inverted U" if shown else teacher_level.INCONCLUSIVE,
            "why": f"rising p = {rising.p:.3f}, falling p = {falling.p:.3f} over {n} teachers"}  # fmt: skip


def capacity_gap(frame: pd.DataFrame, alpha: float) -> dict[str, Any]:
    """The student-size x teacher-accuracy (and x teacher-size) interaction and the inverted-U
    test, per regime."""
    rows, readings, per = [], [], []
    for regime in teacher_regimes(frame):
        mine = frame[frame["regime"] == regime]
        inters = [size_interaction(mine, alpha, p) for p in PROPS]
        hump = inverted_u(mine, alpha)
        per.append({"regime": regime, "interactions": inters, "inverted_u": hump})
        for inter in inters:
            word, reading = _interaction_words(inter, alpha)
            rows.append([regime, f"{inter['prop']} × student size", _fmt(inter["estimate"], True),
                         _pval((inter["test"] or {}).get("p")), "", inter["n_students"],
                         inter["n_tasks"], word])  # fmt: skip
            readings.append(f"{regime}: {reading}")
        rows.append([regime, "inverted U (two lines)", _fmt(hump["peak"] * 10),
                     _pval((hump["rising"] or {}).get("p")),
                     _pval((hump["falling"] or {}).get("p")), "", "",
                     f"{hump['status']}: {hump['why']}"])  # fmt: skip
        readings.append(
            f"{regime}: inverted U of gain in teacher accuracy: {hump['status']} ({hump['why']})"
        )
    columns = ["regime", "test", "estimate / peak (pts)", "p / p rising", "p falling"]
    columns += ["students", "tasks", "reading"]
    return _study(
        "The capacity gap proper",
        "Does the payoff of a stronger teacher depend on the student's size? gain ~ teacher "
        "accuracy (and, separately, log10 teacher size) × log10 student size, with every "
        "(task, student) and every (task, teacher) its own effect. Students are the unit: the "
        "coefficient is tested against every order of the students' sizes, the same on every "
        "task, so a teacher × student effect unrelated to size is not evidence; with S students "
        "the best p is 2 / S!, and below 5 students it says 'too few'. Is gain an inverted U in "
        "teacher accuracy? Two-lines test: the quadratic fit's peak splits the teachers; gain "
        "must rise before it and fall after it, each line one-sided at alpha against every "
        "order of the teachers over the grid ('too few' where that cannot reach alpha).",
        readings,
        [_table("Capacity gap: interaction and inverted U", columns, rows)],
        per_regime=per,
    )


def _interaction_words(inter: dict[str, Any], alpha: float) -> tuple[str, str]:
    """The interaction's word and its reading."""
    unit = PROPS[inter["prop"]][1]
    word = inter.get("word") or (
        f"{TOO_FEW} students ({inter['n_sizes']} student size(s), {inter['n_tasks']} task(s))"
    )
    est = "–" if inter["estimate"] is None else f"{inter['estimate']:+.2f}"
    p = (inter["test"] or {}).get("p")
    return word, (
        f"gain ~ {inter['prop']} × student size {est} pts per {unit} per tenfold student size"
        + ("" if p is None else f" (student-level p = {p:.3f})")
        + f": {word}"
    )


# --- 5. ΔLarge, ΔLong, family averages -----------------------------------------------------------


def delta_pairs(
    result: dict[str, Any], large: Sequence[str] | None, long: Sequence[str] | None
) -> dict[str, Any]:
    """The configured pairs' difference in post per group: the group's own pairwise interval and
    verdict (teacher_level.decide_group), next to each teacher's gain over the baseline."""
    rows: list[list] = []
    found: list[dict[str, Any]] = []
    for name, pair in (("ΔLarge", large), ("ΔLong", long)):
        if not pair:
            continue
        for g in result["groups"]:
            d = g["decision"]
            q = pair_of(d, *pair) if d else None
            if q is None:
                continue
            found.append({"name": name, "task": g["task"], "student": g["student"],
                          "regime": g["regime"], **q})  # fmt: skip
            rows.append([name, g["task"], g["student"], g["regime"], f"{pair[0]} − {pair[1]}",
                         *_interval(q["estimate"]), q["verdict"], _fmt(100 * q["gain_a"], True),
                         _fmt(100 * q["gain_b"], True)])  # fmt: skip
    readings = []
    for name, pair in (("ΔLarge", large), ("ΔLong", long)):
        mine = [f["verdict"] for f in found if f["name"] == name]
        if pair and mine:
            counts = pd.Series(mine).value_counts().to_dict()
            readings.append(f"{name} ({pair[0]} − {pair[1]}): " + ", ".join(
                f"{pair[0]} {k} in {v}" for k, v in counts.items()) + " group(s)")  # fmt: skip
        elif pair:
            readings.append(f"{name} ({pair[0]} − {pair[1]}): no group has both teachers")
    if not readings:
        readings = ["analysis.delta_large and analysis.delta_long are not set"]
    columns = ["Δ", "task", "student", "regime", "pair", "difference", "low", "high", "verdict"]
    columns += ["gain A", "gain B"]
    return _study(
        "ΔLarge and ΔLong (configured pairs)",
        "Earlier work's summary numbers with the pairs it used: ΔLarge = post(large) − "
        "post(small) for analysis.delta_large, ΔLong = post(long-CoT) − post(short-CoT) for "
        "analysis.delta_long, with the group's pairwise interval and verdict (Bonferroni over "
        "its teacher pairs), next to each teacher's gain over the student's own baseline.",
        readings,
        [_table("Configured teacher pairs (points)", columns, rows)],
        pairs=found,
    )


def pair_of(d: dict[str, Any], a: str, b: str) -> dict[str, Any] | None:
    """post(a) − post(b) from a group decision's pairs (which hold b − a, ordered by teacher)."""
    gains = {t["teacher"]: t["gain"] for t in d["teachers"]}
    for q in d["pairs"]:
        if {q["a"], q["b"]} == {a, b}:
            sign = 1 if q["b"] == a else -1
            low, high = sorted((sign * q["low"], sign * q["high"]))
            flipped = {"better": "worse", "worse": "better"}
            verdict = q["verdict"] if sign == 1 else flipped.get(q["verdict"], q["verdict"])
            est = teacher_level.Estimate(sign * q["diff"], low, high, q["level"], NAN, NAN)
            return {"estimate": est, "verdict": verdict, "gain_a": gains[a], "gain_b": gains[b]}
    return None


def family_averages(
    arms: Arms,
    families: Mapping[str, Sequence[str]],
    alpha: float,
    effect: float,
    min_replicates: int = 3,
) -> dict[str, Any]:
    """Per (family of two or more tasks, student, regime, teacher): the mean over the family's
    tasks of post and of gain, the gain's interval from the tasks' (independent items and
    replicates: variances add) and its verdict, Bonferroni over the teachers."""
    by: dict[tuple[str, str, str], list[str]] = {}
    for task, student, regime in arms:
        by.setdefault((family_of(task, families), student, regime), []).append(task)
    rows: list[list] = []
    found: list[dict[str, Any]] = []
    for (fam, student, regime), tasks in by.items():
        if len(tasks) < 2:
            continue
        teachers = set.intersection(*(set(arms[(t, student, regime)][1]) for t in tasks))
        base = float(np.mean([arms[(t, student, regime)][0].mean() for t in tasks]))
        for teacher in sorted(teachers, key=str):
            est, exploratory, post = family_gain(arms, tasks, student, regime, teacher,
                                                 1 - alpha / len(teachers), min_replicates)  # fmt: skip
            verdict = teacher_level.verdict(est, effect, exploratory)
            found.append({"family": fam, "student": student, "regime": regime,
                          "teacher": teacher, "tasks": tasks, "base": base, "post": post,
                          "gain": est, "verdict": verdict})  # fmt: skip
            rows.append([fam, len(tasks), student, regime, teacher, _fmt(100 * base),
                         _fmt(100 * post), *_interval(est), verdict])  # fmt: skip
    readings = [
        f"{f['family']} average, {f['student']} ({f['regime']}) from {f['teacher']}: gain "
        f"{_ci(f['gain'])} pts: {f['verdict']}"
        for f in found
    ] or ["no family has two or more tasks in this grid"]
    columns = ["family", "tasks", "student", "regime", "teacher", "base", "post", "gain", "low"]
    columns += ["high", "vs base"]
    return _study(
        "Task-family averages",
        "Averages over a family's tasks (analysis.families, else the task name's prefix: "
        "bbh_* is BBH), each task weighted equally, as earlier work reports its BBH average. "
        "The gain's interval adds the tasks' variances (their items and replicates are "
        "independent), with Satterthwaite degrees of freedom, Bonferroni over the teachers.",
        readings,
        [_table("Family averages (points)", columns, rows)],
        averages=found,
    )


def family_gain(
    arms: Arms, tasks: list[str], student: str, regime: str, teacher: str, level: float,
    min_replicates: int = 3,
) -> tuple[teacher_level.Estimate, bool, float]:  # fmt: skip
    """The mean over tasks of a teacher's gain, with its interval at `level`."""
    k = len(tasks)
    parts, points, posts, exploratory = [], [], [], False
    for t in tasks:
        base, teachers = arms[(t, student, regime)]
        a = _arm(teachers[teacher], min_replicates)
        e = teacher_level.difference(a, teacher_level.baseline_arm(base), level)
        parts.append(((e.se / k) ** 2, e.df))
        points.append(e.estimate)
        posts.append(a.accuracy)
        exploratory = exploratory or a.exploratory
    se = math.sqrt(sum(v for v, _ in parts))
    df = float(teacher_level.satterthwaite(parts))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    m = float(np.mean(points))
    return (
        teacher_level.Estimate(m, m - half, m + half, level, se, df),
        exploratory,
        float(np.mean(posts)),
    )


# --- 6. the mix against its parts ----------------------------------------------------------------


def mix_parts(
    arms: Arms, parts: Sequence[str], alpha: float, effect: float, min_replicates: int = 3
) -> dict[str, Any]:
    """Each mix adapter (every budget alignment) against each component teacher's per_teacher
    adapter, paired on the test items, Bonferroni over the comparisons of a (task, student)."""
    rows: list[list] = []
    found: list[dict[str, Any]] = []
    for (task, student, regime), (_, teachers) in arms.items():
        ref = arms.get((task, student, "per_teacher"))
        if not regime.startswith("mix") or "mix" not in teachers or ref is None:
            continue
        mixes = sum(1 for k in arms if k[:2] == (task, student) and k[2].startswith("mix"))
        present = [p for p in parts if p in ref[1]]
        for p in present:
            x, y = _arm(teachers["mix"], min_replicates), _arm(ref[1][p], min_replicates)
            est = teacher_level.difference(x, y, 1 - alpha / max(1, mixes * len(present)))
            verdict = teacher_level.verdict(est, effect, x.exploratory or y.exploratory)
            found.append({"task": task, "student": student, "regime": regime, "part": p,
                          "estimate": est, "verdict": verdict})  # fmt: skip
            rows.append([task, student, regime, p, _fmt(100 * x.accuracy),
                         _fmt(100 * y.accuracy), *_interval(est), verdict])  # fmt: skip
    readings = [
        f"{f['student']} on {f['task']}: {f['regime']} − {f['part']} {_ci(f['estimate'])} pts: "
        f"the mix is {f['verdict']}"
        for f in found
    ] or ["no mix regime, or no per_teacher adapters of its teachers: nothing to compare"]
    columns = ["task", "student", "mix (alignment)", "component", "post mix", "post component"]
    columns += ["mix − component", "low", "high", "verdict"]
    return _study(
        "The mix against its parts",
        "Each mix adapter (as configured, and under every budget alignment: mix@updates trains "
        "as many updates as the reference, mix@batch at the single-teacher batch) against the "
        "per_teacher adapter of each teacher it mixes, paired on the same test items, over "
        "items and replicates, Bonferroni over the (task, student)'s comparisons.",
        readings,
        [_table("Mix against each component (points)", columns, rows)],
        comparisons=found,
    )


# --- 8. task pre-selection's effect --------------------------------------------------------------


def selection_effect(
    frame: pd.DataFrame, selection: list[dict[str, Any]], alpha: float
) -> dict[str, Any]:
    """Mean teacher gain on the tasks pre-selection passed against the gated tasks run anyway
    (select.run_gated), per regime, with the task as the unit: each task's mean gain (over its
    students and teachers, who share its traces), then Welch's difference of the two groups'
    means (teacher_level.satterthwaite's degrees of freedom). A regression clustered by task, tried
    first, claimed a difference in 13% of null grids of 6 + 6 tasks (a treatment that is
    constant within clusters is where CR1 errs most)."""
    status = {d["task"]: d["passed"] for d in selection}
    rows: list[list] = []
    found: list[dict[str, Any]] = []
    for regime in teacher_regimes(frame):
        mine = frame[(frame["regime"] == regime) & frame["task"].isin(status)]
        means = 100 * mine.dropna(subset=["gain"]).groupby("task")["gain"].mean()
        chosen = means.index.map(status).astype(bool)
        a, b = means[chosen].to_numpy(), means[~chosen].to_numpy()
        if not len(a) or not len(b):
            continue
        est = welch(a, b, 1 - alpha)
        word = direction(est, "larger gains on selected tasks", "smaller gains on selected tasks")
        found.append({"regime": regime, "estimate": est, "reading": word,
                      "selected": sorted(means.index[chosen]),
                      "gated": sorted(means.index[~chosen])})  # fmt: skip
        rows.append([regime, len(a), len(b), _fmt(a.mean(), True), _fmt(b.mean(), True),
                     *_interval(est, 1), word])  # fmt: skip
    readings = [
        f"{f['regime']}: selected − gated mean gain {_ci(f['estimate'], 1)} pts over "
        f"{len(f['selected'])} selected and {len(f['gated'])} gated task(s): {f['reading']}"
        + (" (a side with one task has no spread to measure)" if f["estimate"] is None else "")
        for f in found
    ] or ["no gated task was run (select.run_gated: 0): the selection's effect is not measured"]
    columns = ["regime", "selected tasks", "gated tasks run", "mean gain selected"]
    columns += ["mean gain gated", "selected − gated", "low", "high", "reading"]
    return _study(
        "Task pre-selection's effect",
        "Pre-selection keeps tasks with a wide teacher spread, so what the study finds may not "
        "extend to the others. With select.run_gated, a seeded sample of gated tasks is run "
        "anyway; the teachers' mean gain there is set against the selected tasks', with the "
        "task as the unit (Welch's interval on the tasks' mean gains). With one task on a side "
        "the spread there is unknown: too few.",
        readings,
        [_table("Selected against gated tasks (points)", columns, rows)],
        contrasts=found,
    )


def welch(a: np.ndarray, b: np.ndarray, level: float) -> teacher_level.Estimate | None:
    """mean(a) − mean(b) with Welch's interval; None when a side has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    parts = [(float(np.var(x, ddof=1)) / len(x), len(x) - 1) for x in (a, b)]
    se = math.sqrt(sum(v for v, _ in parts))
    df = float(teacher_level.satterthwaite(parts))
    d = float(a.mean() - b.mean())
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se if se > 0 else 0.0
    return teacher_level.Estimate(d, d - half, d + half, level, se, df)
