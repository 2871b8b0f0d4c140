"""Error rates and power of the study analyses (harness/analysis/studies.py), by simulation with known truth.

    .venv/bin/python -m benchmarks.studies              # about 10 minutes on 2 cores
    .venv/bin/python -m benchmarks.studies --runs 200   # quicker, noisier

Each analysis is run on synthetic grids twice: with an effect planted (the share of runs that
find it: power) and with none (the share that claim one anyway: the false-positive rate, to be
compared with its stated alpha = 0.05). The nulls carry what makes them hard: a teacher effect on
every student of a task (shared traces), unrelated to the property under test, and a task effect.
tests/test_studies.py runs the same functions with few runs and asserts the bounds; the Markdown
table this prints goes to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import pandas as pd

from harness.analysis import studies as st
from harness.stats import teacher_level

ALPHA = 0.05
SIZES = (1e8, 1e9, 1e10)


def teacher_grid(
    rng: np.random.Generator,
    gain: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    tasks: int = 12,
    teachers: int = 5,
    teacher_sd: float = 0.03,
    noise_sd: float = 0.02,
) -> pd.DataFrame:
    """A teacher-level frame (studies.teacher_frame's columns) with known truth: per task,
    teachers of accuracies spread over 20-90%, a teacher effect (SD `teacher_sd`) every student of
    the task shares, per (task, student) an effect, and `gain(acc, log10 student size, log2
    examples)` (fractions) on top. Training-set size grows with accuracy, with its own noise."""
    rows = []
    for k in range(tasks):
        acc = np.sort(rng.uniform(0.2, 0.9, teachers))
        log_n = 6 + 2 * acc + rng.normal(0, 0.8, teachers)
        shared = rng.normal(0, teacher_sd, teachers)
        for size in SIZES:
            ls = np.full(teachers, np.log10(size))
            g = (
                gain(acc, ls, log_n)
                + shared
                + rng.normal(0, 0.02)
                + rng.normal(0, noise_sd, teachers)
            )
            for t in range(teachers):
                rows.append(
                    {"task": f"task{k}", "student": f"s{int(ls[0])}", "regime": "per_teacher",
                     "teacher": f"t{t}", "post_acc": 0.3 + g[t], "gain": g[t], "gain_low": np.nan,
                     "gain_high": np.nan, "verdict": None, "base_acc": 0.3,
                     "teacher_acc": acc[t], "teacher_size": 1e9 * (t + 1), "student_size": size,
                     "n_examples": 2 ** log_n[t], "family": "all"}
                )  # fmt: skip
    return pd.DataFrame(rows)


def _none(acc: np.ndarray, ls: np.ndarray, log_n: np.ndarray) -> np.ndarray:
    return np.zeros_like(acc)


# --- per analysis: does one run claim an effect? -------------------------------------------------


def stronger_claims(rng: np.random.Generator, planted: bool) -> bool:
    """The win-rate trend: planted, post rises with teacher accuracy (the stronger teacher wins
    more often the larger the gap); null, post is unrelated to accuracy."""
    frame = teacher_grid(rng, (lambda a, s, n: 0.25 * a) if planted else _none)
    fit = st.win_rate_fit(st.teacher_pairs(frame), ALPHA, (0, 20, 40, 100))
    return fit["trend"] not in (st.TOO_FEW, teacher_level.INCONCLUSIVE)


def quantity_claims(rng: np.random.Generator, planted: bool) -> bool:
    """The training-set-size term: planted, +2.5 points per doubling of examples; null, none
    (teacher accuracy still matters: 10 points of gain over the accuracy range)."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return 0.15 * a + (0.025 * n if planted else 0)

    coefs, _ = st.size_and_accuracy(teacher_grid(rng, gain), ALPHA)
    return st.direction(coefs["examples"], "up", "down") in ("up", "down")


def interaction_claims(rng: np.random.Generator, planted: bool) -> bool:
    """Student size x teacher accuracy: planted, a strong teacher pays 14 points more for a
    100-fold larger student (accuracy range 70 points); null, no interaction, but the teacher
    effects every student shares are large."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return 0.1 * (a - 0.55) * (s - 9) if planted else 0.1 * a

    got = st.size_interaction(teacher_grid(rng, gain, teacher_sd=0.05), ALPHA)
    return st.direction(got["estimate"], "up", "down") in ("up", "down")


def inverted_u_claims(rng: np.random.Generator, planted: bool) -> bool:
    """Inverted U: planted, gain peaks at 55% teacher accuracy, 10 points above the ends; null,
    gain rises steadily with accuracy (monotone: no U)."""

    def gain(a: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
        return -0.8 * (a - 0.55) ** 2 if planted else 0.1 * a

    got = st.inverted_u(teacher_grid(rng, gain, teachers=8), ALPHA)
    return got["status"] == "inverted U"


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


def selection_claims(rng: np.random.Generator, planted: bool) -> bool:
    """Selected against gated tasks (6 and 6): planted, teachers gain 8 points more on the
    selected; null, the same, under task and teacher effects."""
    frame = teacher_grid(rng, _none)
    selected = {f"task{k}": k < 6 for k in range(12)}
    if planted:
        frame["gain"] += frame["task"].map(selected) * 0.08
    sel = [{"task": t, "passed": p} for t, p in selected.items()]
    found = st.selection_effect(frame, sel, ALPHA)["contrasts"]
    return found[0]["reading"] not in (st.TOO_FEW, teacher_level.INCONCLUSIVE)


PER_RUN = {
    "stronger vs weaker teacher: win-rate trend": stronger_claims,
    "quantity vs quality: examples term": quantity_claims,
    "capacity gap: student size x teacher accuracy": interaction_claims,
    "capacity gap: inverted U (two lines)": inverted_u_claims,
    "task pre-selection: selected − gated": selection_claims,
}
VECTORISED = {
    "regime flips: change of A − B": flip_claims,
    "family average: gain": family_claims,
    "mix against its parts (any of 2)": mix_claims,
}


def rate(name: str, planted: bool, runs: int, seed: int = 0) -> float:
    """Share of `runs` synthetic grids in which analysis `name` claims an effect."""
    rng = np.random.default_rng(seed)
    if name in VECTORISED:
        return float(np.mean(VECTORISED[name](rng, planted, runs)))
    return float(np.mean([PER_RUN[name](rng, planted) for _ in range(runs)]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    runs = p.parse_args().runs
    print(f"| analysis | false-positive rate (null, alpha {ALPHA}) | power (planted) |")
    print("|---|---|---|")
    for name in (*PER_RUN, *VECTORISED):
        null, power = rate(name, False, runs, seed=1), rate(name, True, runs, seed=2)
        print(f"| {name} | {null:.3f} | {power:.3f} |", flush=True)
    print(f"\n{runs} synthetic grids per cell.")


if __name__ == "__main__":
    main()
