"""Grid features run together: a pairwise covering array over selection, screening, top-k,
per-item filtering, every regime, every budget alignment, the distillation method, replicates
(training seeds, paired trace draws), a served teacher and merged adapters, each grid taken
through validate, plan, run, analyze, view, export and check on the test zoo.

    python -m pytest tests/test_combos.py -m combos       # all 18 grids: make test-combos
    python -m pytest tests/test_combos.py -m "combos and not combos_full"  # CI's: make test-slow
    python -m pytest tests/test_combos.py -m "not combos" # the array itself (make test)

Every pair of feature values that `validate` allows occurs in at least one of the 18 grids, and
no grid holds a pair it refuses (`FORBIDDEN`); the array is built greedily, the same every time.
`COMBOS` lists the grids, one test each. The grids with a served teacher share one vLLM
OpenAI-compatible server, started once for the module, and one xdist worker.
"""

from __future__ import annotations

import csv
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import TEST_TEACHERS, sandbox_grid

from harness.workflow import regimes

FACTORS: dict[str, list] = {
    "regime": ["per_teacher", "intersection", "matched", "mix"],
    "align": ["none", "updates", "tokens", "examples"],
    "method": ["sft", "kd", "on_policy"],
    # 1: one trace draw, one training seed; 2: one draw x two training seeds (crossed);
    # 3: three trace draws, each paired with its own training seed (train.replicates: paired)
    "replicates": [1, 2, 3],
    "teacher": ["local", "served"],  # served: t-small behind vLLM's OpenAI-compatible server
    "select": [False, True],
    "screen": [False, True],
    "top_k": [False, True],
    "filter": [False, True],
    "merge": [False, True],
}

# What `cotgap validate` refuses, as partial rows: no grid holds one, and no pair is asked of
# the array that only such a grid could give.
FORBIDDEN: list[dict] = [
    {"method": "kd", "teacher": "served"},  # no next-token distribution over the API
    {"method": "on_policy", "teacher": "served"},  # the teacher scores in the training worker
    {"method": "on_policy", "regime": "mix"},  # one teacher scores the student's samples
]


def _pair_ids(levels: list[int], rows: np.ndarray) -> np.ndarray:
    """Each row's pairs of (factor, value), one integer per pair of factors, in a shared space."""
    cols, base = [], 0
    for a, b in itertools.combinations(range(len(levels)), 2):
        cols.append(base + rows[:, a] * levels[b] + rows[:, b])
        base += levels[a] * levels[b]
    return np.stack(cols, axis=1)


def allowed_rows(factors: dict[str, list], forbidden: list[dict]) -> np.ndarray:
    """Every full row (value indices, one column per factor) that matches no forbidden entry."""
    names = list(factors)
    rows = np.array(list(itertools.product(*(range(len(v)) for v in factors.values()))))
    ok = np.ones(len(rows), dtype=bool)
    for entry in forbidden:
        hit = np.ones(len(rows), dtype=bool)
        for name, value in entry.items():
            hit &= rows[:, names.index(name)] == factors[name].index(value)
        ok &= ~hit
    return rows[ok]


def pairwise(factors: dict[str, list], forbidden: list[dict] = ()) -> list[dict]:
    """Rows of factor values holding every pair of values of every two factors that some allowed
    row holds, and no row matching a `forbidden` entry (a partial row: {factor: value, ...}).
    Greedy: each step takes the first allowed row that covers the most pairs still missing."""
    rows = allowed_rows(factors, list(forbidden))
    pairs = _pair_ids([len(v) for v in factors.values()], rows)
    missing = np.zeros(pairs.max() + 1, dtype=bool)
    missing[pairs] = True
    chosen = []
    while missing.any():
        best = int(missing[pairs].sum(axis=1).argmax())
        chosen.append(rows[best])
        missing[pairs[best]] = False
    return [{n: factors[n][i] for n, i in zip(factors, r, strict=True)} for r in chosen]


COMBOS = pairwise(FACTORS, FORBIDDEN)


def value_cover(array: list[dict]) -> list[dict]:
    """The grids CI runs: taken greedily from `array` (first best, the same every time) until
    every value of every factor occurs in one; the whole pairwise array is `make test-combos`."""
    need = {(f, repr(v)) for row in array for f, v in row.items()}
    chosen: list[dict] = []
    while need:
        best = max(array, key=lambda r: len(need & {(f, repr(v)) for f, v in r.items()}))
        chosen.append(best)
        need -= {(f, repr(v)) for f, v in best.items()}
    return [r for r in array if r in chosen]  # in the array's order


CI_COMBOS = value_cover(COMBOS)


def combo_id(combo: dict) -> str:
    on = [n for n in ("select", "screen", "top_k", "filter", "merge") if combo[n]]
    head = [combo["regime"], combo["align"], combo["method"], f"r{combo['replicates']}"]
    return "-".join([*head, combo["teacher"], *on])


def served_teacher(url: str) -> dict:
    """t-small of the test zoo, asked through an OpenAI-compatible server at `url`."""
    engine = {"kind": "openai", "base_url": url, "model": "t-small", "endpoint": "completions",
              "vllm_extensions": True, "max_concurrency": 8}  # fmt: skip
    return {**TEST_TEACHERS[0], "engine": engine}


def config(combo: dict, results: Path, url: str | None = None) -> dict:
    """The grid of `combo`; a served teacher is asked at `url` (`validate` contacts no server,
    so without one an unused local address stands in)."""
    regime = combo["regime"]
    train: dict = {"regimes": [regime], "methods": [combo["method"]], "merge": combo["merge"],
                   "max_steps": 2, "per_device_batch_size": 2}  # fmt: skip
    train["seeds"] = {1: [0], 2: [0, 1], 3: [0, 1, 2]}[combo["replicates"]]
    if combo["replicates"] == 3:
        train["replicates"] = "paired"
    if combo["method"] == "kd":
        train["kd"] = {"top_k": 4, "weight": 0.5}
    if combo["method"] == "on_policy":
        train["on_policy"] = {"teacher_share": 0.5, "max_new_tokens": 32}
    if regime == "mix":
        train["mix"] = [{"teacher": "t-large", "weight": 1}, {"teacher": "t-small", "weight": 1}]
    if combo["align"] != "none":
        train["budget"] = {"align": ["none", combo["align"]]}
    if combo["top_k"]:
        train.update(teachers_per_student="top_k", top_k=1)
    if combo["filter"]:
        train.update(filter_by="nll", filter_drop=0.25)
    teachers = TEST_TEACHERS
    if combo["teacher"] == "served":
        teachers = [served_teacher(url or "http://127.0.0.1:9/v1"), *TEST_TEACHERS[1:]]
    data = sandbox_grid("combo", results, teachers=teachers, train_limit=16, test_limit=8, **train)
    data["generate"].update(n=1, max_tokens=64)
    if combo["replicates"] == 3:
        del data["generate"]["seed"]
        data["generate"]["seeds"] = [0, 1, 2]
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


def _pairs_of(row: dict) -> set[tuple]:
    return {(a, repr(row[a]), b, repr(row[b])) for a, b in itertools.combinations(row, 2)}


def _matches(row: dict, entry: dict) -> bool:
    return all(row[n] == v for n, v in entry.items())


def _check_array(factors: dict[str, list], forbidden: list[dict], array: list[dict]) -> None:
    """Every pair some allowed row holds is in `array`; no row of it matches a forbidden entry."""
    every = [dict(zip(factors, r, strict=True)) for r in itertools.product(*factors.values())]
    allowed = [r for r in every if not any(_matches(r, f) for f in forbidden)]
    assert [r for r in array if any(_matches(r, f) for f in forbidden)] == []
    assert all(list(r) == list(factors) and r in every for r in array)
    assert set().union(*map(_pairs_of, array)) == set().union(*map(_pairs_of, allowed))


def test_the_array_covers_every_allowed_pair_and_no_forbidden_one():
    _check_array(FACTORS, FORBIDDEN, COMBOS)
    assert any(_matches(c, {"method": "kd", "regime": "mix"}) for c in COMBOS)
    # near the product of the two largest factors (4 x 4), the least any covering array can be
    assert 16 <= len(COMBOS) <= 20


def test_a_constraint_on_three_factors_and_a_pair_that_no_allowed_row_holds():
    factors = {"a": [0, 1, 2], "b": ["x", "y"], "c": [False, True], "d": [0, 1]}
    # the last two entries leave no allowed row with b=y and c=True, and with the second none
    # with a=2 and c=True either: neither pair is asked for; a=2 with b=x still is (c=False)
    forbidden = [{"a": 0, "b": "y"}, {"a": 2, "b": "x", "c": True},
                 {"b": "y", "c": True, "d": 0}, {"b": "y", "c": True, "d": 1}]  # fmt: skip
    array = pairwise(factors, forbidden)
    _check_array(factors, forbidden, array)
    assert not any(_matches(r, {"b": "y", "c": True}) for r in array)
    assert not any(_matches(r, {"a": 2, "c": True}) for r in array)
    assert any(_matches(r, {"a": 2, "b": "x"}) for r in array)


def test_ci_runs_every_value_of_every_factor():
    """CI's grids hold every value of every factor at least once, fewer grids than the array."""
    values = {(f, repr(v)) for f, vs in FACTORS.items() for v in vs}
    assert set().union(*({(f, repr(v)) for f, v in r.items()} for r in CI_COMBOS)) == values
    assert len(CI_COMBOS) < len(COMBOS) and all(r in COMBOS for r in CI_COMBOS)
    assert value_cover(COMBOS) == CI_COMBOS  # the same grids every time


def test_the_array_is_the_same_every_time():
    assert pairwise(FACTORS, FORBIDDEN) == COMBOS
    assert pairwise(dict(FACTORS), list(FORBIDDEN)) == pairwise(FACTORS, FORBIDDEN)
    ids = [combo_id(c) for c in COMBOS]
    assert len(set(ids)) == len(ids)
    assert f"one of the {len(COMBOS)} grids" in " ".join(__doc__.split())  # the docstring's count


def _problems(data: dict, tmp_path: Path) -> list[str]:
    """What `cotgap validate` says of the experiment `data` (no server is contacted)."""
    from harness.config.loading import load_experiment
    from harness.errors import UserError
    from harness.workflow import grid

    path = tmp_path / "combo.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        return grid.expand_problems(load_experiment(path))
    except UserError as e:
        return [str(e)]


def test_validate_accepts_every_grid_and_refuses_each_forbidden_entry(tmp_path):
    from harness.sandbox import zoo

    zoo.build(profile="test", progress=False)
    for combo in COMBOS:
        assert _problems(config(combo, tmp_path / "results"), tmp_path) == [], combo_id(combo)
    for entry in FORBIDDEN:
        said = " ".join(_problems(config({**COMBOS[0], **entry}, tmp_path / "results"), tmp_path))
        assert ("served teacher" if "teacher" in entry else "the mix regime") in said, entry


@pytest.fixture(scope="module")
def teacher_server(tmp_path_factory: pytest.TempPathFactory) -> str:
    """vLLM's OpenAI-compatible server on the test zoo's t-small, once for the module (started
    by the first grid with a served teacher; those grids share one xdist worker)."""
    from served import vllm_server

    from harness.sandbox import zoo

    zoo.build(profile="test", progress=False)
    log = tmp_path_factory.mktemp("server") / "server.log"
    with vllm_server(zoo.model_dir("test-teacher-s"), "t-small", log) as url:
        yield url


def _param(combo: dict):
    marks = [pytest.mark.xdist_group("combos-served")] if combo["teacher"] == "served" else []
    if combo not in CI_COMBOS:
        marks.append(pytest.mark.combos_full)
    return pytest.param(combo, id=combo_id(combo), marks=marks)


@pytest.mark.combos
@pytest.mark.parametrize("combo", [_param(c) for c in COMBOS])
def test_a_feature_combination_runs_through_every_command(combo, tmp_path, request):
    from harness.sandbox import zoo

    zoo.build(profile="test", progress=False)
    url = request.getfixturevalue("teacher_server") if combo["teacher"] == "served" else None
    path = tmp_path / "combo.yaml"
    path.write_text(yaml.safe_dump(config(combo, tmp_path / "results", url)))
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
    from harness.config.loading import load_experiment

    assert {r["regime"] for r in rows} == set(regimes.row_regimes(load_experiment(path).train))
    assert (tmp_path / "export" / "README.md").is_file() and (tmp_path / "view.html").is_file()
    # each trace draw of the served teacher went through the server (its request journal)
    journals = list((root / "cells" / "traces").glob("*/.requests.jsonl"))
    assert len(journals) == (3 if combo["replicates"] == 3 else 1) * (combo["teacher"] == "served")
