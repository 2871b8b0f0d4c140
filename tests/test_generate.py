"""The traces stage: records, manifest, one child per teacher, resume after SIGKILL byte for byte.

    .venv/bin/pytest tests/test_generate.py -q

Uses the tiny random model of tests/test_engines.py (shared engines, built once per session) on
the real sandbox tasks. The model is untrained, so its answers are wrong; what is checked is
that every record is the task's own score of the completion, and that the files are exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_engines import engine_for, tiny_model_dir, tiny_spec

from harness import engines
from harness.config.schema import Experiment
from harness.execution import plan
from harness.execution.schedule import RunOptions
from harness.stages import generate
from harness.store import Store, read_jsonl
from harness.tasks import answers, scoring
from harness.tasks import suite as tasks
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

TEACHER = "tiny"
LIMITS = {"sandbox_addition": 40, "sandbox_coin_flip": 12}
SAMPLED = {"engine": "vllm", "n": 2, "temperature": 1.0, "top_p": 0.95, "max_tokens": 40, "seed": 3}


def experiment(models: Path, results: Path, **generate_cfg) -> Experiment:
    model = str(tiny_model_dir(models))
    return Experiment.model_validate(
        {
            "name": "gen-test",
            "results_dir": str(results),
            "teachers": [{"name": TEACHER, "path": model}],
            "students": [{"name": "student", "path": model}],
            "tasks": [{"name": t, "train_limit": n} for t, n in LIMITS.items()],
            "generate": {**SAMPLED, **generate_cfg},
            "train": {"max_steps": 1},
        }
    )


def traces_cells(exp: Experiment, task: str | None = None) -> list[Cell]:
    return [c for c in grids.expand(exp).select(kind="traces", model=TEACHER, task=task)]


def traces_path(exp: Experiment, cell: Cell) -> Path:
    return Store(exp.root).cell_dir("traces", cell.key) / generate.TRACES


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="session")
def reference(models_dir, tmp_path_factory) -> Experiment:
    """An uninterrupted run of both tasks' traces through `plan.run` (a real child process)."""
    exp = experiment(models_dir, tmp_path_factory.mktemp("reference"))
    store = Store(exp.root)
    counts = plan.run(
        exp, store, traces_cells(exp), RunOptions(frozenset({"generate"})), log=lambda m: None
    )
    assert counts["traces"] == 2
    return exp


def test_traces_records_and_manifest(reference):
    store = Store(reference.root)
    for cell in traces_cells(reference):
        task = tasks.load_task(cell.task)
        items = tasks.load_items(task, "train", limit=LIMITS[cell.task])
        records = read_jsonl(traces_path(reference, cell))
        assert [(r["id"], r["sample"]) for r in records] == [
            (it.id, k) for it in items for k in range(2)
        ]
        by_id = {it.id: it for it in items}
        for r in records:
            item = by_id[r["id"]]
            assert r["prompt"] == tasks.render_prompt(task, item, "zero_shot_cot")
            assert r["gold"] == item.gold
            assert r["finish_reason"] in ("stop", "length")
            assert 0 < r["completion_tokens"] <= 40 and r["prompt_tokens"] > len(r["prompt"])
            assert (r["completion_tokens"] == 40) == (r["finish_reason"] == "length")
            scored = scoring.score(
                task, r["completion"], item.gold, r["finish_reason"], task.extractor
            )
            assert {k: r[k] for k in ("strict", "flexible", "correct")} == {
                k: scored[k] for k in ("strict", "flexible", "correct")
            }
        # two samples of one item differ: sampling is on and seeded per item, not shared
        assert (
            sum(
                a["completion"] != b["completion"]
                for a, b in zip(records[::2], records[1::2], strict=True)
            )
            > len(items) // 2
        )
        manifest = store.manifest("traces", cell.key)
        s = manifest["summary"]
        assert s["n_items"] == len(items) and s["n_samples"] == 2 * len(items)
        assert s["engine"]["name"] == "vllm" and s["engine"]["version"].startswith("vllm")
        assert s["sampling"] == engines.Sampling.from_config(reference.generate).as_dict()
        assert s["accuracy"] == sum(r["correct"] for r in records) / len(records)
        assert s["truncation_rate"] == sum(r["finish_reason"] == "length" for r in records) / len(
            records
        )
        assert s["mean_completion_tokens"] == pytest.approx(
            sum(r["completion_tokens"] for r in records) / len(records)
        )
        assert s["tokens_per_s"] > 0 and s["resumed_items"] == 0
        # the extractor that scored the records (the key names it but not its version)
        extractor = cell.config["task"]["extractor"]
        assert s["extractor"] == extractor and "extractor_version" not in cell.config["task"]
        assert s["extractor_version"] == answers.EXTRACTORS[extractor].version
        assert manifest["outputs"][generate.TRACES]
    log = reference.root / "logs" / f"generate-{TEACHER}.log"
    # one engine for both tasks: vLLM's line once per construction, never twice (its INFO lines
    # reach the log only where vLLM configured its logging in this child, so absent is allowed)
    assert log.read_text().count("Initializing a V1 LLM engine") <= 1


def test_second_run_computes_nothing(reference):
    store = Store(reference.root)
    assert generate.run(reference, store, traces_cells(reference), progress=False) == {}
    assert (
        plan.run(
            reference,
            store,
            traces_cells(reference),
            RunOptions(frozenset({"generate"})),
            log=lambda m: None,
        )["traces"]
        == 0
    )


def test_resume_after_sigkill_is_byte_identical(models_dir, reference, tmp_path):
    """Kill the stage (parent and child) mid-run; the rerun ends with the reference's bytes."""
    exp = experiment(models_dir, tmp_path)
    [cell] = traces_cells(exp, "sandbox_addition")
    path, expected = traces_path(exp, cell), traces_path(reference, cell).read_bytes()
    total = expected.count(b"\n")
    script = textwrap.dedent(f"""
        import sys
        from harness.stages import generate
        from harness.workflow import grid
        from harness.config.schema import Experiment
        from harness.store import Store
        exp = Experiment.model_validate_json(sys.argv[1])
        cells = [c for c in grid.expand(exp) if c.key == {cell.key!r}]
        generate.run(exp, Store(exp.root), cells, progress=False, inprocess=False, chunk_seqs=4)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, exp.model_dump_json()], start_new_session=True,
        cwd=Path(__file__).parents[1], stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.time() + 120
    lines = 0
    while time.time() < deadline and proc.poll() is None:
        lines = path.read_bytes().count(b"\n") if path.exists() else 0
        if lines >= 10:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_for_group_exit(proc.pid)  # the stage's child holds the cell lock until it is gone
    assert lines >= 10, proc.stderr.read().decode()[-3000:]
    partial = path.read_bytes()
    assert partial.count(b"\n") < total, "the kill came too late to interrupt the run"
    assert not Store(exp.root).complete("traces", cell.key)
    assert expected.startswith(partial[: partial.rfind(b"\n") + 1])
    # rerun in-process with the session's engine (no second engine start-up), in one window:
    # outputs depend on (seed, item id) only, not on how items were batched
    summaries = generate.work(exp, str(exp.root), [cell], engine=_fresh("vllm", models_dir))
    assert path.read_bytes() == expected
    assert summaries[cell.key]["resumed_items"] > 0
    assert Store(exp.root).complete("traces", cell.key)


def _wait_for_group_exit(pgid: int, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes of group {pgid} still alive after SIGKILL")


def test_resume_drops_a_partly_written_item(models_dir, reference, tmp_path):
    exp = experiment(models_dir, tmp_path)
    [cell] = traces_cells(exp, "sandbox_coin_flip")
    path, expected = traces_path(exp, cell), traces_path(reference, cell).read_bytes()
    lines = expected.splitlines(keepends=True)
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b"".join(lines[:5]) + lines[5][:7]
    )  # items 0-1, one sample of item 2, a cut line
    generate.work(exp, str(exp.root), [cell], engine=_fresh("vllm", models_dir))
    assert path.read_bytes() == expected


def test_greedy_traces_are_identical_with_either_engine(models_dir, tmp_path):
    out = {}
    for name in ("vllm", "hf"):
        exp = experiment(models_dir, tmp_path / name, engine=name, n=1, temperature=0.0)
        [cell] = traces_cells(exp, "sandbox_coin_flip")
        generate.work(exp, str(exp.root), [cell], engine=_fresh(name, models_dir))
        out[name] = traces_path(exp, cell).read_bytes()
        assert Store(exp.root).manifest("traces", cell.key)["summary"]["engine"]["name"] == name
    assert out["vllm"] == out["hf"]


def test_failure_names_the_stage_and_its_log(models_dir, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    exp = experiment(models_dir, tmp_path / "results").model_copy(
        update={
            "teachers": (
                experiment(models_dir, tmp_path)
                .teachers[0]
                .model_copy(update={"path": str(broken)}),
            )
        }
    )
    cells = traces_cells(exp)
    with pytest.raises(engines.ChildFailed) as e:
        generate.run(exp, Store(exp.root), cells, progress=False, inprocess=False)
    msg = str(e.value)
    assert "generate stage failed at starting the engine" in msg
    assert str(exp.root / "logs" / f"generate-{TEACHER}.log") in msg
    assert not any(Store(exp.root).complete("traces", c.key) for c in cells)


def test_drop_unfinished_items(tmp_path):
    path = tmp_path / "t.jsonl"
    recs = [{"id": i, "sample": k} for i in "abc" for k in range(2)][:5]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"id": "c", "sam')
    generate.drop_unfinished_items(path, n=2)
    assert [(r["id"], r["sample"]) for r in read_jsonl(path)] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
    ]
    before = path.stat().st_mtime_ns
    generate.drop_unfinished_items(path, n=2)  # nothing to drop: the file is left alone
    assert path.stat().st_mtime_ns == before


def test_summary_yield_and_accuracy():
    recs = [
        {"id": "a", "correct": True, "finish_reason": "stop", "completion_tokens": 10},
        {"id": "a", "correct": False, "finish_reason": "length", "completion_tokens": 20},
        {"id": "b", "correct": False, "finish_reason": "stop", "completion_tokens": 30},
        {"id": "b", "correct": False, "finish_reason": "stop", "completion_tokens": 40},
    ]
    s = generate.summarize(recs, n_items=2, n=2, tokens=100, gen_s=2.0)
    assert (s["yield"], s["accuracy"], s["truncation_rate"]) == (0.5, 0.25, 0.25)
    assert s["mean_completion_tokens"] == 25 and s["tokens_per_s"] == 50


def _fresh(name: str, base: Path):
    """An engine of its own for a test that generates in this process: the session's shared
    vLLM engine (test_engines.engine_for) runs on vLLM's process-wide distributed state, which an
    engine another test closed in this worker may already have torn down."""
    from harness.engines import load

    if name != "vllm":
        return engine_for(name, base)
    return load(name, tiny_spec(base), lora_rank=None)


def test_summary_counts_completions_without_an_answer():
    """format_failure_rate: completions that finished but hold no answer (cut ones are counted
    by truncation_rate only)."""
    recs = [
        {"id": "a", "correct": True, "finish_reason": "stop", "completion_tokens": 5,
         "flexible": "5", "truncated": False},
        {"id": "a", "correct": False, "finish_reason": "stop", "completion_tokens": 5,
         "flexible": None, "truncated": False},
        {"id": "b", "correct": False, "finish_reason": "length", "completion_tokens": 9,
         "flexible": None, "truncated": True},
        {"id": "b", "correct": False, "finish_reason": "stop", "completion_tokens": 5,
         "flexible": None, "truncated": False},
    ]  # fmt: skip
    s = generate.summarize(recs, n_items=2, n=2, tokens=24, gen_s=1.0)
    assert (s["format_failure_rate"], s["truncation_rate"]) == (0.5, 0.25)
