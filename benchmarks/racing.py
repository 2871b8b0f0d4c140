"""Racing against the uniform design, by simulation with known truth (harness/stats/racing.py).

    .venv/bin/python -m benchmarks.racing                 # about 15 CPU minutes
    .venv/bin/python -m benchmarks.racing --runs 100      # quicker, noisier
    .venv/bin/python -m benchmarks.racing --min 3 --max 8 --spending pocock

Each setting is a group of 3-8 teachers with known true gains over a baseline (200 test items,
item concordance 0.5, normal replicate effects of the stated seed SD). The same simulated
replicates are decided three ways: the race (min to max replicates, one look per round), the
uniform design at the race's maximum (every teacher at max, the rule at the full alpha), and the
uniform design at about the race's mean cost. Per design: "error", a better/worse whose
direction the truth does not have (any contrast of the group; the family-wise error); "false",
a teacher named that is not the unique true best; "named", the unique true best named; "none",
"none" said; "decided", a teacher or "none" said; and the adapters trained. The null settings
(every gap 0) give the error rates, to be compared with alpha = 0.05; the others give power and
cost. tests/unit/stats/test_racing.py runs a few settings with few runs and asserts the bounds;
the Markdown table this prints goes to benchmarks/README.md ("Racing").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.stats import racing
from harness.stats import teacher_level as tl

BASE = 0.30
N_ITEMS = 200

# name -> (true gains over the baseline in points, one per teacher; seed SD in points)
SETTINGS: dict[str, tuple[tuple[float, ...], float]] = {
    "null, 3 equal": ((0, 0, 0), 3.5),
    "null, 8 equal, SD 5": ((0,) * 8, 5.0),
    "4 equal, +5 each": ((5, 5, 5, 5), 3.5),
    "3: +15 ahead of 0, 0": ((15, 0, 0), 3.5),
    "3: +10 ahead of 0, 0": ((10, 0, 0), 3.5),
    "4: 15/10/5/0": ((15, 10, 5, 0), 3.5),
    "6: 15/5/0/0/-5/-5, SD 2": ((15, 5, 0, 0, -5, -5), 2.0),
    "6: 15/5/0/0/-5/-5, SD 5": ((15, 5, 0, 0, -5, -5), 5.0),
    "8: 12/2/0/0/0/0/-3/-3": ((12, 2, 0, 0, 0, 0, -3, -3), 3.5),
    "5: 10/10/0/0/0": ((10, 10, 0, 0, 0), 3.5),
}


def claims(d: tl.GroupDecision, gains: dict[str, float]) -> dict[str, bool]:
    """What one decision claims against the truth (`gains`: teacher -> true gain)."""
    wrong = False
    for t in d.teachers:
        g = gains[t["teacher"]]
        wrong |= (t["verdict"] == "better" and g <= 0) or (t["verdict"] == "worse" and g >= 0)
    for q in d.pairs:
        diff = gains[q["b"]] - gains[q["a"]]
        wrong |= (q["verdict"] == "better" and diff <= 0) or (q["verdict"] == "worse" and diff >= 0)
    top = [t for t, g in gains.items() if g == max(gains.values())]
    best = top[0] if len(top) == 1 and gains[top[0]] > 0 else None
    named = d.answer not in (tl.ANSWERS_NONE, tl.INCONCLUSIVE)
    return {
        "error": wrong,
        "false": named and d.answer != best,
        "named": named and d.answer == best,
        "none": d.answer == tl.ANSWERS_NONE,
        "decided": d.answer != tl.INCONCLUSIVE,
    }


def entrants(rng: np.random.Generator, gains: Sequence[float], rho: float, start: int) -> list[int]:
    """The `start` teachers a prior of correlation `rho` with the true gains ranks first: each
    teacher's prior is rho times its standardised gain plus independent noise (a screen that
    reads only the traces, never the test items or the adapters)."""
    g = np.asarray(gains, dtype=float)
    z = (g - g.mean()) / g.std() if g.std() > 0 else np.zeros_like(g)
    prior = rho * z + np.sqrt(1 - rho**2) * rng.standard_normal(len(g))
    return sorted(np.argsort(-prior, kind="stable")[:start].tolist())


def compare(
    rng: np.random.Generator, runs: int, gains: Sequence[float], rep_sd: float,
    race_plan: racing.Plan, effect: float = 0.03, concordance: float = 0.5,
    prior: tuple[float, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Rates of the race and of the two uniform designs over `runs` simulated groups (gains and
    SD in points), on the same replicates. `prior` (rho, start): the race runs only the `start`
    teachers a prior of correlation rho ranks first; its "false" and "named" are judged
    against every teacher's truth, the screened-out ones too."""
    accs = [BASE + g / 100 for g in gains]
    r_max = race_plan.max_replicates
    base, arms = tl.simulate(rng, runs, N_ITEMS, BASE, accs, r_max, rep_sd / 100, concordance)
    names = [f"t{k}" for k in range(len(gains))]
    truth = dict(zip(names, (g / 100 for g in gains), strict=True))
    keys = ("error", "false", "named", "none", "decided")
    out: dict[str, Any] = {f"{d}_{k}": 0.0 for d in ("race", "max", "equal") for k in keys}
    out["race_best_raced"] = 0.0
    races = []
    prior_rng = np.random.default_rng(rng.integers(2**32))
    for s in range(runs):
        teachers = {t: list(a[s]) for t, a in zip(names, arms, strict=True)}
        raced = teachers
        if prior is not None:
            keep = entrants(prior_rng, gains, *prior)
            raced = {names[k]: teachers[names[k]] for k in keep}
            out["race_best_raced"] += max(gains[k] for k in keep) == max(gains)
        race = racing.race_groups({0: (base[s], raced)}, race_plan, effect)[0]
        races.append(race)
        assert race.decision is not None
        for k, v in claims(race.decision, truth).items():
            out[f"race_{k}"] += v
        uniform = tl.decide_group(base[s], teachers, race_plan.alpha, effect)
        for k, v in claims(uniform, truth).items():
            out[f"max_{k}"] += v
    cost = float(np.mean([r.adapters() for r in races]))
    r_eq = int(np.clip(round(cost / len(gains)), race_plan.looks[0], r_max))
    for s in range(runs):
        teachers = {t: list(a[s][:r_eq]) for t, a in zip(names, arms, strict=True)}
        d = tl.decide_group(base[s], teachers, race_plan.alpha, effect)
        for k, v in claims(d, truth).items():
            out[f"equal_{k}"] += v
    out = {k: v / runs for k, v in out.items()}
    out.update(
        race_adapters=cost, max_adapters=racing.uniform_adapters(len(gains), race_plan),
        equal_replicates=r_eq, equal_adapters=r_eq * len(gains),
    )  # fmt: skip
    out["saved"] = 1 - cost / out["max_adapters"]
    return out


def table(
    runs: int, race_plan: racing.Plan, seed: int, settings: Sequence[str],
    prior: tuple[float, int] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Every setting's rates; each row is printed (Markdown) as soon as it is done."""
    rows = []
    print(HEADER, flush=True)
    for name in settings:
        gains, sd = SETTINGS[name]
        rng = np.random.default_rng(seed)
        r = {"setting": name, **compare(rng, runs, gains, sd, race_plan, prior=prior)}
        print(markdown_row(r), flush=True)
        rows.append(r)
    return pd.DataFrame(rows)


HEADER = (
    "| setting | race: error / false / named / none | adapters race / max (saved) "
    "| uniform at max: error / false / named / none | uniform at the race's cost (R): "
    "named / none |\n|---|---|---|---|---|"
)


def markdown_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['setting']} | {r['race_error']:.3f} / {r['race_false']:.3f} / "
        f"{r['race_named']:.2f} / {r['race_none']:.2f} | {r['race_adapters']:.1f} / "
        f"{r['max_adapters']} ({r['saved']:.0%}) | {r['max_error']:.3f} / {r['max_false']:.3f} / "
        f"{r['max_named']:.2f} / {r['max_none']:.2f} | {r['equal_named']:.2f} / "
        f"{r['equal_none']:.2f} ({r['equal_replicates']}) |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="simulated groups per setting")
    ap.add_argument("--min", type=int, default=3, help="replicates at the first look")
    ap.add_argument("--max", type=int, default=8, help="replicates at the last look")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--spending", choices=racing.SPENDING, default="obrien_fleming")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS), help="names of SETTINGS")
    ap.add_argument(
        "--prior-rho",
        type=float,
        help="race only the --start teachers a prior of "
        "this correlation with the true gains ranks first (train.race.prior)",
    )
    ap.add_argument("--start", type=int, default=2, help="with --prior-rho: teachers that race")
    args = ap.parse_args(argv)
    race_plan = racing.plan(args.min, args.max, args.alpha, args.spending)
    print(f"looks {race_plan.looks}, levels {[round(x, 4) for x in race_plan.levels]}")
    prior = None if args.prior_rho is None else (args.prior_rho, args.start)
    if prior is not None:
        print(
            f"prior: rho {prior[0]}, the best-ranked {prior[1]} race; race_best_raced: the "
            "share of groups whose true best raced"
        )
    rows = table(args.runs, race_plan, args.seed, args.settings, prior)
    if prior is not None:
        print(rows[["setting", "race_best_raced"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
