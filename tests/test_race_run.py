"""`train.race` through `plan.run` and the analysis: rounds of ordinary cells, a race that a kill
cannot change, and answers.csv's replicates and savings.

The stage functions are fakes (no engine or training runs, which the race does not touch): each
completes its cells in the real store, an eval cell with 200 items scored right with a known
accuracy per teacher and trace draw, so the race and the analysis read real cells. The real
stages run through the same loop in tests/test_pipeline.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from harness.analysis import analyze
from harness.config.loading import load_experiment
from harness.config.schema import Experiment
from harness.execution import plan, schedule
from harness.store import Store
from harness.workflow import grid
from harness.workflow.cells import KINDS, Cell

CONFIG = Path(__file__).resolve().parent / "fixtures" / "grid" / "test-grid.yaml"
SEEDS = [0, 1, 2, 3, 4]
ITEMS = 200


class ScoredStages(dict):
    """Stages that complete their cells; evals score ITEMS items at `acc[teacher]` (the
    baseline at 0.3) plus a per-draw shift, from a seed made of the cell's key."""

    def __init__(self, acc: dict[str, float]) -> None:
        super().__init__({kind: self._stage for kind in KINDS})
        self.acc = acc
        self.trained: list[str] = []

    def _stage(self, exp: Experiment, store: Store, cells: list[Cell]) -> None:
        for c in cells:
            with store.open_cell(c.kind, c.key, c.config, c.upstream) as out:
                if c.kind == "adapter":
                    self.trained.append(c.key)
                if c.kind == "eval":
                    rng = np.random.default_rng(
                        int(hashlib.sha256(c.key.encode()).hexdigest()[:8], 16)
                    )
                    p = 0.3
                    if c.role == "distilled":
                        p = self.acc[c.teacher] + 0.02 * rng.standard_normal()
                    right = rng.random(ITEMS) < p
                    lines = [
                        f'{{"id": {i}, "correct": {str(bool(r)).lower()}}}'
                        for i, r in enumerate(right)
                    ]
                    (out.dir / "predictions.jsonl").write_text("\n".join(lines) + "\n")
                out.finish(
                    {"n_examples": 5, "accuracy": float(right.mean()) if c.kind == "eval" else None}
                )


def _exp(tmp_path: Path, race: dict | None) -> Experiment:
    exp = load_experiment(CONFIG)
    data = exp.model_dump(mode="json", exclude_unset=True)
    data["results_dir"] = str(tmp_path)
    data["generate"] = {**data["generate"], "seeds": SEEDS}
    data["generate"].pop("seed", None)
    data["train"] = {**data["train"], "regimes": ["per_teacher"], "seeds": SEEDS,
                     "replicates": "paired", "race": race}  # fmt: skip
    return Experiment.model_validate(data)


@pytest.fixture
def fake(monkeypatch):
    def install(acc):
        stages = ScoredStages(acc)
        monkeypatch.setattr(schedule, "_stage_table", lambda: stages)
        return stages

    return install


def _rounds(exp, store):
    return lambda: analyze.race_round(exp, store)


def test_a_clear_race_trains_the_first_look_only_and_says_what_it_saved(tmp_path, fake):
    exp = _exp(tmp_path, {"min_replicates": 3, "max_replicates": 5})
    store = Store(exp.root)
    stages = fake({"t-large": 0.85, "t-small": 0.35})
    plan.run(exp, store, rounds=_rounds(exp, store), log=lambda s: None)
    assert len(stages.trained) == 6  # 3 draws x 2 teachers; the uniform design trains 10
    board, missing, _, decisions = analyze.leaderboard(exp, store)
    assert missing == {}, missing  # the untrained replicates are skipped by design
    (d,) = decisions.values()
    assert d["answer"] == "t-large" and d["race"]["adapters_saved"] == 4
    answers = analyze.answers_table(exp, [{"task": "sandbox_coin_flip", "student": "stu",
                                           "regime": "per_teacher", "decision": d}])  # fmt: skip
    assert answers.loc[0, "replicates"] == "t-small:3;t-large:3"
    assert answers.loc[0, "adapters_saved"] == 4
    out = analyze.run(exp, store)
    assert (out / "answers.csv").read_text().splitlines()[1].endswith(",t-small:3;t-large:3,4")
    assert (
        "**Race** (train.race): teachers got 3 trace draws each (answers.csv `replicates`: per "
        "teacher); the race trained 6 adapters where every teacher at the maximum trains 10: 4 "
        "saved (40%)."
    ) in (out / "report.md").read_text()


def test_a_killed_race_resumes_to_the_same_cells_and_answers(tmp_path, fake):
    """A race of two close teachers (both stay contenders) run whole, and the same race killed
    after its first round and resumed: the same adapters trained, the same answer; a rerun
    trains nothing."""
    acc = {"t-large": 0.62, "t-small": 0.58}
    whole = _exp(tmp_path / "whole", {"min_replicates": 3, "max_replicates": 5})
    store = Store(whole.root)
    stages = fake(acc)
    plan.run(whole, store, rounds=_rounds(whole, store), log=lambda s: None)
    assert len(stages.trained) == 10  # neither teacher is ruled out: both to the maximum
    first = analyze.leaderboard(whole, store)[3]

    killed = _exp(tmp_path / "killed", {"min_replicates": 3, "max_replicates": 5})
    kstore = Store(killed.root)
    kstages = fake(acc)
    plan.run(killed, kstore, analyze.race_round(killed, kstore), log=lambda s: None)  # round 1
    assert len(kstages.trained) == 6
    plan.run(killed, kstore, rounds=_rounds(killed, kstore), log=lambda s: None)
    again = analyze.leaderboard(killed, kstore)[3]
    assert sorted(stages.trained) == sorted(kstages.trained)
    assert [d["answer"] for d in first.values()] == [d["answer"] for d in again.values()]
    assert [d["race"] for d in first.values()] == [d["race"] for d in again.values()]

    rerun = fake(acc)
    plan.run(killed, kstore, rounds=_rounds(killed, kstore), log=lambda s: None)
    assert rerun.trained == []


def test_without_a_race_every_replicate_is_trained(tmp_path, fake):
    exp = _exp(tmp_path, None)
    store = Store(exp.root)
    stages = fake({"t-large": 0.85, "t-small": 0.35})
    plan.run(exp, store, rounds=None, log=lambda s: None)
    assert len(stages.trained) == 10
    (d,) = analyze.leaderboard(exp, store)[3].values()
    assert "race" not in d
    assert d["answer"] == "t-large"


def test_plan_states_the_adapters_and_gpu_hours_of_a_race(tmp_path):
    exp = _exp(tmp_path, {"min_replicates": 3, "max_replicates": 5})
    store, g = Store(exp.root), grid.expand(exp)
    todo = plan.missing(store, g.unique())
    head, total = plan.race_lines(exp, store, g, todo)
    # one group of 2 teachers: 6 adapters if decided at the first look, 10 at the maximum
    assert "3 to 5 trace draws, alpha spent over 3 looks" in head
    assert "adapters at most 10, at least 6, expected about " in head
    expected = float(head.split("expected about ")[1].split(" ")[0])
    assert 6 <= expected <= 10
    assert "the grid's 1 group(s): adapters at most 10" in total
    assert plan.race_lines(_exp(tmp_path, None), store, g, todo) == []


def test_cotgap_run_races_and_its_only_option_keeps_to_the_current_round(tmp_path, fake):
    import yaml
    from typer.testing import CliRunner

    from harness.cli import app

    exp = _exp(tmp_path, {"min_replicates": 3, "max_replicates": 5})
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_unset=True)))
    stages = fake({"t-large": 0.62, "t-small": 0.58})
    result = CliRunner().invoke(app, ["run", str(path), "--only", "generate,train"])
    assert result.exit_code == 0, result.output
    assert len(stages.trained) == 6  # the first look's draws only, not every draw
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert len(stages.trained) == 10 and "race: round" in result.output
