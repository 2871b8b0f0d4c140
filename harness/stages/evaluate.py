"""Stage: evaluation. A model (+ an optional adapter) on a task's test split, scored and summarised.

    cotgap evaluate configs/sandbox.yaml [--model NAME] [--task NAME]
    cotgap evaluate configs/sandbox.yaml --model S --adapter path/to/peft_adapter

`run` takes the eval cells of one base model -- its teacher or baseline eval and every distilled
variant -- and serves them all from one engine session in one child process: adapters through
vLLM's LoRARequest, so the baseline and its adapters share the loaded weights, and the cells under
one eval config share the engine's batches (each request with its own adapter). Every cell is
scored under the same eval config, which it records as `eval_config.json`. A cell writes
`predictions.jsonl` (one record per test item, in item order, streamed: a killed run keeps what
it wrote and generates the rest), then `metrics.json` (headline accuracy with a bootstrap CI,
strict and flexible accuracy, format failures, truncation, lengths), then its manifest.

Greedy decoding keeps one completion per item. Self-consistency keeps all n, reads strict and
flexible answers from each, and takes the majority vote of each (a truncated sample has no
answer, so it has no vote). The raw completions are kept: `cotgap score` re-scores a greedy
`predictions.jsonl` without an engine and gets the same numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import engines
from harness.config.hashing import canonical
from harness.config.schema import AnalysisConfig, Experiment
from harness.engines import Engine, Sampling
from harness.engines.base import adapter_rank
from harness.errors import UserError
from harness.stages.generate import (
    CHUNK_SEQS,
    JOURNAL,
    engine_provenance,
    journal_to,
    requests,
    served_usage,
    task_items,
)
from harness.stats import teacher_level
from harness.store import Store, json_text
from harness.tasks import answers, scoring
from harness.tasks import suite as tasks
from harness.tasks.scoring import METRICS, PREDICTIONS, record

EVAL_CONFIG = "eval_config.json"


def run(
    exp: Experiment,
    store: Store,
    cells: list,
    progress: bool = True,
    inprocess: bool | None = None,
    chunk_seqs: int = CHUNK_SEQS,
) -> dict[str, dict]:
    """Compute the eval cells of one base model; returns metrics by cell key."""
    cells = engines.pending(store, cells, "eval")
    if not cells:
        return {}
    # Resolved here, so that a missing adapter fails before any engine starts.
    served = {c.key: served_by(store, c) for c in cells}
    args = (exp, str(store.root), cells, served, chunk_seqs)
    return engines.run_stage(
        "evaluate", work, *args, cells=cells, store=store, progress=progress, inprocess=inprocess
    )


def served_by(store: Store, cell: Any) -> tuple[str | None, str | None]:
    """(model directory replacing the base model, LoRA adapter directory) that an eval cell scores.

    (None, None) for a teacher or baseline; a PEFT adapter for distilled and ad-hoc cells; the
    merged model of a full fine-tune (an adapter cell with `merged/` and no `adapter/`).
    """
    if cell.adapter_dir:
        return None, cell.adapter_dir
    if not cell.upstream:
        return None, None
    key = cell.upstream[0]
    d = store.cell_dir("adapter", key)
    if store.complete("adapter", key) and (d / "adapter" / "adapter_config.json").is_file():
        return None, str(d / "adapter")
    if store.complete("adapter", key) and (d / "merged" / "config.json").is_file():
        return str(d / "merged"), None
    if store.complete("adapter", key):  # complete without its weights: damaged since
        store.output("adapter", key, "adapter/adapter_config.json")
    raise UserError(
        f"{cell.label}: its adapter cell adapter/{key} is not complete ({d}); "
        "run `cotgap train` (or `cotgap run`) first."
    )


def work(
    exp: Experiment,
    root: str,
    cells: list,
    served: dict[str, tuple[str | None, str | None]],
    chunk_seqs: int = CHUNK_SEQS,
    engine: Engine | None = None,
) -> dict[str, dict]:
    """The engine side (in the child): one engine session per served model, every cell in turn.

    `engine`: an already started engine for the base model (in-process callers: tests, benchmarks).
    """
    store = Store(root)
    # the cell's split: test; a select cell's `select.split` (train by default)
    loaded = [(c, *task_items(exp, c, c.config["task"]["split"])) for c in cells]
    n = exp.evaluate.n
    engines.emit({"total": n * sum(len(items) for _, _, items in loaded)})
    sessions: dict[str | None, list] = {}  # the base model first, then any merged models
    for entry in sorted(loaded, key=lambda e: served[e[0].key][0] is not None):
        sessions.setdefault(served[entry[0].key][0], []).append(entry)
    results = {}
    for model_dir, group in sessions.items():
        adapters = [a for c, _, _ in group if (a := served[c.key][1])]
        own = engine is None or model_dir is not None
        session = _start(exp, group[0][0], model_dir, adapters) if own or engine is None else engine
        session_id = uuid.uuid4().hex[:12]
        print(f"engine session {session_id}: {session.name} on {session.model_dir}", flush=True)
        batches: dict[str, list] = {}  # cells under one eval config share the engine's batches
        for entry in group:
            batches.setdefault(eval_config_json(entry[0].eval_config(exp)), []).append(entry)
        for batch in batches.values():
            adapter_of = {c.key: served[c.key][1] for c, _, _ in batch}
            results.update(
                _evaluate_cells(exp, store, batch, session, adapter_of, session_id, chunk_seqs)
            )
        if own:
            session.close()
    return results


MAX_LORAS = 16  # adapters one vLLM batch may mix: every one of them holds a slot of LoRA weights


def _start(exp: Experiment, cell: Any, model_dir: str | None, adapters: list[str]) -> Engine:
    """The engine for one served model, with LoRA when it serves adapters (rank: the largest)."""
    ev = exp.evaluate
    spec = exp.model(cell.model)
    if model_dir is not None:
        spec = spec.model_copy(update={"path": model_dir})
    rank = max([exp.train.lora.r, *map(adapter_rank, adapters)]) if adapters else None
    slots = max(1, min(len(set(adapters)), MAX_LORAS))
    return engines.load(ev.engine, spec, lora_rank=rank, max_loras=slots)


@dataclasses.dataclass(eq=False)  # a job is itself: hashed and compared by identity
class _Job:
    """One eval cell being computed: the open cell, its writer, the records so far."""

    cell: Any
    task: tasks.TaskSpec
    items: list[tasks.Item]
    adapter: str | None
    out: Any
    writer: Any
    records: list[dict]
    resumed: int = 0  # items already on disk when the run began
    tokens: int = 0  # completion tokens generated for this cell
    generation_s: float = 0.0  # wall time of the engine calls its items were in
    batch_tokens: int = 0  # completion tokens of those calls, every cell's

    @property
    def todo(self) -> list[tasks.Item]:
        return self.items[len(self.records) :]


def _evaluate_cells(
    exp: Experiment,
    store: Store,
    entries: list[tuple[Any, tasks.TaskSpec, list[tasks.Item]]],
    engine: Engine,
    adapter_of: dict[str, str | None],
    session_id: str,
    chunk_seqs: int,
) -> dict[str, dict]:
    """Eval cells of one engine session under one eval config, computed together: their items go
    to the engine in shared windows of `chunk_seqs` sequences (cell after cell, each request with
    its cell's adapter), so that an engine serving a dozen adapters keeps its batches full. Each
    cell's predictions are written in item order, and the cell is completed as soon as its last
    item is in; a killed run keeps every record written."""
    # a select cell's prompt style differs from the experiment's
    ev = entries[0][0].eval_config(exp)
    sampling = Sampling.from_config(ev)
    results: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        jobs = []
        for cell, task, items in entries:
            out = stack.enter_context(
                store.open_cell(cell.kind, cell.key, cell.config, cell.upstream)
            )
            out.write_text(EVAL_CONFIG, eval_config_json(ev))
            scoring.rescore_partial(out.dir, exp.data_dir)
            writer = out.jsonl(PREDICTIONS)
            records = _resumable(writer.records, items, out.dir)
            engines.emit({"skipped": len(records) * ev.n})
            job = _Job(cell, task, items, adapter_of[cell.key], out, writer, records, len(records))
            jobs.append(job)
        todo = [(job, item) for job in jobs for item in job.todo]
        for job in jobs:
            if not job.todo:  # every prediction was written before a kill
                results[job.cell.key] = _finish(exp, job, engine, session_id, 1)
        for window in _windows(todo, max(1, chunk_seqs // ev.n), engine):
            shared = list(dict.fromkeys(job for job, _ in window))
            journal_to(engine, shared[0].out.dir / JOURNAL)
            more = f" (+{len(shared) - 1} more)" if len(shared) > 1 else ""
            engines.emit({"cell": shared[0].cell.label + more})
            batch = [
                r
                for job, pairs in itertools.groupby(window, key=lambda pair: pair[0])
                for r in requests(job.task, [it for _, it in pairs], ev, exp.data_dir)
            ]
            t0, tokens = time.perf_counter(), 0
            stream = engine.stream(batch, sampling, [job.adapter for job, _ in window])
            for i, samples, rec in _scored(window, batch, engines.in_request_order(stream), ev,
                                           engine):  # fmt: skip
                job, item = window[i]
                job.writer.write(rec)
                job.records.append(rec)
                job.tokens += sum(s.completion_tokens for s in samples)
                tokens += sum(s.completion_tokens for s in samples)
                if not job.todo:
                    job.generation_s += time.perf_counter() - t0
                    job.batch_tokens += tokens
                    results[job.cell.key] = _finish(exp, job, engine, session_id, len(shared))
            for job in shared:
                if job.todo:  # goes on in the next window
                    job.generation_s += time.perf_counter() - t0
                    job.batch_tokens += tokens
    return results


def _readable(item: tasks.Item, prompt: Any, rec: dict[str, Any]) -> dict[str, Any]:
    """A predictions record with the item's question and the prompt the model was given, after
    its id (a reader of predictions.jsonl needs neither the task files nor the prompt code)."""
    return {"id": rec["id"], "question": item.question, "prompt": prompt, **rec}


def _windows(todo: list, per_chunk: int, engine: Engine) -> Iterator[list]:
    """The (job, item) windows the engine is given. A served model's windows hold one cell's
    items each, so that each cell journals its own requests (and counts its own cost)."""
    if getattr(engine, "name", "") != "openai":
        for start in range(0, len(todo), per_chunk):
            yield todo[start : start + per_chunk]
        return
    for _, pairs in itertools.groupby(todo, key=lambda pair: pair[0]):
        cell = list(pairs)
        for start in range(0, len(cell), per_chunk):
            yield cell[start : start + per_chunk]


ANSWER_PASS_TOKENS = 32  # Zero-shot-CoT's budget for the answer after its trigger


def _scored(window: list, batch: list, pairs: Any, ev: Any, engine: Engine) -> Any:
    """(request index, samples, record) of each item of a window, in request order. With
    `answer_pass`, the window's items without an answer are asked once more first (one engine
    call), and every record carries its two-pass fields."""
    made = (
        (i, samples, _readable(window[i][1], batch[i].prompt or batch[i].messages,
                               record(window[i][0].task, window[i][1], samples,
                                      window[i][0].cell.extractor, ev.decoding)))
        for i, samples in pairs
    )  # fmt: skip
    if not ev.answer_pass:
        yield from made
        return
    done = list(made)
    again = [
        k for k, (i, _, rec) in enumerate(done) if scoring.needs_answer_pass(window[i][0].task, rec)
    ]
    asks = [
        dataclasses.replace(batch[done[k][0]],
                            continuation=done[k][1][0].text.rstrip() + "\n" + scoring.ANSWER_TRIGGER)
        for k in again
    ]  # fmt: skip
    sampling = Sampling(max_tokens=ANSWER_PASS_TOKENS, stop=(*ev.stop, "\n\n"), seed=ev.seed)
    adapters = [window[done[k][0]][0].adapter for k in again]
    outs = engine.generate(asks, sampling, adapters) if asks else []
    seconds = {k: out[0] for k, out in zip(again, outs, strict=True)}
    for k, (i, samples, rec) in enumerate(done):
        job, item = window[i]
        extra = scoring.answer_pass_fields(job.task, item, rec, seconds.get(k), job.cell.extractor)
        yield i, samples, {**rec, **extra}


def _finish(exp: Experiment, job: _Job, engine: Engine, session_id: str, shared: int) -> dict:
    """Metrics, then the manifest, of a cell whose every item is in. Its items may have shared
    the engine's batches with other cells' (`batched_cells`): `generation_s` is then the wall
    time of those shared calls, and `tokens_per_s` their throughput."""
    ev, task, gen_s = job.cell.eval_config(exp), job.task, job.generation_s
    metrics = summarize(job.records, task.headline, exp.analysis)
    metrics.update(
        task=task.name,
        task_version=task.version,
        extractor=job.cell.extractor,
        extractor_version=answers.get_extractor(job.cell.extractor).version,
        decoding=ev.decoding,
        samples_per_item=ev.n,
        adapter=job.adapter,
        engine={
            "name": engine.name,
            "version": engine.version(),
            "session": session_id,
            **engine_provenance(engine),
        },
        resumed_items=job.resumed,
        generated_tokens=job.tokens,
        generation_s=round(gen_s, 3),
        tokens_per_s=round(job.batch_tokens / gen_s, 1) if gen_s > 0 else None,
        batched_cells=shared,
    )
    journal_to(engine, job.out.dir / JOURNAL)  # this cell's requests (reopened: it may be resumed)
    if usage := served_usage(engine):
        metrics["usage"] = usage
    job.out.write_json(METRICS, metrics)
    job.out.finish(metrics, packages=engine.packages)
    return metrics


def eval_config_json(evaluate_config: Any) -> str:
    """The eval config as canonical JSON: byte-identical in every cell scored under it."""
    return json_text(canonical(evaluate_config))


def _resumable(records: list[dict], items: list[tasks.Item], cell_dir: Path) -> list[dict]:
    """Records already on disk; they must be the first items of the split, in order."""
    if [r.get("id") for r in records] != [it.id for it in items[: len(records)]]:
        raise UserError(
            f"{cell_dir / PREDICTIONS}: its records are not the first {len(records)} test items in "
            f"order (were they made from another copy of the data?); delete {cell_dir} and re-run."
        )
    return list(records)


def summarize(records: list[dict], headline: str, analysis: AnalysisConfig) -> dict[str, Any]:
    """`scoring.rates` plus the headline accuracy's interval at `analysis.ci`: Jeffreys, the one
    the report, the answers and `cotgap eval` give a single 0/1 run (a percentile bootstrap
    collapses to [0, 0] when no item is right)."""
    out = scoring.rates(records, headline)
    verdicts = [float(bool(r["correct"])) for r in records]
    if not verdicts:
        return {**out, "accuracy_ci_low": None, "accuracy_ci_high": None, "ci": analysis.ci}
    est = teacher_level.accuracy(teacher_level.baseline_arm(verdicts), analysis.ci)
    out.update(accuracy_ci_low=est.low, accuracy_ci_high=est.high, ci=analysis.ci,
               ci_method="jeffreys")  # fmt: skip
    return out
