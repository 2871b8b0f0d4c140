"""Error rates and power of the study analyses (harness/analysis/studies.py), by simulation with known truth.

    .venv/bin/python -m benchmarks.studies              # about 10 minutes on 2 cores
    .venv/bin/python -m benchmarks.studies --runs 200   # quicker, noisier
    .venv/bin/python -m benchmarks.studies --grid --runs 100   # the grid-level suite
    .venv/bin/python -m benchmarks.studies --level --runs 10000   # each test's level, on arrays

Each analysis is run on synthetic grids twice: with an effect planted (the share of runs that
find it: power) and with none (the share that claim one anyway: the false-positive rate, to be
compared with its stated alpha = 0.05). The nulls carry what makes them hard: a teacher effect on
every student of a task (shared traces), unrelated to the property under test, and a task effect.
tests/test_studies.py runs the same functions with few runs and asserts the bounds; the Markdown
table this prints goes to benchmarks/README.md. With --grid: every cross-group reading under
nulls where a teacher's quality is shared by every task and student (with teacher x task and
teacher x student effects), grids of 3-8 teachers, 2-4 students, 4-12 tasks, next to the naive
test that permutes teachers within each task; then power at realistic effects
(tests/test_cross_group.py runs a few of these cells).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import studies as st
from harness.stats import grid_level, teacher_level

ALPHA = 0.05
SIZES = (1e8, 1e9, 1e10)


def teacher_grid(
    rng: np.random.Generator,
    gain: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    tasks: int = 12,
    teachers: int = 5,
    teacher_sd: float = 0.03,
    noise_sd: float = 0.02,
    students: int = 3,
    quality_sd: float = 0.0,
    teacher_student_sd: float = 0.0,
) -> pd.DataFrame:
    """A teacher-level frame (studies.teacher_frame's columns) with known truth. Teachers keep
    their order of accuracy on every task (t0 the weakest; accuracies over 20-90%, drawn per
    task); `students` sizes from 1e8 to 1e10. The gain is `gain(acc, log10 student size, log2
    examples)` (fractions) plus the effects that make a null hard: a teacher quality the same on
    every task and student (SD `quality_sd`), a teacher x task effect every student of the task
    shares (SD `teacher_sd`), a teacher x student effect the same on every task (SD
    `teacher_student_sd`), a (task, student) effect and noise; none is related to the property
    under test. Training-set size grows with accuracy, with its own noise."""
    sizes = np.logspace(8, 10, students)
    quality = rng.normal(0, quality_sd, teachers)
    by_student = rng.normal(0, teacher_student_sd, (students, teachers))
    rows = []
    for k in range(tasks):
        acc = np.sort(rng.uniform(0.2, 0.9, teachers))
        log_n = 6 + 2 * acc + rng.normal(0, 0.8, teachers)
        shared = rng.normal(0, teacher_sd, teachers)
        for i, size in enumerate(sizes):
            ls = np.full(teachers, np.log10(size))
            g = (
                gain(acc, ls, log_n)
                + quality
                + by_student[i]
                + shared
                + rng.normal(0, 0.02)
                + rng.normal(0, noise_sd, teachers)
            )
            for t in range(teachers):
                rows.append(
                    {"task": f"task{k}", "student": f"s{i}", "regime": "per_teacher",
                     "teacher": f"t{t}", "post_acc": 0.3 + g[t], "gain": g[t], "gain_low": np.nan,
                     "gain_high": np.nan, "verdict": None, "base_acc": 0.3,
                     "teacher_acc": acc[t], "teacher_size": 1e9 * (t + 1), "student_size": size,
                     "n_examples": 2 ** log_n[t], "family": "all"}
                )  # fmt: skip
    return pd.DataFrame(rows)


def _none(acc: np.ndarray, ls: np.ndarray, log_n: np.ndarray) -> np.ndarray:
    return np.zeros_like(acc)


# --- per analysis: does one run claim an effect? -------------------------------------------------


def claimed(word: str) -> bool:
    """Whether a reading states a direction (neither too few nor inconclusive)."""
    return not word.startswith(st.TOO_FEW) and word != teacher_level.INCONCLUSIVE


def stronger_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """The win-rate trend: planted, post rises with teacher accuracy (the stronger teacher wins
    more often the larger the gap); null, post is unrelated to accuracy."""
    frame = teacher_grid(rng, (lambda a, s, n: 0.25 * a) if planted else _none, **grid)
    return claimed(st.win_rate_fit(frame, ALPHA, (0, 20, 40, 100))["trend"])


def bins_claim(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """Any of the win-rate bins: planted and null as for the trend."""
    frame = teacher_grid(rng, (lambda a, s, n: 0.25 * a) if planted else _none, **grid)
    return any(
        claimed(b["reading"]) for b in st.win_rate_fit(frame, ALPHA, (0, 20, 40, 100))["bins"]
    )


def quantity_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """The training-set-size term: planted, +2.5 points per doubling of examples; null, none."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return 0.025 * n if planted else 0 * a

    tests, _ = st.size_and_accuracy(teacher_grid(rng, gain, **grid), ALPHA)
    return claimed(st.claim(tests["examples"], "up", "down"))


def accuracy_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """The teacher-accuracy term of quantity vs quality: planted, +2.5 points of gain per 10
    points of accuracy; null, none."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return 0.25 * a if planted else 0 * a

    tests, _ = st.size_and_accuracy(teacher_grid(rng, gain, **grid), ALPHA)
    return claimed(st.claim(tests["accuracy"], "up", "down"))


def interaction_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """Student size x teacher accuracy, 5 students by default (fewer can never reach p <= 0.05):
    planted, a strong teacher pays 14 points more for a 100-fold larger student (accuracy
    range 70 points); null, no interaction, but teacher
    effects (and in the grids of `NULLS`, teacher x student effects) unrelated to size."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return 0.1 * (a - 0.55) * (s - 9) if planted else 0.1 * a

    grid = {"teacher_sd": 0.05, "students": 5, **grid}
    got = st.size_interaction(teacher_grid(rng, gain, **grid), ALPHA)
    return claimed(st._interaction_words(got, ALPHA)[0])


def inverted_u_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """Inverted U: planted, gain peaks at 55% teacher accuracy, 10 points above the ends; null,
    gain rises steadily with accuracy (monotone: no U)."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return -0.8 * (a - 0.55) ** 2 if planted else 0.1 * a

    got = st.inverted_u(teacher_grid(rng, gain, **{"teachers": 8, **grid}), ALPHA)
    return got["status"] == "inverted U"


def capacity_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """The report's capacity-gap test (gain against teacher accuracy, mean within-group rho):
    planted, +2.5 points of gain per 10 points of accuracy; null, none."""
    from harness.analysis import analyze
    from harness.config.schema import AnalysisConfig

    frame = teacher_grid(rng, (lambda a, s, n: 0.25 * a) if planted else _none, **grid)
    got = analyze.capacity_gap(AnalysisConfig(), frame)["gain~teacher_acc"]
    return bool(got["rejects"])


def _draws(arm: np.ndarray, s: int) -> list[np.ndarray]:
    return list(arm[s])  # each replicate its own trace draw


def flip_claims(rng: np.random.Generator, planted: bool, runs: int = 1) -> list[bool]:
    """The change of A − B between regimes: planted, A leads B by 20 points in one regime and
    trails it by 20 in the other; null, the same 20-point lead in both. 200 items, 3 replicates
    at a 2-point SD."""
    _, ref = teacher_level.simulate(rng, runs, 200, 0.3, [0.6, 0.4], 3, 0.02)
    _, other = teacher_level.simulate(rng, runs, 200, 0.3, [0.4, 0.6] if planted else [0.6, 0.4], 3,
                                  0.02)  # fmt: skip
    out = []
    for s in range(runs):
        e = st.interaction_contrast(
            {"A": _draws(ref[0], s), "B": _draws(ref[1], s)},
            {"A": _draws(other[0], s), "B": _draws(other[1], s)},
            "A", "B", 1 - ALPHA,
        )  # fmt: skip
        out.append(st.direction(e, "up", "down") in ("up", "down"))
    return out


def family_claims(rng: np.random.Generator, planted: bool, runs: int = 1) -> list[bool]:
    """A family average over three tasks of 100 items: planted, the teacher gains 10 points on
    each; null, none. 3 replicates at a 3-point SD."""
    sims = [teacher_level.simulate(rng, runs, 100, 0.4, [0.5 if planted else 0.4], 3, 0.03)
            for _ in range(3)]  # fmt: skip
    out = []
    for s in range(runs):
        arms = {(f"bbh_{k}", "stu", "per_teacher"): (base[s], {"T": _draws(a[0], s)})
                for k, (base, a) in enumerate(sims)}  # fmt: skip
        got = st.family_averages(arms, {}, ALPHA, 0.03)["averages"][0]
        out.append(got["verdict"] in ("better", "worse"))
    return out


def mix_claims(rng: np.random.Generator, planted: bool, runs: int = 1) -> list[bool]:
    """The mix against its two parts (200 items, 3 replicates at a 2-point SD): planted, the
    mix is 15 points above both; null, all three equal. Any better/worse is a claim."""
    accs = [0.6 if planted else 0.45, 0.45, 0.45]
    _, (mix, a, b) = teacher_level.simulate(rng, runs, 200, 0.3, accs, 3, 0.02)
    out = []
    for s in range(runs):
        arms = {("t", "stu", "per_teacher"): (None, {"A": _draws(a, s), "B": _draws(b, s)}),
                ("t", "stu", "mix"): (None, {"mix": _draws(mix, s)})}  # fmt: skip
        found = st.mix_parts(arms, ["A", "B"], ALPHA, 0.03)["comparisons"]
        out.append(any(c["verdict"] in ("better", "worse") for c in found))
    return out


def selection_claims(rng: np.random.Generator, planted: bool, **grid: Any) -> bool:
    """Selected against gated tasks (half and half: 6 and 6 by default): planted, teachers gain 8 points more on the
    selected; null, the same, under task and teacher effects."""
    frame = teacher_grid(rng, _none, **grid)
    tasks = frame["task"].unique()
    selected = {t: k < len(tasks) // 2 for k, t in enumerate(tasks)}
    if planted:
        frame["gain"] += frame["task"].map(selected) * 0.08
    sel = [{"task": t, "passed": p} for t, p in selected.items()]
    found = st.selection_effect(frame, sel, ALPHA)["contrasts"]
    return found[0]["reading"] not in (st.TOO_FEW, teacher_level.INCONCLUSIVE)


# --- every cross-group reading on one grid (the grid-level simulation suite) ---------------------

BINS = (0, 20, 40, 100)


def readings(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Every cross-group reading of the studies on one grid, in words, by the claim names of
    grid_level.CLAIMS (the ones `cotgap plan` judges before any compute)."""
    from harness.analysis import analyze
    from harness.config.schema import AnalysisConfig

    def word(t: dict[str, Any]) -> str:
        return st.TOO_FEW if t["too_few"] else ("claim" if t["rejects"] else "inconclusive")

    cg = analyze.capacity_gap(AnalysisConfig(), frame)
    fit = st.win_rate_fit(frame, ALPHA, BINS)
    terms, _ = st.size_and_accuracy(frame, ALPHA)
    hump = st.inverted_u(frame, ALPHA)
    bins = [b["reading"] for b in fit["bins"] if b["n_pairs"]]  # one family: any bin claims
    names = [c[0] for c in grid_level.CLAIMS]
    return dict(zip(names, [
        [word(cg["gain~teacher_acc"]), word(cg["gain~teacher_size"])],
        [fit["trend"]],
        [next((w for w in bins if claimed(w)), bins[0] if bins else st.TOO_FEW)],
        [st.claim(t, "up", "down") for t in terms.values() if t is not None],
        [{"inverted U": "claim", st.TOO_FEW: st.TOO_FEW}.get(hump["status"], "inconclusive")],
        [st._interaction_words(st.size_interaction(frame, ALPHA, p), ALPHA)[0] for p in st.PROPS],
    ], strict=True))  # fmt: skip


def naive_claims(frame: pd.DataFrame, draws: int = 999, seed: int = 0) -> bool:
    """The capacity-gap test as it is wrongly done: the mean within-group rho against
    permutations of the teachers drawn independently on every task (tasks as independent
    repeats of the teachers; the students of a task share one), for comparison."""
    rng = np.random.default_rng(seed)
    keys, _, arr = grid_level.block(frame, ["gain", "teacher_acc"])
    y, x = arr["gain"], arr["teacher_acc"]
    keep = grid_level.spread(y) & grid_level.spread(x)
    ry, rx = grid_level._standard_ranks(y[keep]), grid_level._standard_ranks(x[keep])
    tasks = pd.factorize(keys["task"][keep])[0]
    n = y.shape[1]
    orders = rng.permuted(np.tile(np.arange(n), (draws, tasks.max() + 1, 1)), axis=2)[:, tasks]
    null = np.einsum("dgt,gt->d", np.take_along_axis(rx[None], orders, axis=2), ry) / len(ry)
    observed = float((rx * ry).sum() / len(ry))
    return (1 + np.sum(np.abs(null) >= abs(observed) - 1e-12)) / (draws + 1) <= ALPHA


NULLS = {  # name: teacher_grid's arguments (gain 0: no relation to any property)
    "shared quality": {"quality_sd": 0.05},
    "shared quality + teacher x task": {"quality_sd": 0.05, "teacher_sd": 0.05},
    "shared quality + teacher x student": {"quality_sd": 0.05, "teacher_student_sd": 0.05},
}
SHAPES = [(t, s, k) for t in (2, 3, 4, 5, 6, 8) for s in (2, 4) for k in (2, 6, 12)]


def null_rates(
    runs: int, nulls: dict = NULLS, shapes: list = SHAPES, seed: int = 0, with_naive: bool = True
) -> list[dict]:
    """Per null and grid shape (teachers, students, tasks): per cross-group claim, the share of
    `runs` grids in which its worst reading line claims a direction (the bins: any bin), and
    the share in which every line says 'too few'; and the naive within-task test's rate."""
    rng = np.random.default_rng(seed)
    out = []
    for null, effects in nulls.items():
        for t, s, k in shapes:
            claims: dict[tuple[str, int], int] = {}
            few: dict[str, int] = {}
            naive = 0
            for _ in range(runs):
                frame = teacher_grid(rng, _none, tasks=k, teachers=t, students=s, **effects)
                for name, words in readings(frame).items():
                    for i, w in enumerate(words):  # each reading line on its own
                        claims[name, i] = claims.get((name, i), 0) + claimed(w)
                    few[name] = few.get(name, 0) + all(w.startswith(st.TOO_FEW) for w in words)
                naive += bool(naive_claims(frame)) if with_naive else 0
            rates: dict[str, float] = {}
            for (name, _), c in claims.items():
                rates[name] = max(rates.get(name, 0.0), c / runs)  # the worst of its lines
            out.append({"null": null, "teachers": t, "students": s, "tasks": k, "runs": runs,
                        "naive": naive / runs if with_naive else None, "claims": rates,
                        "too_few": {n: c / runs for n, c in few.items()}})  # fmt: skip
    return out


PER_RUN = {
    "capacity gap (report): gain vs teacher accuracy": capacity_claims,
    "stronger vs weaker teacher: win-rate trend": stronger_claims,
    "stronger vs weaker teacher: any win-rate bin": bins_claim,
    "quantity vs quality: examples term": quantity_claims,
    "quantity vs quality: accuracy term": accuracy_claims,
    "capacity gap: student size x teacher accuracy": interaction_claims,
    "capacity gap: inverted U (two lines)": inverted_u_claims,
    "task pre-selection: selected − gated": selection_claims,
}
VECTORISED = {
    "regime flips: change of A − B": flip_claims,
    "family average: gain": family_claims,
    "mix against its parts (any of 2)": mix_claims,
}


def rate(name: str, planted: bool, runs: int, seed: int = 0, **grid: Any) -> float:
    """Share of `runs` synthetic grids (teacher_grid's shape and effects: `grid`) in which
    analysis `name` claims an effect."""
    rng = np.random.default_rng(seed)
    if name in VECTORISED:
        return float(np.mean(VECTORISED[name](rng, planted, runs)))
    return float(np.mean([PER_RUN[name](rng, planted, **grid) for _ in range(runs)]))


GRID_SHAPES = [(t, s, k) for t in (3, 4, 5, 6, 8) for s, k in ((2, 4), (2, 12), (4, 6))]
POWER = {  # analysis: teacher_grid's arguments at a realistic effect (shared quality SD 2 pts)
    "capacity gap (report): gain vs teacher accuracy": {},
    "stronger vs weaker teacher: win-rate trend": {},
    "stronger vs weaker teacher: any win-rate bin": {},
    "quantity vs quality: examples term": {},
    "quantity vs quality: accuracy term": {},
    "capacity gap: student size x teacher accuracy": {"students": 5},
    "capacity gap: inverted U (two lines)": {"teachers": 8},
}


def grid_tables(runs: int) -> list[str]:
    """The grid-level suite as Markdown: every cross-group reading's claim rate under each null
    and grid shape (and the naive within-task test's), then power at realistic effects."""
    short = ["capacity gap", "trend", "any bin", "quantity terms", "inverted U", "size × teacher"]
    lines = ["| null | teachers | students | tasks | within-task test (naive) | "
             + " | ".join(short) + " |", "|---" * (5 + len(short)) + "|"]  # fmt: skip
    rows = (r for null in NULLS for shape in GRID_SHAPES
            for r in null_rates(runs, {null: NULLS[null]}, [shape], seed=sum(shape)))  # fmt: skip
    for row in rows:
        cells = [
            "too few" if row["too_few"][name] == 1.0 else f"{row['claims'].get(name, 0):.3f}"
            for name, *_ in grid_level.CLAIMS
        ]
        lines.append(f"| {row['null']} | {row['teachers']} | {row['students']} | {row['tasks']} "
                     f"| {row['naive']:.3f} | " + " | ".join(cells) + " |")  # fmt: skip
        print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", "| analysis | teachers | students | tasks | power |", "|---|---|---|---|---|"]
    for name, extra in POWER.items():
        for t in (5, 6, 8) if "teachers" not in extra else (extra["teachers"],):
            grid = {"tasks": 6, "students": 2, "quality_sd": 0.02, **extra, "teachers": t}
            power = rate(name, True, runs, seed=3, **grid)
            lines.append(f"| {name} | {t} | {grid['students']} | 6 | {power:.3f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def level_checks(runs: int, teachers: int = 5, groups: int = 12, seed: int = 0) -> list[str]:
    """Each grid-level statistic straight on arrays (no frames: thousands of grids a minute),
    under a null with a teacher quality shared by every group and a teacher x group effect:
    the share of `runs` grids whose test rejects at its level, per reading line."""
    rng = np.random.default_rng(seed)
    n, k = teachers, groups
    hits: dict[str, int] = {}
    for _ in range(runs):
        acc = np.sort(rng.uniform(20, 90, (k, n)), axis=1)
        log_n = 6 + acc / 50 + rng.normal(0, 0.8, (k, n))
        gain = rng.normal(0, 3, (1, n)) + rng.normal(0, 3, (k, n)) + rng.normal(0, 2, (k, 1))
        wins = grid_level.pair_wins(gain, acc)
        coefs = grid_level.within_slopes(gain, np.stack([log_n, acc / 10], axis=2))
        size = np.log10(np.logspace(8, 10, n))  # as many students as teachers
        tests = {
            "capacity gap: mean rho": (grid_level.mean_rank_correlation(gain, acc), ALPHA),
            "win-rate trend": (grid_level.win_slope(wins), ALPHA),
            "win-rate bin 20-40": (grid_level.win_rate_in(wins, 20, 40, False), ALPHA / 3),
            "quantity: examples term": (grid_level.column(coefs, 0), ALPHA),
            "quantity: accuracy term": (grid_level.column(coefs, 1), ALPHA),
            "size interaction (students)": (
                grid_level.student_interaction(gain.reshape(1, k, n)[:, :n], acc[:1], size),
                ALPHA,
            ),
        }
        for name, (stat, level) in tests.items():
            hits[name] = hits.get(name, 0) + grid_level.permutation_test(stat, n, level).rejects
    lines = ["| reading | level | rejection rate |", "|---|---|---|"]
    for name, h in hits.items():
        level = ALPHA / 3 if "bin" in name else ALPHA
        lines.append(f"| {name} | {level:.4f} | {h / runs:.4f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--grid", action="store_true", help="the grid-level suite: nulls x shapes")
    p.add_argument("--level", action="store_true", help="each grid-level test's level, on arrays")
    args = p.parse_args()
    runs = args.runs
    if args.level:
        print("\n".join(level_checks(runs)))
        print(f"\n{runs} synthetic grids, 5 teachers (5 students for the interaction).")
        return
    if args.grid:
        print("\n".join(grid_tables(runs)))
        print(f"\n{runs} synthetic grids per cell.")
        return
    print(f"| analysis | false-positive rate (null, alpha {ALPHA}) | power (planted) |")
    print("|---|---|---|")
    for name in (*PER_RUN, *VECTORISED):
        null, power = rate(name, False, runs, seed=1), rate(name, True, runs, seed=2)
        print(f"| {name} | {null:.3f} | {power:.3f} |", flush=True)
    print(f"\n{runs} synthetic grids per cell.")


if __name__ == "__main__":
    main()
