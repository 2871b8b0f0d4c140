"""Stage: student-side screening of teacher traces. A screen cell runs one forward pass of the
student over its dataset cell's examples (the tokens training would see, masked as training masks
them) and records, per example, how the student predicts every completion token; no training.

    cotgap screen configs/sandbox.yaml        # screens, then analysis/screen.csv

Per example (`signals.jsonl`), over the completion tokens and the EOS (training's labels):
  nll          mean negative log-likelihood (nats) of the tokens under the student
  mean_rank    mean rank of each token among the student's next-token logits (1 = its argmax;
               ties count in the token's favour: 1 + the number of strictly larger logits)
  median_rank  median of those ranks
  rsr          rank-surprisal ratio, mean_rank / nll: our reading of arXiv 2601.14249 ("the ratio
               of a trajectory's average token-wise rank to its average negative log-likelihood";
               lower is better there: surprising tokens that the student still ranks high). Ranks
               are not clipped here.
  top1, top5   share of the tokens that are the student's first choice / among its first five
With `screen.max_examples: N`, a seeded sample of N examples is screened (in the key when set).
With `screen.local_window: W`, also
  local_nll    local naturalness (arXiv 2510.03988, as we read it; negated): each reasoning step's
               (sentence or line) mean NLL given only the prompt and the W steps before it,
               averaged over the trace's steps. One more forward pass per step.
The cell's summary holds their means over the examples, the dataset's size (`n_examples`; the
examples screened: `n_screened`), the teacher's train yield, and the cost (wall time, tokens
scored, tokens per second).
"""

from __future__ import annotations

import gc
import json
import math
import random
import re
import time
from typing import Any

import numpy as np
import torch
import yaml

from harness.config.schema import Experiment, ScreenConfig
from harness.errors import UserError
from harness.models import sources as models
from harness.stages.encoding import collate, encode, load_tokenizer
from harness.store import Store, read_jsonl
from harness.workflow.cells import SCREEN_SIGNALS, Screen

SAMPLE_SEED = 0
SIGNALS = SCREEN_SIGNALS
STEP = re.compile(r".*?(?:[.!?](?=\s|$)|\n|$)\s*", re.S)  # a sentence or a line, with its spaces


def run(exp: Experiment, store: Store, cells: list[Screen]) -> dict[str, dict]:
    """Compute screen cells, loading each student once; returns their summaries by key.

    An example the student has already been scored on (the same prompt and completion in another
    training set of the task: a regime's subset of a teacher's traces, or samples that agree word
    for word) is not computed again: its signals are copied from the cell that scored it first.
    The screen cells of a (student, task), complete or not, go in one order, largest training
    set first (so that a subset costs nothing), then by key; a cell copies from the cells before
    it only, so a killed run, resumed, gives every cell the bytes an uninterrupted run gives it."""
    todo = [c for c in cells if not store.complete(c.kind, c.key)]
    for c in todo:
        if not store.complete("dataset", c.upstream[0]):
            raise UserError(f"dataset cell {c.upstream[0]} is not complete; build it first.")
    batch_size = (exp.screen or ScreenConfig()).batch_size
    done = {}
    for student in dict.fromkeys(c.student for c in todo):
        spec = exp.model(student)
        model_dir = models.resolve(spec)
        tok = load_tokenizer(model_dir, spec.chat_template, spec.trust_remote_code)
        model, device = load_model(model_dir, spec.trust_remote_code)
        mine = [c for c in todo if c.student == student]
        for task in dict.fromkeys(c.task for c in mine):
            pending = {c.key: c for c in mine if c.task == task}
            datasets = {c.key: c.upstream[0] for c in pending.values()}
            datasets.update(_complete_screens(store, mine[0].config, task))
            size = {
                k: store.completed("dataset", d)["summary"]["n_examples"]
                for k, d in datasets.items()
            }
            known: dict[tuple[str, str], dict] = {}
            for key in sorted(datasets, key=lambda k: (-size[k], k)):
                if key in pending:
                    done[key] = screen_cell(
                        store,
                        pending[key],
                        model,
                        tok,
                        spec.chat_template,
                        batch_size,
                        device,
                        known,
                    )
                else:
                    _copy_signals(store, key, datasets[key], known)
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return done


def _complete_screens(store: Store, config: dict, task: str) -> dict[str, str]:
    """Screen key -> dataset key, for the complete screen cells of `task` whose student, screen
    version and dtype are `config`'s (their signals are the ones it would compute)."""
    same = {k: config[k] for k in ("student", "version", "dtype")}
    found = {}
    base = store.root / "cells" / "screen"
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        manifest = store.manifest("screen", d.name) if (d / "manifest.json").exists() else None
        if manifest is None:
            continue
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        dataset = manifest["upstream"][0]
        ds_cfg = yaml.safe_load((store.cell_dir("dataset", dataset) / "config.yaml").read_text())
        if {k: cfg.get(k) for k in same} == same and ds_cfg["task"]["name"] == task:
            found[d.name] = dataset
    return found


def _copy_signals(
    store: Store, screen_key: str, dataset_key: str, known: dict[tuple[str, str], dict]
) -> None:
    """Add a complete screen cell's signals to `known`, by (prompt, completion)."""
    ds_dir = store.cell_dir("dataset", dataset_key)
    examples = {(r["id"], r["sample"]): r for r in read_jsonl(ds_dir / "examples.jsonl")}
    for row in read_jsonl(store.cell_dir("screen", screen_key) / "signals.jsonl"):
        ex = examples[row["id"], row["sample"]]
        signals = {k: v for k, v in row.items() if k not in ("id", "sample", "local_nll")}
        known.setdefault((ex["prompt"], ex["completion"]), signals)


def load_model(model_dir: str, trust_remote_code: bool) -> tuple[Any, str]:
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    return model.to(device).eval(), device


def screen_cell(
    store: Store,
    cell: Screen,
    model: Any,
    tok: Any,
    chat: bool,
    batch_size: int,
    device: str,
    known: dict[tuple[str, str], dict] | None = None,
) -> dict:
    """Score one dataset cell's examples with the loaded student and complete the screen cell
    (its manifest's wall_s is the cell's cost: reading, encoding, the forward passes, writing).
    `known`: signals by (prompt, completion) already computed (`run`); this cell's are added."""
    known = {} if known is None else known
    ds_dir = store.cell_dir("dataset", cell.upstream[0])
    with store.open_cell("screen", cell.key, cell.config, cell.upstream) as out:
        began = time.perf_counter()
        every = read_jsonl(ds_dir / "examples.jsonl")
        records = subsample(every, cell.config.get("max_examples"))
        texts = [(r["prompt"], r["completion"]) for r in records]
        new = [i for i, t in enumerate(texts) if t not in known]
        data = [encode(tok, *texts[i], chat) for i in new]
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        for i, row in zip(new, signals(model, data, batch_size, device, pad), strict=True):
            known.setdefault(texts[i], row)
        rows = [known[t] for t in texts]
        if cell.config.get("local_window"):
            window = cell.config["local_window"]
            local = local_nll(model, tok, records, chat, window, batch_size, device, pad)
            rows = [{**row, "local_nll": v} for row, v in zip(rows, local, strict=True)]
        seconds = time.perf_counter() - began
        own = yaml.safe_load((ds_dir / "config.yaml").read_text())["teacher"]  # None: a mix
        traces = (store.manifest("traces", own) if own else None) or {}
        n_tokens = sum(r["n_tokens"] for r in rows)
        computed = sum(len(ids) - n for ids, n in set((tuple(i), n) for i, n in data))  # here
        names = [k for k in (rows[0] if rows else SIGNALS) if k != "n_tokens"]  # + local_nll
        summary = {
            **{s: _mean([r[s] for r in rows]) for s in names},
            "n_examples": len(every),  # the teacher's data count
            "n_screened": len(rows),
            "n_tokens": n_tokens,
            "n_copied": len(records) - len(new),  # scored before, by another cell
            "teacher_train_acc": traces.get("summary", {}).get("yield"),
            "device": device,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(computed / seconds, 1) if seconds > 0 else None,
        }
        keys = [{"id": r["id"], "sample": r["sample"]} for r in records]
        text = "".join(json.dumps({**k, **row}) + "\n" for k, row in zip(keys, rows, strict=True))
        out.write_text("signals.jsonl", text)
        out.finish(summary, packages=("torch", "transformers"))
    return summary


def steps(completion: str) -> list[str]:
    """A completion cut into its reasoning steps: sentences (a `.`, `!` or `?` before a space or
    the end; not the point of 3.5) and lines, each with the spaces after it; they join back to it."""
    return [m for m in STEP.findall(completion) if m]


def local_nll(
    model: Any,
    tok: Any,
    records: list[dict],
    chat: bool,
    window: int,
    batch_size: int,
    device: str,
    pad: int,
) -> list[float]:
    """Local naturalness, as we read arXiv 2510.03988 (negated, so lower is better like `nll`): each
    step's mean NLL given only the prompt and the `window` steps before it, averaged over the steps
    of a trace. Steps are tokenized one by one (exact for a character tokenizer; at step borders a
    BPE tokenizer may split a word differently than in the whole completion)."""
    data, owner = [], []
    for n, r in enumerate(records):
        ids, n_prompt = encode(tok, r["prompt"], "", chat)
        prompt = ids[:n_prompt]
        parts = steps(r["completion"])
        for i, step in enumerate(parts):
            context = tok("".join(parts[max(0, i - window) : i]), add_special_tokens=False)
            target = tok(step, add_special_tokens=False)["input_ids"]
            if i == len(parts) - 1:
                target = [*target, tok.eos_token_id]
            head = [*prompt, *context["input_ids"]]
            data.append(([*head, *target], len(head)))
            owner.append(n)
    per_step = signals(model, data, batch_size, device, pad)
    out: list[list[float]] = [[] for _ in records]
    for n, row in zip(owner, per_step, strict=True):
        out[n].append(row["nll"])
    return [_mean(v) for v in out]


def subsample(records: list[dict], k: int | None) -> list[dict]:
    """`k` of the records (seeded, in their order), or all of them."""
    if k is None or k >= len(records):
        return records
    return [records[i] for i in sorted(random.Random(SAMPLE_SEED).sample(range(len(records)), k))]


def _mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else math.nan


LOGIT_BYTES = 1 << 30  # a batch's float32 logits stay under this: fewer rows for a large vocabulary


@torch.inference_mode()
def signals(
    model: Any, data: list[tuple[list[int], int]], batch_size: int, device: str, pad_id: int
) -> list[dict[str, Any]]:
    """Per example (token ids, prompt length; as harness/stages/dataset.py encodes it): the signals over
    the positions training puts its loss on (train.collate's labels).

    An example that occurs several times (a teacher's n samples often agree word for word) is
    computed once. Batches hold the examples in length order, at most `batch_size` of them and
    fewer where their logits would pass LOGIT_BYTES; which batch an example lands in depends on
    the examples given, so a cell computed again gives the same bytes."""
    first: dict[tuple, int] = {}
    unique = [first.setdefault((tuple(ids), n), i) == i for i, (ids, n) in enumerate(data)]
    todo = sorted((i for i, u in enumerate(unique) if u), key=lambda i: len(data[i][0]))
    vocab = model.get_output_embeddings().weight.shape[0]
    positions = max(1, LOGIT_BYTES // (4 * vocab))  # rows x width of one batch, at most
    out: list[dict[str, Any]] = [{}] * len(data)
    s = 0
    while s < len(todo):
        width = len(data[todo[min(s + batch_size, len(todo)) - 1]][0])
        idx = todo[s : s + max(1, min(batch_size, positions // max(1, width)))]
        s += len(idx)
        b = collate(data, idx, pad_id)
        logits = model(
            input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device)
        ).logits.float()
        scored = token_signals(logits[:, :-1], b["labels"][:, 1:].to(device))
        for i, row in zip(idx, scored, strict=True):
            out[i] = row
    return [out[i] if unique[i] else out[first[(tuple(ids), n)]] for i, (ids, n) in enumerate(data)]


def token_signals(logits: torch.Tensor, targets: torch.Tensor) -> list[dict[str, Any]]:
    """The signals of each row of a batch: `logits` (rows x positions x vocab) predict `targets`
    (rows x positions; -100 where there is no loss)."""
    mask = targets != -100
    tgt = targets.clamp(min=0)[..., None]
    target_logit = logits.gather(-1, tgt)
    nll = -(logits.gather(-1, tgt) - logits.logsumexp(-1, keepdim=True))[..., 0].double()
    ranks = (logits > target_logit).sum(-1).double() + 1
    n = mask.sum(1)
    means = {
        "nll": (nll * mask).sum(1) / n,
        "mean_rank": (ranks * mask).sum(1) / n,
        "top1": ((ranks == 1) & mask).sum(1) / n,
        "top5": ((ranks <= 5) & mask).sum(1) / n,
    }
    means = {k: v.cpu().tolist() for k, v in means.items()}
    ranks, mask, n = ranks.cpu().numpy(), mask.cpu().numpy(), n.cpu().tolist()
    rows = []
    for r in range(len(n)):
        row = {"n_tokens": int(n[r]), **{k: v[r] for k, v in means.items()}}
        row["median_rank"] = float(np.median(ranks[r][mask[r]]))
        row["rsr"] = row["mean_rank"] / row["nll"] if row["nll"] > 0 else math.inf
        rows.append(row)
    return rows
