"""Stage: teacher traces. n chain-of-thought samples per train question, scored, streamed to JSONL.

    cotgap generate configs/sandbox.yaml [--teacher NAME] [--task NAME]

`run` takes the traces cells of one teacher (every trace draw of it: `generate.seeds`) and runs
them in one child process with one engine session; each cell samples with its own draw's seed.
Each cell's `traces.jsonl` holds one record per sample, in item then sample order; where the
grid distils by kd (`train.methods`), `topk.npz` beside it holds the teacher's top-k
log-probabilities of every generated token (harness/stages/distill_methods.py).
Items are generated in windows of `chunk_seqs` sequences, and within a window a record is
written as soon as every earlier item of the window is written, so the file on disk is always
a run of whole items in item order. A killed run keeps those items, regenerates the rest and
ends with the same bytes as an uninterrupted run: each request samples with its own seed
(base seed, item id), so its output does not depend on which items share its batch. The same
makes data-parallel generation exact: with `engine.data_parallel_size: N`, N engines in N
children, each on its own GPUs, generate contiguous shares of the items, joined in item order.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import devices, engines
from harness.config.schema import Experiment
from harness.engines import Engine, Request, Sampling
from harness.stages import distill_methods
from harness.store import (
    JsonlWriter,
    Store,
    atomic_write_bytes,
    atomic_write_text,
    jsonl_text,
    read_jsonl,
    safe_name,
)
from harness.tasks import answers, scoring
from harness.tasks import suite as tasks
from harness.tasks.scoring import TRACES, trace_record

if TYPE_CHECKING:
    from harness.workflow.cells import Traces

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
    spec = exp.model(cells[0].model)
    if not spec.served:  # a served teacher's replicas are the server's business
        e = spec.engine
        gpus = devices.replicas(
            e.data_parallel_size, e.tensor_parallel_size * e.pipeline_parallel_size
        )
        if len(gpus) > 1:
            return _run_replicas(exp, store, cells, gpus, progress, inprocess, chunk_seqs)
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
        k = max(c.config["generate"].get("top_logprobs", 0) for c in cells)
        engine = engines.load(exp.generate.engine, exp.model(cells[0].model), max_logprobs=k)
    return {
        c.key: _generate_cell(exp, store, c, task, items, engine, _drawn(sampling, c), chunk_seqs)
        for c, task, items in loaded
    }


def _run_replicas(
    exp: Experiment,
    store: Store,
    cells: list[Traces],
    gpus: list[tuple[str, ...]],
    progress: bool,
    inprocess: bool | None,
    chunk_seqs: int,
) -> dict[str, dict]:
    """engine.data_parallel_size: replica i of N generates the i-th contiguous share of every
    cell's items, in a child of its own that sees only its GPUs (`gpus[i]`), into a file of its
    own in the cell; the shares are then joined in item order into the cell. Each request samples
    with its own seed (base seed, item id), so the cell holds the bytes one engine would write."""
    import concurrent.futures
    import contextlib
    import threading

    from harness.progress import StageProgress

    model, n = cells[0].model, len(gpus)
    label = f"generate ({model}: {', '.join(c.label for c in cells)})"
    lock = threading.Lock()
    with contextlib.ExitStack() as stack:
        opened = [
            stack.enter_context(store.open_cell(c.kind, c.key, c.config, c.upstream)) for c in cells
        ]
        bar = stack.enter_context(StageProgress(f"generate {model} x{n}", enabled=progress))

        def relay(event: dict) -> None:  # the replicas' totals add up
            with lock:
                bar.update(
                    {**event, "total": (bar.total or 0) + event["total"]}
                    if "total" in event
                    else event
                )

        def replica(i: int) -> dict[str, dict]:
            log = store.root / "logs" / f"generate-{safe_name(model)}-replica{i}.log"
            args = (exp, str(store.root), cells, i, n, chunk_seqs)
            with devices.visible(gpus[i]):
                return engines.run_in_child(
                    work_replica, *args, label=f"{label} replica {i}", log_path=log,
                    on_event=relay, inprocess=inprocess,
                )  # fmt: skip

        # in this process (tests, debuggers) the replicas run one after another
        here = engines.inprocess_default() if inprocess is None else inprocess
        threads = 1 if here else n
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(replica, range(n)))
        return {
            c.key: _join_replicas(exp, out, c, [p[c.key] for p in parts])
            for c, out in zip(cells, opened, strict=True)
        }


def work_replica(
    exp: Experiment, root: str, cells: list[Traces], replica: int, replicas: int, chunk_seqs: int
) -> dict[str, dict]:
    """The engine side of one replica (in its child): its share of each cell's items."""
    store, sampling = Store(root), Sampling.from_config(exp.generate)
    loaded = [(c, task, items, share(items, replica, replicas)) for c, task, items in
              ((c, *task_items(exp, c, "train")) for c in cells)]  # fmt: skip
    engines.emit({"total": sampling.n * sum(len(part) for *_, part in loaded)})
    k = max(c.config["generate"].get("top_logprobs", 0) for c in cells)
    engine = engines.load(exp.generate.engine, exp.model(cells[0].model), max_logprobs=k)
    out = {}
    for c, task, items, part in loaded:
        engines.emit({"cell": c.label})
        drawn = _drawn(sampling, c)
        path = store.cell_dir(c.kind, c.key) / replica_file(replica, replicas)
        drop_unfinished_items(path, drawn.n)
        got = _generate_items(exp, c, task, part, engine, drawn, chunk_seqs, path)
        out[c.key] = {**got, "n_items": len(items)}
    return out


def share(items: list, i: int, n: int) -> list:
    """The i-th of n contiguous shares of `items` (their sizes differ by at most one)."""
    return items[i * len(items) // n : (i + 1) * len(items) // n]


def replica_file(i: int, n: int) -> str:
    """Replica i's share of a traces cell while it generates (a dot file: not an output)."""
    return f".replica-{i}-of-{n}.jsonl"


def _join_replicas(exp: Experiment, c: Any, cell: Traces, parts: list[dict]) -> dict[str, Any]:
    """The replicas' shares joined in item order into the cell's traces (and top-k lines), which
    is then completed; a share resumed from an earlier run is re-scored with the rest."""
    sampling = _drawn(Sampling.from_config(exp.generate), cell)
    files = [c.dir / replica_file(i, len(parts)) for i in range(len(parts))]
    atomic_write_bytes(c.dir / TRACES, b"".join(f.read_bytes() for f in files))
    if sampling.top_logprobs:
        lines = b"".join(_topk_path(f).read_bytes() for f in files)
        atomic_write_bytes(c.dir / distill_methods.TOPK_LINES, lines)
    if any(p["resumed_items"] for p in parts):
        scoring.rescore_partial(c.dir, exp.data_dir)
    for f in c.dir.glob(".replica-*"):  # and those of an earlier run with another count
        f.unlink()
    part = {
        "resumed_items": sum(p["resumed_items"] for p in parts),
        "tokens": sum(p["tokens"] for p in parts),
        "gen_s": max(p["gen_s"] for p in parts),  # the replicas ran at the same time
        "engine": {**parts[0]["engine"], "replicas": len(parts)},
        "usage": {},
    }
    packages = engines.ENGINES[exp.generate.engine].packages
    return _finish_cell(c, cell, part, parts[0]["n_items"], sampling, packages)


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
    engines.emit({"cell": cell.label})
    with store.open_cell(cell.kind, cell.key, cell.config, cell.upstream) as c:
        journal_to(engine, c.dir / JOURNAL)  # a served model's answers, kept as they come
        drop_unfinished_items(c.dir / TRACES, sampling.n)
        scoring.rescore_partial(c.dir, exp.data_dir)
        part = _generate_items(exp, cell, task, items, engine, sampling, chunk_seqs, c.dir / TRACES)
        return _finish_cell(c, cell, part, len(items), sampling, engine.packages)


def _generate_items(
    exp: Experiment,
    cell: Traces,
    task: tasks.TaskSpec,
    items: list[tasks.Item],
    engine: Engine,
    sampling: Sampling,
    chunk_seqs: int,
    path: Path,
) -> dict[str, Any]:
    """The records of `items` into `path` (the cell's traces, or a replica's share of them),
    resuming after the whole items already there; with top-k, their lines beside it. Returns
    what the summary needs: items resumed, tokens generated, seconds, the engine."""
    n, extractor = sampling.n, cell.extractor
    out = JsonlWriter(path)
    records, done = list(out.records), {r["id"] for r in out.records}
    topk = _topk_lines(_topk_path(path), records) if sampling.top_logprobs else None
    engines.emit({"skipped": len(records)})
    gen_s, per_chunk, resumed = 0.0, max(1, chunk_seqs // n), len(records)
    try:
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
                        topk.write(
                            {"id": todo[i].id, "sample": k, **distill_methods.encode_topk(s)}
                        )
                    out.write(records[-1])
            gen_s += time.perf_counter() - t0
    finally:
        out.close()
        if topk is not None:
            topk.close()
    return {
        "resumed_items": resumed // n,
        "tokens": sum(r["completion_tokens"] for r in records[resumed:]),
        "gen_s": gen_s,
        "engine": {"name": engine.name, "version": engine.version(), **engine_provenance(engine)},
        "usage": served_usage(engine),
    }


def _finish_cell(
    c: Any, cell: Traces, part: dict, n_items: int, sampling: Sampling, packages: tuple
) -> dict[str, Any]:
    """Summarise the cell's records (all of them, resumed ones included) and complete it."""
    records = read_jsonl(c.dir / TRACES)
    n = sampling.n
    summary = summarize(records, n_items=n_items, n=n, tokens=part["tokens"], gen_s=part["gen_s"])
    summary.update(
        # the extractor that scored the records: the dataset stage re-scores them when the
        # extractor's version has changed since (its key leaves the version out)
        extractor=cell.extractor,
        extractor_version=answers.get_extractor(cell.extractor).version,
        engine=part["engine"],
        sampling=sampling.as_dict(),
        resumed_items=part["resumed_items"],
    )
    if sampling.top_logprobs:
        summary.update(_pack_topk(c.dir, sampling.top_logprobs))
    if part["usage"]:
        summary["usage"] = part["usage"]
    c.finish(summary, packages=packages)
    return summary


def _topk_path(traces: Path) -> Path:
    """The top-k lines beside a traces file: topk.jsonl, or `.replica-I-of-N.topk.jsonl`."""
    if traces.name == TRACES:
        return traces.with_name(distill_methods.TOPK_LINES)
    return traces.with_name(traces.name.removesuffix(".jsonl") + ".topk.jsonl")


def _topk_lines(path: Path, records: list[dict]) -> Any:
    """The top-k lines' writer, its lines cut back to the trace records kept on disk (a killed
    run can leave a line whose record it never wrote)."""
    kept = {(r["id"], r["sample"]) for r in records}
    lines = [x for x in read_jsonl(path, repair=True) if (x["id"], x["sample"]) in kept]
    atomic_write_text(path, jsonl_text(lines))
    return JsonlWriter(path)


def _pack_topk(cell_dir: Path, k: int) -> dict[str, Any]:
    """topk.jsonl packed into topk.npz (the cell keeps the npz); its size for the summary."""
    path = cell_dir / distill_methods.TOPK_LINES
    size = distill_methods.pack_topk(read_jsonl(path), cell_dir / distill_methods.TOPK)
    path.unlink()
    return {"top_logprobs": k, "topk_bytes": size}


def engine_provenance(engine: Engine) -> dict[str, Any]:
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
