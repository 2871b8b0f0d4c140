"""Frequency properties of the report's rule (harness/stats/teacher_level.py), by simulation with known truth.

    .venv/bin/python -m benchmarks.inference              # about 25 minutes on 2 cores
    .venv/bin/python -m benchmarks.inference --runs 200   # quicker, noisier
    .venv/bin/python -m benchmarks.inference --only grid  # one section (see --help)

Prints, as Markdown tables for benchmarks/README.md:
1. family-wise error of any `better`/`worse`, the false-teacher rate and the rate of "none",
   four teachers equal to each other and to the baseline (200 items), by replicates and by the
   replicates' spread: one SD for all, one erratic teacher at 3x, t(3)-tailed replicate effects;
   at 3 replicates also with the replicate variance pooled over the group, and with each
   teacher's own (signed) alone (the ablations);
2. the answer's power: one teacher truly 10 points ahead of the others and of the baseline;
   in a grid of 4 tasks x 2 students decided together (`decide_groups`, the replicate variance
   borrowed across the grid) and in a grid of one group: the error of better/worse against the
   truth's direction, the false-teacher rate and the leader named, with equal teachers, one
   erratic, t(3) replicate effects, teacher effects shared across tasks, teacher x task
   effects of SD 5 and 10 points, and the leader route's least favourable case (the best
   teacher exactly at the baseline: naming it is wrong) (`inference.grid_rates`);
3. every claim by grid size (2-12 tasks, 2-4 students, 2-8 teachers): equal teachers, a
   teacher x task spread, a 10-point leader;
4. "none" at the boundary: one teacher's true gain exactly the effect of interest;
5. coverage of the teacher-level gain, teacher-difference and accuracy intervals at 50 and 200
   items, accuracies from 2% to 98%, groups of four teachers with 3 replicates at a 2-point SD;
6. power of the rule at the MDE `cotgap plan` states (fresh simulations, another seed).
(The cross-group tests are benchmarks/studies.py's.)
The synthetic model is `inference.simulate`; tests/test_inference.py asserts the bounds.
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np

from harness.stats import teacher_level as inf

SPREADS = {
    "SD 0": dict(rep_sd=0.0),
    "SD 1.8": dict(rep_sd=0.018),
    "SD 3.5": dict(rep_sd=0.035),
    "one at 3x 1.8": dict(rep_sd=[0.054, 0.018, 0.018, 0.018]),
    "one at 3x 3.5": dict(rep_sd=[0.105, 0.035, 0.035, 0.035]),
    "t(3), SD 3.5": dict(rep_sd=0.035, rep_df=3),
}


@contextlib.contextmanager
def variance_rule(rule: str):
    """The rule's replicate variance ("max": own or pooled, the larger), or an ablation:
    "pooled" (the group's for every teacher), "own" (each teacher's own, signed)."""
    keep = inf.own_mean_squares

    def ablation(units, pooled):
        own = keep(units, None)
        return own if rule == "own" or pooled is None else inf.Pooled(
            pooled.ms_rep, own.ms_res, pooled.df_rep, own.df_res)  # fmt: skip

    if rule != "max":
        inf.own_mean_squares = ablation
    try:
        yield
    finally:
        inf.own_mean_squares = keep


def fwer(runs: int) -> list[str]:
    lines = ["| replicates | replicate spread | FWER of better/worse | false teacher | none "
             "| FWER, pooled | FWER, own (signed) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for reps in (2, 3, 5):
        for k, (name, kw) in enumerate(SPREADS.items()):
            rng = np.random.default_rng(100 * reps + k)
            base, arms = inf.simulate(rng, runs, 200, 0.3, [0.3] * 4, reps, **kw)
            err, false, _, none = inf.answer_rates(base, arms)
            cols = [f"{err:.3f}", f"{false:.3f}", f"{none:.3f}"]
            for rule in ("pooled", "own"):
                if reps != 3:
                    cols.append("–")
                    continue
                with variance_rule(rule):
                    cols.append(f"{inf.answer_rates(base, arms)[0]:.3f}")
            lines.append(f"| {reps} | {name} | " + " | ".join(cols) + " |")
    return lines


def lead(runs: int) -> list[str]:
    lines = ["| teachers | replicates | item concordance | named | false teacher |",
             "|---|---|---|---|---|"]  # fmt: skip
    for m in (2, 3, 4):
        for reps, conc in ((3, 0.5), (5, 0.5), (3, 0.8)):
            rng = np.random.default_rng(10 * m + reps)
            accs = [0.4] + [0.3] * (m - 1)
            base, arms = inf.simulate(rng, runs, 200, 0.3, accs, reps, 0.035, concordance=conc)
            _, false, named, _ = inf.answer_rates(base, arms, leader="t0")
            lines.append(f"| {m} | {reps} | {conc:g} | {named:.3f} | {false:.3f} |")
    return lines


GRID = {  # accs of the teachers (baseline 30%) and the spread of their replicates
    "four equal": dict(accs=[0.3] * 4),
    "four equal, one at 3x": dict(accs=[0.3] * 4, rep_sd=[0.105, 0.035, 0.035, 0.035]),
    "four equal, t(3)": dict(accs=[0.3] * 4, rep_df=3),
    "+6, +3, 0, 0 on every task": dict(accs=[0.36, 0.33, 0.3, 0.3]),
    "teacher x task SD 5": dict(accs=[0.3] * 4, task_sd=0.05),
    "teacher x task SD 10": dict(accs=[0.3] * 4, task_sd=0.10),
    "best at the baseline, 2 others 10 below": dict(accs=[0.3, 0.2, 0.2]),
    "10-point lead, 2 teachers": dict(accs=[0.4, 0.3]),
    "10-point lead, 3 teachers": dict(accs=[0.4, 0.3, 0.3]),
    "10-point lead, 4 teachers": dict(accs=[0.4, 0.3, 0.3, 0.3]),
}


def grid(runs: int) -> list[str]:
    lines = ["| grid | teachers' truth | groups | error of better/worse | false teacher "
             "| of which not the best | leader named | none |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for tasks, students in ((4, 2), (1, 1)):
        for k, (name, kw) in enumerate(GRID.items()):
            n_runs = runs * 8 // (tasks * students)
            r = inf.grid_rates(np.random.default_rng(1000 + k + tasks), n_runs, tasks=tasks,
                               students=students, **kw)  # fmt: skip
            lead = f"{r['named']:.3f}" if "lead" in name else "–"
            lines.append(f"| {tasks} x {students} | {name} | {n_runs * tasks * students} | "
                         f"{r['error']:.3f} | {r['false']:.3f} | {r['not_best']:.3f} | {lead} | "
                         f"{r['none']:.3f} |")  # fmt: skip
    return lines


SIZES = [  # tasks, students, teachers: the range of grids
    (2, 2, 2),
    (2, 4, 8),
    (12, 2, 3),
    (12, 4, 8),
]


def sizes(runs: int) -> list[str]:
    """Every claim by grid size, with all teachers equal (and a teacher x task spread of 5
    points), and with one teacher 10 points ahead on every task: `runs` grids per row, fewer for
    the larger grids (at least 200 groups)."""
    lines = ["| tasks x students | teachers | truth | groups | error of better/worse "
             "| false teacher | of which not the best | leader named | none |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for k, (tasks, students, m) in enumerate(SIZES):
        n_runs = max(runs * 8 // (tasks * students), 200 // (tasks * students) + 1)
        for name, kw in (("equal", dict(accs=[0.3] * m)),
                         ("equal, teacher x task SD 5", dict(accs=[0.3] * m, task_sd=0.05)),
                         ("10-point lead", dict(accs=[0.4] + [0.3] * (m - 1)))):  # fmt: skip
            r = inf.grid_rates(np.random.default_rng(2000 + k), n_runs, tasks=tasks,
                               students=students, **kw)  # fmt: skip
            lead = f"{r['named']:.3f}" if "lead" in name else "–"
            lines.append(f"| {tasks} x {students} | {m} | {name} | {n_runs * tasks * students} | "
                         f"{r['error']:.3f} | {r['false']:.3f} | {r['not_best']:.3f} | {lead} | "
                         f"{r['none']:.3f} |")  # fmt: skip
    return lines


def none_level(runs: int) -> list[str]:
    lines = ["| items | teachers' true gains (pts) | none |", "|---|---|---|"]
    for n, accs in ((400, [0.53, 0.4, 0.4]), (400, [0.53, 0.53, 0.53]), (1000, [0.53, 0.5])):
        base, arms = inf.simulate(np.random.default_rng(n), runs, n, 0.5, accs, 3, 0.01, 0.9)
        gains = ", ".join(f"{100 * (a - 0.5):+.0f}" for a in accs)
        lines.append(f"| {n} | {gains} | {inf.answer_rates(base, arms)[3]:.3f} |")
    return lines


def coverage(runs: int) -> list[str]:
    lines = ["| items | accuracy | gain coverage | teacher difference coverage | accuracy coverage |",
             "|---|---|---|---|---|"]  # fmt: skip
    for n in (50, 200):
        for acc in (0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98):
            hg, hd, ha = inf.coverage(n, acc, runs, seed=int(acc * 1000) + n)
            lines.append(f"| {n} | {100 * acc:g}% | {hg:.3f} | {hd:.3f} | {ha:.3f} |")
    return lines


def power() -> list[str]:
    lines = ["| items | baseline | replicates | replicate SD | teachers | MDE gain (pts) | power at it |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for n, base, reps, sd, m in ((200, 0.3, 3, 0.03, 3), (200, 0.05, 3, 0.03, 3),
                                 (500, 0.5, 5, 0.02, 4), (1319, 0.4, 3, 0.02, 4)):  # fmt: skip
        mde = inf.minimum_detectable_gain(n, base, reps, sd, m)
        pw = inf.gain_power(n, base, mde, reps, sd, m, sims=4000, seed=123)
        lines.append(
            f"| {n} | {100 * base:g}% | {reps} | {100 * sd:g} | {m} | {100 * mde:.1f} | {pw:.3f} |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=600)
    p.add_argument(
        "--only", help="comma-separated sections: fwer,lead,grid,sizes,none,coverage,power"
    )
    args = p.parse_args()
    runs = args.runs
    sections = {
        "fwer": ("Family-wise error, four equal teachers (baseline 30%)", lambda: fwer(runs)),
        "lead": ("A 10-point lead, 200 items, replicate SD 3.5", lambda: lead(runs)),
        "grid": ("Borrowing across a grid, 200 items, 3 replicates, SD 3.5", lambda: grid(runs)),
        "sizes": ("Grids of 2-12 tasks, 2-4 students, 2-8 teachers", lambda: sizes(runs)),
        "none": ("None at the effect of interest (3 points)", lambda: none_level(runs)),
        "coverage": ("Coverage, 3 replicates, 2-point replicate SD", lambda: coverage(runs)),
        "power": ("Power at the stated MDE", power),
    }  # fmt: skip
    for key in args.only.split(",") if args.only else sections:
        title, make = sections[key]
        print(f"\n### {title}\n", flush=True)
        print("\n".join(make()), flush=True)


if __name__ == "__main__":
    main()
