"""Grid features run together: a pairwise covering array over selection, screening, top-k,
per-item filtering, every regime, every budget alignment, seeds and merged adapters, each grid
taken through validate, plan, run, analyze, view, export and check on the test zoo.

    python -m pytest tests/test_combos.py -m combos       # make test-slow runs it

Every pair of feature values occurs in at least one grid (the array is built greedily, the same
every time); `COMBOS` lists the grids, one test each.
"""

from __future__ import annotations

import csv
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import sandbox_grid

from harness import regimes

FACTORS: dict[str, list] = {
    "regime": ["per_teacher", "intersection", "matched", "mix"],
    "align": ["none", "updates", "tokens", "examples"],
    "select": [False, True],
    "screen": [False, True],
    "top_k": [False, True],
    "filter": [False, True],
    "seeds": [[0], [0, 1]],
    "merge": [False, True],
}


def _pairs(row: dict[str, int]) -> set[tuple]:
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(FACTORS, 2)}


def pairwise() -> list[dict]:
    """Rows of factor values covering every pair of values of every two factors."""
    names = list(FACTORS)
    todo = set().union(
        *(_pairs(dict(zip(names, r, strict=True)))
          for r in itertools.product(*(range(len(v)) for v in FACTORS.values())))
    )  # fmt: skip
    rows = []
    while todo:
        a, i, b, j = min(todo)
        row = {a: i, b: j}
        for n in names:
            if n not in row:
                gain = [
                    sum((x, row[x], n, v) in todo or (n, v, x, row[x]) in todo for x in row)
                    for v in range(len(FACTORS[n]))
                ]
                row[n] = gain.index(max(gain))
        row = {n: row[n] for n in names}
        rows.append(row)
        todo -= _pairs(row)
    return [{n: FACTORS[n][r[n]] for n in names} for r in rows]


COMBOS = pairwise()


def config(combo: dict, results: Path) -> dict:
    regime = combo["regime"]
    train: dict = {"regimes": [regime], "seeds": combo["seeds"], "merge": combo["merge"],
                   "max_steps": 2, "per_device_batch_size": 2}  # fmt: skip
    if regime == "mix":
        train["mix"] = [{"teacher": "t-large", "weight": 1}, {"teacher": "t-small", "weight": 1}]
    if combo["align"] != "none":
        train["budget"] = {"align": ["none", combo["align"]]}
    if combo["top_k"]:
        train.update(teachers_per_student="top_k", top_k=1)
    if combo["filter"]:
        train.update(filter_by="nll", filter_drop=0.25)
    data = sandbox_grid("combo", results, train_limit=16, test_limit=8, **train)
    data["generate"].update(n=1, max_tokens=64)
    data["evaluate"]["max_tokens"] = 64
    if combo["select"]:
        data["select"] = {"prompt_style": "zero_shot_cot", "min_points": 0, "limit": 8}
    if combo["screen"]:
        data["screen"] = {"max_examples": 8}
    return data


def cotgap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True, text=True, env={**os.environ}, timeout=1800,
    )  # fmt: skip


def test_the_array_covers_every_pair():
    seen = set().union(*(_pairs({n: FACTORS[n].index(c[n]) for n in FACTORS}) for c in COMBOS))
    every = set().union(
        *(_pairs(dict(zip(FACTORS, r, strict=True)))
          for r in itertools.product(*(range(len(v)) for v in FACTORS.values())))
    )  # fmt: skip
    assert seen == every and len(COMBOS) < 24


@pytest.mark.combos
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(map(str, c.values())))
def test_a_feature_combination_runs_through_every_command(combo, tmp_path):
    from harness.sandbox import zoo

    zoo.build(profile="test", progress=False)
    path = tmp_path / "combo.yaml"
    path.write_text(yaml.safe_dump(config(combo, tmp_path / "results")))
    root = tmp_path / "results" / "combo"
    for args in (
        ["validate", str(path)],
        ["plan", str(path)],
        ["run", str(path)],
        ["analyze", str(path)],
        ["view", str(path), "--out", str(tmp_path / "view.html")],
        ["export", str(path), "--out", str(tmp_path / "export")],
        ["check", str(path)],
    ):
        out = cotgap(*args)
        assert out.returncode == 0, (args[0], out.stderr[-3000:])
    with open(root / "analysis" / "leaderboard.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["row_type"] == "distilled"]
    from harness.config import load_experiment

    assert {r["regime"] for r in rows} == set(regimes.row_regimes(load_experiment(path).train))
    assert (tmp_path / "export" / "README.md").is_file() and (tmp_path / "view.html").is_file()
