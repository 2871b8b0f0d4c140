"""Frequency properties of the report's rule (harness/stats/teacher_level.py), by simulation with known truth.

    .venv/bin/python -m benchmarks.inference              # about 5 minutes on 2 cores
    .venv/bin/python -m benchmarks.inference --runs 200   # quicker, noisier

Prints, as Markdown tables for benchmarks/README.md:
1. family-wise error of any `better`/`worse` and the rate of a false "distill from X", four
   teachers equal to each other and to the baseline, by replicate SD and replicates, and the
   same without pooling the replicate variance over the group's teachers (the ablation);
2. coverage of the teacher-level gain, teacher-difference and accuracy intervals at 50 and 200
   items, accuracies from 2% to 98%, groups of four teachers with 3 replicates at a 2-point SD;
3. power of the rule at the MDE `cotgap plan` states (fresh simulations, another seed).
(The cross-group tests are benchmarks/studies.py's.)
The synthetic model is `inference.simulate`; tests/test_inference.py asserts the bounds.
"""

from __future__ import annotations

import argparse

import numpy as np

from harness.stats import teacher_level as inf


def fwer(runs: int) -> list[str]:
    lines = ["| items | replicates | replicate SD (pts) | FWER of better/worse | false 'distill from X' "
             "| FWER, each teacher's own replicate variance |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for n in (50, 200):
        for reps in (3, 5):
            for sd in (0.0, 0.018, 0.035):
                rng = np.random.default_rng(n + 10 * reps + int(1000 * sd))
                base, arms = inf.simulate(rng, runs, n, 0.3, [0.3] * 4, reps, sd)
                err, dist = _errors(base, arms, runs)
                own, _ = _errors(base, arms, runs, pooled=False)
                lines.append(
                    f"| {n} | {reps} | {100 * sd:.1f} | {err:.3f} | {dist:.3f} | {own:.3f} |"
                )
    return lines


def _errors(base, arms, runs: int, pooled: bool = True) -> tuple[float, float]:
    """(family-wise error, false 'distill from X') of `decide_group` over the simulated groups;
    `pooled=False`: the ablation in which every teacher keeps its own replicate variance."""
    accepts = inf._bartlett_accepts
    if not pooled:
        inf._bartlett_accepts = lambda variances, dfs, p: np.zeros(np.shape(p), dtype=bool)
    try:
        err = dist = 0
        for s in range(runs):
            d = inf.decide_group(base[s], {f"t{k}": list(arms[k][s]) for k in range(4)})
            calls = [t["verdict"] for t in d.teachers] + [q["verdict"] for q in d.pairs]
            err += any(v in ("better", "worse") for v in calls)
            dist += d.answer not in ("none", "inconclusive")
    finally:
        inf._bartlett_accepts = accepts
    return err / runs, dist / runs


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
    runs = p.parse_args().runs
    for title, lines in (("Family-wise error, four equal teachers (baseline 30%)", fwer(runs)),
                         ("Coverage, 3 replicates, 2-point replicate SD", coverage(runs)),
                         ("Power at the stated MDE", power())):  # fmt: skip
        print(f"\n### {title}\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
