"""Scoring: the one definition of a verdict, of accuracy, and of re-scoring stored completions.

    cotgap score --task gsm8k --predictions preds.jsonl --data-dir ../shared/data [--explain]
    cotgap score --results results/sandbox

`score` reads the strict and flexible answers of one completion and judges each against the gold;
the task's headline reading (`verdict`) is the item's verdict. `rates` turns scored records into
accuracies and failure rates: the eval stage, `cotgap score`, the analysis and the lm-eval metric
all count through it. Re-scoring needs no engine, since raw completions are always kept:
`score_file` for a JSONL of predictions, `rescore_cell` / `rescore_results` for stored cells.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import UserError
from harness.stats.adapters import majority_vote
from harness.store import OUT_FIX, atomic_write_text, jsonl_text, read_json, read_jsonl
from harness.tasks import answers
from harness.tasks.suite import (
    Item,
    TaskSpec,
    data_dir_or_env,
    excluded_ids,
    load_items,
    load_task,
    read_utf8,
    task_spec,
)

if TYPE_CHECKING:  # the engines' Sample, for the records' signatures only
    from harness.engines.base import Sample

# where each answer came from (rule, span) or why there is none (reason): in every verdict record
READING_FIELDS = tuple(
    f"{r}_{f}" for r in ("strict", "flexible") for f in ("rule", "span", "reason")
)
VERDICT_FIELDS = ("strict", "flexible", "strict_correct", "flexible_correct", "correct")


def verdict(headline: str, strict_ok: bool, flexible_ok: bool) -> bool:
    """An item's verdict: its task's headline reading (tasks/<name>.yaml `headline`)."""
    return strict_ok if headline == "strict" else flexible_ok


def accuracy(verdicts: Iterable[Any]) -> float:
    """The share of true verdicts (0 when there are none)."""
    values = [bool(v) for v in verdicts]
    return sum(values) / max(1, len(values))


def rates(records: list[dict], headline: str) -> dict[str, Any]:
    """Accuracies and failure rates of scored records (greedy or self-consistency).

    format_failure_rate: items with no headline answer that were neither cut at max_tokens nor
    missing, so that an item is exactly one of correct, wrong, format failure, truncated (or
    missing). truncation_rate and mean_completion_tokens count completions (n per item under
    self-consistency).
    """
    n = len(records)
    if n == 0:
        raise ValueError("no records to summarise")
    finishes = [f for r in records for f in r.get("finish_reasons", [r.get("finish_reason")])]
    lengths = [t for r in records for t in _as_list(r.get("completion_tokens"))]
    failures = [
        r[headline] is None and not r["truncated"] and not r.get("missing") for r in records
    ]
    return {
        **_two_pass_rates(records),
        "n": n,
        "headline": headline,
        "accuracy": accuracy(r["correct"] for r in records),
        "strict_accuracy": accuracy(r["strict_correct"] for r in records),
        "flexible_accuracy": accuracy(r["flexible_correct"] for r in records),
        "format_failure_rate": sum(failures) / n,
        "truncation_rate": finishes.count("length") / max(1, len(finishes)),
        "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else None,
    }


def _two_pass_rates(records: list[dict]) -> dict[str, Any]:
    """With the second answer pass (`evaluate.answer_pass`): its own accuracy, beside the
    one-pass accuracy and never mixed into it; the items it asked again, and those still
    without an answer after it."""
    if not any("two_pass_correct" in r for r in records):
        return {}
    passes = [r["answer_pass"] for r in records if r.get("answer_pass")]
    return {
        "two_pass_accuracy": accuracy(r.get("two_pass_correct", r["correct"]) for r in records),
        "answer_pass_items": len(passes),
        "two_pass_format_failure_rate": sum(p["answer"] is None for p in passes) / len(records),
    }


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def score(
    task: TaskSpec | str,
    completion: str,
    gold: str,
    finish_reason: str | None = "stop",
    extractor: str | None = None,
    choices: list[str] | None = None,
) -> dict[str, Any]:
    """Strict and flexible answers of one completion, side by side; `correct` is the headline.

    A truncated generation (finish_reason "length") is never scored as an answer. Only the text
    after the last end of a reasoning part (</think>, <|end_of_thought|>, ...) is read, and
    within a solution block (<|begin_of_solution|> ...) when there is one; a block cut off before
    its close that states nothing leaves the reasoning before it to be read. `choices` (the item's option texts) lets a choice extractor
    match an answer given as option text instead of a letter."""
    spec = task_spec(task)
    ex = answers.get_extractor(extractor or spec.extractor)
    if spec.answer_type not in ex.answer_types:
        raise UserError(
            f"extractor {ex.name!r} cannot score task {spec.name} (answer_type {spec.answer_type}); "
            f"it scores {', '.join(ex.answer_types)}."
        )
    out: dict[str, Any] = {"extractor": ex.name, "extractor_version": ex.version}
    if finish_reason == "length":
        return {**out, **_no_answer("truncated at max_tokens", truncated=True)}
    text = completion if isinstance(completion, str) else ""
    rules = spec.scoring
    scored, *before = answers.final_segments(text, rules.reasoning_ends)
    strict, flexible = ex.read(scored, choices, closing=rules.closing_sentence)
    if strict.value is None and before and ex.reasoning_rules:  # a cut-off solution, no answer
        earlier = ex.read(before[0], choices, closing=rules.closing_sentence)
        if earlier[0].value is not None:
            strict, flexible = earlier
    kind = ex.answer_types[0]
    strict_ok = matches(spec, kind, strict.value, gold)
    same = flexible.value == strict.value
    flexible_ok = strict_ok if same else matches(spec, kind, flexible.value, gold)
    return {
        **out,
        "strict": strict.value,
        "flexible": flexible.value,
        "strict_correct": strict_ok,
        "flexible_correct": flexible_ok,
        "correct": verdict(spec.headline, strict_ok, flexible_ok),
        "truncated": False,
        **strict.fields("strict"),
        **flexible.fields("flexible"),
    }


def matches(spec: TaskSpec, kind: str, pred: str | None, gold: str | None) -> bool:
    """`answers.equivalent` under the task's scoring rules (list order, units)."""
    rules = spec.scoring
    return answers.equivalent(
        kind, pred, gold, ordered=rules.list_order == "as_given", strip_units=rules.units == "strip"
    )


ANSWER_TRIGGER = "Therefore, the answer is"  # Zero-shot-CoT's answer extraction prompt


def needs_answer_pass(task: TaskSpec, rec: dict[str, Any]) -> bool:
    """A greedy record whose completion ended by itself without a headline answer."""
    return rec[task.headline] is None and not rec["truncated"]


def answer_pass_fields(
    task: TaskSpec, item: Item, rec: dict[str, Any], second: Sample | None, extractor: str
) -> dict[str, Any]:
    """A greedy record's second answer pass: what the model wrote after its completion and
    ANSWER_TRIGGER (`second`; None where the pass did not run), that text's answer and verdict,
    and the item's two-pass verdict (the one-pass verdict where the first pass had an answer)."""
    if second is None:
        return {"answer_pass": None, "two_pass_correct": rec["correct"]}
    choices = item.meta.get("choices")
    r = score(task, ANSWER_TRIGGER + second.text, item.gold, "stop", extractor, choices)
    passed = {
        "completion": second.text,
        "finish_reason": second.finish_reason,
        "completion_tokens": second.completion_tokens,
        "answer": r[task.headline],
        "correct": r["correct"],
    }
    return {"answer_pass": passed, "two_pass_correct": r["correct"]}


def _no_answer(reason: str, truncated: bool = False) -> dict[str, Any]:
    none = answers.Reading(None, reason=reason)
    return {"strict": None, "flexible": None, "strict_correct": False, "flexible_correct": False,
            "correct": False, "truncated": truncated, **none.fields("strict"),
            **none.fields("flexible")}  # fmt: skip


def _no_lone_surrogate(rec: dict, where: str) -> None:
    """An escape like \\ud800 with no partner decodes to half a character, which cannot be
    written back as UTF-8: refused where it is read, not in a traceback where it is written."""
    try:
        json.dumps(rec, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(e.object[e.start])
        raise UserError(
            f"{where}: holds a lone UTF-16 surrogate escape (\\u{code:04x}), half of a character "
            "pair, which is not text; fix or drop that escape in the file."
        ) from None


def _read_predictions(
    path: Path, by_id: dict[str, Item], spec: TaskSpec, split: str
) -> dict[str, dict]:
    if not path.is_file():
        raise UserError(f"{path}: no such file; give a JSONL file of {{id, completion}} records.")
    preds: dict[str, dict] = {}
    records = 0  # excluded rows count: a file of only those is not empty
    # StringIO splits lines at "\n" only, as a file does (str.splitlines also splits at U+2028)
    for lineno, line in enumerate(io.StringIO(read_utf8(path)), 1):
        if not line.strip():
            continue
        records += 1
        where = f"{path}: line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not valid JSON ({e.msg}); one object per line.") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
            raise UserError(
                f"{where}: field 'id' is missing or not text; each line needs id and completion."
            )
        if not isinstance(rec.get("completion"), str):
            raise UserError(f"{where}: field 'completion' is missing or not text.")
        _no_lone_surrogate(rec, where)
        if rec["id"] in excluded_ids(spec):
            continue  # a row the task excludes (tasks/<name>.yaml `exclude`): counted, not scored
        if rec["id"] not in by_id:
            raise UserError(
                f"{where}: id {rec['id']!r} is not in the {split} split of task {spec.name} "
                f"({len(by_id)} items); were these predictions made for another task, split or data copy?"
            )
        if rec["id"] in preds:
            raise UserError(
                f"{where}: id {rec['id']!r} appears twice; keep one prediction per item."
            )
        preds[rec["id"]] = rec
    if not records:
        raise UserError(
            f"{path}: holds no predictions; give a JSONL file with one {{id, completion}} record "
            "per line."
        )
    return preds


def score_file(
    task: TaskSpec | str,
    predictions_path: str | Path,
    data_dir: str | Path | None = None,
    split: str = "test",
    out_path: str | Path | None = None,
    extractor: str | None = None,
    partial: bool = True,
) -> dict[str, Any]:
    """Re-score a JSONL of {id, completion[, finish_reason]} without an engine.

    Writes one result per item of the split (default <predictions>.scored.jsonl) and returns a
    summary with its coverage (items with a prediction / items); items without a prediction
    count as missing and incorrect. `partial=False`: a file that misses items is refused."""
    spec = task_spec(task)
    pred_path = Path(predictions_path)
    items = load_items(spec, split, data_dir)
    by_id = {item.id: item for item in items}
    preds = _read_predictions(pred_path, by_id, spec, split)
    if not partial and len(preds) < len(items):
        raise UserError(_partial_message(pred_path, spec.name, split, len(preds), len(items)))
    results = []
    for item in items:
        rec = preds.get(item.id)
        base = {"id": item.id, "source_index": item.source_index, "gold": item.gold}
        if rec is None:
            results.append({**base, "missing": True, **_no_answer("no prediction for this item")})
            continue
        finish = rec.get("finish_reason", "stop")
        scored = score(
            spec, rec["completion"], item.gold, finish, extractor, item.meta.get("choices")
        )
        if "two_pass_correct" in rec:  # an eval cell's predictions with the second answer pass
            name = extractor or spec.extractor
            scored.update(_rescored_pass(spec, item, scored, rec.get("answer_pass"), name))
        results.append({**base, "missing": False, "finish_reason": finish, **scored})
    out = Path(out_path) if out_path else pred_path.with_name(pred_path.stem + ".scored.jsonl")
    atomic_write_text(out, jsonl_text(results), OUT_FIX)
    missing = [r["id"] for r in results if r["missing"]]
    ex = answers.get_extractor(extractor or spec.extractor)
    r = rates(results, spec.headline)
    return {
        "task": spec.name,
        "task_version": spec.version,
        "split": split,
        "extractor": ex.name,
        "extractor_version": ex.version,
        "headline": spec.headline,
        "n": r["n"],
        "n_predictions": len(preds),
        "excluded_rows": len(spec.exclude),
        **{k: r[k] for k in ("accuracy", "strict_accuracy", "flexible_accuracy")},
        **{k: r[k] for k in ("two_pass_accuracy", "answer_pass_items") if k in r},
        **{k: r[k] for k in ("format_failure_rate", "truncation_rate")},
        "truncated": sum(x["truncated"] for x in results),
        "missing": len(missing),
        "missing_ids": missing[:20],
        "coverage": (len(results) - len(missing)) / len(results) if results else 0.0,
        "accuracy_on_predicted": accuracy(x["correct"] for x in results if not x["missing"]),
        "out": str(out),
    }


def _partial_message(path: Path, task: str, split: str, have: int, n: int) -> str:
    return (
        f"{path}: {have:,} prediction(s) for {n:,} items of {task} {split} (coverage "
        f"{100 * have / n:.1f}%): the {n - have:,} items without one would be scored incorrect, "
        f"so the accuracy would describe the file, not the model. Give a prediction for every "
        f"item (`cotgap ls items {task} --split {split}` lists their ids), or pass --partial to "
        "score it anyway (missing items count as incorrect; the summary adds "
        "accuracy_on_predicted). Nothing was written."
    )


def _cell_config(cell: Path) -> tuple[dict[str, Any], TaskSpec, str]:
    import yaml

    config = yaml.safe_load((cell / "config.yaml").read_text(encoding="utf-8"))
    return config, load_task(config["task"]["name"]), config["task"]["extractor"]


def rescore_cell(cell: str | Path, data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The records of one complete eval or traces cell, re-scored with the current extractor from
    their stored completions, without an engine; the cell is not modified. Each record is what the
    stage that made the cell writes (`record`, `trace_record`, below) with the stored
    token counts. Option texts (for answers given as text) come from the data dir when one is given."""
    from harness.engines.base import Sample

    cell = Path(cell)
    config, spec, extractor = _cell_config(cell)
    ident, traces = config["task"], "evaluate" not in config
    choices: dict[str, Any] = {}
    if data_dir_or_env(data_dir) is not None:
        items = load_items(spec, ident["split"], data_dir, ident.get("limit"))
        choices = {it.id: it.meta.get("choices") for it in items}
    new = []
    for rec in read_jsonl(cell / (TRACES if traces else PREDICTIONS)):
        item = Item(rec["id"], 0, "", rec["gold"], {"choices": choices.get(rec["id"])})
        if traces:
            sample = Sample(rec["completion"], (), 0, rec["finish_reason"])
            scored = trace_record(spec, item, rec["prompt"], rec["sample"], sample, extractor)
        else:
            texts = rec["completions"] if "completions" in rec else [rec["completion"]]
            finishes = rec.get("finish_reasons", [rec.get("finish_reason")])
            samples = [Sample(t, (), 0, f) for t, f in zip(texts, finishes, strict=True)]
            scored = record(spec, item, samples, extractor, config["evaluate"]["decoding"])
            # the item's question and prompt stay where the eval stage wrote them, after the id
            shown = {k: rec[k] for k in ("id", "question", "prompt") if k in rec}
            scored = {**shown, **scored}
            if "two_pass_correct" in rec:
                scored.update(_rescored_pass(spec, item, scored, rec.get("answer_pass"), extractor))
        keep = ("prompt_tokens", "completion_tokens")
        new.append({**scored, **{k: rec[k] for k in keep if k in rec}})
    return new


def _rescored_pass(
    spec: TaskSpec, item: Item, rec: dict[str, Any], stored: dict | None, extractor: str
) -> dict[str, Any]:
    """A stored second answer pass, re-scored from its stored text."""
    from harness.engines.base import Sample

    if stored is None:
        return answer_pass_fields(spec, item, rec, None, extractor)
    second = Sample(stored["completion"], (0,) * stored["completion_tokens"], 0,
                    stored["finish_reason"])  # fmt: skip
    return answer_pass_fields(spec, item, rec, second, extractor)


def rescore_partial(cell: Path, data_dir: str | Path | None = None) -> None:
    """Re-score, in place, the records a killed run left in a cell being computed (before the
    run resumes; a cut last line is removed): the extractor may have changed in between, and the
    key leaves its version out, so old verdicts must not end up beside new ones. With the same
    extractor the file keeps its bytes."""

    path = cell / (TRACES if (cell / TRACES).exists() else PREDICTIONS)
    if not read_jsonl(path, repair=True):
        return
    data = jsonl_text(rescore_cell(cell, data_dir))
    if data.encode("utf-8") != path.read_bytes():
        atomic_write_text(path, data)


def rescore_due(recorded: dict[str, Any]) -> bool:
    """Whether a cell's stored verdicts come from another version of its extractor than today's
    (`recorded`: its metrics.json or manifest summary); then `rescore_cell` gives today's. A cell
    that records no extractor version (made by hand) is taken as it is."""
    version, name = recorded.get("extractor_version"), recorded.get("extractor")
    return (
        version is not None and name is not None and answers.get_extractor(name).version != version
    )


def rescore_results(
    root: str | Path, data_dir: str | Path | None = None, out_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Re-score every complete eval cell of a results directory with the current extractors,
    from its stored completions, without an engine (`rescore_cell`). Cells are left as they are:
    the re-scored records go to <out_dir>/<key>.jsonl (default <root>/rescored/); returns one
    summary per cell."""

    root = Path(root)
    cells = sorted(p.parent for p in (root / "cells" / "eval").glob("*/manifest.json"))
    if not cells:
        raise UserError(
            f"{root}: no complete eval cells under cells/eval/; give a results directory."
        )
    out_root = Path(out_dir) if out_dir else root / "rescored"
    summaries = []
    for cell in cells:
        _, spec, extractor = _cell_config(cell)
        old = read_jsonl(cell / PREDICTIONS)
        new = rescore_cell(cell, data_dir)
        atomic_write_text(out_root / f"{cell.name}.jsonl", jsonl_text(new), OUT_FIX)
        stored = read_json(cell / METRICS, f"delete {cell} and re-run to recompute it")
        summaries.append(
            {
                "cell": cell.name,
                "task": spec.name,
                "n": len(new),
                "extractor": extractor,
                "stored_extractor_version": stored.get("extractor_version"),
                "extractor_version": answers.get_extractor(extractor).version,
                "stored_accuracy": stored.get("accuracy"),
                **rates(new, spec.headline),
                "changed_verdicts": sum(
                    a["correct"] != b["correct"] for a, b in zip(old, new, strict=True)
                ),
                "out": str(out_root / f"{cell.name}.jsonl"),
            }
        )
    return summaries


def explain(result: dict[str, Any]) -> str:
    """One scored item as text: verdict, gold, and each reading with its rule and span, or why
    it has no answer."""
    mark = "ok   " if result["correct"] else "WRONG"
    if result.get("missing"):
        return f"{mark} {result['id']}  gold={result['gold']!r}  no prediction"
    parts = [f"{mark} {result['id']}  gold={result['gold']!r}"]
    for reading in ("strict", "flexible"):
        value, rule = result.get(reading), result.get(f"{reading}_rule")
        span = result.get(f"{reading}_span")
        where = f" [{rule}: {span}]" if rule and span else f" [{rule}]" if rule else ""
        if value is not None:
            parts.append(f"{reading}={value!r}{where}")
        else:
            parts.append(f"{reading}=None ({result.get(f'{reading}_reason')}){where}")
    return "  ".join(parts)


def explain_file(path: str | Path) -> Iterable[str]:
    """`explain` for every record of a scored JSONL file (`cotgap score --explain`)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield explain(json.loads(line))


# --- the records the stages write ------------------------------------------------------------------

TRACES = "traces.jsonl"  # traces cells: one record per sample (trace_record)
PREDICTIONS = "predictions.jsonl"  # eval cells: one record per item (record)
METRICS = "metrics.json"


def trace_record(
    task: TaskSpec,
    item: Item,
    prompt: str | None,
    k: int,
    s: Sample,
    extractor: str,
    scored_texts: dict[tuple[str, str], dict] | None = None,
) -> dict[str, Any]:
    """The traces.jsonl record of one sample: prompt, completion, token counts and scores.

    `scored_texts`: the scores of this item's samples so far, by (text, finish reason); a sample
    that repeats one word for word (a strong teacher's n samples often do) takes its scores."""
    key = (s.text, s.finish_reason)
    scored = scored_texts.get(key) if scored_texts is not None else None
    if scored is None:
        choices = item.meta.get("choices")
        scored = score(task, s.text, item.gold, s.finish_reason, extractor, choices)
        if scored_texts is not None:
            scored_texts[key] = scored
    return {
        "id": item.id,
        "sample": k,
        "prompt": prompt,
        **_sample_fields(s, item),
        **{k: scored[k] for k in (*VERDICT_FIELDS, *READING_FIELDS)},
    }


def _sample_fields(s: Sample, item: Item) -> dict[str, Any]:
    return {
        "completion": s.text,
        "finish_reason": s.finish_reason,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "gold": item.gold,
    }


def record(
    task: TaskSpec, item: Item, samples: list[Sample], extractor: str, decoding: str
) -> dict[str, Any]:
    """The predictions.jsonl record of one item: its completion(s), token counts and scores."""
    choices = item.meta.get("choices")
    scored = [score(task, s.text, item.gold, s.finish_reason, extractor, choices) for s in samples]
    if decoding == "greedy":
        (s,), (r,) = samples, scored
        fields = (*VERDICT_FIELDS, "truncated", *READING_FIELDS)
        return {"id": item.id, **_sample_fields(s, item), **{k: r[k] for k in fields}}
    # self-consistency: one vote per sample on each reading; equivalence as scoring.score judges it
    kind = answers.get_extractor(extractor).answer_types[0]
    strict = majority_vote([r["strict"] for r in scored])
    flexible = majority_vote([r["flexible"] for r in scored])
    strict_ok = matches(task, kind, strict, item.gold)
    flexible_ok = matches(task, kind, flexible, item.gold)
    per_sample = ("strict", "flexible", *READING_FIELDS)
    return {
        "id": item.id,
        "completions": [s.text for s in samples],
        "finish_reasons": [s.finish_reason for s in samples],
        "prompt_tokens": samples[0].prompt_tokens,
        "completion_tokens": [s.completion_tokens for s in samples],
        "gold": item.gold,
        **{f"sample_{k}": [r[k] for r in scored] for k in per_sample},
        "strict": strict,
        "flexible": flexible,
        "strict_correct": strict_ok,
        "flexible_correct": flexible_ok,
        "correct": verdict(task.headline, strict_ok, flexible_ok),
        "truncated": all(r["truncated"] for r in scored),
    }
