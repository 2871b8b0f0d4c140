"""Stage: training sets. A dataset cell selects a teacher's usable traces under its regime
(harness/workflow/regimes.py), renders them for the student (its tokenizer and chat template, as
evaluation renders prompts), with `train.filter_by` drops the share the student finds least
learnable (one forward pass, harness/stages/screen.py), and writes `examples.jsonl` with a summary.

    cotgap train configs/sandbox.yaml     # datasets, then adapters
"""

from __future__ import annotations

import json
from typing import Any

from harness.config.schema import Experiment
from harness.errors import UserError
from harness.models import sources as models
from harness.stages.encoding import encode, load_tokenizer
from harness.store import Store, read_jsonl
from harness.tasks import scoring
from harness.workflow import regimes
from harness.workflow.cells import Dataset, Traces, model_identities


def _traces(exp: Experiment, store: Store, cell: Dataset) -> tuple[dict[str, list[dict]], int]:
    """Usable traces of every teacher a dataset cell draws on, by trace cell key (its teacher's
    key is config["teacher"]; every key it reads is in `upstream`), and how
    many traces cells were re-scored: one scored by an earlier extractor version is re-scored
    from its completions, so the selection follows the current extractor's verdicts."""
    out, rescored = {}, 0
    for key in cell.upstream:
        d = store.cell_dir("traces", key)
        if not store.complete("traces", key):
            raise UserError(f"traces cell {d} is not complete; run the traces stage first.")
        if scoring.rescore_due(store.completed("traces", key).get("summary") or {}):
            out[key], rescored = _usable(scoring.rescore_cell(d, exp.data_dir)), rescored + 1
        else:
            out[key] = _usable(read_jsonl(store.output("traces", key, "traces.jsonl")))
    return out, rescored


def _usable(records: list[dict]) -> list[dict]:
    """Correct traces whose generation finished: a truncated one is never an answer."""
    return [r for r in records if r.get("correct") and r.get("finish_reason") != "length"]


def _render(records: list[dict], tok: Any, chat: bool, max_length: int) -> tuple[list[dict], int]:
    """Training examples of `records`, and how many were dropped (never truncated) as over-long."""
    kept, dropped = [], 0
    for r in records:
        ids, n_prompt = encode(tok, r["prompt"], r["completion"], chat)
        if len(ids) > max_length:
            dropped += 1
            continue
        example = {k: r[k] for k in ("id", "sample", "prompt", "completion")}
        kept.append({**example, "n_tokens": len(ids), "n_completion_tokens": len(ids) - n_prompt})
    return kept, dropped


def _teacher_names(exp: Experiment, cell: Dataset) -> dict[str, str]:
    """Traces key -> teacher name, for the teachers a mix set reads."""
    ids = model_identities(exp)
    names = {
        Traces.of(exp, ids[t.name], t.name, cell.task, cell.trace_seed).key: t.name
        for t in exp.teachers
    }
    return {key: names[key] for key in cell.upstream}


def _filter(student: Any, tok: Any, examples: list[dict], how: dict) -> list[dict]:
    """The examples without the `how["drop"]` share the student finds least learnable by
    `how["by"]` (one forward pass of the student: harness/stages/screen.py)."""
    from harness.stages import screen
    from harness.workflow.cells import SCREEN_DIRECTION

    model, device = screen.load_model(models.resolve(student), student.trust_remote_code)
    data = [encode(tok, e["prompt"], e["completion"], student.chat_template) for e in examples]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = screen.signals(model, data, 16, device, pad)
    scores = [SCREEN_DIRECTION[how["by"]] * r[how["by"]] for r in rows]
    return regimes.filter_worst(examples, scores, how["drop"])


def run(exp: Experiment, store: Store, cells: list[Dataset]) -> dict[str, dict]:
    """Build dataset cells; returns their summaries by key."""
    return {c.key: build(exp, store, c) for c in cells if not store.complete(c.kind, c.key)}


def build(exp: Experiment, store: Store, cell: Dataset) -> dict:
    """Select, render and write the training examples of one dataset cell; returns its summary."""
    cfg = cell.config
    student = exp.model(cell.student)
    tok = load_tokenizer(models.resolve(student), student.chat_template, student.trust_remote_code)
    usable, rescored = _traces(exp, store, cell)
    examples, dropped = regimes.select(
        cell.regime,
        cfg["teacher"],
        usable,
        lambda rs: _render(rs, tok, student.chat_template, cfg["max_length"]),
        cfg["matched_by"],
        [(key, weight) for key, weight in cfg.get("mix", [])],
    )
    filtered = 0
    if cfg.get("filter") and examples:
        kept = _filter(student, tok, examples, cfg["filter"])
        examples, filtered = kept, len(examples) - len(kept)
    # An empty set is a result (the teacher solved nothing usable), not an error: the cell completes
    # with n_examples 0, and the scheduler skips the adapter and eval cells downstream of it.
    completion_tokens = sum(e["n_completion_tokens"] for e in examples)
    summary = {
        "n_examples": len(examples),
        "n_dropped_overlong": dropped,
        "train_tokens": sum(e["n_tokens"] for e in examples),
        "completion_tokens": completion_tokens,
        "mean_trace_tokens": completion_tokens / len(examples) if examples else 0.0,
        "n_questions": len({e["id"] for e in examples}),
        "rescored_traces_cells": rescored,
    }
    if cell.regime == "mix":
        summary["mix"] = regimes.realised_mix(examples, _teacher_names(exp, cell))
        summary["mix_weights"] = {p.teacher: p.weight for p in exp.train.mix}
    if cfg.get("filter"):
        summary["n_filtered"] = filtered
    with store.open_cell("dataset", cell.key, cell.config, cell.upstream) as out:
        out.write_text("examples.jsonl", "".join(json.dumps(e) + "\n" for e in examples))
        out.finish(summary, packages=("transformers",))
    return summary
