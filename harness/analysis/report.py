"""report.md and its plots, written from the leaderboard and analysis.json that `analyze` derives.

    cotgap analyze configs/sandbox.yaml   # writes <results>/<experiment>/analysis/report.md

Every sentence is filled in from the numbers: which teacher wins, whether it beats the baseline,
whether ΔLarge and the baseline tell the same story. Accuracies and gains are shown in points.
"""

from __future__ import annotations

import math
import re
from itertools import product
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "cotgap"  # fixed SVG element ids: a rebuild is byte-identical
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from harness.analysis import screening, spend  # noqa: E402
from harness.config.schema import Experiment  # noqa: E402

WORDS = {
    "better": "better",
    "worse": "worse",
    "equivalent": "equivalent",
    "inconclusive": "inconclusive",
    None: "–",
}


def _epochs(x: float) -> str:
    """Epochs as a reader counts them: 2 decimals below 10 (0.25, 3.75), whole numbers above."""
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


def write(out: Path, exp: Experiment, board: pd.DataFrame, result: dict[str, Any]) -> None:
    """Plots and report.md into `out` (a fresh directory that `analyze.run` swaps in): the answers
    first (header, setup, answers, warnings), then the appendices, each section once."""
    figures = plot_all(board, out, result)
    front = [_header(exp, result), _setup(result), _answers(result), _warnings(result)]
    appendices = [
        _evidence(result),
        _capacity_gap(result),
        _methods(result),
        _degraded(result),
        _delta_large(result),
        _regimes(result),
        _budgets(result),
        _studies(result),
        _selection(result),
        _spread(result),
        screening.section(result.get("screening")),
        _leaderboard(board),
        spend.section(board),
        _formats(board),
        _figures(figures, out),
    ]
    appendices = [_demote(s) for s in appendices if s]
    head = (
        "## Appendices\n\nThe evidence behind the answers: "
        + "; ".join(_title_of(s) for s in appendices)
        + "."
    )
    text = "\n\n".join([*(s for s in front if s), head, *appendices])
    (out / "report.md").write_text(text + "\n", encoding="utf-8")


def _demote(section: str) -> str:
    """An appendix section one heading level down (## -> ###), so it sits under Appendices."""
    return re.sub(r"^(#+) ", r"#\1 ", section, flags=re.M)


def _title_of(section: str) -> str:
    return section.split("\n", 1)[0].lstrip("#").strip()


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
        f"Grid: {len(grid['teachers'])} teachers ({', '.join(grid['teachers'])}) × "
        f"{len(grid['students'])} students ({', '.join(grid['students'])}) × "
        f"{len(grid['tasks'])} tasks ({', '.join(grid['tasks'])}); regimes: "
        f"{', '.join(grid['regimes'])}; seeds: {', '.join(map(str, grid['seeds']))}"
        + _draws(grid)
        + ". Numbers are points (percent of test items); rebuilt from the cells by "
        "`cotgap analyze`, do not edit."
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
    """Two lines: the training budget every teacher shares, and the eval config."""
    c, o = r["budget"]["configured"], r["budget"]["observed"]
    budget = f"max_steps {c['max_steps']}" if c["max_steps"] else f"{c['epochs']} epochs"
    method = (
        f"LoRA r={c['lora']['r']}, alpha={c['lora']['alpha']:g}"
        if c["method"] == "lora"
        else "full"
    )
    procs = c["num_processes"]
    text = (
        f"**Training** (the same for every teacher): {budget}, effective batch "
        f"{c['effective_batch']} ({c['per_device_batch_size']} per device × {c['grad_accum']} "
        f"accumulation × {procs} process{'es' if procs != 1 else ''}), lr {c['lr']:g} "
        f"({c['schedule']}, warmup {c['warmup_ratio']:g}), {method}, max length {c['max_length']}"
    )
    special = []
    if c.get("mix_batch"):
        mb = c["mix_batch"]
        special.append(
            f"the mix trains at its own batch ({mb['per_device_batch_size']} per device × "
            f"{mb['grad_accum']} accumulation)"
        )
    if [a for a in (c.get("budget") or {}).get("align", ["none"]) if a != "none"]:
        special.append("aligned adapters (`regime@align`) train as many updates as their reference")
    if special:
        text += f"; except: {'; '.join(special)} (see Training budgets)"
    if o["n_adapters"]:
        steps = o["steps"]
        each = "each" if len(steps) == 1 else "(different across adapters)"
        text += (
            f"; the {o['n_adapters']} adapters ran {', '.join(map(str, steps))} optimizer steps "
            f"{each}, {_epochs(o['epochs_min'])}–{_epochs(o['epochs_max'])} epochs over their training sets"
        )
    ev = ", ".join(f"{k}={v}" for k, v in r["eval_config"].items() if v not in (None, [], {}, ""))
    return (
        f"## Setup\n\n{text}.\n\n"
        f"**Eval** (the same for teachers, baselines and distilled students): {ev}."
    )


def answer_row(g: dict[str, Any]) -> list[str]:
    """The group's row of the Answers table (the same words as answers.csv)."""
    d = g["decision"]
    h = d["headline"]
    reps = min(t["n_replicates"] for t in d["teachers"])
    answer = d["answer"] + (" (exploratory)" if d["exploratory"] else "")
    none = d["answer"] == "none"  # no teacher is recommended: none is named
    return [g["task"], g["student"], g["regime"], pts(d["base_acc"]), answer, d["distill"],
            "" if none else h["teacher"], spts(h["gain"]), ci(h["gain_low"], h["gain_high"]),
            d["clears_effect"], "" if none else ", ".join(d["best_set"]), str(reps)]  # fmt: skip


ANSWER_HEADER = ["task", "student", "regime", "base", "answer", "distill?", "quoted teacher",
                 "gain", "interval", "clears effect?", "best set", "replicates"]  # fmt: skip


def _answers(r: dict[str, Any]) -> str:
    decided = [g for g in r["groups"] if g["decision"]]
    if not decided:
        return "## Answers\n\nNo group has a scored baseline and distilled student yet."
    a = r["analysis_config"]
    effect = f"{a['effect_of_interest']:g} points (analysis.effect_of_interest)"
    intro = (
        "Which teacher should each student distill from? One row per (task, student, regime), as "
        "in answers.csv. The gain is the quoted teacher's over the student's own baseline (base), "
        "pooled over its replicates (trace draws and training seeds); its interval covers test "
        f"items and replicates{_interval_levels(a, decided)}. The quoted "
        "teacher is the answer where the answer names one; on an inconclusive row it is the "
        "teacher with the largest gain, a description and not a recommendation (the answer and "
        "the best set say what to do)."
    )
    verdicts = [
        "**a teacher**: it beats the baseline and is shown the best teacher of the group, by "
        "one of two routes that share alpha, so a wrong teacher (not the best, or not above the "
        f"baseline) is named at most {100 * (1 - a['ci']):g}% of the time: the **leader**, the "
        "teacher the grid's other tasks put first (chosen from data this group does not "
        f"hold), beats every other teacher and the baseline, each one-sided at {_share(a, decided)}; "
        "or it is the only member of the best set (multiple comparisons with the best: the "
        "teachers no other is shown above) at the rest of alpha and its gain clears a one-sided "
        "max-t over the group's gains. Its row quotes the interval of the test that named it "
        "(two-sided; its lower bound is that test's). Distill from it. **clears "
        f"effect?** says whether its gain is shown above {effect} (yes), below (no), or neither",
        f"**none**: no teacher beats the baseline, and every teacher's gain is shown below "
        f"{effect} (each one-sided at {100 * (1 - a['ci']):g}%, an intersection-union test at "
        "that level); keep the base student. It rules out a gain that large, not a smaller one: "
        "a teacher's own verdict may stay inconclusive; its row quotes the largest gain and "
        "names no teacher",
        "**inconclusive**: neither. With distill? yes, several teachers beat the baseline and "
        "none is shown better than the others (the best set): distill from any of them, the "
        "cheapest. With distill? inconclusive, no teacher is shown better than the baseline and "
        "one may still be: more test items or replicates (`cotgap plan` gives the smallest gain "
        "they detect)",
        f"**exploratory**: fewer than {a['min_replicates']} replicates per teacher "
        "(analysis.min_replicates): nothing is claimed, the row quotes the largest gain",
        "**per teacher** (appendices): better / worse: the interval excludes 0; equivalent: it "
        f"lies within ±{a['effect_of_interest']:g} points; inconclusive: neither",
    ]
    return "\n\n".join(
        [
            "## Answers",
            intro,
            md_table(ANSWER_HEADER, [answer_row(g) for g in decided]),
            "\n".join(f"- {v}." for v in verdicts),
            _named_by(decided),
            _two_replicates(decided),
            _replicate_cost(r, decided),
            _race(decided),
        ]
    ).rstrip()


def _interval_levels(a: dict[str, Any], decided: list[dict[str, Any]]) -> str:
    """The quoted intervals' levels, in words: a named teacher's row quotes the test that named
    it, the others the group's simultaneous family."""
    named = [g for g in decided if g["decision"].get("named_by")]
    other = [g for g in decided if not g["decision"].get("named_by")]
    parts = []
    if named:
        parts.append(f"on a row that names a teacher, the interval of the test that named it "
                     f"(below; {_levels(named)})")  # fmt: skip
    if other:
        parts.append(f"{'on the others, ' if named else ''}at {_levels(other)}, "
                     f"{_multiplicity(a, other)}")  # fmt: skip
    return (": " if named else " ") + "; ".join(parts)


def _levels(decided: list[dict[str, Any]]) -> str:
    """The quoted intervals' per-comparison confidence levels (each group's max-t family sets
    its own, from its teachers and their correlation): one, or their range."""
    levels = sorted({round(100 * g["decision"]["headline"]["level"], 2) for g in decided})
    if len(levels) == 1:
        return f"{levels[0]:.4g}%"
    return f"{levels[0]:.4g}–{levels[-1]:.4g}% per comparison"


def _multiplicity(a: dict[str, Any], decided: list[dict[str, Any]]) -> str:
    """How the intervals are adjusted for multiplicity (analysis.multiplicity)."""
    alpha = 100 * (1 - a["ci"])
    return (
        "simultaneous over the group's comparisons (each teacher against the baseline and "
        f"against each other, one max-t family; family-wise {alpha:g}%)"
    )


def _share(a: dict[str, Any], decided: list[dict[str, Any]]) -> str:
    """The leader route's one-sided level, in words (its share of alpha)."""
    from harness.stats import teacher_level

    shares = {g["decision"].get("multiplicity", {}).get("leader_share") for g in decided}
    share = max((x for x in shares if x is not None), default=teacher_level.LEADER_SHARE)
    return f"{100 * share * (1 - a['ci']):g}% ({share:g} of alpha)"


def _named_by(decided: list[dict[str, Any]]) -> str:
    """Which route named each named teacher (`teacher_level._name`)."""
    routes: dict[str, list[str]] = {"leader": [], "best_set": []}
    for g in decided:
        route = g["decision"].get("named_by", "")
        if route in routes:
            routes[route].append(f"{g['task']} / {g['student']} / {g['regime']}")
    if not any(routes.values()):
        return ""
    words = {"leader": "as the leader the other tasks put first",
             "best_set": "as the only member of the group's best set"}  # fmt: skip
    parts = [f"{words[k]}: {', '.join(v)}" for k, v in routes.items() if v]
    return "**How each teacher was named:** " + "; ".join(parts) + "."


def _two_replicates(decided: list[dict[str, Any]]) -> str:
    """Groups decided on two replicates per teacher (analysis.min_replicates: 2) are weaker."""
    two = [g for g in decided if not g["decision"]["exploratory"]
           and min(t["n_replicates"] for t in g["decision"]["teachers"]) == 2]  # fmt: skip
    if not two:
        return ""
    return (
        f"**Two replicates:** {len(two)} group(s) rest on 2 replicates of a teacher. They are "
        "weaker than the others: the spread of two replicates has one degree of freedom, so "
        "their intervals are wide and few verdicts are reached, and whether a teacher's "
        "replicates agree by chance cannot be told; three or more replicates "
        "(analysis.min_replicates) narrow them."
    )


def _race(decided: list[dict[str, Any]]) -> str:
    """Under train.race: the draws each teacher got, and what the race saved."""
    raced = [g["decision"]["race"] for g in decided if "race" in g["decision"]]
    if not raced:
        return ""
    counts = [n for x in raced for n in x["replicates"].values()]
    used, uniform = sum(x["adapters"] for x in raced), sum(x["uniform_adapters"] for x in raced)
    running = sum(not x["done"] for x in raced)
    levels = ", ".join(f"{100 * v:.2g}%" for v in raced[0]["levels"])
    got = f"{min(counts)}–{max(counts)}" if min(counts) < max(counts) else str(min(counts))
    return (
        f"**Race** (train.race): teachers got {got} trace draws each "
        "(answers.csv `replicates`: per teacher); the race trained "
        f"{used} adapters where every teacher at the maximum trains {uniform}: "
        f"{uniform - used} saved ({(uniform - used) / uniform:.0%}). Each look decides at its "
        f"own level ({levels} from the first look to the last: alpha spent over the looks, "
        "docs/statistics.md \"Racing\"), and a group's answer is its last look's."
        + _screened_line(raced)
        + (
            f" {running} group(s) are still racing: `cotgap run` trains their next round."
            if running
            else ""
        )
    )


def _screened_line(raced: list[dict[str, Any]]) -> str:
    """Under train.race.prior with start: the teachers that never raced, and what that means."""
    out = sum(len(x.get("screened_out", {})) for x in raced)
    if not out:
        return ""
    return (
        f" The race's prior (train.race.prior) screened out {out} teacher row(s) over the "
        f"{len(raced)} groups before any training (answers.csv `screened_out`, with each one's "
        "rank): each answer is about the teachers its group raced, and a teacher screened out "
        "is neither ruled out nor measured."
    )


def _replicate_cost(r: dict[str, Any], decided: list[dict[str, Any]]) -> str:
    """For exploratory groups: what the replicates the rule needs would cost."""
    if not any(g["decision"]["exploratory"] for g in decided):
        return ""
    grid, a = r["grid"], r["analysis_config"]
    have = min(min(t["n_replicates"] for t in g["decision"]["teachers"]) for g in decided)
    per = len(grid["tasks"]) * len(grid["students"]) * len(grid["regimes"]) * len(grid["teachers"])
    more = a["min_replicates"] - have
    return (
        f"**Exploratory:** {have} replicate(s) per teacher, and the rule needs "
        f"{a['min_replicates']} (analysis.min_replicates). Each replicate adds one traces cell "
        f"per (task, teacher) with `generate.seeds`, and one adapter and distilled eval per "
        f"(task, student, regime, teacher): about {per} adapters here, {more * per} for the "
        f"{more} missing. `cotgap plan` prices it and states what it would detect."
    )


def _warnings(r: dict[str, Any]) -> str:
    """Cells that completed but give nothing usable (harness/analysis/health.py), and a selection made on
    the test split: each with its number and what to change."""
    lines = list(r.get("warnings") or [])
    sel = r.get("selection") or []
    if sel and sel[0]["split"] == "test":
        lines.append(
            "tasks were pre-selected on the test split: the items that score the students also "
            "chose the tasks, so the gains are optimistic; set select.split to a held-out split"
        )
    if not lines:
        return ""
    return "## Warnings\n\n" + "\n".join(f"- {x}." for x in lines)


def _evidence(r: dict[str, Any]) -> str:
    """Per group: every teacher against the baseline and against the others, with verdicts."""
    decided = [g for g in r["groups"] if g["decision"]]
    if not decided:
        return ""
    parts = [
        "## Evidence per group",
        "Per group, each teacher against the baseline and each pair of teachers (difference "
        "b − a), with the intervals and per-teacher verdicts defined under Answers. The "
        "between-replicate SD is the variance component of a teacher's post accuracy (its "
        "replicates' spread beyond each adapter's item-level noise); the leaderboard's seed_sd "
        "is the raw SD and larger. The MDE is "
        "the smallest gain (and teacher difference) the group's items and replicates detect with "
        "80% power under that rule.",
    ]
    for g in decided:
        d = g["decision"]
        rows = [
            [t["teacher"], pts(t["post_acc"]), spts(t["gain"]), ci(t["gain_low"], t["gain_high"]),
             t["n_replicates"], pts(t["rep_sd"]) if t["n_replicates"] > 1 else "–",
             WORDS[t["verdict"]], "yes" if t["teacher"] in d["best_set"] else "no"]
            for t in d["teachers"]
        ]  # fmt: skip
        header = ["teacher", "post", "gain", "interval", "replicates", "between-replicate SD",
                  "vs base"]  # fmt: skip
        header.append("in best set")
        pairs = "; ".join(
            f"{q['b']} − {q['a']} {spts(q['diff'])} {ci(q['low'], q['high'])}: {WORDS[q['verdict']]}"
            for q in d["pairs"]
        )
        mde = d.get("mde") or {}
        reach = (
            f"MDE: gain {pts(mde.get('gain'))} pts, teacher difference "
            f"{pts(mde.get('difference'))} pts at {mde.get('replicates')} replicates "
            f"(between-replicate SD {pts(mde.get('rep_sd'))} pts, {mde.get('rep_sd_source')})"
            if mde
            else ""
        )
        untrained = d.get("untrained") or []
        empty = (
            f" {', '.join(untrained)} gave no usable training example: nothing was trained, so "
            "its distilled student is the baseline itself (gain 0 by construction)."
            if untrained
            else ""
        )
        parts.append(
            f"### {_who(g)}\n\nBaseline {pts(d['base_acc'])} "
            f"{ci(d['base_low'], d['base_high']).replace('+', '')} on {d['n_items']} items.{empty}\n\n"
            + md_table(header, rows)
            + (f"\n\nPairs: {pairs}." if pairs else "")
            + (f"\n\n{reach}." if reach else "")
        )
    return "\n\n".join(parts)


CAPACITY_GAP_ABOUT = (
    "Is a teacher's gain related to its accuracy or size? Tested with teachers as the unit: "
    "the mean within-group Spearman rho of gain and the property, against every order of "
    "the teachers' labels, one order applied on every task, student and regime (a teacher "
    "good everywhere counts once). Where this many teachers cannot reach the level the test "
    "says 'too few' and how many it needs."
)


def capacity_gap_readings(r: dict[str, Any]) -> list[str]:
    """Per regime with decided groups: the strongest teacher's place in the best sets and the
    teacher-level tests of gain against accuracy and size (the report and the viewer)."""
    out = []
    for reg, o in r["overall"].items():
        if not o["n_decided"]:
            continue
        cg = o["capacity_gap"]
        line = (
            f"**{reg}:** the strongest teacher (by accuracy) is in the best set in "
            f"{o['n_strongest_in_best_set']} of {o['n_decided']} groups. "
        )
        keys = (
            ["gain~teacher_acc"] if cg["collinear"] else ["gain~teacher_acc", "gain~teacher_size"]
        )
        tests = [f"{_measure(k)}: {_perm(cg[k])}" for k in keys]
        if cg["collinear"]:
            tests.append(
                "teacher accuracy and size order every task's teachers the same way: one relation, "
                "not two"
            )
        sd = cg.get("components") or {}
        if not _nan(sd.get("teacher", math.nan)):
            tests.append(
                f"teacher effects on gain (SD, pts): {sd['teacher']:.1f} shared by every task and "
                f"student, {sd['teacher_x_task']:.1f} teacher × task, {sd['teacher_x_student']:.1f} "
                f"teacher × student, {sd['residual']:.1f} left over"
            )
        out.append(line + "; ".join(tests))
    return out


def _capacity_gap(r: dict[str, Any]) -> str:
    lines = capacity_gap_readings(r)
    if not lines:
        return "## Capacity gap\n\nNo distilled cell is scored yet."
    return "\n\n".join(["## Capacity gap", CAPACITY_GAP_ABOUT, *(f"{x}." for x in lines)])


def _methods(r: dict[str, Any]) -> str:
    """The capacity gap per distillation method, with each method's extra cost; only where the
    grid has more than one method (train.methods)."""
    from harness.workflow.regimes import method_of

    if len({method_of(reg) for reg in r["overall"]}) < 2:
        return ""
    cost: dict[str, dict[str, float]] = {}
    for b in r.get("adapter_budgets", []):
        c = cost.setdefault(b["regime"], {})
        for k, v in (b.get("extra_cost") or {}).items():
            if isinstance(v, (int, float)):
                c[k] = c.get(k, 0) + v
    rows = []
    for reg, o in r["overall"].items():
        cg, c = o["capacity_gap"]["gain~teacher_acc"], cost.get(reg, {})
        rows.append(
            [method_of(reg), reg, f"{o['n_decided']}/{o['n_groups']}", spts(o["mean_gain"]),
             _perm(cg), f"{o['n_strongest_in_best_set']}/{o['n_decided']}",
             c.get("teacher_forward_tokens", 0), c.get("student_sampled_tokens", 0),
             f"{c.get('teacher_s', 0) + c.get('sampling_s', 0):.1f}"]
        )  # fmt: skip
    header = ["method", "regime", "groups decided", "mean gain", "gain vs teacher accuracy",
              "strongest in best set", "teacher forward tokens", "student sampled tokens",
              "extra device-s"]  # fmt: skip
    return (
        "## Capacity gap per method\n\nThe same teachers, students and training sets, distilled "
        "by each method of `train.methods`: sft (the teacher's traces), kd (plus its top-k "
        "next-token distribution), on_policy (the student's own samples scored by the teacher). Per method: the share of "
        "groups decided, the mean gain, the teacher-level test of gain against teacher accuracy, "
        "how often the strongest teacher is in the best set, and what the method cost beyond "
        "training (summed over its adapters).\n\n" + md_table(header, rows) + _topk_size(r)
    )


def _topk_size(r: dict[str, Any]) -> str:
    topk = r.get("teacher_topk") or []
    if not topk:
        return ""
    size, tokens = sum(t["bytes"] for t in topk), sum(t["tokens"] or 0 for t in topk)
    return (
        f"\n\nkd trains from the teachers' top-{topk[0]['k']} log-probabilities, captured while "
        f"their traces were generated and stored with them: {size / 2**20:.2f} MiB over "
        f"{len(topk)} traces cell(s), {tokens} generated tokens ({size / max(tokens, 1):.0f} "
        "bytes a token); training never loads a teacher for kd."
    )


def _perm(t: dict[str, Any]) -> str:
    n = t.get("n_teachers", 0)
    if t["too_few"] and n:
        rho = "" if _nan(t["rho"]) else f"mean rho {t['rho']:+.2f}, "
        return (
            f"{rho}too few teachers ({n}: the smallest possible p is {t['smallest_p']:.3f}; it "
            f"needs ≥ {t['needed']} teachers)"
        )
    if _nan(t["rho"]):
        return "not defined (no group holds every teacher, or no spread)"
    text = (
        f"mean rho {t['rho']:+.2f}, teacher-permutation p={pval(t['p'])} ({n} teachers, "
        f"{t['n_groups']} groups)"
    )
    if not t["rejects"]:
        return text + ": inconclusive"
    return text + (": gain rises with it" if t["rho"] > 0 else ": gain falls with it")


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


def _degraded(r: dict[str, Any]) -> str:
    d = r["degraded"]
    if not d["n_cells"]:
        return ""
    return (
        f"## Degraded\n\n{d['n_worse']} of {d['n_teachers']} (teacher, group) comparisons find "
        "the distilled student worse than its baseline (the verdict above). Descriptively, "
        f"{d['n_degraded']} of {d['n_cells']} single adapters ({pts(d['share_degraded'])}%) "
        "scored below the baseline; a single adapter's sign is not a finding."
    )


def _delta_large(r: dict[str, Any]) -> str:
    groups = [g for g in r["groups"] if not _nan(g["delta_large"]["delta"])]
    if not groups:
        return ""
    rows = []
    for g in groups:
        d = g["delta_large"]
        rows.append(
            [g["task"], g["student"], g["regime"], f"{d['large']} / {d['small']}", spts(d["delta"]),
             ci(d["low"], d["high"]), WORDS[d["verdict"]], pts(d["base_acc"]),
             f"{spts(d['gain_large'])} ({WORDS[d['large_vs_base']]})",
             f"{spts(d['gain_small'])} ({WORDS[d['small_vs_base']]})"]
        )  # fmt: skip
    by = {_BY[g["delta_large"]["by"]] for g in groups}
    header = ["task", "student", "regime", "large / small", "ΔLarge", "interval", "large vs small"]
    header += ["base", "gain large (vs base)", "gain small (vs base)"]
    return "\n\n".join(
        [
            "## ΔLarge vs the baseline",
            "ΔLarge = post(large teacher) − post(small teacher) (analysis.delta_large's pair, else "
            "the largest and the smallest), the comparison earlier work reported without baselines; here with the pairwise interval and verdict, next to each "
            f"teacher's gain over the student's own baseline. Large and small by {' / '.join(sorted(by))}.",
            md_table(header, rows),
        ]
    )


_BY = {
    "configured": "analysis.delta_large",
    "teacher_size": "parameter count",
    "teacher_acc": "teacher accuracy (a size is missing or sizes are equal)",
}


def _studies(r: dict[str, Any]) -> str:
    """The study analyses (harness/analysis/studies.py): each one's question, readings and tables."""
    parts = ["## Studies"] if r.get("studies") else []
    for study in (r.get("studies") or {}).values():
        parts.append(f"### {study['title']}\n\n{study['about']}")
        parts.append("\n".join(f"- {x}." for x in study["readings"]))
        for t in study["tables"]:
            if t["rows"]:
                rows = [[_cell(v) for v in row] for row in t["rows"]]
                parts.append(f"{t['title']}:\n\n" + md_table(t["columns"], rows))
    return "\n\n".join(parts)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.1f}"
    return "–" if v is None else str(v)


def _selection(r: dict[str, Any]) -> str:
    """Every candidate task of `select:` with its teachers' accuracies, spread and decision."""
    rows = r.get("selection") or []
    if not rows:
        return ""
    decision = {True: "goes on", False: "gated", None: "undecided"}
    table = [
        [d["task"], ", ".join(f"{t} {pts(a)}" for t, a in d["accuracies"].items()),
         "–" if d["spread"] is None else f"{d['spread']:.1f}",
         "gated, run anyway" if d.get("runs") and d["passed"] is False else decision[d["passed"]],
         d["reason"]]
        for d in rows
    ]  # fmt: skip
    split = rows[0]["split"]
    leak = " (a leak: see Warnings)" if split == "test" else ""
    gated = [d["task"] for d in rows if d["passed"] is False and not d.get("runs")]
    return (
        "## Task pre-selection\n\nEvery teacher was evaluated on each candidate task's "
        f"{split} split before any trace; a task went on when the teacher accuracy spread "
        f"reached {rows[0]['min_points']:g} points{leak}. A gated task has no traces, training "
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
    return (
        f"## Regimes\n\nDescriptive: means over the {c['n_pairs']} (student, task, teacher, trace seed, seed) "
        "cells scored in every regime, with single-adapter wins, ties and losses against "
        f"{ref}; no regime is called better here.\n\n" + md_table(header, rows)
    )


def _spread(r: dict[str, Any]) -> str:
    rows = [
        [i, t["task"], "–" if _nan(t["spread"]) else f"{t['spread']:.1f}",
         f"{t['strongest']} ({pts(t['strongest_acc'])})", f"{t['weakest']} ({pts(t['weakest_acc'])})",
         "yes" if t["task"] in r["selected_tasks"] else "no"]
        for i, t in enumerate(r["task_spread"], 1)
    ]  # fmt: skip
    sel = r["selected_tasks"]
    over = f"{len(sel)} of {len(rows)} tasks{': ' + ', '.join(sel) if sel else ''}"
    if r.get("selection"):  # select: configured: the spread decided which tasks ran
        header = ["rank", "task", "spread", "strongest teacher", "weakest teacher", "selected"]
        said = f"With a threshold of {r['spread_threshold']:g} points, {over} are selected."
    else:
        header = [
            "rank",
            "task",
            "spread",
            "strongest teacher",
            "weakest teacher",
            "over threshold",
        ]
        said = (
            "No task pre-selection is configured (`select:`): every task ran. A description: "
            f"{over} have a spread over analysis.spread_threshold ({r['spread_threshold']:g} points)."
        )
    return (
        "## Tasks by teacher accuracy spread\n\n"
        f"Spread = max − min teacher accuracy. {said}\n\n" + md_table(header, rows)
    )


def _leaderboard(board: pd.DataFrame) -> str:
    d = board[board["row_type"] == "distilled"]
    rows = [
        [x.task, x.student, x.regime, x.teacher, _seeds(x), pts(x.teacher_acc), pts(x.base_acc),
         pts(x.post_acc), spts(x.gain), ci(x.gain_ci_low, x.gain_ci_high),
         WORDS.get(x.verdict if isinstance(x.verdict, str) else None), pts(x.format_fail_rate)]
        for x in d.itertuples()
    ]  # fmt: skip
    header = ["task", "student", "regime", "teacher", "replicate", "teacher acc", "base", "post"]
    header += ["adapter gain", "adapter CI (items only)", "teacher verdict", "no answer"]
    return (
        "## Leaderboard (distilled cells)\n\nOne row per adapter of the design (a teacher that gave "
        "no training example has its rows, with nothing trained: the baseline's accuracy, gain 0); "
        "all rows, teacher and baseline rows included, are in leaderboard.csv. An adapter's gain and CI cover the test "
        "items only and describe that one adapter; the teacher verdict (the same in every row of "
        "a teacher) is the group's, over items and replicates. No answer: % of completions the "
        "extractor found no answer in.\n\n" + md_table(header, rows)
    )


def _seeds(x: Any) -> str:
    trace = getattr(x, "trace_seed", None)
    return f"{x.seed}" if _nan(trace) else f"traces {trace}, train {x.seed}"


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


def _figures(figures: list[Path], out: Path) -> str:
    if not figures:
        return ""
    links = [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in figures]
    note = (
        "Error bars: each teacher's interval over test items and replicates, as in the Answers "
        "table (gain) or at the same level for its accuracy (post); each figure is also saved as "
        "SVG next to its PNG."
    )
    return "## Figures\n\n" + note + "\n\n" + "\n\n".join(links)


# --- plots ---------------------------------------------------------------------------------------


def plot_all(board: pd.DataFrame, out: Path, result: dict[str, Any]) -> list[Path]:
    """One figure per question, whatever the grid's size: gains by teacher, distilled accuracy
    against teacher accuracy, and the capacity gap. PNG paths (an SVG is saved beside each)."""
    points = _points(result)
    points.to_csv(out / "plot_data.csv", index=False)  # what the plots show, for checks
    if points["gain"].notna().sum() == 0:
        return []
    figures = [gains(points, out / "gains.png")]
    # a mix (no single teacher) has no teacher accuracy or size: those figures have nothing to show
    single = points.dropna(subset=["gain", "teacher_acc"])
    if not single.empty:
        figures.append(post_vs_teacher(single, out / "post_vs_teacher.png"))
        figures.append(capacity_gap(single, out / "capacity_gap.png"))
    return figures


def _points(result: dict[str, Any]) -> pd.DataFrame:
    """One row per (task, student, regime, teacher) with a decision: the teacher-level numbers
    the Answers table reads (the plots show nothing the decision does not)."""
    rows = []
    for g in result["groups"]:
        d = g["decision"]
        if not d:
            continue
        info = {t["teacher"]: t for t in g["ranking"]}
        for t in d["teachers"]:
            rows.append(
                {"task": g["task"], "student": g["student"], "regime": g["regime"],
                 "base_acc": d["base_acc"], **t,
                 "teacher_acc": info[t["teacher"]]["teacher_acc"],
                 "teacher_size": info[t["teacher"]]["teacher_size"]}
            )  # fmt: skip
    columns = ["task", "student", "regime", "teacher", "base_acc", "post_acc", "post_low"]
    columns += ["post_high", "gain", "gain_low", "gain_high", "verdict", "teacher_acc"]
    columns += ["teacher_size"]
    return pd.DataFrame(rows, columns=columns)


def _errors(mid: Any, low: Any, high: Any) -> np.ndarray:
    return 100 * np.vstack([np.atleast_1d(mid - low), np.atleast_1d(high - mid)]).clip(min=0)


def _order(values: pd.Series) -> list[str]:
    return list(dict.fromkeys(values))


# Each colour and marker has one meaning in every figure: a verdict against the baseline (gains),
# a student (the other figures); the marker is the regime.
VERDICT_COLORS = {
    "better": "tab:green",
    "worse": "tab:red",
    "equivalent": "tab:gray",
    "inconclusive": "tab:orange",
}
STUDENT_COLORS = ["tab:blue", "tab:purple", "tab:brown", "tab:cyan", "tab:olive", "tab:pink"]
REGIME_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def _student_color(students: list[str], s: str) -> str:
    return STUDENT_COLORS[students.index(s) % len(STUDENT_COLORS)]


def _regime_marker(regimes: list[str], r: str) -> str:
    return REGIME_MARKERS[regimes.index(r) % len(REGIME_MARKERS)]


def _legend(fig: plt.Figure, handles: list[Line2D], title: str) -> None:
    fig.legend(handles=handles, title=title, loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=min(len(handles), 5), fontsize=8, title_fontsize=8, frameon=False)  # fmt: skip


def _regime_handles(regimes: list[str]) -> list[Line2D]:
    return [Line2D([], [], color="black", mfc="none", marker=_regime_marker(regimes, r), ls="", label=r)
            for r in regimes]  # fmt: skip


def gains(p: pd.DataFrame, path: Path) -> Path:
    """Each teacher's gain over its student's baseline with the Answers table's interval: one
    panel per (task, student), one row per teacher; colour: the verdict against the baseline,
    marker: the regime."""
    p = p.dropna(subset=["gain"])
    tasks, students = _order(p["task"]), _order(p["student"])
    regimes, teachers = _order(p["regime"]), _order(p["teacher"])
    height = 0.6 + len(tasks) * (0.7 + 0.22 * len(teachers) * len(regimes))
    fig, axes = plt.subplots(len(tasks), len(students), squeeze=False, sharex=True,
                             figsize=(1.5 + 3.4 * len(students), height))  # fmt: skip
    step = 0.6 / len(regimes)
    for (i, task), (j, student) in product(enumerate(tasks), enumerate(students)):
        ax, mine = axes[i][j], p[(p["task"] == task) & (p["student"] == student)]
        for k, regime in enumerate(regimes):
            for row in mine[mine["regime"] == regime].itertuples():
                y = teachers.index(row.teacher) + (k - (len(regimes) - 1) / 2) * step
                ax.errorbar(100 * row.gain, y, xerr=_errors(row.gain, row.gain_low, row.gain_high),
                            fmt=_regime_marker(regimes, regime), capsize=2, ms=5,
                            color=VERDICT_COLORS.get(row.verdict, "black"))  # fmt: skip
        ax.axvline(0, color="0.3", lw=1, ls="--")
        ax.set_yticks(range(len(teachers)), teachers if j == 0 else [""] * len(teachers))
        ax.tick_params(labelsize=8)
        ax.set_ylim(len(teachers) - 0.5, -0.5)
        ax.set_title(f"{task} · {student}", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("gain over the baseline (points)", fontsize=8)
    seen = set(p["verdict"])
    handles = [Line2D([], [], color=c, marker="o", ls="", label=v)
               for v, c in VERDICT_COLORS.items() if v in seen]  # fmt: skip
    if seen - set(VERDICT_COLORS):
        handles.append(Line2D([], [], color="black", marker="o", ls="", label="no verdict"))
    if len(regimes) > 1:
        handles += _regime_handles(regimes)
    what = "colour: verdict vs the baseline" + ("; marker: regime" if len(regimes) > 1 else "")
    _legend(fig, handles, f"gain by teacher ({what}); the interval of the Answers table")
    return _save(fig, path)


def post_vs_teacher(p: pd.DataFrame, path: Path) -> Path:
    """The distilled student's accuracy against its teacher's, one panel per task: colour: the
    student (its baseline dashed), marker: the regime; teachers named on the top axis."""
    p = p.dropna(subset=["teacher_acc", "post_acc"])
    tasks, students, regimes = _order(p["task"]), _order(p["student"]), _order(p["regime"])
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.4 * cols, 3.6 * rows))
    for ax, task in zip(axes.flat, tasks, strict=False):
        mine = p[p["task"] == task]
        for (student, regime), s in mine.groupby(["student", "regime"], sort=False):
            s = s.sort_values("teacher_acc")
            ax.errorbar(100 * s["teacher_acc"], 100 * s["post_acc"], capsize=2, ms=5, lw=1,
                        yerr=_errors(s["post_acc"], s["post_low"], s["post_high"]),
                        fmt=_regime_marker(regimes, regime) + "-",
                        color=_student_color(students, student))  # fmt: skip
        for student, s in mine.groupby("student", sort=False):
            ax.axhline(100 * s["base_acc"].iloc[0], ls="--", lw=1,
                       color=_student_color(students, student))  # fmt: skip
        named = mine.drop_duplicates("teacher")
        top = ax.secondary_xaxis("top")
        top.set_xticks(100 * named["teacher_acc"], named["teacher"], fontsize=7, rotation=30)
        ax.set_title(task, fontsize=9, pad=18)
        ax.set_xlabel("teacher accuracy (points)", fontsize=8)
        ax.set_ylabel("distilled student accuracy (points)", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    handles = [Line2D([], [], color=_student_color(students, s), label=s) for s in students]
    handles.append(Line2D([], [], color="0.3", ls="--", label="its baseline"))
    if len(regimes) > 1:
        handles += _regime_handles(regimes)
    _legend(fig, handles, "distilled accuracy vs teacher accuracy (colour: student"
            + ("; marker: regime)" if len(regimes) > 1 else ")"))  # fmt: skip
    return _save(fig, path)


def capacity_gap(p: pd.DataFrame, path: Path) -> Path:
    """Gain against teacher accuracy and teacher size (log scale), one row of panels per regime:
    colour: the student, one line per (task, student) across its teachers; 0 is the baseline."""
    p = p.dropna(subset=["gain"])
    students, regimes = _order(p["student"]), _order(p["regime"])
    xs = [("teacher_acc", "teacher accuracy (points)"), ("teacher_size", "teacher parameters")]
    fig, axes = plt.subplots(len(regimes), 2, squeeze=False, sharey="row",
                             figsize=(9, 0.6 + 3.2 * len(regimes)))  # fmt: skip
    for i, regime in enumerate(regimes):
        mine = p[p["regime"] == regime]
        for ax, (x, label) in zip(axes[i], xs, strict=True):
            for (_, student), s in mine.groupby(["task", "student"], sort=False):
                s = s.dropna(subset=[x]).sort_values(x)
                ax.errorbar(100 * s[x] if x == "teacher_acc" else s[x], 100 * s["gain"],
                            yerr=_errors(s["gain"], s["gain_low"], s["gain_high"]), fmt="o-",
                            ms=4, lw=1, capsize=2, color=_student_color(students, student))  # fmt: skip
            ax.axhline(0, color="0.3", lw=1, ls="--")
            if x == "teacher_size" and mine[x].notna().any() and (mine[x].dropna() > 0).all():
                ax.set_xscale("log")
            ax.set_xlabel(label, fontsize=8)
            ax.set_title(f"{regime}: gain vs {label.removesuffix(' (points)')}", fontsize=9)
            ax.tick_params(labelsize=8)
        axes[i][0].set_ylabel("gain over the baseline (points)", fontsize=8)
    handles = [Line2D([], [], color=_student_color(students, s), marker="o", label=s)
               for s in students]  # fmt: skip
    handles.append(Line2D([], [], color="0.3", ls="--", label="baseline (gain 0)"))
    _legend(fig, handles, "capacity gap: gain vs the teacher (colour: student; a line per task)")
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    # no creation date in the SVG, so a rebuild writes the same bytes
    fig.savefig(path.with_suffix(".svg"), metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return path
