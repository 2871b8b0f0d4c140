"""The scheduler, on a fake stage table: order, grouping, resume, `--only`, skips and events.

The stage functions here are fakes (no engine or training runs): each completes its cells in the
real store, recording the groups it was handed, so the ready loop is tested on its own. The real
stages run through the same loop in tests/test_pipeline.py and tests/test_ray.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import progress
from harness.config.loading import load_experiment
from harness.config.schema import Experiment
from harness.errors import UserError
from harness.execution import schedule
from harness.store import Store
from harness.workflow import grid
from harness.workflow.cells import KINDS, Cell

CONFIG = Path(__file__).resolve().parent / "fixtures" / "grid" / "test-grid.yaml"


class FakeStages(dict):
    """A stage table whose functions complete their cells and record each call's group; the
    dataset of `empty_teacher` (if any) is built with no examples."""

    def __init__(self, empty_teacher: str | None = None) -> None:
        super().__init__({kind: self._stage for kind in KINDS})
        self.calls: list[tuple[str, list[str]]] = []
        self.empty = empty_teacher

    def _stage(self, exp: Experiment, store: Store, cells: list[Cell]) -> None:
        self.calls.append((cells[0].kind, [c.key for c in cells]))
        for c in cells:
            empty = c.kind == "dataset" and c.teacher == self.empty
            summary = {"n_examples": 0 if empty else 5}
            with store.open_cell(c.kind, c.key, c.config, c.upstream) as out:
                out.finish(summary)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Experiment, grid.Grid, Store]:
    exp = load_experiment(CONFIG).model_copy(update={"results_dir": str(tmp_path)})
    return exp, grid.expand(exp), Store(exp.root)


def run(exp, g, store, wanted=None, only=None, table=None, **kw):
    table = table if table is not None else FakeStages()
    sched = schedule.Schedule(g, g if wanted is None else wanted, store, only, **kw)
    counts = schedule.run_local(exp, store, sched, table)
    return table, counts


def test_local_runs_phase_by_phase_with_one_group_per_model_and_one_training_worker(setup):
    exp, g, store = setup
    stages, counts = run(exp, g, store)
    phases = [g.by_key()[keys[0]].phase for _, keys in stages.calls]
    assert phases == sorted(phases) and set(phases) == {1, 2, 3, 5, 6}  # no screen: section
    by_kind = [(k, len(keys)) for k, keys in stages.calls]
    # traces: one group per teacher; pre-evals: one per model; every adapter in one worker;
    # distilled evals: one session for the student
    assert by_kind[:2] == [("traces", 1), ("traces", 1)]
    assert [n for k, n in by_kind if k == "adapter"] == [6]
    assert [n for k, n in by_kind if k == "eval" and n > 1] == [6]
    assert counts == {"traces": 2, "eval": 9, "dataset": 6, "adapter": 6}
    assert all(store.complete(c.kind, c.key) for c in g)
    events = schedule.read_events(store)
    assert [e["phase"] for e in events if e["event"] == "phase_done"] == [1, 2, 3, 5, 6]
    assert events[-1]["event"] == "run_done" and events[-1]["counts"] == counts


def test_a_second_run_hands_nothing_to_a_stage(setup):
    exp, g, store = setup
    run(exp, g, store)
    stages, counts = run(exp, g, store)
    assert stages.calls == [] and sum(counts.values()) == 0


def test_wanted_cells_pull_in_their_missing_inputs_only(setup):
    exp, g, store = setup
    (target,) = g.select(kind="eval", role="distilled", teacher="t-small", regime="per_teacher")
    stages, _ = run(exp, g, store, wanted=[target])
    ran = [key for _, keys in stages.calls for key in keys]
    d = g.distilled["sandbox_coin_flip", "stu", "t-small", "per_teacher", 0, 0]
    assert ran == [d.traces.key, d.dataset.key, d.adapter.key, d.eval.key]


def test_only_keeps_stages_and_skips_cells_whose_inputs_are_missing(setup):
    exp, g, store = setup
    said: list[str] = []
    events = schedule.Events(store, said.append)
    stages, counts = run(exp, g, store, only=frozenset({"train"}), events=events)
    assert stages.calls == [] and sum(counts.values()) == 0
    [blocked] = [e for e in schedule.read_events(store) if e["event"] == "blocked"]
    assert len(blocked["cells"]) == 12 and "run the earlier stages first" in said[0]
    run(exp, g, store, only=frozenset({"generate"}))
    stages, counts = run(exp, g, store, only=frozenset({"train"}))
    assert counts == {"traces": 0, "eval": 0, "dataset": 6, "adapter": 6}


def test_an_empty_training_set_skips_its_adapter_and_eval_with_the_reason(setup, capsys):
    exp, g, store = setup
    stages, counts = run(exp, g, store, table=FakeStages(empty_teacher="t-large"))
    skips = [e for e in schedule.read_events(store) if e["event"] == "skip"]
    empty = {c.key for c in g.select(kind="adapter", teacher="t-large")}
    assert {e["cell"] for e in skips if e["kind"] == "adapter"} == empty
    assert {e["reason"] for e in skips if e["kind"] == "adapter"} == {
        "its teacher left no training examples"
    }
    assert sum(e["kind"] == "eval" for e in skips) == 3  # their evals: input skipped
    assert counts["adapter"] == 3 and counts["eval"] == 2 + 1 + 3
    # what `plan` and the analysis take as never to run is what the scheduler skipped
    assert schedule.left_empty(store, g.unique()) == {e["cell"] for e in skips}
    from harness.execution import plan

    plan.show(exp, store)
    said = " ".join(capsys.readouterr().out.split())
    assert f"to run: 0 of {len(g.unique())} cells" in said
    assert f"not run: {len(skips)} cells downstream of a training set left empty" in said


def test_the_ready_loop_without_phases_starts_independent_groups_at_once(setup):
    """The Ray executor's loop: every ready group at once, one adapter a group; a dataset is
    ready only when every traces cell it reads is done."""
    _, g, store = setup
    sched = schedule.Schedule(g, g, store)
    first = sched.ready(lowest_phase=False, share_workers=False)
    assert {grp.phase for grp in first} == {1, 2}  # traces and the pre-evals: no inputs
    assert sched.ready(lowest_phase=False, share_workers=False) == []  # nothing new is ready
    stages = FakeStages()
    traces = [grp for grp in first if grp.kind == "traces"]
    schedule.run_group(None, store, traces[0], stages)
    sched.finish(traces[0], 0.0)
    ready = sched.ready(lowest_phase=False, share_workers=False)
    # per_teacher datasets of the finished teacher; intersection and matched wait for both
    assert [c.regime for grp in ready for c in grp.cells] == ["per_teacher"]
    schedule.run_group(None, store, traces[1], stages)
    sched.finish(traces[1], 0.0)
    ready = sched.ready(lowest_phase=False, share_workers=False)
    assert sorted(c.regime for grp in ready for c in grp.cells) == [
        "intersection",
        "intersection",
        "matched",
        "matched",
        "per_teacher",
    ]


def test_only_names_stages_and_rejects_anything_else() -> None:
    assert schedule.parse_only("generate,train") == {"generate", "train"}
    assert schedule.parse_only(None) is None
    for wrong in ("traces", "eval", "", "train,trian"):
        with pytest.raises(UserError, match="is not a stage"):
            schedule.parse_only(wrong)


def test_on_a_terminal_one_bar_per_phase_counts_its_cells_as_they_complete(setup, monkeypatch):
    """The phase bar (made to think stderr is a terminal; Rich draws nothing on pytest's stderr,
    the bar's counts are read instead): its total is the phase's cells, and inside the one group of
    6 adapters it moves cell by cell, from the manifests on disk. The phase and group lines go to
    the bar, not the log; the phase-done lines and every event stay."""
    exp, g, store = setup
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    monkeypatch.setattr(schedule.PhaseProgress, "every", 0.02)
    seen: list[tuple[str, float, float]] = []

    class Watched(FakeStages):
        groups = 0

        def _stage(self, exp: Experiment, store: Store, cells: list[Cell]) -> None:
            Watched.groups += 1
            for c in cells:
                super()._stage(exp, store, [c])
                time.sleep(0.15)  # a few looks of the bar's thread
                [phase] = [
                    t for t in progress._DISPLAY.progress.tasks if t.fields["speed"] == "cells"
                ]
                seen.append((phase.description, phase.completed, phase.total))

    said: list[str] = []
    run(exp, g, store, table=Watched(), events=schedule.Events(store, said.append))
    adapters = [(done, total) for what, done, total in seen if "LoRA adapters" in what]
    assert adapters == [(i, 6) for i in range(1, 7)]
    assert {what for what, _, _ in seen} == {
        f"phase {p}/6 {stage}: {title}"
        for p, (stage, title) in schedule.PHASES.items()
        if p in (1, 2, 3, 5, 6)
    }
    assert not any("cells done]" in line or line.endswith("cell(s) planned") for line in said)
    assert sum("done in" in line for line in said) == 5  # one per phase
    kinds = [e["event"] for e in schedule.read_events(store)]
    assert kinds.count("phase") == 5 and kinds.count("group") == Watched.groups
    assert not progress.live()  # the display is down once the run is over
