"""Task pre-selection (`select:`): select cells in the grid (phase 0, train split by default),
the scheduler gating a task's other cells on the teachers' spread, plan and report lines.

    python -m pytest tests/test_selection.py -m "not slow"
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import sandbox_grid

from harness.analysis.report import _selection, _warnings
from harness.config.schema import Experiment
from harness.execution import plan, schedule
from harness.stages import evaluate
from harness.store import Store
from harness.tasks import suite as tasks
from harness.workflow import grid as grids
from harness.workflow import selection
from harness.workflow.cells import KINDS, Cell

TASKS = ("sandbox_coin_flip", "sandbox_addition")
# what the fake select evals score: teachers differ by 40 points on coin flip, 2 on addition
ACCURACY = {
    ("sandbox_coin_flip", "t-small"): 0.3,
    ("sandbox_coin_flip", "t-large"): 0.7,
    ("sandbox_addition", "t-small"): 0.0,
    ("sandbox_addition", "t-large"): 0.02,
}


def experiment(root: Path, select: dict | None = None) -> Experiment:
    g = sandbox_grid("sel", root)
    g["tasks"] = [{"name": t, "train_limit": 16, "test_limit": 8} for t in TASKS]
    if select is not None:
        g["select"] = select
    return Experiment.model_validate(g)


class Stages(dict):
    """Completes every cell; a select eval scores ACCURACY."""

    def __init__(self) -> None:
        super().__init__({kind: self._stage for kind in KINDS})

    def _stage(self, exp: Experiment, store: Store, cells: list[Cell]) -> None:
        for c in cells:
            summary = {"n_examples": 5}
            if getattr(c, "role", None) == "select":
                summary["accuracy"] = ACCURACY[c.task, c.model]
            with store.open_cell(c.kind, c.key, c.config, c.upstream) as out:
                out.finish(summary)


def run(exp: Experiment, only: frozenset[str] | None = None):
    g, store = grids.expand(exp), Store(exp.root)
    sched = schedule.Schedule(
        g, g, store, only, None, task_gates=selection.gates(g), decide=plan._decider(exp, g, store)
    )
    schedule.run_local(exp, store, sched, Stages())
    return g, store, schedule.read_events(store)


def test_select_cells_are_phase_0_teacher_evals_on_the_train_split(tmp_path):
    exp = experiment(tmp_path, {"min_points": 30})
    g = grids.expand(exp)
    assert set(g.candidates) == {(t, m) for t in TASKS for m in ("t-small", "t-large")}
    for c in g.candidates.values():
        assert (c.phase, c.kind, c.role, c.stage) == (0, "eval", "select", "evaluate")
        assert c.config["task"]["split"] == "train" and c.limit == 16
        assert c.eval_config(exp).prompt_style == "few_shot_cot"
    # the other cells keep the keys they have without `select:` (it adds cells, changes none)
    plain = {c.key for c in grids.expand(experiment(tmp_path))}
    assert plain == {c.key for c in g if c.key not in {s.key for s in g.candidates.values()}}


def test_a_gated_task_runs_no_traces_training_or_evaluation(tmp_path):
    exp = experiment(tmp_path, {"min_points": 30})
    g, store, events = run(exp)
    for c in g:
        done = store.complete(c.kind, c.key)
        assert done == (c.task == "sandbox_coin_flip" or c.phase == 0), c.label
    skips = [e for e in events if e["event"] == "skip"]
    assert len(skips) == len([c for c in g.unique() if c.task == "sandbox_addition"]) - 2
    assert all("sandbox_addition is gated" in e["reason"] for e in skips)
    assert "spread 2.0 pts on the train split is below select.min_points 30" in skips[0]["reason"]
    decided = {e["task"]: e["passed"] for e in events if e["event"] == "select"}
    assert decided == {"sandbox_coin_flip": True, "sandbox_addition": False}
    phases = [e["phase"] for e in events if e["event"] == "phase_done"]
    assert phases[0] == 0 and phases == sorted(phases)
    # every planned cell of a phase is either done or skipped by its end line
    planned = {e["phase"]: e["cells"] for e in events if e["event"] == "phase"}
    ended = {e["phase"]: (e["cells"], e["skipped"]) for e in events if e["event"] == "phase_done"}
    assert all(done + skipped == planned[p] for p, (done, skipped) in ended.items())


def test_without_select_cells_computed_nothing_of_the_task_runs(tmp_path):
    exp = experiment(tmp_path, {"min_points": 30})
    g, store, events = run(exp, only=frozenset({"generate"}))
    assert not any(store.complete(c.kind, c.key) for c in g)
    assert {e["reason"].split(": ")[1] for e in events if e["event"] == "skip"} == {"not decided"}


def test_plan_and_report_show_every_candidate_and_the_work_saved(tmp_path):
    exp = experiment(tmp_path, {"min_points": 30})
    g, store = grids.expand(exp), Store(exp.root)
    todo = plan.missing(store, g.unique())
    assert (
        "undecided until their select cells run: 2 task(s)"
        in plan.selection_lines(exp, store, g, todo)[1]
    )
    g, store, _ = run(experiment(tmp_path / "b", {"min_points": 30}))
    exp = experiment(tmp_path / "b", {"min_points": 30})
    # as planned before anything else ran: select cells complete, the rest to run
    todo = [c for c in g.unique() if c.phase > 0]
    lines = plan.selection_lines(exp, store, g, todo)
    assert (
        "sandbox_coin_flip: goes on" in lines[1] and "sandbox_addition: [yellow]gated" in lines[2]
    )
    n = len([c for c in todo if c.task == "sandbox_addition"])
    assert f"gating saves {n} cells" in lines[3]
    rows = [
        {"task": d.task, "accuracies": d.accuracies, "spread": d.spread, "passed": d.passed,
         "reason": d.reason, "split": d.split, "min_points": d.min_points}
        for d in selection.decide(exp, g, store).values()
    ]  # fmt: skip
    text = _selection({"selection": rows})
    assert "| sandbox_addition | t-small 0.0, t-large 2.0 | 2.0 | gated |" in text
    assert "| sandbox_coin_flip | t-small 30.0, t-large 70.0 | 40.0 | goes on |" in text
    assert "a leak" not in text
    assert "a leak" in _selection({"selection": [{**rows[0], "split": "test"}]})
    assert _warnings({"selection": rows}) == ""  # the leak is a warning only on the test split
    leak = _warnings({"selection": [{**rows[0], "split": "test"}]})
    assert leak.startswith("## Warnings") and "set select.split to a held-out split" in leak


def test_selection_reads_no_test_item_by_default(tmp_path, monkeypatch):
    """The select evals of the default config load train items only: choosing tasks on the
    items that score the students would leak."""
    from test_evaluate import ScriptedEngine

    exp = experiment(tmp_path, {"min_points": 30, "prompt_style": "zero_shot_cot"})
    g = grids.expand(exp)
    splits, load = [], tasks.load_items

    def spy(task, split, *a, **kw):
        splits.append(split)
        return load(task, split, *a, **kw)

    monkeypatch.setattr(tasks, "load_items", spy)
    cells = [c for (t, _), c in g.candidates.items() if t == "sandbox_addition"]
    served = {c.key: (None, None) for c in cells}
    out = evaluate.work(exp, str(Store(exp.root).root), cells, served, engine=ScriptedEngine())
    assert len(out) == 2 and splits == ["train", "train"]
    test_exp = experiment(tmp_path, {"split": "test", "prompt_style": "zero_shot_cot"})
    assert {c.config["task"]["split"] for c in grids.expand(test_exp).candidates.values()} == {
        "test"
    }


def test_select_config_is_strict(tmp_path):
    with pytest.raises(ValueError, match="extra"):
        experiment(tmp_path, {"min_point": 30})
    with pytest.raises(ValueError):
        experiment(tmp_path, {"split": "validation"})
