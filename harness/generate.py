"""Stage: teacher traces. n chain-of-thought samples per train question, scored, streamed to JSONL.

    cotgap generate configs/sandbox.yaml [--teacher NAME] [--task NAME]

`run` takes the traces cells of one teacher (every trace draw of it: `generate.seeds`) and runs
them in one child process with one engine session; each cell samples with its own draw's seed.
Each cell's `traces.jsonl` holds one record per sample, in item then sample order; where the
grid distils by kd (`train.methods`), `topk.npz` beside it holds the teacher's top-k
log-probabilities of every generated token (harness/distill.py).
Items are generated in windows of `chunk_seqs` sequences, and within a window a record is
written as soon as every earlier item of the window is written, so the file on disk is always
a run of whole items in item order. A killed run keeps those items, regenerates the rest and
ends with the same bytes as an uninterrupted run: each request samples with its own seed
(base seed, item id), so its output does not depend on which items share its batch.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import answers, distill, engines, scoring, tasks
from harness.config import Experiment
from harness.engines import Engine, Request, Sampling
from harness.scoring import TRACES, trace_record
from harness.store import Store, atomic_write_bytes, atomic_write_text, jsonl_text, read_jsonl

if TYPE_CHECKING:
    from harness.cells import Traces

JOURNAL = ".requests.jsonl"  # a served model's finished requests (not an output: a dot file)
CHUNK_SEQS = 16384  # sequences per engine call: several times what a CPU engine runs at once (up
# to 4,096), so that it rarely runs dry between calls


def run(
    exp: Experiment,
    store: Store,
    cells: list[Traces],
    progress: bool = True,
    inprocess: bool | None = None,
    chunk_seqs: int = CHUNK_SEQS,
) -> dict[str, dict]:
    """Compute the traces cells of one teacher; returns summaries by cell key."""
    cells = engines.pending(store, cells, "traces")
    if not cells:
        return {}
    args = (exp, str(store.root), cells, chunk_seqs)
    return engines.run_stage(
        "generate", work, *args, cells=cells, store=store, progress=progress, inprocess=inprocess
    )


def work(
    exp: Experiment,
    root: str,
    cells: list[Traces],
    chunk_seqs: int = CHUNK_SEQS,
    engine: Engine | None = None,
) -> dict[str, dict]:
    """The engine side (in the child): one engine session, every cell in turn.

    `engine`: an already started engine to use (in-process callers: tests, benchmarks).
    """
    store, sampling = Store(root), Sampling.from_config(exp.generate)
    loaded = [(c, *task_items(exp, c, "train")) for c in cells]
    engines.emit({"total": sampling.n * sum(len(items) for _, _, items in loaded)})
    if engine is None:
        engines.emit({"status": f"starting the {exp.generate.engine} engine"})
        k = max(c.config["generate"].get("top_logprobs", 0) for c in cells)
        engine = engines.load(exp.generate.engine, exp.model(cells[0].model), max_logprobs=k)
    return {
        c.key: _generate_cell(exp, store, c, task, items, engine, _drawn(sampling, c), chunk_seqs)
        for c, task, items in loaded
    }


def _drawn(sampling: Sampling, cell: Traces) -> Sampling:
    """The sampling of one trace draw: the generate settings at the cell's own seed (and the
    top-k log-probabilities its key asks for)."""
    settings = cell.config["generate"]
    k = settings.get("top_logprobs", 0)
    return dataclasses.replace(sampling, seed=settings["seed"], top_logprobs=k)


def task_items(exp: Experiment, cell: Any, split: str) -> tuple[tasks.TaskSpec, list[tasks.Item]]:
    """A cell's task and its items of `split` (train for traces, test for eval)."""
    task = tasks.load_task(cell.task)
    return task, tasks.load_items(task, split, data_dir=exp.data_dir, limit=cell.limit)


def requests(
    task: tasks.TaskSpec, items: list[tasks.Item], cfg: Any, data_dir: str | None
) -> list[Request]:
    """One request per item, its prompt rendered as `cfg` (generate or evaluate settings) says."""
    style, shots = cfg.prompt_style, cfg.num_fewshot
    prompts = [tasks.render_prompt(task, it, style, shots, data_dir) for it in items]
    return [Request(it.id, prompt=p) for it, p in zip(items, prompts, strict=True)]


def _generate_cell(
    exp: Experiment,
    store: Store,
    cell: Traces,
    task: tasks.TaskSpec,
    items: list[tasks.Item],
    engine: Engine,
    sampling: Sampling,
    chunk_seqs: int,
) -> dict[str, Any]:
    n, extractor = sampling.n, cell.extractor
    engines.emit({"cell": cell.label})
    with store.open_cell(cell.kind, cell.key, cell.config, cell.upstream) as c:
        journal_to(engine, c.dir / JOURNAL)  # a served model's answers, kept as they come
        drop_unfinished_items(c.dir / TRACES, n)
        scoring.rescore_partial(c.dir, exp.data_dir)
        out = c.jsonl(TRACES)
        records, done = list(out.records), {r["id"] for r in out.records}
        topk = _topk_lines(c, records) if sampling.top_logprobs else None
        engines.emit({"skipped": len(records)})
        gen_s, per_chunk = 0.0, max(1, chunk_seqs // n)
        for start in range(0, len(items), per_chunk):
            todo = [it for it in items[start : start + per_chunk] if it.id not in done]
            if not todo:
                continue
            batch = requests(task, todo, exp.generate, exp.data_dir)
            t0 = time.perf_counter()
            # an item's records are written once all earlier items of the window are
            for i, samples in engines.in_request_order(engine.stream(batch, sampling)):
                scored: dict = {}  # an item's samples are often the same text: scored once
                prompt = batch[i].prompt
                for k, s in enumerate(samples):
                    records.append(trace_record(task, todo[i], prompt, k, s, extractor, scored))
                    if topk is not None:  # first: every trace record on disk has its line
                        topk.write({"id": todo[i].id, "sample": k, **distill.encode_topk(s)})
                    out.write(records[-1])
            gen_s += time.perf_counter() - t0
        tokens = sum(r["completion_tokens"] for r in records[len(done) * n :])
        summary = summarize(records, n_items=len(items), n=n, tokens=tokens, gen_s=gen_s)
        summary.update(
            # the extractor that scored the records: the dataset stage re-scores them when the
            # extractor's version has changed since (its key leaves the version out)
            extractor=extractor,
            extractor_version=answers.get_extractor(extractor).version,
            engine={"name": engine.name, "version": engine.version(), **provenance(engine)},
            sampling=sampling.as_dict(),
            resumed_items=len(done),
        )
        if topk is not None:
            topk.close()
            summary.update(_pack_topk(c.dir, sampling.top_logprobs))
        if usage := served_usage(engine):
            summary["usage"] = usage
        c.finish(summary, packages=engine.packages)
    return summary


def _topk_lines(cell: Any, records: list[dict]) -> Any:
    """topk.jsonl's writer, its lines cut back to the trace records kept on disk (a killed run
    may have written a line for a record it never wrote)."""
    path = cell.dir / distill.TOPK_LINES
    kept = {(r["id"], r["sample"]) for r in records}
    lines = [x for x in read_jsonl(path, repair=True) if (x["id"], x["sample"]) in kept]
    atomic_write_text(path, jsonl_text(lines))
    return cell.jsonl(distill.TOPK_LINES)


def _pack_topk(cell_dir: Path, k: int) -> dict[str, Any]:
    """topk.jsonl packed into topk.npz (the cell keeps the npz); its size for the summary."""
    path = cell_dir / distill.TOPK_LINES
    size = distill.pack_topk(read_jsonl(path), cell_dir / distill.TOPK)
    path.unlink()
    return {"top_logprobs": k, "topk_bytes": size}


def provenance(engine: Engine) -> dict[str, Any]:
    """What a served model's engine says about where its samples came from (none in-process)."""
    return engine.provenance() if hasattr(engine, "provenance") else {}


# An engine here is anything with Engine's `stream` (tests script their own): the served-model
# calls are optional.
def journal_to(engine: Engine, path: Path) -> None:
    """Point a served model's engine at the journal of the cell it now works for."""
    if hasattr(engine, "journal_to"):
        engine.journal_to(path)


def served_usage(engine: Engine) -> dict[str, Any]:
    """A served model's requests, retries and tokens in its current journal (none in-process)."""
    return engine.usage() if hasattr(engine, "usage") else {}


def drop_unfinished_items(path: Path, n: int) -> None:
    """Remove records of items with fewer than n samples on disk (and a cut last line).

    Records are written item by item, so these can only be the tail a kill interrupted; they
    are generated again, and the file ends as it would have without the kill.
    """
    if not path.exists():
        return
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines.pop()
    ids = [json.loads(line)["id"] for line in lines]
    counts = Counter(ids)
    keep = b"".join(line for line, i in zip(lines, ids, strict=True) if counts[i] == n)
    if keep != data:
        atomic_write_bytes(path, keep)


def summarize(
    records: list[dict], n_items: int, n: int, tokens: int, gen_s: float
) -> dict[str, Any]:
    """Yield (share of questions with a correct trace), accuracy, truncation, lengths, speed."""
    by_item: dict[str, bool] = defaultdict(bool)
    for r in records:
        by_item[r["id"]] |= bool(r["correct"])
    count = max(1, len(records))
    return {
        "n_items": n_items,
        "n_samples": len(records),
        "samples_per_item": n,
        "yield": sum(by_item.values()) / max(1, n_items),
        "accuracy": scoring.accuracy(r["correct"] for r in records),
        "truncation_rate": sum(r["finish_reason"] == "length" for r in records) / count,
        # completions neither cut at max_tokens nor holding an answer the extractor reads
        "format_failure_rate": sum(
            r.get("flexible") is None and not r.get("truncated") for r in records
        )
        / count,
        "mean_completion_tokens": sum(r["completion_tokens"] for r in records) / count,
        "generated_tokens": tokens,
        "generation_s": round(gen_s, 3),
        "tokens_per_s": round(tokens / gen_s, 1) if gen_s > 0 else None,
    }
