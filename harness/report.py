"""report.md and its plots, written from the leaderboard and analysis.json that `analyze` derives.

    cotgap analyze configs/sandbox.yaml   # writes <results>/<experiment>/analysis/report.md

Every sentence is filled in from the numbers: which teacher wins, whether it beats the baseline,
whether ΔLarge and the baseline tell the same story. Accuracies and gains are shown in points.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "cotgap"  # fixed SVG element ids: a rebuild is byte-identical
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness import screening  # noqa: E402
from harness.config import Experiment  # noqa: E402
from harness.store import safe_name  # noqa: E402

VERDICTS = {
    "significant_gain": "distill from {t}: it beats the baseline and the CI excludes 0",
    "gain_not_significant": "{t} beats the baseline, but the CI includes 0",
    "no_gain": "no teacher beats the baseline (best: {t}); keep the base student",
}


def write(out: Path, exp: Experiment, board: pd.DataFrame, result: dict[str, Any]) -> None:
    """Plots and report.md into `out` (a fresh directory that `analyze.run` swaps in)."""
    figures = plot_all(board, out, result)
    sections = [
        _header(exp, result),
        _selection(result),
        _setup(result),
        _answers(result),
        _capacity_gap(result),
        _degraded(result),
        _delta_large(result),
        _regimes(result),
        _budgets(result),
        _spread(result),
        screening.section(result.get("screening")),
        _leaderboard(board),
        _formats(board),
        _figures(figures, out),
    ]
    (out / "report.md").write_text("\n\n".join(s for s in sections if s) + "\n", encoding="utf-8")


# --- formatting ----------------------------------------------------------------------------------


def _nan(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def pts(x: Any) -> str:
    """A fraction as points: 0.543 -> '54.3'."""
    return "–" if _nan(x) else f"{100 * x:.1f}"


def spts(x: Any) -> str:
    """A difference of fractions as signed points: -0.04 -> '-4.0'."""
    return "–" if _nan(x) else f"{round(100 * x, 1) + 0.0:+.1f}"  # + 0.0: no "-0.0"


def pval(p: Any) -> str:
    return "–" if _nan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def ci(low: Any, high: Any) -> str:
    return "–" if _nan(low) else f"[{spts(low)}, {spts(high)}]"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table (pandas' to_markdown needs tabulate, which is not a dependency)."""
    cell = [[str(v).replace("|", "\\|") for v in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in cell]
    return "\n".join(lines)


def _who(g: dict[str, Any]) -> str:
    return f"{g['student']} on {g['task']} ({g['regime']})"


def _names(names: list[str]) -> str:
    return " = ".join(names) if names else "–"


# --- sections ------------------------------------------------------------------------------------


def _draws(grid: dict[str, Any]) -> str:
    """The trace draws of a grid with several (`generate.seeds`), and how they meet the seeds."""
    draws = grid.get("trace_seeds") or []
    if len(draws) < 2:
        return ""
    how = "each with every seed" if grid["replicates"] == "crossed" else "paired with the seeds"
    return f"; trace draws (generate.seeds): {', '.join(map(str, draws))}, {how}"


def _header(exp: Experiment, r: dict[str, Any]) -> str:
    grid = r["grid"]
    text = (
        f"# cotgap report: {exp.name}\n\n"
        "Rebuilt from the cells by `cotgap analyze`; do not edit. Accuracies, gains and spreads "
        "are in points (percent of test items); leaderboard.csv holds fractions.\n\n"
        f"Grid: {len(grid['teachers'])} teachers ({', '.join(grid['teachers'])}) × "
        f"{len(grid['students'])} students ({', '.join(grid['students'])}) × "
        f"{len(grid['tasks'])} tasks ({', '.join(grid['tasks'])}); regimes: "
        f"{', '.join(grid['regimes'])}; seeds: {', '.join(map(str, grid['seeds']))}"
        + _draws(grid)
        + "."
    )
    missing = r["missing_cells"]
    if missing:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(missing.items()))
        text += (
            f"\n\n**Incomplete:** {sum(missing.values())} cell(s) are not computed yet ({counts}); "
            "their rows are empty and every number below leaves them out."
        )
    return text


def _setup(r: dict[str, Any]) -> str:
    c, o = r["budget"]["configured"], r["budget"]["observed"]
    budget = f"max_steps {c['max_steps']}" if c["max_steps"] else f"{c['epochs']} epochs"
    method = (
        f"LoRA r={c['lora']['r']}, alpha={c['lora']['alpha']}" if c["method"] == "lora" else "full"
    )
    text = (
        "## Setup\n\n"
        f"Training budget (the same for every teacher): {budget}, effective batch "
        f"{c['effective_batch']} ({c['per_device_batch_size']} per device × {c['grad_accum']} "
        f"accumulation × {c['num_processes']} process{'es' if c['num_processes'] != 1 else ''}), lr {c['lr']:g} ({c['schedule']}, warmup "
        f"{c['warmup_ratio']:g}), {method}, max length {c['max_length']}."
    )
    special = []
    if c.get("mix_batch"):
        mb = c["mix_batch"]
        special.append(
            f"the mix trains at its own batch ({mb['per_device_batch_size']} per device × "
            f"{mb['grad_accum']} accumulation)"
        )
    if [a for a in (c.get("budget") or {}).get("align", ["none"]) if a != "none"]:
        special.append(
            "aligned adapters (`regime@align`) train as many updates as match their reference"
        )
    if special:
        text += f" Except: {'; '.join(special)} (see Training budgets)."
    if o["n_adapters"]:
        steps = o["steps"]
        same = "equal across adapters" if len(steps) == 1 else "different across adapters"
        text += (
            f" The {o['n_adapters']} complete adapter cells report optimizer steps "
            f"{', '.join(map(str, steps))} ({same}), effective batch "
            f"{', '.join(map(str, o['effective_batch']))}, and "
            f"{o['epochs_min']:.2f}–{o['epochs_max']:.2f} epochs over their training sets."
        )
    ev = ", ".join(f"{k}={v}" for k, v in r["eval_config"].items())
    return (
        text + f"\n\nEval config (identical for teachers, baselines and distilled students): {ev}."
    )


def _answers(r: dict[str, Any]) -> str:
    rows = []
    for g in r["groups"]:
        best = g["ranking"][0] if g["best_teachers"] else {}
        verdict = VERDICTS.get(g["verdict"], "not computed yet")
        rows.append(
            [
                g["task"],
                g["student"],
                g["regime"],
                pts(g["base_acc"]),
                f"{_names(g['best_teachers'])} ({pts(best.get('post_acc'))})",
                spts(best.get("gain")),
                _names(g["strongest_teachers"]),
                {True: "yes", False: "no", None: "–"}[g["best_is_strongest"]],
                verdict.format(t=_names(g["best_teachers"])),
            ]
        )
    header = [
        "task",
        "student",
        "regime",
        "base",
        "best teacher (post)",
        "gain",
        "strongest teacher",
    ]
    header += ["best is strongest?", "verdict (point-estimate best, its own CI)"]
    for row, g in zip(rows, r["groups"], strict=True):
        row.append(_tell(g["decision"]))
    header.append("can the data tell the teachers apart?")
    lines = [
        f"- {_who(g)}: {decision_text(g['decision'], g['comparison'])}"
        for g in r["groups"]
        if g["decision"]
    ]
    return "\n\n".join(
        [
            "## Which teacher, if any?",
            "Best teacher and gain by mean post (point estimates), then what the test items and "
            "seeds can support: each teacher's p_best (share of joint bootstrap resamples of items "
            f"and seeds in which it is best), differences with their {100 * r['analysis_config']['ci']:g}% "
            "CI and exact sign-test p (McNemar with one seed), Holm-adjusted within the group. A "
            "difference counts when both the Holm p and the CI say so.",
            md_table(header, rows),
            "\n".join(lines),
        ]
    )


def _tell(d: dict[str, Any] | None) -> str:
    if d is None:
        return "–"
    if not d["versus"]:
        return "one teacher only"
    if d["separable"]:
        return f"yes: {d['best']} beats every other teacher"
    return (
        "no: "
        + ", ".join(v["teacher"] for v in d["versus"] if not v["separated"])
        + (f" indistinguishable from {d['best']}")
    )


def _diff(x: dict[str, Any], low: str = "low", high: str = "high", key: str = "diff") -> str:
    return f"{spts(x[key])} pts, CI {ci(x[low], x[high])}, Holm p {pval(x['p_holm'])}"


def decision_text(d: dict[str, Any], comparison: dict[str, Any]) -> str:
    """'teacher-m (p_best 0.81) beats teacher-l (+4.5 pts, CI [+1.0, +8.0], Holm p 0.020); ...'"""
    best = f"{d['best']} (p_best {d['p_best']:.2f})"
    beaten = [v for v in d["versus"] if v["separated"]]
    tied = [v for v in d["versus"] if not v["separated"]]
    parts = []
    if not d["versus"]:
        parts.append(f"{d['best']} is the only teacher scored")
    elif beaten:
        parts.append(f"{best} beats " + ", ".join(f"{v['teacher']} ({_diff(v)})" for v in beaten))
    else:
        parts.append(f"{best} is ahead by its point estimate")
    parts += [f"{v['teacher']} is indistinguishable from {d['best']} ({_diff(v)})" for v in tied]
    gains = {t["teacher"]: t for t in comparison["teachers"]}

    def against_base(names: list[str]) -> str:
        return ", ".join(f"{t} ({_diff(gains[t], 'gain_low', 'gain_high', 'gain')})" for t in names)

    if d["beats_baseline"]:
        parts.append("beats the baseline: " + against_base(d["beats_baseline"]))
    else:
        mde = comparison["mde"]
        reach = (
            "no gain is detectable on this test set"
            if _nan(mde)
            else f"{comparison['n_items']} test items detect a gain of {pts(mde)} pts with 80% power"
        )
        parts.append(f"no teacher beats the baseline ({reach})")
    if d["worse_than_baseline"]:
        parts.append("worse than the baseline: " + against_base(d["worse_than_baseline"]))
    return "; ".join(parts) + "."


def _capacity_gap(r: dict[str, Any]) -> str:
    scored = [g for g in r["groups"] if g["best_teachers"]]
    if not scored:
        return "## Capacity gap\n\nNo distilled cell is scored yet."
    parts = [
        "## Capacity gap",
        "Teachers ranked by post (mean over seeds; ≈ where the step is within the seed-to-seed "
        f"SD, so seeds alone could reorder it), with p_best and the {100 * r['analysis_config']['ci']:g}% "
        "interval of the rank:",
    ]
    ranks = [
        [g["task"], g["student"], g["regime"], _ranked(g["ranking"]), _p_best(g["comparison"])]
        for g in scored
    ]
    parts.append(md_table(["task", "student", "regime", "ranking by post", "p_best [rank]"], ranks))
    parts.extend(_overall_text(reg, o) for reg, o in r["overall"].items() if o["n_best_judged"])
    parts.append(
        "Per group, one point per teacher: within a group the baseline is one number, so gain "
        "ranks as post does and the gap as teacher accuracy. Spearman rho with its exact "
        f"permutation p; a two-sided test needs at least {r['min_teachers']} teachers to reach "
        "0.05:"
    )
    keys = ("gain~teacher_acc", "gain~teacher_size")
    rows = [
        [g["task"], g["student"], g["regime"], *(_rho_exact(g["correlations"][k]) for k in keys)]
        for g in scored
    ]
    parts.append(md_table(["task", "student", "regime", *map(_measure, keys)], rows))
    return "\n\n".join(parts)


def _p_best(c: dict[str, Any] | None) -> str:
    if not c:
        return "–"
    ts = sorted(c["teachers"], key=lambda t: -t["p_best"])
    return ", ".join(
        f"{t['teacher']} {t['p_best']:.2f} [{t['rank_low']}–{t['rank_high']}]" for t in ts
    )


def _rho_exact(c: dict[str, Any]) -> str:
    if _nan(c["rho"]):
        return f"n/a (n={c['n']})"
    text = f"{c['rho']:+.2f}, exact p={pval(c['p'])}, n={c['n']}"
    if c["too_few"]:
        text += f": too few teachers to tell (smallest possible p {c['smallest_p']:.2f})"
    return text


_LABELS = {
    "post_acc": "post",
    "gain": "gain",
    "teacher_acc": "teacher accuracy",
    "teacher_size": "teacher size",
    "gap": "gap (teacher acc − base)",
}


def _measure(key: str) -> str:
    y, x = key.split("~")
    return f"{_LABELS[y]} vs {_LABELS[x]}"


def _ranked(ranking: list[dict[str, Any]]) -> str:
    """`a 16.0 > b 13.5 = c 13.5`: teachers by post, best first; equal posts (as shown) tie, and
    `≈` joins a step within the seed-to-seed SD."""
    shown = [t for t in ranking if not _nan(t["post_acc"])]
    out = ""
    for i, t in enumerate(shown):
        post = pts(t["post_acc"])
        if i:
            prev = shown[i - 1]
            same = post == pts(prev["post_acc"])
            out += " = " if same else " ≈ " if prev.get("within_seed_noise_of_next") else " > "
        sd = t.get("seed_sd")
        out += f"{t['teacher']} {post}" + ("" if _nan(sd) else f" (seed SD {pts(sd)})")
    return out


def _overall_text(regime: str, o: dict[str, Any]) -> str:
    lines = [
        f"**{regime}, over all (student, task) groups:** the best teacher by post is the strongest "
        f"by teacher accuracy in {o['n_best_is_strongest']} of {o['n_best_judged']} groups; "
        f"in {o['n_separable']} of {o['n_decided']} the data separate the best teacher from every "
        "other (Holm), so elsewhere that count rests on point estimates. "
        "Within-group capacity gap (each group's own teachers compared, then combined):"
    ]
    for key, w in o["within_group"].items():
        sp, fe = w["spearman"], w["fixed_effects"]
        unit = "per point of teacher accuracy" if fe["x"] == "teacher_acc" else "per 10× size"
        slope = (
            "n/a"
            if _nan(fe["slope"])
            else f"{fe['slope'] if fe['x'] == 'teacher_acc' else 100 * fe['slope']:+.2f}"
            f"{'' if fe['x'] == 'teacher_acc' else ' pts'} {unit} "
            f"[{_scaled(fe, 'low')}, {_scaled(fe, 'high')}], p={pval(fe['p'])}"
        )
        mean = (
            "n/a"
            if _nan(sp["mean_rho"])
            else f"{sp['mean_rho']:+.2f} [{_f2(sp['low'])}, {_f2(sp['high'])}], "
            f"sign-flip p={pval(sp['p'])}, {sp['n_groups']} groups with a defined rho"
        )
        lines.append(
            f"- {_measure(key)}: mean within-group Spearman {mean}; slope with group fixed "
            f"effects {slope}, n={fe['n']} — {_trend_fe(fe)}"
        )
    lines.append(
        "(One Spearman over all (student, task, teacher) points pooled together is not shown: the "
        "groups' different baselines drive it. analysis.json keeps it as pooled_correlations.)"
    )
    return "\n".join(lines)


def _f2(x: Any) -> str:
    return "–" if _nan(x) else f"{x:+.2f}"


def _scaled(fe: dict[str, Any], key: str) -> str:
    return _f2(fe[key] if fe["x"] == "teacher_acc" else 100 * fe[key])


def _trend_fe(fe: dict[str, Any]) -> str:
    if _nan(fe["slope"]):
        return "not defined (too few points for one intercept per group)"
    if fe["low"] > 0:
        return "the CI excludes 0: gain rises with it inside groups"
    if fe["high"] < 0:
        return "the CI excludes 0: gain falls as it rises inside groups"
    return "the CI includes 0: no evidence of a relation inside groups"


def _degraded(r: dict[str, Any]) -> str:
    d = r["degraded"]
    if not d["n_cells"]:
        return "## Degraded cells\n\nNo distilled cell is scored yet."
    text = (
        f"## Degraded cells\n\n{d['n_degraded']} of {d['n_cells']} distilled cells "
        f"({pts(d['share_degraded'])}%) are degraded (gain < 0); {d['n_significant']} "
        f"({pts(d['share_significant'])}%) significantly (the whole gain CI below 0)."
    )
    rows = [
        [g["task"], g["student"], g["regime"], _count(g["degraded"], "n_degraded"),
         _count(g["degraded"], "n_significant")]
        for g in r["groups"]
        if g["degraded"]["n_cells"]
    ]  # fmt: skip
    header = ["task", "student", "regime", "degraded", "significantly degraded"]
    return text + "\n\n" + md_table(header, rows)


def _count(d: dict[str, Any], key: str) -> str:
    share = key.replace("n_", "share_")
    return f"{d[key]} of {d['n_cells']} ({pts(d[share])}%)" if d["n_cells"] else "–"


def _delta_large(r: dict[str, Any]) -> str:
    groups = [g for g in r["groups"] if not _nan(g["delta_large"]["delta"])]
    if not groups:
        return "## ΔLarge vs the baseline\n\nΔLarge needs two teachers of different size (or accuracy) with scored students."
    rows, lines = [], []
    for g in groups:
        d = g["delta_large"]
        rows.append(
            [g["task"], g["student"], g["regime"], f"{d['large']} / {d['small']}", spts(d["delta"]),
             pts(d["post_large"]), pts(d["post_small"]), pts(d["base_acc"]),
             spts(d["gain_large"]), spts(d["gain_small"]),
             {True: "agree", False: "disagree", None: "–"}[d["agree"]]]
        )  # fmt: skip
        lines.append(f"- {_who(g)}: {_story(d)}")
    agree = sum(o["n_agree"] for o in r["overall"].values())
    judged = sum(o["n_delta_large"] for o in r["overall"].values())
    by = {_BY[g["delta_large"]["by"]] for g in groups}
    header = ["task", "student", "regime", "large / small", "ΔLarge", "post large", "post small"]
    header += ["base", "gain large", "gain small", "stories"]
    return "\n\n".join(
        [
            "## ΔLarge vs the baseline",
            "ΔLarge = post(largest teacher) − post(smallest teacher), the comparison earlier work "
            "reported without baselines; here next to the student's own baseline. Large and small "
            f"by {' / '.join(sorted(by))}.",
            md_table(header, rows),
            "\n".join(lines),
            f"The ΔLarge story and the baseline story agree in {agree} of {judged} groups.",
        ]
    )


_BY = {
    "teacher_size": "parameter count",
    "teacher_acc": "teacher accuracy (a size is missing or sizes are equal)",
}


def _story(d: dict[str, Any]) -> str:
    if d["preferred"] is None:
        return f"ΔLarge = 0 prefers neither {d['large']} nor {d['small']}."
    t = d[d["preferred"]]
    gain = d[f"gain_{d['preferred']}"]
    head = f"ΔLarge = {spts(d['delta'])} prefers the {d['preferred']} teacher {t}"
    if d["agree"] is None:
        return head + "; its baseline is not scored yet."
    if d["agree"]:
        return (
            head
            + f", and distilling from it beats the student's own baseline ({spts(gain)}): the stories agree."
        )
    return (
        head + f", but distilling from it does not beat the student's own baseline ({spts(gain)}; "
        f"the other teacher: {spts(d['gain_' + ('small' if d['preferred'] == 'large' else 'large')])}): "
        "the stories disagree — neither teacher helps."
    )


def _selection(r: dict[str, Any]) -> str:
    """Every candidate task of `select:` with its teachers' accuracies, spread and decision."""
    rows = r.get("selection") or []
    if not rows:
        return ""
    decision = {True: "goes on", False: "gated", None: "undecided"}
    table = [
        [d["task"], ", ".join(f"{t} {pts(a)}" for t, a in d["accuracies"].items()),
         "–" if d["spread"] is None else f"{d['spread']:.1f}", decision[d["passed"]], d["reason"]]
        for d in rows
    ]  # fmt: skip
    split = rows[0]["split"]
    leak = (
        " **Selected on the test split: the items that score the students also chose the tasks "
        "(a leak); the gains below are optimistic.**"
        if split == "test"
        else ""
    )
    gated = [d["task"] for d in rows if d["passed"] is False]
    return (
        "## Task pre-selection\n\nEvery teacher was evaluated on each candidate task's "
        f"{split} split before any trace; a task went on when the teacher accuracy spread "
        f"reached {rows[0]['min_points']:g} points.{leak} A gated task has no traces, training "
        f"or evaluation cells (its rows are empty, and counted as not computed above)"
        f"{': ' + ', '.join(gated) if gated else ''}.\n\n"
        + md_table(["task", "teacher accuracy", "spread", "decision", "why"], table)
    )


def _budgets(r: dict[str, Any]) -> str:
    """Per adapter, the updates, examples and tokens it trained on: what `train.budget.align`
    equalises, and the mix re-check (as configured against aligned) side by side."""
    rows = r.get("adapter_budgets") or []
    if not any(b["align"] != "none" or b["mix"] for b in rows):
        return ""
    table = [
        [b["task"], b["student"], b["regime"], b["teacher"], b["trace_seed"], b["seed"],
         b["updates"], b["effective_batch"], b["examples"], b["tokens"],
         ", ".join(f"{k} {v}" for k, v in b["mix"].items()) if b["mix"] else "",
         pts(b["post_acc"]), spts(b["gain"])]
        for b in rows
    ]  # fmt: skip
    header = ["task", "student", "regime", "teacher", "trace seed", "seed", "updates", "batch",
              "examples", "tokens", "realised mix", "post", "gain"]  # fmt: skip
    text = (
        "## Training budgets\n\n`train.budget.align` trains each adapter for as many optimizer "
        "updates as match its reference (a per_teacher set at the training's batch) in updates, "
        "examples or tokens (within one batch); `none` trains each adapter's own config. A "
        "comparison of regimes at different budgets compares budgets as much as data.\n\n"
        + md_table(header, table)
    )
    ratios = []
    for b in rows:
        if b["regime"] != "mix":
            continue
        for a in rows:
            names = ("task", "student", "trace_seed", "seed")
            same = all(a[k] == b[k] for k in names)
            if same and a["regime"].startswith("mix@") and b["updates"]:
                ratios.append(
                    f"{b['student']} on {b['task']} (trace seed {b['trace_seed']}, seed "
                    f"{b['seed']}): the mix as configured took "
                    f"{b['updates']} update(s), aligned to {a['regime'].split('@')[1]} "
                    f"{a['updates']} (×{a['updates'] / b['updates']:.1f}); post "
                    f"{pts(b['post_acc'])} against {pts(a['post_acc'])}."
                )
    return text + ("\n\n" + "\n".join(f"- {x}" for x in ratios) if ratios else "")


def _regimes(r: dict[str, Any]) -> str:
    c = r["regimes"]
    if len(c["per_regime"]) < 2:
        return ""
    if not c["n_pairs"]:
        return (
            "## Regimes\n\nNo (student, task, teacher, trace seed, seed) is scored in every regime "
            "yet."
        )
    ref = c["reference"]
    rows = [
        [reg, pts(v["mean_post"]), spts(v["mean_gain"]),
         "–" if reg == ref else spts(v["mean_diff_post"]),
         "–" if reg == ref else f"{v['wins']} / {v['ties']} / {v['losses']}"]
        for reg, v in c["per_regime"].items()
    ]  # fmt: skip
    header = ["regime", "mean post", "mean gain", f"post − {ref}", f"wins / ties / losses vs {ref}"]
    best = c["per_regime"][c["best"]]
    return (
        f"## Regimes\n\nPaired over the {c['n_pairs']} (student, task, teacher, trace seed, seed) "
        f"cells scored in every regime, **{c['best']}** has the highest mean post "
        f"({pts(best['mean_post'])}, mean gain {spts(best['mean_gain'])}).\n\n"
        + md_table(header, rows)
    )


def _spread(r: dict[str, Any]) -> str:
    rows = [
        [i, t["task"], "–" if _nan(t["spread"]) else f"{t['spread']:.1f}",
         f"{t['strongest']} ({pts(t['strongest_acc'])})", f"{t['weakest']} ({pts(t['weakest_acc'])})",
         "yes" if t["task"] in r["selected_tasks"] else "no"]
        for i, t in enumerate(r["task_spread"], 1)
    ]  # fmt: skip
    sel = r["selected_tasks"]
    header = ["rank", "task", "spread", "strongest teacher", "weakest teacher", "selected"]
    return (
        "## Tasks by teacher accuracy spread\n\n"
        f"Spread = max − min teacher accuracy. With a threshold of {r['spread_threshold']:g} points, "
        f"{len(sel)} of {len(rows)} tasks are selected{': ' + ', '.join(sel) if sel else ''}.\n\n"
        + md_table(header, rows)
    )


def _leaderboard(board: pd.DataFrame) -> str:
    d = board[board["row_type"] == "distilled"]
    rows = [
        [x.task, x.student, x.regime, x.teacher, x.trace_seed, x.seed, pts(x.teacher_acc),
         pts(x.base_acc), pts(x.post_acc), spts(x.gain), ci(x.gain_ci_low, x.gain_ci_high),
         pts(x.seed_sd),
         _prob(x.p_best), "–" if _nan(x.rank_ci) else x.rank_ci, pval(x.p_holm),
         _mark(x.degraded, x.gain_ci_high), pts(x.format_fail_rate)]
        for x in d.itertuples()
    ]  # fmt: skip
    header = ["task", "student", "regime", "teacher", "trace seed", "seed", "teacher acc", "base",
              "post", "gain", "gain CI", "seed SD", "p_best", "rank CI", "p (Holm)", "degraded",
              "no answer"]  # fmt: skip
    return (
        "## Leaderboard (distilled cells)\n\nAll rows, including teacher and baseline rows, are in "
        "leaderboard.csv. Degraded: yes* when the whole CI is below 0. Seed SD: post's SD over "
        "replicates (trace draws × training seeds; – with one), the noise floor of every gain "
        "and ranking. No answer: % of completions the extractor found no answer in.\n\n"
        + md_table(header, rows)
    )


def _formats(board: pd.DataFrame) -> str:
    """Teachers' and baselines' format failures per task: a low accuracy can be a format problem."""
    d = board[board["row_type"].isin(["teacher", "baseline"])]
    rows = [
        [x.task, x.row_type, x.teacher if x.row_type == "teacher" else x.student,
         pts(x.teacher_acc if x.row_type == "teacher" else x.base_acc), pts(x.format_fail_rate),
         pts(x.truncation_rate)]
        for x in d.itertuples()
    ]  # fmt: skip
    header = ["task", "row", "model", "accuracy", "no answer (%)", "cut at max_tokens (%)"]
    return "## Answer formats (teachers and baselines)\n\n" + md_table(header, rows)


def _prob(p: Any) -> str:
    return "–" if _nan(p) else f"{p:.2f}"


def _mark(degraded: Any, high: Any) -> str:
    if _nan(degraded):
        return "–"
    return ("yes*" if high < 0 else "yes") if degraded else "no"


def _figures(figures: list[Path], out: Path) -> str:
    if not figures:
        return ""
    links = [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in figures]
    note = (
        "Error bars: the 95% joint bootstrap interval over test items (and training seeds); each "
        "figure is also saved as SVG next to its PNG."
    )
    return "## Figures\n\n" + note + "\n\n" + "\n\n".join(links)


# --- plots ---------------------------------------------------------------------------------------


def plot_all(board: pd.DataFrame, out: Path, result: dict[str, Any]) -> list[Path]:
    """Per (task, regime): gains with CIs and post vs teacher accuracy; per (student, regime): the
    capacity gap (gain vs teacher accuracy and vs size). PNG paths (an SVG is saved beside each)."""
    d = board[board["row_type"] == "distilled"]
    points = _points(result)
    paths = []
    for (task, regime), g in d.groupby(["task", "regime"], sort=False):
        if g["post_acc"].notna().any():
            stem, title = f"{safe_name(task)}_{safe_name(regime)}", f"{task} ({regime})"
            mine = points[(points["task"] == task) & (points["regime"] == regime)]
            paths.append(gains(mine, out / f"gain_{stem}.png", title))
            paths.append(post_vs_teacher(mine, out / f"post_vs_teacher_{stem}.png", title))
    for (student, regime), mine in points.groupby(["student", "regime"], sort=False):
        stem = f"{safe_name(student)}_{safe_name(regime)}"
        paths.append(capacity_gap(mine, out / f"capacity_gap_{stem}.png", f"{student} ({regime})"))
    return paths


def _points(result: dict[str, Any]) -> pd.DataFrame:
    """One row per (task, student, regime, teacher) with a comparison: means over seeds and CIs."""
    rows = []
    for g in result["groups"]:
        if not g["comparison"]:
            continue
        info = {t["teacher"]: t for t in g["ranking"]}
        for t in g["comparison"]["teachers"]:
            rows.append(
                {"task": g["task"], "student": g["student"], "regime": g["regime"],
                 "base_acc": g["comparison"]["base_acc"], **t,
                 "teacher_acc": info[t["teacher"]]["teacher_acc"],
                 "teacher_size": info[t["teacher"]]["teacher_size"]}
            )  # fmt: skip
    columns = ["task", "student", "regime", "teacher", "base_acc", "post_acc", "post_low"]
    columns += ["post_high", "gain", "gain_low", "gain_high", "teacher_acc", "teacher_size"]
    return pd.DataFrame(rows, columns=columns)


def _title(ax: plt.Axes, text: str) -> None:
    ax.set_title(textwrap.fill(text, 48), fontsize=9)


def _errors(mid: pd.Series, low: pd.Series, high: pd.Series) -> np.ndarray:
    return 100 * np.vstack([mid - low, high - mid]).clip(min=0)


def gains(p: pd.DataFrame, path: Path, title: str) -> Path:
    """Gain over the baseline (points) of each teacher, one row per student, with its 95% CI;
    red where the whole CI is below 0 (significantly degraded)."""
    students = list(dict.fromkeys(p["student"]))
    teachers = list(dict.fromkeys(p["teacher"]))
    fig, ax = plt.subplots(figsize=(6.4, 1.2 + 0.45 * len(p)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels, y = [], 0
    for student in students:
        s = (
            p[p["student"] == student]
            .set_index("teacher")
            .reindex(teachers)
            .dropna(subset=["gain"])
        )
        for teacher, row in s.iterrows():
            color = "tab:red" if row["gain_high"] < 0 else colors[teachers.index(teacher) % 10]
            ax.errorbar(100 * row["gain"], y, xerr=_errors(row["gain"], row["gain_low"],
                        row["gain_high"]).reshape(2, 1), fmt="o", color=color, capsize=3)  # fmt: skip
            labels.append(f"{student} ← {teacher}")
            y += 1
    ax.axvline(0, color="0.3", lw=1, ls="--")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("gain over the student's baseline (points, 95% CI)")
    _title(ax, f"gain by teacher: {title}")
    return _save(fig, path)


def post_vs_teacher(p: pd.DataFrame, path: Path, title: str) -> Path:
    """Post vs teacher accuracy with 95% CIs, one line per student; its baseline is dashed."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (student, s) in enumerate(p.groupby("student", sort=False)):
        s = s.dropna(subset=["teacher_acc", "post_acc"]).sort_values("teacher_acc")
        color = colors[i % len(colors)]
        ax.errorbar(100 * s["teacher_acc"], 100 * s["post_acc"], capsize=3, fmt="o-", color=color,
                    yerr=_errors(s["post_acc"], s["post_low"], s["post_high"]), label=student)  # fmt: skip
        for row in s.itertuples():
            ax.annotate(row.teacher, (100 * row.teacher_acc, 100 * row.post_acc), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
        if len(s):
            ax.axhline(100 * s["base_acc"].iloc[0], ls="--", color=color, lw=1,
                       label=f"{student} baseline")  # fmt: skip
    ax.set_xlabel("teacher test accuracy (points)")
    ax.set_ylabel("distilled student accuracy (points, 95% CI)")
    _title(ax, f"post vs teacher accuracy: {title}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def capacity_gap(p: pd.DataFrame, path: Path, title: str) -> Path:
    """Gain vs teacher accuracy and vs teacher size (log scale), one series per task, 95% CIs;
    the student's own baseline is the line at 0."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, x, label in zip(axes, ("teacher_acc", "teacher_size"),
                            ("teacher test accuracy (points)", "teacher parameters"), strict=True):  # fmt: skip
        for i, (task, s) in enumerate(p.groupby("task", sort=False)):
            s = s.dropna(subset=[x, "gain"]).sort_values(x)
            xs = 100 * s[x] if x == "teacher_acc" else s[x]
            ax.errorbar(xs, 100 * s["gain"], yerr=_errors(s["gain"], s["gain_low"], s["gain_high"]),
                        fmt="o-", capsize=3, color=colors[i % len(colors)], label=task)  # fmt: skip
        ax.axhline(0, color="0.3", lw=1, ls="--", label="baseline (gain 0)")
        if x == "teacher_size" and p[x].notna().any() and (p[x] > 0).all():
            ax.set_xscale("log")
        ax.set_xlabel(label)
    axes[0].set_ylabel("gain over baseline (points, 95% CI)")
    axes[0].legend(fontsize=8)
    fig.suptitle(textwrap.fill(f"capacity gap: {title}", 80), fontsize=10)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    # no creation date in the SVG, so a rebuild writes the same bytes
    fig.savefig(path.with_suffix(".svg"), metadata={"Date": None})
    plt.close(fig)
    return path
