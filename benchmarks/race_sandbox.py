"""Benchmark: a race on the sandbox grid against the uniform design, the ground truth and a rerun.

    .venv/bin/python -m benchmarks.race_sandbox --uniform results/sandbox --race results/RACE
                                                --rerun results/RACE-SHIFTED
                                                [--truth harness/sandbox/models/TRUTH.md]
                                                [--out results/bench/race_sandbox.json]

Each directory is a finished `cotgap run` of the demo's grid (configs/sandbox.yaml): `--uniform`
with every teacher at the same replicates (the demo), `--race` with `train.race` on, `--rerun` the
same race with every trace and training seed shifted (benchmarks/demo_truth.py `shifted`). Nothing
is computed here; their answers.csv are compared per (task, student, regime) group, as
benchmarks/demo_truth.py compares them: each run against the truth (TRUTH.md's answers: 10
replicates x 1,000 test items per arm; a decided answer, a teacher or `none`, agrees when the
truth gives the same), the race against the uniform design and the rerun against the race (the
same answer). Also the adapters each race trained (its `replicates` column, one adapter a trace
draw under `replicates: paired`) against a uniform design at the race's maximum (those plus
`adapters_saved`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.demo_truth import TRUTH_MD, answers, compare, truth_answers, truth_md


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--uniform", type=Path, required=True, help="the uniform design's run")
    p.add_argument("--race", type=Path, required=True, help="the race's run")
    p.add_argument("--rerun", type=Path, required=True, help="the race with shifted seeds")
    p.add_argument("--truth", type=Path, default=TRUTH_MD, help="the zoo's model card")
    p.add_argument("--out", default="results/bench/race_sandbox.json")
    return p.parse_args(argv)


def adapters(run: dict[tuple[str, ...], dict[str, str]]) -> dict[str, int]:
    """A race's adapters (trace draws of every teacher of every group) and the uniform design's
    at its maximum, from answers.csv's `replicates` and `adapters_saved`."""
    trained = uniform = 0
    for row in run.values():
        if not row.get("adapters_saved"):
            raise SystemExit("answers.csv has no adapters_saved: is this run a race?")
        n = sum(int(part.rsplit(":", 1)[1]) for part in row["replicates"].split(";"))
        trained += n
        uniform += n + int(float(row["adapters_saved"]))
    return {"trained": trained, "uniform_at_max": uniform, "saved": uniform - trained}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    truth = truth_answers(truth_md(args.truth))
    uniform, race, rerun = answers(args.uniform), answers(args.race), answers(args.rerun)
    rows, vs_uniform = compare(truth, uniform, race)  # the uniform design vs truth; race = it?
    race_rows, vs_race = compare(truth, race, rerun)  # the race vs truth; rerun = the race?
    vs_rerun = compare(truth, rerun, race)[1]  # the rerun vs truth
    for row, r in zip(rows, race_rows, strict=True):
        row["rerun"] = r.pop("shifted")
        row["race"] = row.pop("shifted")
        row["replicates"] = race[tuple(row["group"].split("/"))]["replicates"]
        row["rerun_replicates"] = rerun.get(tuple(row["group"].split("/")), {}).get("replicates")
    result = {
        "groups": rows,
        "uniform": vs_uniform,  # decided/agree/disagree: the uniform design; same: race = uniform
        "race": vs_race,  # decided/agree/disagree: the race; same: rerun = race
        "rerun": {k: v for k, v in vs_rerun.items() if k != "same"},
        "adapters": {"race": adapters(race), "rerun": adapters(rerun)},
    }
    for r in rows:
        print(f"{r['group']}: truth {r['truth']} | uniform {r['demo']} | race {r['race']} "
              f"[{r['replicates']}] | rerun {r['rerun']} [{r['rerun_replicates']}]")  # fmt: skip
    print(json.dumps({k: result[k] for k in ("uniform", "race", "rerun", "adapters")}))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
