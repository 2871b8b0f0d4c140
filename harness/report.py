"""report.md and its plots, written from the leaderboard and analysis.json that `analyze` derives.

    cotgap analyze configs/sandbox.yaml   # writes <results>/<experiment>/analysis/report.md

Every sentence is filled in from the numbers: which teacher wins, whether it beats the baseline,
whether ΔLarge and the baseline tell the same story. Accuracies and gains are shown in points.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
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
    figures = plot_all(board, out)
    sections = [
        _header(exp, result),
        _setup(result),
        _answers(result),
        _capacity_gap(result),
        _degraded(result),
        _delta_large(result),
        _regimes(result),
        _spread(result),
        screening.section(result.get("screening")),
        _leaderboard(board),
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
    return "–" if _nan(x) else f"{100 * x:+.1f}"


def pval(p: Any) -> str:
    return "–" if _nan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def ci(low: Any, high: Any) -> str:
    return "–" if _nan(low) else f"[{spts(low)}, {spts(high)}]"


def rho(c: dict[str, Any]) -> str:
    if _nan(c["rho"]):
        return f"n/a (n={c['n']})"
    return f"{c['rho']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}], p={pval(c['p'])}, n={c['n']}"


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


def _header(exp: Experiment, r: dict[str, Any]) -> str:
    grid = r["grid"]
    text = (
        f"# cotgap report: {exp.name}\n\n"
        "Rebuilt from the cells by `cotgap analyze`; do not edit. Accuracies, gains and spreads "
        "are in points (percent of test items); leaderboard.csv holds fractions.\n\n"
        f"Grid: {len(grid['teachers'])} teachers ({', '.join(grid['teachers'])}) × "
        f"{len(grid['students'])} students ({', '.join(grid['students'])}) × "
        f"{len(grid['tasks'])} tasks ({', '.join(grid['tasks'])}); regimes: "
        f"{', '.join(grid['regimes'])}; seeds: {', '.join(map(str, grid['seeds']))}."
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
    header += ["best is strongest?", "verdict"]
    return "## Which teacher, if any?\n\n" + md_table(header, rows)


def _capacity_gap(r: dict[str, Any]) -> str:
    scored = [g for g in r["groups"] if g["best_teachers"]]
    if not scored:
        return "## Capacity gap\n\nNo distilled cell is scored yet."
    parts = ["## Capacity gap", "Teachers ranked by post (mean over seeds):"]
    ranks = [[g["task"], g["student"], g["regime"], _ranked(g["ranking"])] for g in scored]
    parts.append(md_table(["task", "student", "regime", "ranking by post"], ranks))
    parts.extend(_overall_text(reg, o) for reg, o in r["overall"].items() if o["n_best_judged"])
    parts.append(
        "Spearman rho [CI] per (student, task) group, one point per teacher (few points: wide CIs; "
        "within a group the gap is teacher accuracy minus a constant):"
    )
    keys = list(r["groups"][0]["correlations"]) if r["groups"] else []
    rows = [
        [g["task"], g["student"], g["regime"], *(_rho_short(g["correlations"][k]) for k in keys)]
        for g in scored
    ]
    parts.append(md_table(["task", "student", "regime", *map(_measure, keys)], rows))
    return "\n\n".join(parts)


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


def _rho_short(c: dict[str, Any]) -> str:
    return "n/a" if _nan(c["rho"]) else f"{c['rho']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}]"


def _ranked(ranking: list[dict[str, Any]]) -> str:
    """`a 16.0 > b 13.5 = c 13.5`: teachers by post, best first; equal posts (as shown) tie."""
    shown = [(t["teacher"], pts(t["post_acc"])) for t in ranking if not _nan(t["post_acc"])]
    out = ""
    for i, (teacher, post) in enumerate(shown):
        if i:
            out += " = " if post == shown[i - 1][1] else " > "
        out += f"{teacher} {post}"
    return out


def _overall_text(regime: str, o: dict[str, Any]) -> str:
    lines = [
        f"**{regime}, over all (student, task) groups:** the best teacher by post is the strongest "
        f"by teacher accuracy in {o['n_best_is_strongest']} of {o['n_best_judged']} groups. "
        "Pooled Spearman, one point per (student, task, teacher):"
    ]
    for key, c in o["correlations"].items():
        lines.append(f"- {_measure(key)}: {rho(c)} — {_trend(c)}")
    return "\n".join(lines)


def _trend(c: dict[str, Any]) -> str:
    if _nan(c["rho"]) or _nan(c["low"]):
        return "not defined (fewer than 3 points or a constant side)"
    if c["low"] > 0:
        return "the CI excludes 0: rises with it"
    if c["high"] < 0:
        return "the CI excludes 0: falls as it rises"
    return "the CI includes 0: no evidence of a monotone relation"


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


def _regimes(r: dict[str, Any]) -> str:
    c = r["regimes"]
    if len(c["per_regime"]) < 2:
        return ""
    if not c["n_pairs"]:
        return "## Regimes\n\nNo (student, task, teacher, seed) is scored in every regime yet."
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
        f"## Regimes\n\nPaired over the {c['n_pairs']} (student, task, teacher, seed) cells scored "
        f"in every regime, **{c['best']}** has the highest mean post ({pts(best['mean_post'])}, "
        f"mean gain {spts(best['mean_gain'])}).\n\n" + md_table(header, rows)
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
        [x.task, x.student, x.regime, x.teacher, x.seed, pts(x.teacher_acc), pts(x.base_acc),
         pts(x.post_acc), spts(x.gain), ci(x.gain_ci_low, x.gain_ci_high), pval(x.p_holm),
         _mark(x.degraded, x.gain_ci_high)]
        for x in d.itertuples()
    ]  # fmt: skip
    header = ["task", "student", "regime", "teacher", "seed", "teacher acc", "base", "post", "gain"]
    header += ["gain CI", "p (Holm)", "degraded"]
    return (
        "## Leaderboard (distilled cells)\n\nAll rows, including teacher and baseline rows, are in "
        "leaderboard.csv. Degraded: yes* when the whole CI is below 0.\n\n" + md_table(header, rows)
    )


def _mark(degraded: Any, high: Any) -> str:
    if _nan(degraded):
        return "–"
    return ("yes*" if high < 0 else "yes") if degraded else "no"


def _figures(figures: list[Path], out: Path) -> str:
    if not figures:
        return ""
    links = [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in figures]
    return "## Figures\n\n" + "\n\n".join(links)


# --- plots ---------------------------------------------------------------------------------------


def plot_all(board: pd.DataFrame, out: Path) -> list[Path]:
    """One gain heatmap and one post-vs-teacher-accuracy plot per (task, regime) with data."""
    d = board[board["row_type"] == "distilled"]
    paths = []
    for (task, regime), g in d.groupby(["task", "regime"], sort=False):
        if g["post_acc"].notna().any():
            stem = f"{safe_name(task)}_{safe_name(regime)}"
            paths.append(heatmap(g, out / f"gain_{stem}.png", f"{task} ({regime})"))
            paths.append(
                post_vs_teacher(g, out / f"post_vs_teacher_{stem}.png", f"{task} ({regime})")
            )
    return paths


def heatmap(g: pd.DataFrame, path: Path, title: str) -> Path:
    """Gain (points, mean over seeds) over teacher × student; degraded cells hatched with an ×."""
    gain = 100 * g.pivot_table(index="teacher", columns="student", values="gain", sort=False)
    order = g.groupby("teacher", sort=False)["teacher_acc"].first().sort_values(kind="stable")
    gain = gain.reindex(index=order.index)
    lim = max(float(np.nanmax(np.abs(gain.to_numpy()))), 1.0) if gain.notna().any().any() else 1.0
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * gain.shape[1], 1.2 + 0.7 * gain.shape[0]))
    im = ax.imshow(gain.to_numpy(dtype=float), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for (i, j), v in np.ndenumerate(gain.to_numpy(dtype=float)):
        if np.isnan(v):
            ax.text(j, i, "n/a", ha="center", va="center", color="grey")
            continue
        if v < 0:
            box = plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xx", ec="0.35", lw=0)
            ax.add_patch(box)
        label = f"{v:+.1f}" + (" ×" if v < 0 else "")
        ax.text(
            j, i, label, ha="center", va="center", bbox={"fc": "white", "ec": "none", "alpha": 0.85}
        )
    ax.set_xticks(range(gain.shape[1]), gain.columns)
    ax.set_yticks(range(gain.shape[0]), [f"{t} ({pts(order[t])})" for t in gain.index])
    ax.set_xlabel("student")
    ax.set_ylabel("teacher (test accuracy)")
    ax.set_title(f"gain over baseline, points: {title}\nhatched × = degraded")
    fig.colorbar(im, ax=ax, label="gain (points)")
    return _save(fig, path)


def post_vs_teacher(g: pd.DataFrame, path: Path, title: str) -> Path:
    """Post vs teacher accuracy, one line per student; its baseline is the dashed line."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (student, s) in enumerate(g.groupby("student", sort=False)):
        m = s.groupby("teacher", sort=False)[["teacher_acc", "post_acc", "base_acc"]].mean()
        m = m.dropna(subset=["teacher_acc", "post_acc"]).sort_values("teacher_acc")
        color = colors[i % len(colors)]
        ax.plot(100 * m["teacher_acc"], 100 * m["post_acc"], "o-", color=color, label=student)
        for teacher, row in m.iterrows():
            ax.annotate(teacher, (100 * row["teacher_acc"], 100 * row["post_acc"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
        if s["base_acc"].notna().any():
            ax.axhline(100 * s["base_acc"].dropna().iloc[0], ls="--", color=color, lw=1,
                       label=f"{student} baseline")  # fmt: skip
    ax.set_xlabel("teacher test accuracy (points)")
    ax.set_ylabel("distilled student accuracy (points)")
    ax.set_title(f"post vs teacher accuracy: {title}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
