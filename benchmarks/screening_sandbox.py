"""Benchmark: every screening signal against the sandbox grid's measured gains and its ground truth.

    .venv/bin/python -m benchmarks.screening_sandbox CONFIG [--truth harness/sandbox/models/TRUTH.md]
                                                     [--out results/bench/screening_sandbox.json]

CONFIG: a sandbox grid that has been run (`cotgap run CONFIG`) and screened (`cotgap screen
CONFIG`; with `screen: {local_window: 1}` in it, `local_nll` too). Nothing is computed here: the
screen cells and the distilled evals are read from its results directory.

Three units, each reported as the mean Spearman rho of a signal (signed: > 0 = the predicted
direction held) over groups of teachers, with a percentile bootstrap CI over those groups, and the
top-1 hit rate (the signal's first choice has the best gain) against chance:

- `draw`: each (task, student, regime, trace draw) group, the gain of that draw's adapters; what
  `cotgap analyze` reports (harness/analysis/screening.py), with its CI over test items too;
- `group`: each (task, student, regime) group, signals and gains averaged over the trace draws;
- `truth`: the same groups against the ground truth's gains (TRUTH.md: 10 replicates x 1,000 test
  items per arm), which the demo's own measurement noise does not touch; left out on a grid the
  truth does not cover (any grid but the demo's).

With 3 teachers a group's rho is one of -1, -0.5, +0.5, +1 (0 or +-0.87 with ties), so the
interval is over groups, not within one. `cells` pools the (task, student, regime, teacher) cells
of the grid into one Spearman rho per signal (bootstrap CI resampling cells), against the measured
and the true gains: a signal whose scale differs between tasks is penalised there, a task effect
shared by signal and gain is rewarded. Also the screen's cost: its cells' wall time against the
training time of every adapter of the grid (the cells' manifests).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import offline_env
from benchmarks.demo_truth import TRUTH_MD, truth_md

KEY = ["task", "student", "regime", "teacher"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path, help="a sandbox config, run and screened")
    p.add_argument("--truth", type=Path, default=TRUTH_MD, help="the zoo's model card")
    p.add_argument("--task", help="only this task's groups (e.g. the one where teachers differ)")
    p.add_argument("--out", default="results/bench/screening_sandbox.json")
    return p.parse_args(argv)


def per_group(tbl: pd.DataFrame, predictors: list[str]) -> pd.DataFrame:
    """`screening.table`'s rows averaged over the trace draws: one row per (task, student, regime,
    teacher), as one (task, student, regime) group for `screening.validate` (trace_seed -1)."""
    numeric = {c: "mean" for c in (*predictors, "gain")}
    out = tbl.groupby(KEY, as_index=False, sort=False).agg({**numeric, "train_s": "sum"})
    return out.assign(trace_seed=-1, screen_rank=1.0)


def with_truth(tbl: pd.DataFrame, truth: list[dict[str, Any]]) -> pd.DataFrame | None:
    """`per_group`'s rows with the gain replaced by the truth's (a fraction, as the leaderboard);
    None where the truth lacks a row (a grid other than the sandbox demo's)."""
    if not truth:
        return None
    gains = pd.DataFrame(truth)[[*KEY, "gain"]].assign(gain=lambda d: d["gain"] / 100)
    out = tbl.drop(columns="gain").merge(gains, on=KEY, how="left")
    return None if out["gain"].isna().any() else out


def pooled(tbl: pd.DataFrame, predictor: str, samples: int, seed: int) -> dict[str, float]:
    """One Spearman rho over every cell (signed by the predictor's direction), with a 95%
    percentile bootstrap CI resampling cells (scipy.stats.bootstrap, paired)."""
    from scipy import stats

    from harness.analysis.screening import DIRECTION

    x = DIRECTION[predictor] * tbl[predictor].to_numpy(float)
    y = tbl["gain"].to_numpy(float)
    ok = ~np.isnan(x) & ~np.isnan(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0:
        return {"rho": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n": int(ok.sum())}

    def rho(a: np.ndarray, b: np.ndarray) -> float:
        return float(stats.spearmanr(a, b).statistic)

    with np.errstate(invalid="ignore"):  # a resample with a constant column has no rho
        ci = stats.bootstrap(
            (x[ok], y[ok]), rho, paired=True, vectorized=False, n_resamples=samples,
            method="percentile", random_state=np.random.default_rng(seed),
        ).confidence_interval  # fmt: skip
    return {"rho": rho(x[ok], y[ok]), "ci_low": ci.low, "ci_high": ci.high, "n": int(ok.sum())}


def summarise(validation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per predictor: mean rho, its CI over groups (and over test items where given), groups with
    a rho, top-1 hit rate and chance."""
    out = {}
    for p, c in validation["correlation"].items():
        t = validation["top1"][p]
        out[p] = {
            "rho": c["mean"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
            "item_ci": c.get("item_ci"), "groups": c["n"], "per_group": c["per_group"],
            "top1": t["hit_rate"], "chance": t["chance"],
        }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    offline_env()
    args = parse_args(argv)
    from harness.analysis import analyze, screening
    from harness.config.loading import load_experiment
    from harness.store import Store

    exp = screening.screened(load_experiment(args.config))
    store = Store(exp.root)
    board = analyze.leaderboard(exp, store)[0]
    tbl = screening.table(exp, store, board)
    if args.task:
        tbl = tbl[tbl["task"] == args.task].reset_index(drop=True)
    if tbl.empty or tbl["gain"].isna().all():
        raise SystemExit(f"{args.config}: no screen cell with a measured gain; run `cotgap run` "
                         "and `cotgap screen` on it first")  # fmt: skip
    a, signal = exp.analysis, exp.screen.signal
    every = [*screening.SIGNALS, "teacher_acc", "teacher_train_acc", "n_examples"]
    predictors = [s for s in every if tbl[s].notna().any()]  # local_nll: with local_window only
    groups = per_group(tbl, every)
    truth = with_truth(groups, truth_md(args.truth))
    validated = {
        "draw": screening.validate(tbl, a, signal, analyze.item_posts(exp, store, board)),
        "group": screening.validate(groups, a, signal),
        "truth": None if truth is None else screening.validate(truth, a, signal),
    }
    result: dict[str, Any] = {
        "config": str(args.config),
        "task": args.task,
        "cost": screening.cost(tbl, store),
        "units": {
            unit: {p: r for p, r in summarise(v).items() if p in predictors}
            for unit, v in validated.items()
            if v
        },
        "groups": {  # the order of each unit's per_group lists
            unit: ["/".join(str(r[c]) for c in screening.GROUP) for r in v["per_group"]]
            for unit, v in validated.items()
            if v
        },
        "cells": {
            p: {
                "measured": pooled(groups, p, a.bootstrap_samples, a.seed),
                **(
                    {}
                    if truth is None
                    else {"truth": pooled(truth, p, a.bootstrap_samples, a.seed)}
                ),
            }
            for p in predictors
        },
    }
    print(table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float) + "\n")
    return result


def table(result: dict[str, Any]) -> str:
    """The figures as a markdown table: one row per predictor."""

    def rho(r: dict[str, Any] | None) -> str:
        if r is None or r["rho"] != r["rho"]:
            return "n/a"
        return f"{r['rho']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"

    def top1(r: dict[str, Any] | None) -> str:
        if r is None:
            return "n/a"
        return f"{100 * r['top1']:.0f}% ({100 * r['chance']:.0f}%)"

    u, lines = result["units"], []
    lines.append(
        "| predictor | draw groups: rho [CI] | top-1 (chance) | groups: rho [CI] | top-1 (chance) "
        "| truth: rho [CI] | top-1 (chance) | cells: rho vs measured | cells: rho vs truth |"
    )
    lines.append("|---" * 9 + "|")
    for p in u["draw"]:
        d, g, t = u["draw"][p], u["group"][p], u.get("truth", {}).get(p)
        c = result["cells"][p]
        lines.append(
            f"| {p} | {rho(d)} | {top1(d)} | {rho(g)} | {top1(g)} | {rho(t)} | {top1(t)} "
            f"| {rho(c['measured'])} | {rho(c.get('truth'))} |"
        )
    c = result["cost"]
    lines.append(
        f"\nscreen cells {c['screen_s']:.1f} s ({c['screen_tokens']:,} tokens) against "
        f"{c['train_s']:.1f} s of training for {c['n_adapters']} adapters: "
        f"{100 * c['ratio']:.1f}%"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
