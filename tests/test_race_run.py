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
from harness.workflow.cells import KINDS, SCREEN_SIGNALS, Cell

CONFIG = Path(__file__).resolve().parent / "fixtures" / "grid" / "test-grid.yaml"
SEEDS = [0, 1, 2, 3, 4]
ITEMS = 200


class ScoredStages(dict):
    """Stages that complete their cells; evals score ITEMS items at `acc[teacher]` (the
    baseline at 0.3) plus a per-draw shift, from a seed made of the cell's key."""

    def __init__(self, acc: dict[str, float], prior: dict[str, float] | None = None) -> None:
        super().__init__({kind: self._stage for kind in KINDS})
        self.acc, self.prior = acc, prior or {}
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
                    if c.role == "teacher" and c.model in self.prior:
                        p = self.prior[c.model]
                    right = rng.random(ITEMS) < p
                    lines = [
                        f'{{"id": {i}, "correct": {str(bool(r)).lower()}}}'
                        for i, r in enumerate(right)
                    ]
                    (out.dir / "predictions.jsonl").write_text("\n".join(lines) + "\n")
                summary = {
                    "n_examples": 5,
                    "accuracy": float(right.mean()) if c.kind == "eval" else None,
                }
                if c.kind == "screen":  # a student-side signal: lower mean_rank predicts more
                    value = 10 * (1 - self.prior.get(c.teacher, 0.5))
                    summary |= dict.fromkeys(SCREEN_SIGNALS, value)
                    summary |= {"n_screened": 5, "n_tokens": 100, "teacher_train_acc": 0.5}
                out.finish(summary)


def _exp(tmp_path: Path, race: dict | None, **extra: dict) -> Experiment:
    exp = load_experiment(CONFIG)
    data = exp.model_dump(mode="json", exclude_unset=True)
    data["results_dir"] = str(tmp_path)
    data["generate"] = {**data["generate"], "seeds": SEEDS}
    data["generate"].pop("seed", None)
    data["train"] = {**data["train"], "regimes": ["per_teacher"], "seeds": SEEDS,
                     "replicates": "paired", "race": race}  # fmt: skip
    return Experiment.model_validate({**data, **extra})


@pytest.fixture
def fake(monkeypatch):
    def install(acc, prior=None):
        stages = ScoredStages(acc, prior)
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
    assert (out / "answers.csv").read_text().splitlines()[1].endswith(",t-small:3;t-large:3,4,")
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


@pytest.mark.parametrize("prior", ["teacher_acc", "mean_rank"])
def test_a_prior_races_the_best_ranked_and_reports_the_teacher_it_screened_out(
    tmp_path, fake, prior
):
    """train.race.prior ranks the teachers before any training (the teacher's own accuracy, or
    a screen of the first trace draw); with start: 1 only the best-ranked races: its adapters
    alone are trained, the other is reported as screened out (not ruled out), and the uniform
    design the saving is counted against still holds both teachers."""
    race = {"min_replicates": 3, "max_replicates": 5, "prior": prior, "start": 1}
    exp = _exp(
        tmp_path, race, **({"screen": {"signal": "mean_rank"}} if prior == "mean_rank" else {})
    )
    store = Store(exp.root)
    # the prior puts t-small first, though t-large distils better: the race must follow the
    # prior, and the answer must be about the teacher that raced
    stages = fake({"t-large": 0.85, "t-small": 0.60}, prior={"t-small": 0.9, "t-large": 0.5})
    plan.run(exp, store, rounds=_rounds(exp, store), log=lambda s: None)
    adapters = {k for k in stages.trained}
    assert len(adapters) == 3, adapters  # t-small's first look; t-large never trains
    board, missing, _, decisions = analyze.leaderboard(exp, store)
    assert missing == {}, missing  # t-large's rows are skipped by design, not missing
    (d,) = decisions.values()
    assert [t["teacher"] for t in d["teachers"]] == ["t-small"]
    assert d["answer"] == "t-small"
    assert list(d["race"]["screened_out"]) == ["t-large"]
    assert d["race"]["screened_out"]["t-large"]["rank"] == 2
    assert "rank 2 of 2, the best 1 raced" in d["race"]["screened_out"]["t-large"]["why"]
    assert d["race"]["adapters_saved"] == 10 - 3
    dist = board[board["row_type"] == "distilled"]
    assert dist.loc[dist["teacher"] == "t-large", "screened_out"].notna().all()
    assert dist.loc[dist["teacher"] == "t-small", "screened_out"].isna().all()
    out = analyze.run(exp, store)
    answers = (out / "answers.csv").read_text().splitlines()
    assert answers[1].endswith(",7,t-large:2")
    assert "screened out 1 teacher row(s)" in (out / "report.md").read_text()


def test_a_prior_needs_what_computes_it():
    base = load_experiment(CONFIG).model_dump(mode="json", exclude_unset=True)
    race = {"min_replicates": 3, "max_replicates": 3, "prior": "mean_rank"}
    data = {**base, "generate": {"seeds": [0, 1, 2]},
            "train": {**base["train"], "seeds": [0, 1, 2], "replicates": "paired", "race": race}}  # fmt: skip
    with pytest.raises(ValueError, match="no `screen:` section"):
        Experiment.model_validate(data)
    with pytest.raises(ValueError, match="needs a prior"):
        Experiment.model_validate({**data, "train": {**data["train"], "race": {
            "min_replicates": 3, "max_replicates": 3, "start": 1}}})  # fmt: skip
    too_many = {**race, "prior": "teacher_acc", "start": 3}
    with pytest.raises(ValueError, match="more than the 2 teachers"):
        Experiment.model_validate({**data, "train": {**data["train"], "race": too_many}})


def test_a_prior_without_start_races_every_teacher(tmp_path, fake):
    """Without start the prior screens nobody out: the race, its adapters and its answer are
    those of the race without a prior, though the prior ranks the worse teacher first."""
    race = {"min_replicates": 3, "max_replicates": 5, "prior": "teacher_acc"}
    exp = _exp(tmp_path, race)
    store = Store(exp.root)
    stages = fake({"t-large": 0.85, "t-small": 0.35}, prior={"t-small": 0.9, "t-large": 0.5})
    plan.run(exp, store, rounds=_rounds(exp, store), log=lambda s: None)
    teacher_of = {d.adapter.key: k[2] for k, d in grid.expand(exp).distilled.items()}
    assert sorted(teacher_of[k] for k in stages.trained) == ["t-large"] * 3 + ["t-small"] * 3
    (d,) = analyze.leaderboard(exp, store)[3].values()
    assert d["answer"] == "t-large" and d["race"]["screened_out"] == {}
    assert d["race"]["adapters_saved"] == 4


def test_plan_states_a_race_with_a_prior_that_screens_out(tmp_path):
    race = {"min_replicates": 3, "max_replicates": 5, "prior": "teacher_acc", "start": 1}
    exp = _exp(tmp_path, race)
    store, g = Store(exp.root), grid.expand(exp)
    head, total = plan.race_lines(exp, store, g, plan.missing(store, g.unique()))
    # one teacher races: 3 adapters if decided at the first look, 5 at the maximum
    assert "group of 1 teachers (1 of 2 screened out by train.race.prior: teacher_acc" in head
    assert "adapters at most 5, at least 3" in head
    assert "the grid's 1 group(s): adapters at most 5" in total


def test_before_its_prior_is_computed_a_group_trains_nothing(tmp_path):
    """A group whose first-draw screens are not done (or never will be: a task pre-selection
    gated) has no entrants yet: the round holds its screens and none of its distilled cells."""
    from harness.analysis import race as race_analysis
    from harness.workflow import race as race_cells

    race = {"min_replicates": 3, "max_replicates": 5, "prior": "mean_rank", "start": 1}
    exp = _exp(tmp_path, race, screen={"signal": "mean_rank"})
    store, g = Store(exp.root), grid.expand(exp)
    assert race_analysis.prior_ranks(exp, g, store) == {}
    entrants = race_analysis.entrants(exp, g, store)
    assert entrants == {}
    cells = race_cells.round_cells(exp, g, {}, entrants)
    assert not [c for c in cells if c.kind == "eval" and c.role == "distilled"]
    screens = [c for c in cells if c.kind == "screen"]
    assert len(screens) == 2 and {c.trace_seed for c in screens} == {SEEDS[0]}
