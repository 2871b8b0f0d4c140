"""The grid: expansion from a config, without a store, and the keys it gives.

The goldens in tests/fixtures/grid/ were written by the code before the cell redesign (tag
golden-pre-cells): every cell's kind, key, config and upstream for configs/sandbox.yaml and a test
grid, and a digest of the 15,167 cells of configs/paper-scale.yaml. Keys include package versions,
so where the installed ones differ from the golden's, keys are not compared (configs still are).
The paper-scale digest was rewritten for the task versions math 2 and bbh_* 2 (with the task files
of version 1, the grid still gives the digest of that tag).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness import cells, grid, regimes
from harness.cells import PHASES, STAGE_OF_KIND, TRAIN_PACKAGES, Adapter, Dataset, Eval, Traces
from harness.config import load_experiment
from harness.sandbox import tasks as sandbox_tasks
from harness.store import package_versions, vllm_version

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "grid"
CONFIGS = {
    "sandbox": REPO / "configs" / "sandbox.yaml",
    "test-grid": FIXTURES / "test-grid.yaml",
    "paper-scale": REPO / "configs" / "paper-scale.yaml",
}


def versions() -> dict[str, str]:
    return {"vllm": vllm_version(), **package_versions(TRAIN_PACKAGES)}


def golden(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def as_json(cells: grid.Grid) -> list[dict]:
    rows = [
        {"kind": c.kind, "key": c.key, "config": c.config, "upstream": list(c.upstream)}
        for c in cells
    ]
    return json.loads(json.dumps(rows))


def without_keys(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "key"} for r in rows]


@pytest.mark.parametrize("name", ["sandbox", "test-grid"])
def test_cells_equal_the_golden_of_the_code_before_the_redesign(name: str) -> None:
    gold = golden(name)
    rows = as_json(grid.expand(load_experiment(CONFIGS[name])))
    assert without_keys(rows) == without_keys(gold["cells"])  # configs, upstream, order
    if gold["versions"] != versions():
        pytest.skip(f"installed versions {versions()} differ from the golden's; keys not compared")
    assert rows == gold["cells"]


def test_paper_scale_keys_equal_the_golden() -> None:
    gold = golden("paper-scale")
    if gold["versions"] != versions():
        pytest.skip(f"installed versions {versions()} differ from the golden's")
    rows = as_json(grid.expand(load_experiment(CONFIGS["paper-scale"])))
    blob = json.dumps([[c["kind"], c["key"], c["upstream"]] for c in rows])
    digest = hashlib.sha256(blob.encode()).hexdigest()
    assert (len(rows), digest) == (gold["n_cells"], gold["sha256"])


@pytest.fixture(scope="module")
def test_grid() -> tuple:
    exp = load_experiment(CONFIGS["test-grid"])
    return exp, grid.expand(exp)


def test_expansion_has_every_row_once_with_its_cells(test_grid: tuple) -> None:
    exp, g = test_grid
    n_t, n_s, n_r = len(exp.teachers), len(exp.students), len(exp.train.regimes)
    kinds = [c.kind for c in g]
    assert kinds.count("traces") == n_t
    assert kinds.count("dataset") == kinds.count("adapter") == n_s * n_r * n_t
    assert kinds.count("eval") == n_t + n_s + n_s * n_r * n_t
    assert len(g.distilled) == n_s * n_r * n_t
    position = {c.key: i for i, c in enumerate(g.cells)}
    for i, c in enumerate(g.cells):  # every input is in the grid, and earlier
        assert all(position[u] < i for u in c.upstream)
    for row, d in g.distilled.items():
        task, student, teacher, regime, _ = row
        assert (d.eval.model, d.eval.teacher, d.eval.regime, d.eval.seed) == row[1:]
        assert d.eval.upstream == (d.adapter.key,) and d.adapter.upstream == (d.dataset.key,)
        assert d.baseline is g.baselines[task, student] and d.baseline.upstream == ()
        every = [g.traces[task, t.name].key for t in exp.teachers]
        assert d.dataset.upstream == regimes.inputs(regime, d.traces.key, every)
        assert d.dataset.config["teacher"] == g.traces[task, teacher].key
        assert (d.baseline.phase, d.dataset.phase, d.adapter.phase, d.eval.phase) == (2, 3, 5, 6)


def test_cells_are_typed_and_name_their_stage_and_phase(test_grid: tuple) -> None:
    _, g = test_grid
    for c in g:
        assert c.stage == STAGE_OF_KIND[c.kind] == PHASES[c.phase][0]
    assert {type(c) for c in g} == {Traces, Eval, Dataset, Adapter}
    (t,) = g.select(kind="traces", model="t-small")
    assert t.label == "traces:teacher/t-small/sandbox_coin_flip" and t.limit == 48
    (d,) = g.select(kind="eval", role="distilled", teacher="t-large", regime="matched")
    assert d.label == "eval:distilled/stu/t-large/sandbox_coin_flip/matched/0"
    assert d.student == "stu" and g.select(kind="eval", role="teacher")[0].student is None


def test_expansion_reads_no_store(tmp_path: Path) -> None:
    """Planning is pure: expanding a grid whose results directory does not exist creates nothing."""
    exp = load_experiment(CONFIGS["test-grid"])
    grid.expand(exp.model_copy(update={"results_dir": str(tmp_path / "nowhere")}))
    assert not (tmp_path / "nowhere").exists()


def test_merge_is_part_of_the_adapter_key_and_left_out_when_false(test_grid: tuple) -> None:
    """`cotgap train --merge` writes merged/: another cell. Unmerged keys are those published
    before merge was a field (the golden test above), so no cell computed then is orphaned."""
    exp, g = test_grid
    merged = exp.model_copy(update={"train": exp.train.model_copy(update={"merge": True})})
    m = grid.expand(merged)
    a, b = g.select(kind="adapter"), m.select(kind="adapter")
    assert all(x.key != y.key and y.merge and not x.merge for x, y in zip(a, b, strict=True))
    assert "merge" not in a[0].config["train"] and b[0].config["train"]["merge"] is True
    for kind in ("traces", "dataset"):
        assert [c.key for c in g.select(kind=kind)] == [c.key for c in m.select(kind=kind)]


def test_a_sandbox_generator_bump_changes_the_sandbox_task_keys(
    test_grid: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox generators' VERSION is part of a sandbox task's identity (left out at 1, the
    value every key before it was made with): a bump re-plans every cell of the task."""
    exp, g = test_grid
    cells.task_identity.cache_clear()
    monkeypatch.setattr(sandbox_tasks, "VERSION", 2)
    try:
        bumped = grid.expand(exp)
    finally:
        cells.task_identity.cache_clear()
    assert {c.key for c in bumped}.isdisjoint(c.key for c in g)
    assert bumped.cells[0].config["task"]["source_version"] == 2
    assert "source_version" not in g.cells[0].config["task"]


def test_check_reports_every_problem_at_once(tmp_path: Path) -> None:
    exp = load_experiment(CONFIGS["test-grid"])
    teachers = (
        exp.teachers[0].model_copy(update={"path": "sandbox:nope"}),
        exp.teachers[1].model_copy(update={"path": str(tmp_path / "missing")}),
    )
    problems = grid.check(exp.model_copy(update={"teachers": teachers}))
    assert len(problems) == 2 and "nope" in problems[0] and "missing" in problems[1]
