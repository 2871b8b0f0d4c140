"""Benchmark: a full sandbox grid through `cotgap run`, then the same command again.

    .venv/bin/python -m benchmarks.grid [--train-limit 32] [--test-limit 24] [--steps 6]
                                        [--keep DIR] [--out results/bench/grid.json]

Two test-zoo teachers x one student x one task (per_teacher regime, one seed), in a fresh
temporary results directory: the first run computes every cell (traces, teacher evals, the
baseline, datasets, adapters, distilled evals) and the analysis; the second finds every cell
complete, computes none and rebuilds the analysis. A teacher whose traces hold no correct answer
leaves its adapter and that adapter's eval uncomputed (cotgap skips them and says so): they count
as "not computed" in both runs. Reported: the wall time of each run (the CLI
as a user starts it: a new Python process each time), their ratio, the cells each computed (from
the CLI's own summary line) and whether the leaderboard came out byte-identical.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import offline_env

REPO = Path(__file__).resolve().parents[1]
TEACHERS = {"t-small": "test-teacher-s", "t-large": "test-teacher-l"}
STUDENT = "test-student"
COMPUTED = re.compile(r"computed (\d+) cell\(s\) (\{[^}]*\}) in ([0-9.]+) s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="sandbox_sums")
    p.add_argument("--train-limit", type=int, default=32, help="train questions per teacher")
    p.add_argument("--test-limit", type=int, default=24)
    p.add_argument("--n", type=int, default=2, help="traces per question")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=6, help="LoRA steps per adapter")
    p.add_argument("--keep", type=Path, help="results directory to keep (default: a temp dir)")
    p.add_argument("--out", default="results/bench/grid.json")
    return p.parse_args(argv)


def config(results: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": "bench-grid",
        "results_dir": str(results),
        "teachers": [{"name": n, "path": f"sandbox:{m}"} for n, m in TEACHERS.items()],
        "students": [{"name": "student", "path": f"sandbox:{STUDENT}"}],
        "tasks": [
            {"name": args.task, "train_limit": args.train_limit, "test_limit": args.test_limit}
        ],
        "generate": {"n": args.n, "temperature": 0.8, "max_tokens": args.max_tokens, "seed": 0},
        "train": {
            "lr": 5e-3,
            "max_steps": args.steps,
            "per_device_batch_size": 8,
            "max_length": 256,
            "regimes": ["per_teacher"],
            "lora": {"r": 8, "alpha": 16},
        },
        "evaluate": {"max_tokens": args.max_tokens},
        "analysis": {"bootstrap_samples": 200},
    }


def cotgap_run(config_path: Path, log: Path) -> dict[str, Any]:
    """`cotgap run CONFIG` in a new process; its wall time and the cells it says it computed."""
    env = {**os.environ, "COLUMNS": "200"}  # one summary line, unwrapped
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(config_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"cotgap run exited {proc.returncode} (log: {log}):\n{tail}")
    m = COMPUTED.search(" ".join((proc.stdout + proc.stderr).split()))
    if not m:
        raise RuntimeError(f"no 'computed N cell(s)' line in the output (log: {log})")
    text = proc.stdout + proc.stderr
    skipped = re.findall(r"^skipping (\S+): (.*)$", text, re.M)
    left = re.search(r"analysis: (\d+) cell\(s\) not computed", text)
    return {
        "wall_s": round(wall, 2),
        "cells": int(m.group(1)),
        "not_computed": int(left.group(1)) if left else 0,  # skipped cells and their evals
        "skipped": [f"{cell}: {why}" for cell, why in skipped],
        "by_kind": ast.literal_eval(m.group(2)),
        "cli_reported_s": float(m.group(3)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build the test zoo if needed, run the grid twice, print and write the result."""
    offline_env()
    args = parse_args(argv)
    import yaml

    from harness.sandbox import zoo

    t0 = time.perf_counter()
    zoo.build([*TEACHERS.values(), STUDENT], progress=False, profile="test")
    zoo_s = time.perf_counter() - t0
    out = Path(args.out)
    logs = out.parent / "logs"
    with tempfile.TemporaryDirectory(prefix="cotgap-bench-grid-") as tmp:
        work = args.keep.resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        cfg = work / "grid.yaml"
        cfg.write_text(yaml.safe_dump(config(work / "results", args), sort_keys=False))
        board = work / "results" / "bench-grid" / "analysis" / "leaderboard.csv"
        if board.exists():
            raise RuntimeError(f"{board.parent.parent} exists: give --keep an empty directory")
        first = cotgap_run(cfg, logs / "grid-first.log")
        board_first = board.read_bytes()
        again = cotgap_run(cfg, logs / "grid-rerun.log")
        same_board = board.read_bytes() == board_first
    result = {
        "workload": {
            "teachers": list(TEACHERS.values()),
            "student": STUDENT,
            "task": args.task,
            "train_limit": args.train_limit,
            "test_limit": args.test_limit,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "steps": args.steps,
            "results_dir": str(work / "results") if args.keep else "(temporary)",
        },
        "zoo_build_s": round(zoo_s, 2),
        "first_run": first,
        "rerun": again,
        "rerun_over_first": round(again["wall_s"] / first["wall_s"], 4),
        "speedup": round(first["wall_s"] / again["wall_s"], 1),
        "leaderboard_unchanged": same_board,
    }
    print(f"{'run':<10}{'wall s':>9}{'cells':>7}  by kind")
    for name, r in (("first", first), ("re-run", again)):
        print(f"{name:<10}{r['wall_s']:>9.2f}{r['cells']:>7}  {r['by_kind']}")
    if first["not_computed"]:
        print(f"{first['not_computed']} cell(s) of the grid not computed (both runs):")
    for line in first["skipped"]:
        print(f"  {line}")
    print(
        f"re-run / first: {result['rerun_over_first']:.3f} (x{result['speedup']} faster); "
        f"leaderboard unchanged: {same_board}"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
