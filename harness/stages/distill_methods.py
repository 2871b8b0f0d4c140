"""Distillation methods beyond SFT: their losses, the teacher's stored top-k distributions, and
the student's on-policy samples. The training worker (harness/stages/train_worker.py) calls these per micro-batch.

    kd         (1 - w) * CE + w * KL(teacher || student) on the teacher's traces, the teacher's
               distribution known only on its top k tokens of each position (captured when the
               traces were generated, harness/stages/generate.py) plus one tail bucket for the rest
    on_policy  generalized JSD (GKD, Agarwal et al. 2024) between teacher and student on the
               student's own samples (or, for `teacher_share` of the micro-batches, the
               teacher's traces); the teacher scores every token in the training worker

    from harness.stages import distill_methods
    kl = distill_methods.topk_forward_kl(student_logits, top_ids, top_logprobs, full=False)
"""

from __future__ import annotations

import base64
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

TOPK_LINES = "topk.jsonl"  # written while a traces cell generates, one line per trace record
TOPK = "topk.npz"  # what the complete traces cell keeps: every record's arrays, packed


# --- losses ------------------------------------------------------------------------------------


def topk_forward_kl(
    student_logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor, full: bool
) -> torch.Tensor:
    """KL(teacher || student) at each position (rows), the teacher known on `top_ids` (N, k) with
    `top_logprobs`; the rest of its mass, 1 - sum(exp(top_logprobs)), is one tail bucket matched
    against the student's mass outside `top_ids`. `full`: the k ids cover the whole vocabulary
    (no tail), so the value equals the KL of the full distributions."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    lp = top_logprobs.float()
    kl = (lp.exp() * (lp - log_q.gather(-1, top_ids))).sum(-1)
    if full:
        return kl
    p_tail = (1 - lp.exp().sum(-1)).clamp(min=0)
    outside = student_logits.float().scatter(-1, top_ids, float("-inf"))
    log_q_tail = torch.logsumexp(outside, -1) - torch.logsumexp(student_logits.float(), -1)
    has_tail = p_tail > 0
    # where the teacher puts no mass in the tail the term is 0 (and must not become 0 * -inf)
    safe_p = torch.where(has_tail, p_tail, torch.ones_like(p_tail))
    tail = torch.where(has_tail, p_tail * (safe_p.log() - log_q_tail), torch.zeros_like(p_tail))
    return kl + tail


def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float
) -> torch.Tensor:
    """GKD's generalized Jensen-Shannon divergence at each position (rows), over the vocabulary:
    beta * KL(T || M) + (1 - beta) * KL(S || M), M = beta * T + (1 - beta) * S; beta 1 is the
    reverse KL(S || T) and beta 0 the forward KL(T || S), the limits GKD names them by."""
    log_s = F.log_softmax(student_logits.float(), dim=-1)
    log_t = F.log_softmax(teacher_logits.float(), dim=-1)
    if beta == 1:
        return (log_s.exp() * (log_s - log_t)).sum(-1)
    if beta == 0:
        return (log_t.exp() * (log_t - log_s)).sum(-1)
    log_m = torch.logsumexp(
        torch.stack([log_t + math.log(beta), log_s + math.log(1 - beta)]), dim=0
    )
    kl_t = (log_t.exp() * (log_t - log_m)).sum(-1)
    kl_s = (log_s.exp() * (log_s - log_m)).sum(-1)
    return beta * kl_t + (1 - beta) * kl_s


def on_policy_beta(settings: dict[str, Any]) -> float:
    """The generalized JSD's beta of an on_policy method's settings (reverse_kl: 1)."""
    return 1.0 if settings["divergence"] == "reverse_kl" else float(settings["beta"])


# --- the teacher's top-k distributions, stored with its traces --------------------------------


def encode_topk(sample: Any) -> dict[str, Any]:
    """One trace record's line of topk.jsonl: its generated tokens and, per token, the top-k ids
    and log-probabilities (`sample`: an engine Sample with `top`)."""
    ids = np.array([i for i, _ in sample.top], dtype=np.int32).reshape(len(sample.top), -1)
    lps = np.array([v for _, v in sample.top], dtype=np.float32).reshape(ids.shape)
    tokens = np.array(sample.token_ids[: len(sample.top)], dtype=np.int32)
    return {
        "k": int(ids.shape[1]) if ids.size else 0,
        "tokens": _b64(tokens),
        "ids": _b64(ids),
        "logprobs": _b64(lps),
    }


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


def _unb64(text: str, dtype: Any) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def pack_topk(lines: list[dict[str, Any]], out: Path) -> int:
    """Pack topk.jsonl's lines (each with id and sample) into one npz: `tokens` (T,), `ids` and
    `logprobs` (T, k), record r's rows at offsets[r]:offsets[r+1]. Returns the file's bytes."""
    k = max((line["k"] for line in lines), default=0)
    tokens = [_unb64(line["tokens"], np.int32) for line in lines]
    pairs = zip(lines, tokens, strict=True)
    ids = [_unb64(line["ids"], np.int32).reshape(len(t), -1) for line, t in pairs]
    pairs = zip(lines, ids, strict=True)
    lps = [_unb64(line["logprobs"], np.float32).reshape(a.shape) for line, a in pairs]
    offsets = np.cumsum([0, *map(len, tokens)]).astype(np.int64)
    tmp = out.with_name(f".{out.name}.tmp.npz")
    np.savez_compressed(
        tmp,
        record=np.array([str(line["id"]) for line in lines]),
        sample=np.array([line["sample"] for line in lines], dtype=np.int32),
        offsets=offsets,
        tokens=np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
        ids=np.concatenate(ids) if ids else np.zeros((0, k), np.int32),
        logprobs=np.concatenate(lps) if lps else np.zeros((0, k), np.float32),
    )
    tmp.replace(out)
    return out.stat().st_size


class TopK:
    """A traces cell's topk.npz: per (record id, sample) its tokens, top-k ids and log-probs."""

    def __init__(self, path: Path):
        with np.load(path) as z:
            self.tokens, self.ids, self.logprobs = z["tokens"], z["ids"], z["logprobs"]
            offsets = z["offsets"]
            self.index = {
                (str(r), int(s)): (int(offsets[i]), int(offsets[i + 1]))
                for i, (r, s) in enumerate(zip(z["record"], z["sample"], strict=True))
            }

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def get(self, record: Any, sample: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        span = self.index.get((str(record), int(sample)))
        if span is None:
            return None
        a, b = span
        return self.tokens[a:b], self.ids[a:b], self.logprobs[a:b]


def align_topk(
    seq: Sequence[int], n_prompt: int, stored: tuple[np.ndarray, np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """The teacher's top-k rows for an example's completion tokens (`seq[n_prompt:]`, the student's
    tokenization): the longest prefix where the teacher's generated tokens are the same ids (the
    rest, e.g. an EOS the teacher never generated, trains on the SFT term only). Returns (ids,
    logprobs, n aligned)."""
    if stored is None:
        return np.zeros((0, 1), np.int32), np.zeros((0, 1), np.float32), 0
    tokens, ids, lps = stored
    completion = np.asarray(seq[n_prompt:], dtype=np.int64)
    n = min(len(completion), len(tokens))
    differ = np.nonzero(completion[:n] != tokens[:n])[0]
    n = int(differ[0]) if len(differ) else n
    return ids[:n], lps[:n], n


# --- on-policy samples -------------------------------------------------------------------------


def uses_teacher_data(seed: int, position: int, share: float) -> bool:
    """Whether micro-batch `position` of a run trains on the teacher's traces (GKD's 1 - lambda):
    a function of (seed, position) only, so a resumed run makes the same choices."""
    return share > 0 and random.Random(f"{seed}/teacher-data/{position}").random() < share


def row_seeds(seed: int, position: int, n: int) -> list[int]:
    """The sampling seed of each row of micro-batch `position`."""
    from harness.engines.base import request_seed

    return [request_seed(seed, f"{position}/{row}") for row in range(n)]


@torch.no_grad()
def sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    temperature: float,
    max_new: Sequence[int],
    eos_ids: Sequence[int],
    pad_id: int,
) -> list[list[int]]:
    """The student's completion of each prompt, sampled at `temperature` with each row's own
    seeded generator (so the result depends on the seeds and the weights only), cut after its
    first EOS and at the row's `max_new` tokens."""
    from transformers import GenerationConfig, LogitsProcessorList

    from harness.engines.base import Sampling
    from harness.engines.hf_engine import SeededSampler

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p) :] = torch.tensor(list(p))
        mask[row, width - len(p) :] = 1
    sampler = SeededSampler(seeds, Sampling(temperature=temperature), device)
    was_training = model.training
    model.eval()
    try:
        # only what is passed decides decoding (a model's own generation_config may sample)
        config = GenerationConfig(
            max_new_tokens=max(max_new),
            do_sample=False,
            use_cache=True,  # training with gradient checkpointing turns the model's off
            eos_token_id=list(eos_ids),
            pad_token_id=pad_id,
        )
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
        )
    finally:
        model.train(was_training)
    completions = []
    for row, ids in enumerate(out[:, width:].tolist()):
        ids = ids[: max_new[row]]
        stop = next((j for j, t in enumerate(ids) if t in eos_ids), None)
        completions.append(ids if stop is None else ids[: stop + 1])
    return completions


# --- the per-micro-batch losses (summed over completion tokens) --------------------------------


def chunked_sum(fn: Any, chunk: int, *rows: torch.Tensor) -> torch.Tensor:
    """sum of fn(*parts) over `chunk` rows at a time of each of `rows`, each chunk recomputed in
    the backward pass (as train.linear_cross_entropy does): the fp32 logits of the whole batch
    never exist at once."""
    from torch.utils.checkpoint import checkpoint

    total = rows[0].new_zeros((), dtype=torch.float32)
    for start in range(0, len(rows[0]), chunk):
        parts = [r[start : start + chunk] for r in rows]
        total = total + checkpoint(fn, *parts, use_reentrant=False)
    return total


def kd_sum(
    logits: torch.Tensor,
    targets: torch.Tensor,
    top_ids: torch.Tensor,
    top_logprobs: torch.Tensor,
    valid: torch.Tensor,
    weight: float,
    full: bool,
) -> torch.Tensor:
    """(1 - weight) * cross-entropy + weight * top-k forward KL, summed over positions (rows);
    the KL only where the teacher's distribution is `valid` (aligned with the example)."""
    ce = F.cross_entropy(logits.float(), targets, reduction="sum")
    kl = topk_forward_kl(logits, top_ids.clamp(min=0), top_logprobs, full)
    return (1 - weight) * ce + weight * (kl * valid).sum()


def jsd_sum(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float
) -> torch.Tensor:
    """The generalized JSD summed over positions (rows)."""
    return generalized_jsd(student_logits, teacher_logits.detach(), beta).sum()
