"""A changed extractor re-scores stored completions; it regenerates nothing.

    .venv/bin/pytest tests/test_rescore.py

Traces and eval cells of a test-zoo grid are written without an engine, at the keys `grid.expand`
gives, through the stages' own record and summary functions (`generate.trace_record`,
`evaluate.record`, `evaluate.summarize`). Then the yes_no extractor gets a new version that reads
yes as no and no as yes: traces and eval keys stay, the analysis and the dataset stage follow the
new verdicts, and the dataset key changes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import sandbox_grid

from harness.analysis import analyze
from harness.config.schema import Experiment
from harness.engines.base import Sample
from harness.execution import plan, schedule
from harness.sandbox import zoo
from harness.stages import dataset, evaluate, generate
from harness.store import Store, read_jsonl
from harness.tasks import answers, scoring
from harness.tasks import suite as tasks
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

TASK, EXTRACTOR = "sandbox_coin_flip", "yes_no"
TRAIN_LIMIT, TEST_LIMIT, N = 40, 200, 2
FLIP = {"yes": "no", "no": "yes"}
TEACHERS = ("t-small", "t-large")


def completion(item: tasks.Item, kind: int) -> str:
    """kind 0: the wrong answer; 1: no answer; 2, 3: the right one."""
    if kind == 1:
        return "Each person may or may not flip it. I cannot tell."
    answer = FLIP[item.gold] if kind == 0 else item.gold
    return f"Count the flips: an even number keeps it heads up. So the answer is {answer}."


def kind_of(i: int, model: str) -> int:
    return (i + {"t-small": 0, "t-large": 1, "stu": 3}[model]) % 4  # each model its own items


def sample(text: str) -> Sample:
    return Sample(text, (7,) * 9, 30, "stop")


def write_traces(exp: Experiment, store: Store, cell: Cell) -> None:
    spec = tasks.load_task(TASK)
    items = tasks.load_items(spec, "train", limit=TRAIN_LIMIT)
    records = [
        generate.trace_record(spec, it, it.question, k, sample(completion(it, kind)), EXTRACTOR)
        for i, it in enumerate(items)
        for k, kind in enumerate([kind_of(i, cell.model)] * N)
    ]
    summary = generate.summarize(records, n_items=len(items), n=N, tokens=0, gen_s=0.0)
    summary.update(extractor=EXTRACTOR, extractor_version=answers.EXTRACTORS[EXTRACTOR].version)
    with store.open_cell(cell.kind, cell.key, cell.config, cell.upstream) as c:
        c.write_text(generate.TRACES, "".join(json.dumps(r) + "\n" for r in records))
        c.finish(summary)


def write_eval(exp: Experiment, store: Store, cell: Cell) -> None:
    spec = tasks.load_task(TASK)
    items = tasks.load_items(spec, "test", limit=TEST_LIMIT)
    records = [
        evaluate.record(
            spec, it, [sample(completion(it, kind_of(i, cell.model)))], EXTRACTOR, "greedy"
        )
        for i, it in enumerate(items)
    ]
    metrics = evaluate.summarize(records, spec.headline, exp.analysis)
    metrics.update(
        task=TASK,
        task_version=spec.version,
        extractor=EXTRACTOR,
        extractor_version=answers.EXTRACTORS[EXTRACTOR].version,
        decoding="greedy",
    )
    with store.open_cell(cell.kind, cell.key, cell.config, cell.upstream) as c:
        c.write_text(evaluate.PREDICTIONS, "".join(json.dumps(r) + "\n" for r in records))
        c.write_json(evaluate.METRICS, metrics)
        c.finish(metrics)


def accuracy(model: str, right: set[int], n: int = TEST_LIMIT) -> float:
    """Share of the first n items whose completion `kind` is in `right`."""
    return sum(kind_of(i, model) in right for i in range(n)) / n


def bump(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new yes_no extractor version whose readings swap yes and no."""
    old = answers.EXTRACTORS[EXTRACTOR]

    def flipped(read):
        return lambda text, choices: FLIP.get(v, v) if (v := read(text, choices)) else v

    new = dataclasses.replace(
        old, version=old.version + 1, parse_at=flipped(old.parse_at), last=flipped(old.last)
    )
    monkeypatch.setitem(answers.EXTRACTORS, EXTRACTOR, new)


@pytest.fixture
def grid(tmp_path: Path) -> tuple[Experiment, Store, list[Cell]]:
    """Every traces cell and every teacher and baseline eval cell of the grid, complete."""
    zoo.build(profile="test", progress=False)
    config = sandbox_grid(
        "bump",
        tmp_path / "results",
        train_limit=TRAIN_LIMIT,
        test_limit=TEST_LIMIT,
        max_length=1024,
    )
    config["generate"]["n"] = N
    exp = Experiment.model_validate(config)
    store = Store(exp.root)
    made = [
        c
        for c in grids.expand(exp).unique()
        if c.kind == "traces" or c.kind == "eval" and not c.upstream
    ]
    for c in made:
        (write_traces if c.kind == "traces" else write_eval)(exp, store, c)
    return exp, store, made


def board(exp: Experiment, store: Store) -> tuple[pd.DataFrame, dict, list[str]]:
    logs: list[str] = []
    out = analyze.run(exp, store, log=logs.append)
    result = json.loads((out / "analysis.json").read_text())
    return pd.read_csv(out / "leaderboard.csv"), result, logs


def test_a_bump_keeps_traces_and_eval_keys_and_the_analysis_rescores(grid, monkeypatch) -> None:
    exp, store, made = grid
    files = {
        c.key: (store.cell_dir(c.kind, c.key) / "predictions.jsonl")
        for c in made
        if c.kind == "eval"
    }
    stored = {k: p.read_bytes() for k, p in files.items()}
    rows, result, _ = board(exp, store)
    assert result["rescored_cells"] == {}
    teacher = rows[rows["row_type"] == "teacher"].set_index("teacher")
    assert teacher["teacher_acc"].to_dict() == {m: accuracy(m, {2, 3}) for m in TEACHERS}
    yields = {m: accuracy(m, {2, 3}, TRAIN_LIMIT) for m in TEACHERS}
    assert teacher["teacher_train_acc"].to_dict() == yields
    datasets = {c.key for c in grids.expand(exp) if c.kind == "dataset"}

    bump(monkeypatch)
    after = grids.expand(exp).unique()
    same = [c for c in after if c.kind == "traces" or c.kind == "eval" and not c.upstream]
    assert [c.key for c in same] == [c.key for c in made]
    assert plan.missing(store, same) == []  # nothing to generate or evaluate again
    assert [c for c in schedule.closure(after, after, store) if c in same] == []
    assert datasets.isdisjoint(c.key for c in after if c.kind == "dataset")

    rows, result, logs = board(exp, store)
    # two teacher evals and the baseline; the teachers' traces for their train-split yield
    assert result["rescored_cells"] == {"eval": 3, "traces": 2}
    assert any("(eval: 3, traces: 2)" in line for line in logs), logs
    teacher = rows[rows["row_type"] == "teacher"].set_index("teacher")
    base = rows[rows["row_type"] == "baseline"].set_index("student")
    # the new verdicts: a stated answer that was wrong is now right, and the other way round
    assert teacher["teacher_acc"].to_dict() == {m: accuracy(m, {0}) for m in TEACHERS}
    yields = {m: accuracy(m, {0}, TRAIN_LIMIT) for m in TEACHERS}
    assert teacher["teacher_train_acc"].to_dict() == yields
    assert base.loc["stu", "base_acc"] == accuracy("stu", {0})
    assert base.loc["stu", "format_fail_rate"] == accuracy("stu", {1})
    assert {k: p.read_bytes() for k, p in files.items()} == stored  # the cells are untouched


def test_rescoring_a_results_directory_rescores_each_eval_cell_once(grid, monkeypatch) -> None:
    exp, store, made = grid
    bump(monkeypatch)
    summaries = scoring.rescore_results(exp.root)
    assert len(summaries) == 3
    version = answers.EXTRACTORS[EXTRACTOR].version
    for s in summaries:
        assert (s["stored_extractor_version"], s["extractor_version"]) == (version - 1, version)
        assert s["n"] == TEST_LIMIT and s["changed_verdicts"] == s["n"] - round(
            s["n"] * s["format_failure_rate"]
        )


def test_the_dataset_selects_by_the_current_extractor(grid, monkeypatch) -> None:
    exp, store, _ = grid
    (before,) = [c for c in grids.expand(exp) if c.kind == "dataset" and c.teacher == "t-small"]
    traces_key = before.upstream[0]
    assert dataset.build(exp, store, before)["rescored_traces_cells"] == 0

    bump(monkeypatch)
    (after,) = [c for c in grids.expand(exp) if c.kind == "dataset" and c.teacher == "t-small"]
    assert after.key != before.key and after.upstream == (traces_key,)
    assert after.config["extractor_version"] == before.config["extractor_version"] + 1
    summary = dataset.build(exp, store, after)
    assert summary["rescored_traces_cells"] == 1

    items = tasks.load_items(TASK, "train", limit=TRAIN_LIMIT)
    index = {it.id: i for i, it in enumerate(items)}
    for cell, right in ((before, {2, 3}), (after, {0})):
        examples = read_jsonl(store.cell_dir("dataset", cell.key) / "examples.jsonl")
        chosen = {index[e["id"]] for e in examples}
        assert chosen == {i for i in range(TRAIN_LIMIT) if kind_of(i, "t-small") in right}
        assert len(examples) == N * len(chosen)
    # the traces cell still holds the verdicts it was generated with
    traces = read_jsonl(store.cell_dir("traces", traces_key) / generate.TRACES)
    assert [index[r["id"]] for r in traces if r["correct"]] == [
        i for i in range(TRAIN_LIMIT) for _ in range(N) if kind_of(i, "t-small") in {2, 3}
    ]


def test_a_resumed_cell_is_rescored_before_it_goes_on(tmp_path, monkeypatch) -> None:
    """What a killed run left of a traces or eval cell (no manifest; here with a cut last line) is
    re-scored in place when the run resumes, so no cell mixes two extractor versions; with the
    same extractor its bytes stay."""
    zoo.build(profile="test", progress=False)
    exp = Experiment.model_validate(
        sandbox_grid("partial", tmp_path, train_limit=TRAIN_LIMIT, test_limit=TEST_LIMIT)
    )
    store = Store(exp.root)
    partial = [c for c in grids.expand(exp).unique() if c.model == "t-small"]
    partial = [c for c in partial if c.kind == "traces" or c.kind == "eval" and not c.upstream]
    for c in partial:
        (write_traces if c.kind == "traces" else write_eval)(exp, store, c)
        d = store.cell_dir(c.kind, c.key)
        (d / "manifest.json").unlink()
        path = d / (generate.TRACES if c.kind == "traces" else evaluate.PREDICTIONS)
        path.write_bytes(path.read_bytes() + b'{"id": "cut')
        whole = path.read_bytes().rsplit(b"\n", 1)[0] + b"\n"
        scoring.rescore_partial(d)
        assert path.read_bytes() == whole and not store.complete(c.kind, c.key)
        old = read_jsonl(path)
        with monkeypatch.context() as m:
            bump(m)
            scoring.rescore_partial(d)
        new = read_jsonl(path)
        assert [r["id"] for r in new] == [r["id"] for r in old]
        flipped = [r["strict"] is not None for r in old]
        assert [a["correct"] != b["correct"] for a, b in zip(old, new, strict=True)] == flipped
        assert [r["completion_tokens"] for r in new] == [r["completion_tokens"] for r in old]


def test_a_repeated_sample_takes_the_scores_of_its_twin():
    # the traces stage scores each distinct (text, finish reason) of an item once; every record
    # must equal the one scored on its own, a truncated twin of the same text included
    spec = tasks.load_task(TASK)
    item = tasks.load_items(spec, "train", limit=1)[0]
    right, wrong = completion(item, 2), completion(item, 0)
    samples = [sample(right), sample(wrong), sample(right), Sample(right, (7,) * 9, 30, "length")]
    cache: dict = {}
    shared = [
        scoring.trace_record(spec, item, "q", k, s, EXTRACTOR, cache) for k, s in enumerate(samples)
    ]
    alone = [scoring.trace_record(spec, item, "q", k, s, EXTRACTOR) for k, s in enumerate(samples)]
    assert shared == alone
    assert [r["correct"] for r in alone] == [True, False, True, False]
    assert len(cache) == 3  # right, wrong, right cut at max_tokens
