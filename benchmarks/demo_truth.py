"""Benchmark: the demo's answers against the sandbox's ground truth, and with every seed shifted.

    .venv/bin/python -m benchmarks.demo_truth [--shift 100] [--demo results/sandbox]
                                              [--truth results/sandbox-truth] [--keep DIR]
                                              [--out results/bench/demo_truth.json]

The ground truth is `configs/sandbox-truth.yaml` (the demo's world, more replicates and test
items) run with `cotgap run`; the demo is `configs/sandbox.yaml` (`make demo`). This runs the demo
again in a fresh results directory with every trace and training seed shifted by `--shift`
(its test items are the first `test_limit` of the split: nothing else is drawn), then compares
answers.csv per group (task, student, regime): the demo against the truth (a decided answer, a
teacher or `none`, agrees when its claim is true of the truth, `holds`; `same_label` counts those
with the truth's very answer), and the shifted run against the
demo (the same answer). Reported: each group's answers, the counts, the shifted run's wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import REPO, offline_env
from benchmarks.grid import cotgap_run

GROUP = ("task", "student", "regime")
UNDECIDED = "inconclusive"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "sandbox.yaml")
    p.add_argument("--shift", type=int, default=100, help="added to every trace and train seed")
    p.add_argument("--demo", type=Path, default=REPO / "results" / "sandbox", help="its run")
    p.add_argument("--truth", type=Path, default=REPO / "results" / "sandbox-truth")
    p.add_argument("--keep", type=Path, help="results directory to keep (default: a temp dir)")
    p.add_argument("--out", default="results/bench/demo_truth.json")
    return p.parse_args(argv)


def answers(run: Path) -> dict[tuple[str, ...], dict[str, str]]:
    """(task, student, regime) -> that group's row of `run`'s analysis/answers.csv."""
    path = run / "analysis" / "answers.csv"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run `cotgap run` on that config first.")
    with path.open() as f:
        return {tuple(r[k] for k in GROUP): r for r in csv.DictReader(f)}


TRUTH_MD = REPO / "harness" / "sandbox" / "models" / "TRUTH.md"
TASK_NAMES = {"sums": "sandbox_sums", "coin flip": "sandbox_coin_flip"}


def truth_md(path: Path = TRUTH_MD) -> list[dict[str, Any]]:
    """The ground truth as the zoo's model card records it (its first table: 10 replicates x
    1,000 test items per arm), for when no `configs/sandbox-truth.yaml` run is at hand: one row
    per (task, student, regime, teacher) with the baseline and the mean distilled accuracy (points)
    and the group's answer (a teacher, `none` or `inconclusive`, with "clears the effect of
    interest: yes|no|inconclusive" where the card says it). The teachers' order is the
    header's "(teacher-s / teacher-m / teacher-l)"."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    start = next(i for i, ln in enumerate(lines) if "| regime |" in ln)
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    teachers = re.search(r"\(([^)]*)\)", header[4])
    if teachers is None:
        raise ValueError(f"{path}: no '(teacher / ...)' in the table's header {header[4]!r}")
    names = [t.strip() for t in teachers.group(1).split("/")]
    rows = []
    for ln in lines[start + 2 :]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the end of the first table
        task, student, regime, base, posts, answer = cells
        clears = re.search(r"clears the effect of interest: (yes|no|inconclusive)", answer)
        baseline = float(base.rstrip("%"))
        for teacher, post in zip(names, posts.split("/"), strict=True):
            rows.append(
                {"task": TASK_NAMES.get(task, task), "student": student, "regime": regime,
                 "teacher": teacher, "base_acc": baseline, "post_acc": float(post),
                 "gain": round(float(post) - baseline, 6),
                 "answer": re.split(r"[\s:(]", answer, maxsplit=1)[0],
                 "clears_effect": clears.group(1) if clears else ""}
            )  # fmt: skip
    return rows


def truth_answers(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, str]]:
    """(task, student, regime) -> {"answer": ...}: `truth_md`'s rows as `compare` reads a run's."""
    return {
        tuple(r[k] for k in GROUP): {"answer": r["answer"], "clears_effect": r["clears_effect"]}
        for r in rows
    }


def shifted(config: Path, shift: int, results: Path) -> dict[str, Any]:
    import yaml

    cfg = yaml.safe_load(config.read_text())
    cfg["results_dir"] = str(results)
    for section in ("generate", "train"):
        cfg[section]["seeds"] = [s + shift for s in cfg[section]["seeds"]]
    return cfg


def holds(answer: str, truth: dict[str, str]) -> bool:
    """Whether a decided answer's claim is true of the world the truth measured: a teacher when
    the truth names it; `none` ("no teacher reaches the effect of interest") when the truth says
    none, or names a teacher whose gain it shows below the effect of interest (`clears_effect`
    no: a teacher better than the baseline by less than the margin, which a truth with 10,000
    scored answers per arm resolves and the demo's `none` rightly rules out as worth distilling)."""
    if answer == "none":
        return truth.get("answer") == "none" or truth.get("clears_effect") == "no"
    return truth.get("answer") == answer


def compare(truth: dict, demo: dict, again: dict) -> tuple[list[dict[str, Any]], dict[str, int]]:
    rows, counts = [], {"groups": len(demo), "decided": 0, "agree": 0, "disagree": 0, "same": 0}
    counts["same_label"] = 0  # decided answers that are the truth's very answer
    for group, d in demo.items():
        t, s = truth.get(group, {}), again.get(group, {})
        decided = d["answer"] != UNDECIDED
        counts["decided"] += decided
        if decided and t:
            agree = holds(d["answer"], t)
            counts["agree" if agree else "disagree"] += 1
            counts["same_label"] += t.get("answer") == d["answer"]
        counts["same"] += s.get("answer") == d["answer"]
        rows.append(
            {
                "group": "/".join(group),
                "truth": _said(t),
                "demo": _said(d),
                "shifted": _said(s),
            }
        )
    return rows, counts


def _said(row: dict[str, str]) -> str:
    if not row:
        return "(missing)"
    if row["answer"] == UNDECIDED and row.get("best_set"):
        return f"inconclusive, distill {row['distill']}, best set {row['best_set']}"
    gain = f" ({row['gain']})" if row.get("gain") else ""
    return f"{row['answer']}{gain}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    offline_env()
    args = parse_args(argv)
    import yaml

    demo = answers(args.demo)
    # without a truth run (it takes about an hour) only the rerun is compared
    truth = answers(args.truth) if (args.truth / "analysis").is_dir() else {}
    with tempfile.TemporaryDirectory(prefix="cotgap-bench-demo-truth-") as tmp:
        work = args.keep.resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        cfg = work / "sandbox-shifted.yaml"
        body = shifted(args.config, args.shift, work / "results")
        cfg.write_text(yaml.safe_dump(body, sort_keys=False))
        run = cotgap_run(cfg, Path(args.out).parent / "logs" / "demo-shifted.log")
        again = answers(work / "results" / body["name"])
    rows, counts = compare(truth, demo, again)
    result = {"shift": args.shift, "shifted_run": run, "counts": counts, "groups": rows}
    for r in rows:
        print(f"{r['group']}: truth {r['truth']} | demo {r['demo']} | shifted {r['shifted']}")
    print(json.dumps(counts))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
