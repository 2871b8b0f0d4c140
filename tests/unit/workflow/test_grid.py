"""The grid: expansion from a config, without a store, and the keys it gives.

The goldens in tests/fixtures/grid/ were written by the code before the cell redesign (tag
golden-pre-cells): every cell's kind, key, config and upstream for configs/sandbox.yaml and a test
grid, and a digest of the 15,167 cells of configs/paper-scale.yaml. The paper-scale digest was rewritten for the task versions math 2 and bbh_* 2 (with the task files
of version 1, the grid still gives the digest of that tag), and every golden for the extractor
versions that rebuild training sets (a dataset's key holds its extractor's version); the sandbox
golden is of tests/fixtures/grid/sandbox.yaml, the demo config before it had replicates, and
the paper-scale digest of tests/fixtures/grid/paper-scale.yaml, that config with one trace draw.

Keys include the versions of the packages that change a cell's output. The goldens record the
versions they were written with, and the key tests compute keys with those versions (the lookups
in harness.workflow.cells are replaced for the test), so the keys are compared on every machine
whatever is installed: a key can never change unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from helpers import pin_zoo_ids

from harness.config.loading import load_experiment
from harness.config.schema import Experiment
from harness.execution import plan
from harness.sandbox import tasks as sandbox_tasks
from harness.stages import dataset
from harness.store import package_versions, vllm_version
from harness.workflow import cells, grid, regimes
from harness.workflow.cells import (
    PHASES,
    STAGE_OF_KIND,
    TRAIN_PACKAGES,
    Adapter,
    Dataset,
    Eval,
    Traces,
)

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "grid"
CONFIGS = {
    "sandbox": FIXTURES / "sandbox.yaml",  # the demo config before it had replicates
    "test-grid": FIXTURES / "test-grid.yaml",
    "paper-scale": FIXTURES / "paper-scale.yaml",  # one trace draw, as the golden was written
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


def pin_versions(monkeypatch: pytest.MonkeyPatch, pinned: dict[str, str]) -> None:
    """Keys computed as if `pinned` were installed (the versions a golden was written with)."""
    monkeypatch.setattr(cells, "vllm_version", lambda: pinned["vllm"])
    monkeypatch.setattr(
        cells, "package_versions", lambda names: {n: pinned[n] for n in names if n in pinned}
    )


@pytest.mark.parametrize("name", ["sandbox", "test-grid"])
def test_cells_equal_the_golden_of_the_code_before_the_redesign(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gold = golden(name)
    pin_versions(monkeypatch, gold["versions"])
    pin_zoo_ids(monkeypatch, gold["cells"])
    rows = as_json(grid.expand(load_experiment(CONFIGS[name])))
    assert rows == gold["cells"]  # kinds, keys, configs, upstream, order


def test_pinned_versions_change_the_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinning reaches the keys: other versions give other keys (so the goldens test keys)."""
    gold = golden("test-grid")
    pin_versions(monkeypatch, {**gold["versions"], "torch": "0.0.0"})
    rows = as_json(grid.expand(load_experiment(CONFIGS["test-grid"])))
    pairs = list(zip(rows, gold["cells"], strict=True))
    assert all(r["kind"] == g["kind"] for r, g in pairs)
    adapters = [r["key"] != g["key"] for r, g in pairs if r["kind"] == "adapter"]
    assert adapters and all(adapters)


def test_paper_scale_keys_equal_the_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    gold = golden("paper-scale")
    pin_versions(monkeypatch, gold["versions"])
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
        task, student, teacher, regime, draw, seed = row
        assert (d.eval.model, d.eval.teacher, d.eval.regime, d.eval.seed) == row[1:4] + (seed,)
        assert (d.trace_seed, d.train_seed, draw, d.eval.trace_seed) == (0, seed, 0, None)
        assert d.eval.upstream == (d.adapter.key,) and d.adapter.upstream == (d.dataset.key,)
        assert d.baseline is g.baselines[task, student] and d.baseline.upstream == ()
        every = [g.traces[task, t.name, draw].key for t in exp.teachers]
        assert d.dataset.upstream == regimes.inputs(regime, d.traces.key, every)
        assert d.dataset.config["teacher"] == g.traces[task, teacher, draw].key
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
    problems = grid.expand_problems(exp.model_copy(update={"teachers": teachers}))
    assert len(problems) == 2 and "nope" in problems[0] and "missing" in problems[1]


# --- trace-sampling replicates -------------------------------------------------------------------


def replicated(name: str, tmp_path: Path, generate: dict, **train) -> Experiment:
    """A shipped config with its generate and train sections updated, read as a user's file."""
    data = yaml.safe_load(CONFIGS[name].read_text())
    data["generate"] = {k: v for k, v in {**data["generate"], **generate}.items() if v is not None}
    data["train"] = {**data["train"], **train}
    data["results_dir"] = str(tmp_path)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_experiment(path)


def test_one_trace_draw_at_seed_0_keeps_every_key_of_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`generate.seeds: [0]` is today's `seed: 0`: the same cells, configs and keys (and those
    equal the golden's, written before trace draws existed, in the test above)."""
    pin_versions(monkeypatch, golden("sandbox")["versions"])
    pin_zoo_ids(monkeypatch, golden("sandbox")["cells"])
    plain = as_json(grid.expand(load_experiment(CONFIGS["sandbox"])))
    drawn = as_json(grid.expand(replicated("sandbox", tmp_path, {"seed": None, "seeds": [0]})))
    assert [c["key"] for c in drawn] == [c["key"] for c in plain]
    assert without_keys(drawn) == without_keys(golden("sandbox")["cells"])
    assert all("seeds" not in c["config"].get("generate", {}) for c in drawn)


def test_a_second_draw_adds_cells_and_keeps_the_first_draws_keys(tmp_path: Path) -> None:
    """Draw 0 of `seeds: [0, 1]` is the plain grid's; draw 1's traces are those of `seed: 1`."""
    plain = grid.expand(load_experiment(CONFIGS["test-grid"]))
    two = grid.expand(replicated("test-grid", tmp_path, {"seed": None, "seeds": [0, 1]}))
    one = grid.expand(replicated("test-grid", tmp_path, {"seed": 1}))
    for (task, teacher), c in {(k[0], k[1]): c for k, c in plain.traces.items()}.items():
        assert two.traces[task, teacher, 0].key == c.key
        assert two.traces[task, teacher, 1].key == one.traces[task, teacher, 1].key != c.key
        assert two.traces[task, teacher, 1].config["generate"]["seed"] == 1
    for (*row, draw, seed), d in two.distilled.items():
        if draw == 0:
            p = plain.distilled[(*row, 0, seed)]
            assert (d.eval.key, d.adapter.key, d.dataset.key) == (
                p.eval.key,
                p.adapter.key,
                p.dataset.key,
            )
    assert {c.key for c in plain} <= {c.key for c in two}


@pytest.mark.parametrize(
    ("replicates", "train_seeds", "pairs"),
    [
        ("crossed", [0, 1, 2], [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]),
        ("paired", [5, 7], [(0, 5), (1, 7)]),
    ],
)
def test_crossed_and_paired_replicates_count_their_cells(
    tmp_path: Path, replicates: str, train_seeds: list[int], pairs: list[tuple[int, int]]
) -> None:
    exp = replicated(
        "test-grid",
        tmp_path,
        {"seed": None, "seeds": [0, 1]},
        seeds=train_seeds,
        replicates=replicates,
    )
    g = grid.expand(exp)
    n_t, n_r = len(exp.teachers), len(exp.train.regimes)  # one student, one task
    kinds = [c.kind for c in g.unique()]
    assert kinds.count("traces") == n_t * 2 and len(g.traces) == n_t * 2
    assert kinds.count("dataset") == n_r * n_t * 2  # one set per trace draw
    assert kinds.count("adapter") == len(g.distilled) == n_r * n_t * len(pairs)
    assert kinds.count("eval") == n_t + 1 + n_r * n_t * len(pairs)
    for teacher in (t.name for t in exp.teachers):
        for regime in exp.train.regimes:
            mine = sorted(r[4:] for r in g.distilled if r[2:4] == (teacher, regime))
            assert mine == pairs
    # the rule's unit is a trace draw (its training seeds averaged), crossed or paired: the plan's
    # replicates line says what its MDE line and the analysis count
    line = f"replicates per teacher: 2 ({replicates}: 2 trace draw(s), generate.seeds 0, 1"
    assert plan.replicates_line(exp).startswith(line)
    assert plan.replicate_units(exp) == 2
    counted = f"{len(pairs)} adapters, the rule counts each trace draw once"
    assert (counted in plan.replicates_line(exp)) == (replicates == "crossed")
    for (*_, draw, seed), d in g.distilled.items():
        assert (d.trace_seed, d.train_seed) == (draw, seed)
        assert d.dataset.trace_seed == d.adapter.trace_seed == d.eval.trace_seed == draw
        assert d.eval.label.endswith(f"/trace{draw}/{seed}")
        assert "replicates" not in d.adapter.config["train"]


def test_crossed_and_paired_share_the_keys_of_their_common_replicates(tmp_path: Path) -> None:
    """train.replicates and generate.seeds reach an adapter only through its dataset's key."""
    draws = {"seed": None, "seeds": [0, 1]}
    crossed = grid.expand(replicated("test-grid", tmp_path, draws, seeds=[0, 1]))
    paired = grid.expand(
        replicated("test-grid", tmp_path, draws, seeds=[0, 1], replicates="paired")
    )
    assert set(paired.distilled) < set(crossed.distilled)
    for row, d in paired.distilled.items():
        assert d.adapter.key == crossed.distilled[row].adapter.key
        assert d.eval.key == crossed.distilled[row].eval.key


def test_every_set_reads_only_its_own_draws_traces(tmp_path: Path) -> None:
    """Intersection, matched and mix sets intersect or match the teachers' traces of the same
    draw; a budget's reference set is that draw's too."""
    exp = replicated(
        "test-grid",
        tmp_path,
        {"seed": None, "seeds": [0, 1]},
        regimes=["per_teacher", "intersection", "matched", "mix"],
        mix=[{"teacher": "t-small", "weight": 1}, {"teacher": "t-large", "weight": 1}],
        budget={"align": ["none", "updates"]},
    )
    g = grid.expand(exp)
    by_draw = {draw: {c.key for (_, _, d), c in g.traces.items() if d == draw} for draw in (0, 1)}
    assert not by_draw[0] & by_draw[1]
    regimes_seen = set()
    for (_, _, teacher, _, draw, _), d in g.distilled.items():
        regimes_seen.add(d.dataset.regime)
        assert set(d.dataset.upstream) <= by_draw[draw]
        if d.dataset.regime in ("intersection", "matched", "mix"):
            assert set(d.dataset.upstream) == by_draw[draw]
            assert sorted(d.dataset.config["teachers"]) == sorted(by_draw[draw])
        if d.dataset.regime == "mix":
            assert {k for k, _ in d.dataset.config["mix"]} == by_draw[draw]
            names = {g.traces["sandbox_coin_flip", t, draw].key: t for t in ("t-small", "t-large")}
            assert dataset._teacher_names(exp, d.dataset) == names  # the realised mix's names
        else:
            assert d.dataset.config["teacher"] == g.traces["sandbox_coin_flip", teacher, draw].key
        if len(d.adapter.upstream) == 2:  # aligned: the reference set of the same draw
            ref = g.by_key()[d.adapter.upstream[1]]
            assert ref.trace_seed == draw and set(ref.upstream) <= by_draw[draw]
    assert regimes_seen == {"per_teacher", "intersection", "matched", "mix"}


def test_top_k_gates_group_the_teachers_of_one_draw(tmp_path: Path) -> None:
    exp = replicated(
        "test-grid",
        tmp_path,
        {"seed": None, "seeds": [0, 1]},
        teachers_per_student="top_k",
        top_k=1,
    )
    g = grid.expand(exp)
    assert len(g.screens) == 2 * 3 * 2  # teachers x regimes x draws
    for (*_, draw, _), d in g.distilled.items():
        gate = g.gates[d.adapter.key]
        group = {k: s for k, s in g.screens.items() if s.key in gate.group}
        assert len(group) == 2 and {k[4] for k in group} == {draw}
        assert {k[3] for k in group} == {d.dataset.regime} and gate.screen in gate.group
