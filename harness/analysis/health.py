"""Cells that completed but give nothing usable, said in a run's output with the number and what
to change: a teacher with no correct trace, a training set left empty or so small that it is learnt by
heart, completions cut at max_tokens or without an answer the task's extractor reads.

    cotgap run configs/sandbox.yaml    (the lines follow "computed N cell(s)")

Each complete cell's manifest summary is read (traces: yield, truncation and format-failure
rates; dataset: n_examples; adapter: examples and epochs; eval: truncation and format-failure
rates); nothing is recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.config.schema import Experiment
from harness.store import Store
from harness.workflow.cells import Cell

MOST = 0.5  # "most completions": a share above this is reported


def problems(exp: Experiment, store: Store, cells: Iterable[Cell]) -> list[str]:
    """One line per problem of the complete cells among `cells` (each key once), in order; the
    cells that share a problem and its advice share one line, the advice said once."""
    found: dict[str, list[str]] = {}  # advice -> the facts it answers, in first-seen order
    seen: set[str] = set()
    for c in cells:
        if c.key in seen or c.kind not in _CHECKS:
            continue
        seen.add(c.key)
        manifest = store.manifest(c.kind, c.key)
        if manifest:
            for fact, advice in _CHECKS[c.kind](exp, c, manifest.get("summary") or {}):
                found.setdefault(advice, []).append(fact)
    return ["; ".join(facts) + advice for advice, facts in found.items()]


Problem = tuple[str, str]  # (the cell's label and what is wrong, the advice with its separator)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _rates(c: Cell, s: dict[str, Any], n: int, section: str, max_tokens: int) -> list[Problem]:
    out = []
    if (s.get("truncation_rate") or 0) > MOST:
        out.append((
            f"{c.label}: {_pct(s['truncation_rate'])} of {n} completions were cut at max_tokens "
            f"({max_tokens})",
            f"; raise {section}.max_tokens",
        ))  # fmt: skip
    if (s.get("format_failure_rate") or 0) > MOST:
        out.append((
            f"{c.label}: {_pct(s['format_failure_rate'])} of {n} completions hold no answer the "
            "task's extractor reads",
            " (`cotgap score --explain --task TASK --predictions P`, P the cell's "
            "predictions.jsonl, linked under by-name/eval/ of the experiment's results, shows "
            "what it reads); if the task's prompt already asks for one ('The answer is ...'), "
            "the model does not follow it: try few-shot prompts "
            "(evaluate.prompt_style: few_shot_cot), the second answer pass "
            "(evaluate.answer_pass: true) or a larger model",
        ))  # fmt: skip
    return out


def _traces(exp: Experiment, c: Cell, s: dict[str, Any]) -> list[Problem]:
    n, samples = s.get("n_items", 0), s.get("n_samples", 0)
    out = []
    if n and s.get("yield") == 0:
        out.append((
            f"{c.label}: 0 of {n} questions have a correct trace ({samples} samples)",
            ": this teacher gives no training examples; raise generate.n or generate.max_tokens, "
            "check the prompt, or choose a stronger teacher",
        ))  # fmt: skip
    return out + _rates(c, s, samples, "generate", exp.generate.max_tokens)


DROPPED = 0.05  # a share of a teacher's examples dropped as over-long that is reported


def _dataset(exp: Experiment, c: Cell, s: dict[str, Any]) -> list[Problem]:
    overlong = s.get("n_dropped_overlong", 0)
    filtered = s.get("n_filtered", 0)
    kept = s.get("n_examples", 1)
    if kept and overlong >= DROPPED * (kept + overlong):
        return [(
            f"{c.label}: {overlong} of {kept + overlong} examples dropped as longer than "
            f"train.max_length {exp.train.max_length}",
            ": the set keeps the teacher's shorter traces only, which biases a comparison of "
            "teachers whose traces differ in length; raise train.max_length",
        )]  # fmt: skip
    if kept:
        return []
    if not overlong and not filtered:  # nothing was dropped: the teacher gave nothing to keep
        return [(
            f"{c.label}: 0 training examples",
            ": its teacher wrote no correct trace to train on (see its traces above), so its "
            "adapters and evals are skipped; raise generate.n or generate.max_tokens, check the "
            "prompt, or choose a stronger teacher",
        )]  # fmt: skip
    return [(
        f"{c.label}: 0 training examples after filtering ({overlong} dropped as longer than "
        f"train.max_length {exp.train.max_length}, {filtered} by train.filter_by)",
        ": its adapters and evals are skipped; raise train.max_length or lower train.filter_drop",
    )]  # fmt: skip


REPEATS = 50  # epochs beyond which a training set is learnt by heart


def _adapter(exp: Experiment, c: Cell, s: dict[str, Any]) -> list[Problem]:
    n, epochs, batch = s.get("examples") or 0, s.get("epochs") or 0, s.get("effective_batch") or 0
    if not n or (epochs <= REPEATS and n >= batch):
        return []
    return [(
        f"{c.label}: {n} training example(s) seen {epochs:.0f} times each ({s.get('steps')} "
        f"steps, batch {batch})",
        ": the adapter learns them by heart and its gain says little about the teacher; give the "
        "teacher more training questions (the task's train_limit, generate.n) or train fewer "
        "steps (train.max_steps, train.epochs)",
    )]  # fmt: skip


def _eval(exp: Experiment, c: Cell, s: dict[str, Any]) -> list[Problem]:
    return _rates(c, s, s.get("n", 0), "evaluate", exp.evaluate.max_tokens)


_CHECKS = {"traces": _traces, "dataset": _dataset, "adapter": _adapter, "eval": _eval}
