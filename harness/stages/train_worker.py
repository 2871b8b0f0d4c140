"""The training worker: trains adapter cells one after another, each as its job.json says, with a
plain accelerate loop. The train stage (harness/stages/train.py) writes the jobs and starts it.

    python -m harness.stages.train_worker --cell-dir results/<exp>/cells/adapter/<key>

The worker reads `<cell>/job.json` and writes `train_log.jsonl` (one record per optimizer step),
`checkpoints/step-N/` every `checkpoint_seconds` of training and every `checkpoint_every` steps
(the last is kept until the cell completes), `adapter/` (PEFT format), `merged/` (full
fine-tuning, or LoRA with `merge=True`) and `summary.json`, and completes the cell (its manifest)
as soon as that cell is trained. A killed run keeps every cell the worker finished, resumes the
others from their last checkpoint with the same data order, and reaches the same weights.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness.config.schema import TrainConfig
from harness.errors import Interrupted, UserError, stop_on_signals
from harness.stages import distill_methods
from harness.stages.encoding import collate, encode, load_tokenizer
from harness.store import (
    JsonlWriter,
    Store,
    atomic_write_json,
    atomic_write_text,
    jsonl_text,
    read_json,
    read_jsonl,
)
from harness.workflow.cells import TRAIN_PACKAGES
from harness.workflow.estimate import CHUNK_BYTES, checkpointing

MEGA_BATCH = 64  # micro-batches sorted together by length: little padding, order still shuffled
TRAINABLE = "trainable.safetensors"

# --- adapter cells: the worker ------------------------------------------------------------------


def train_cell(cell_dir: Path, owner_pid: int | None = None) -> dict:
    """The worker: trains the adapter cell in `cell_dir` as its job.json says; returns a summary."""
    import psutil  # a dependency of accelerate
    from accelerate.utils import set_seed

    from harness.progress import StageProgress

    started = time.time()
    job = read_json(cell_dir / "job.json", f"delete {cell_dir} and re-run to train that cell again")
    cfg = TrainConfig.model_validate(job["train"])
    every_s = job.get("checkpoint_seconds", cfg.checkpoint_seconds)
    acc = _accelerator(cfg)
    world, ga, size = acc.num_processes, cfg.grad_accum, cfg.per_device_batch_size
    set_seed(job["seed"])
    tok = load_tokenizer(job["model_dir"], job["chat_template"], job["trust_remote_code"])
    records = read_jsonl(Path(job["examples"]))
    data = [encode(tok, r["prompt"], r["completion"], job["chat_template"]) for r in records]
    total = cfg.max_steps or math.ceil(cfg.epochs * math.ceil(len(data) / size) / (ga * world))
    model, optimizer, scheduler = acc.prepare(*_model_and_optimizer(job, cfg, total))
    _checkpoint_trainable_only(acc)
    progress = _resume(acc, cell_dir)
    method = _method(job, acc, model, tok, records, data, cfg, progress)
    log = _open_log(acc, cell_dir, progress["step"])
    lengths = [len(ids) for ids, _ in data]
    start = progress["step"] * ga * world
    stream = micro_batches(
        lengths, size, cfg.group_by_length, job["seed"], world, acc.process_index, start
    )
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.train()
    began = time.perf_counter() - progress["elapsed"]
    saved = time.perf_counter()
    # steps, tokens/s and the loss, shown by the main process (the others stay quiet)
    bar = StageProgress(
        f"train {job.get('label', '')}".strip(), enabled=acc.is_main_process, unit="steps"
    )
    bar.update({"total": total - progress["step"]})
    with bar:
        for step in range(progress["step"] + 1, total + 1):
            if owner_pid and not psutil.pid_exists(owner_pid):
                sys.exit(f"the cotgap process {owner_pid} that started this worker is gone.")
            first = (step - 1) * ga * world + acc.process_index  # global micro-batch positions
            before = dict(method["extra"])
            batches = [
                _micro_batch(method, model, data, next(stream), pad, first + j * world)
                for j in range(ga)
            ]
            lr = optimizer.param_groups[0]["lr"]
            loss, counts = _step(
                acc, model, optimizer, scheduler, batches, cfg.max_grad_norm, method
            )
            _sum_extra_over_ranks(acc, method["extra"], before)
            progress["step"], progress["elapsed"] = step, round(time.perf_counter() - began, 3)
            progress["tokens"] += int(counts[1])
            progress["positions"] += int(counts[2])
            if log:
                keys = ("step", "tokens", "elapsed")
                log.write({"loss": round(loss, 6), "lr": lr, **{k: progress[k] for k in keys}})
            if step < total and _checkpoint_due(
                acc, cfg, step, time.perf_counter() - saved, every_s
            ):
                _checkpoint(acc, cell_dir, progress)
                saved = time.perf_counter()
            bar.update({"fields": f"loss {loss:.3f}", "samples": 1, "tokens": int(counts[1])})
    _save(acc, model, tok, cell_dir, job, cfg.method)
    summary = {}
    if log:
        log.close()
        summary = _summary(cell_dir, cfg, progress, len(data), world)
        summary["distillation"] = _method_summary(method)
        summary["dtypes"] = _dtypes(model)
        atomic_write_json(cell_dir / "summary.json", summary)
        if "cell" in job:
            _complete(cell_dir, job, summary, started)
    acc.end_training()
    return summary


def _dtypes(model: Any) -> dict[str, str | None]:
    """The dtypes the model holds its trained and its frozen parameters in (None: none frozen)."""
    held: dict[bool, set[str]] = {True: set(), False: set()}
    for p in model.parameters():
        held[p.requires_grad].add(str(p.dtype).removeprefix("torch."))
    return {k: ",".join(sorted(held[t])) or None for k, t in (("trained", True), ("frozen", False))}


def _checkpoint_due(acc: Any, cfg: TrainConfig, step: int, since: float, every_s: float) -> bool:
    """Every `checkpoint_every` steps, and once `every_s` seconds of training went by since the
    last one: lost work stays bounded in time on any machine. Ranks agree (rank 0's clock decides),
    since saving is a collective."""
    if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
        return True
    if not every_s:
        return False
    due = torch.tensor([float(since >= every_s)], device=acc.device)
    if acc.num_processes > 1:
        from accelerate.utils import broadcast

        due = broadcast(due, from_process=0)
    return bool(due.item())


def _complete(cell_dir: Path, job: dict, summary: dict, started: float) -> None:
    """Complete the adapter cell through the store, as the parent process would, now that it is
    trained: a later kill of this worker (training the group's next cell) keeps it. The last
    checkpoint goes only after the manifest: a kill in between must not lose the cell."""
    cell = Store(job["cell"]["root"]).open_cell(
        "adapter", job["cell"]["key"], None, job["cell"]["upstream"]
    )
    full = {**summary, "n_dropped_overlong": job["n_dropped_overlong"], "budget": job.get("budget")}
    cell.finish(full, packages=TRAIN_PACKAGES, start=started, exclude=("checkpoints",))
    shutil.rmtree(cell_dir / "checkpoints", ignore_errors=True)


def train_precision(cfg: TrainConfig) -> str:
    """bf16 or fp32: the config's, or for "auto" what this machine runs natively (a CPU without
    bf16 instructions emulates it ~6x slower than fp32). Recorded in the adapter's summary."""
    from harness import precision

    return precision.choose(cfg.precision, "cuda" if torch.cuda.is_available() else "cpu")


def _accelerator(cfg: TrainConfig) -> Any:
    from accelerate import Accelerator

    acc = Accelerator(
        gradient_accumulation_steps=cfg.grad_accum,
        mixed_precision="bf16" if train_precision(cfg) == "bf16" else "no",
        cpu=not torch.cuda.is_available(),
        step_scheduler_with_optimizer=False,  # else it steps once per process per optimizer step
    )
    if acc.num_processes != cfg.num_processes:  # the effective batch must be the one configured
        raise UserError(f"train.num_processes is {cfg.num_processes}; {acc.num_processes} started.")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and not _sharded(acc):
        raise UserError(
            f"train.accelerate_config {cfg.accelerate_config} asks for FSDP, but accelerate "
            f"started {acc.distributed_type.value}: accelerate shards only on accelerators (GPUs), "
            "and on a CPU it would train unsharded copies without saying so. Run on GPUs, or "
            "drop the FSDP config (train.num_processes alone trains with DDP)."
        )
    return acc


def micro_batches(
    lengths: Sequence[int],
    size: int,
    grouped: bool,
    seed: int,
    world: int = 1,
    rank: int = 0,
    start: int = 0,
) -> Iterator[list[int]]:
    """This process's micro-batches (example indices) from global position `start` on, epoch after
    epoch. Each epoch is a shuffle seeded by (seed, epoch) alone, so a resumed run sees the same
    order; with `grouped`, batches hold examples of similar length and are shuffled as wholes."""
    pos, epoch, chunk = 0, 0, size * MEGA_BATCH
    while True:
        rng = random.Random(f"{seed}/{epoch}")
        order = rng.sample(range(len(lengths)), len(lengths))
        if grouped:
            chunks = [order[s : s + chunk] for s in range(0, len(order), chunk)]
            order = [i for c in chunks for i in sorted(c, key=lambda i: -lengths[i])]
        batches = [order[s : s + size] for s in range(0, len(order), size)]
        if grouped:
            rng.shuffle(batches)
        for b in batches:
            if pos >= start and pos % world == rank:
                yield b
            pos += 1
        epoch += 1


def _model_and_optimizer(job: dict, cfg: TrainConfig, total: int) -> tuple[Any, Any, Any]:
    import peft
    import transformers
    from transformers import AutoModelForCausalLM, get_scheduler

    transformers.utils.logging.disable_progress_bar()  # our own bar shows the training steps
    # What trains stays fp32 under bf16 mixed precision (accelerate autocasts the compute): full
    # fine-tuning holds fp32 weights, gradients and AdamW moments (costs.FULL_BYTES, 16 bytes a
    # parameter; FSDP shards them), since AdamW on bf16 weights would keep bf16 moments and round
    # small updates away. A frozen LoRA base sits in the compute dtype (peft keeps adapters fp32).
    dtype = (
        torch.bfloat16 if train_precision(cfg) == "bf16" and cfg.method == "lora" else torch.float32
    )
    remote = job["trust_remote_code"]
    model = AutoModelForCausalLM.from_pretrained(
        job["model_dir"], dtype=dtype, trust_remote_code=remote
    )
    if checkpointing(cfg, model.num_parameters()):
        # non-reentrant: a frozen base (LoRA) needs no inputs that require grad
        model.gradient_checkpointing_enable({"use_reentrant": False})
        model.config.use_cache = False
    if cfg.method == "lora":
        targets = list(cfg.lora.target_modules)
        lora = peft.LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        try:
            model = peft.get_peft_model(model, lora)
        except ValueError as e:
            raise UserError(f"train.lora.target_modules {targets}: {e}") from None
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = round(cfg.warmup_ratio * total)
    name = "constant_with_warmup" if cfg.schedule == "constant" and warmup else cfg.schedule
    return model, optimizer, get_scheduler(name, optimizer, warmup, total)


# chunks of CHUNK_BYTES of fp32 logits: at Qwen2.5's vocabulary 441 positions, where a whole
# batch of 5 x 4,096 would be 12 GB
_NO_LOGITS = torch.zeros(0, dtype=torch.long)  # logits_to_keep: the model computes none


def linear_cross_entropy(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Summed cross-entropy of `head(hidden)` against `targets` (rows of hidden: positions),
    `chunk` positions at a time, each chunk's logits recomputed in the backward pass: the fp32
    logits of the whole batch never exist at once. Written here because the fused kernels that do
    this (Liger's fused linear cross-entropy, Apple's cut-cross-entropy) run on Triton, on GPUs
    only, and the same code must train on a CPU."""
    from torch.utils.checkpoint import checkpoint

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, len(targets), chunk):
        part = slice(start, start + chunk)
        total = total + checkpoint(
            _chunk_ce, hidden[part], targets[part], head, use_reentrant=False
        )
    return total


def _chunk_ce(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum")


def completion_ce(acc: Any, model: Any, batch: dict) -> torch.Tensor:
    """The summed cross-entropy of a micro-batch's completion tokens: the model's last hidden
    states (no logits), then the output layer and the loss a chunk of targets at a time. A model
    whose forward takes no `logits_to_keep`, and a sharded one (FSDP, DeepSpeed: the output layer
    is gathered only inside the forward), get the plain loss over the whole batch's logits."""
    targets = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if not _chunked_loss(acc, model):
        logits = model(**inputs).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
    out = model(**inputs, output_hidden_states=True, logits_to_keep=_NO_LOGITS.to(acc.device))
    keep = targets != -100
    hidden = out.hidden_states[-1][keep]
    head = acc.unwrap_model(model).get_output_embeddings()
    chunk = max(1, CHUNK_BYTES // (4 * head.weight.shape[0]))
    with acc.autocast():
        return linear_cross_entropy(hidden, head, targets[keep], chunk)


# --- distillation methods (harness/stages/distill_methods.py): their data and losses ---------------------------


def _method(
    job: dict, acc: Any, model: Any, tok: Any, records: list, data: list, cfg: TrainConfig,
    progress: dict,
) -> dict[str, Any]:  # fmt: skip
    """The method's state in the worker: its settings, kd's per-example teacher top-k, the
    on_policy teacher, and its extra cost (in `progress`, so a resumed run counts on)."""
    settings = job.get("method") or {"name": "sft"}
    out: dict[str, Any] = {**settings, "seed": job["seed"]}
    out["extra"] = progress.setdefault("extra", _no_extra(settings["name"]))
    vocab = acc.unwrap_model(model).get_output_embeddings().weight.shape[0]
    if settings["name"] == "kd":
        files = {k: distill_methods.TopK(Path(p)) for k, p in job["topk"]["paths"].items()}
        own = job["topk"]["own"]
        out["kd"] = [
            distill_methods.align_topk(
                seq, n, files[r.get("source") or own].get(r["id"], r["sample"])
            )
            for r, (seq, n) in zip(records, data, strict=True)
        ]
        out["full"] = all(f.k >= vocab for f in files.values())
        out["extra"]["kd_positions"] = sum(n for *_, n in out["kd"])
    if settings["name"] == "on_policy":
        from transformers import AutoModelForCausalLM

        t = job["teacher"]
        dtype = (
            torch.bfloat16 if train_precision(cfg) == "bf16" else torch.float32
        )  # frozen: as LoRA's base
        teacher = AutoModelForCausalLM.from_pretrained(
            t["model_dir"], dtype=dtype, trust_remote_code=t["trust_remote_code"]
        )
        out["teacher"] = teacher.to(acc.device).eval().requires_grad_(False)
        eos = acc.unwrap_model(model).generation_config.eos_token_id
        out["eos"] = sorted({*([eos] if isinstance(eos, int) else eos or []), tok.eos_token_id})
        out["max_length"] = cfg.max_length
    return out


def _sum_extra_over_ranks(acc: Any, extra: dict[str, Any], before: dict[str, Any]) -> None:
    """Every rank's share of this step's extra cost added on every rank (a collective), so the
    counters rank 0 checkpoints and reports are the whole run's."""
    keys = [k for k in sorted(extra) if k != "kd_positions"]  # kd's: the same set on each rank
    if acc.num_processes == 1 or not keys:
        return
    step = torch.tensor([extra[k] - before[k] for k in keys], dtype=torch.float64)
    total = acc.reduce(step.to(acc.device), "sum").tolist()
    for k, v in zip(keys, total, strict=True):
        extra[k] = before[k] + (round(v) if isinstance(before[k], int) else v)


def _method_summary(method: dict) -> dict[str, Any]:
    """The method and its extra cost, for the adapter's summary (device-seconds rounded)."""
    extra = {k: round(v, 3) if isinstance(v, float) else v for k, v in method["extra"].items()}
    return {"method": method["name"], **extra}


def _no_extra(name: str) -> dict[str, Any]:
    """A method's extra cost before training: teacher forward tokens and device-seconds,
    student-sampled tokens and device-seconds, micro-batches on student samples or teacher data."""
    if name != "on_policy":
        return {}
    return {
        "teacher_forward_tokens": 0,
        "teacher_s": 0.0,
        "student_sampled_tokens": 0,
        "sampling_s": 0.0,
        "student_batches": 0,
        "teacher_batches": 0,
    }


def _micro_batch(
    method: dict | None, model: Any, data: list, indices: list[int], pad: int, position: int
) -> dict:
    """A micro-batch of the method: sft, the examples; kd, with the teacher's top-k at each
    target; on_policy, the student's own samples of the prompts (or, for the teacher_share of
    micro-batches, the teacher's traces)."""
    method = method or {}  # none: sft
    name = method.get("name", "sft")
    if name == "on_policy":
        if distill_methods.uses_teacher_data(method["seed"], position, method["teacher_share"]):
            method["extra"]["teacher_batches"] += 1
        else:
            data, indices = _student_samples(method, model, data, indices, pad, position)
    batch = collate(data, indices, pad)
    if name == "kd":
        batch.update(_kd_columns(method["kd"], data, indices, batch["input_ids"].shape[1]))
    return batch


def _student_samples(
    method: dict, model: Any, data: list, indices: list[int], pad: int, position: int
) -> tuple[list, list[int]]:
    """The prompts of `indices` with the student's sampled completions, as new examples."""
    from accelerate.utils import extract_model_from_parallel

    prompts = [data[i][0][: data[i][1]] for i in indices]
    room = [min(method["max_new_tokens"], method["max_length"] - len(p)) for p in prompts]
    seeds = distill_methods.row_seeds(method["seed"], position, len(prompts))
    t0 = time.perf_counter()
    student = extract_model_from_parallel(model)
    completions = distill_methods.sample(
        student, prompts, seeds, method["temperature"], room, method["eos"], pad
    )
    method["extra"]["sampling_s"] += time.perf_counter() - t0
    method["extra"]["student_sampled_tokens"] += sum(map(len, completions))
    method["extra"]["student_batches"] += 1
    sampled = [([*p, *c], len(p)) for p, c in zip(prompts, completions, strict=True)]
    return sampled, list(range(len(sampled)))


def _kd_columns(kd: list, data: list, indices: list[int], width: int) -> dict:
    """The teacher's top-k ids and log-probabilities at each target position of a micro-batch
    (position t predicts token t + 1), and where they are known (`kd_valid`)."""
    k = max((a.shape[1] for a, _, n in kd if n), default=1)
    ids = torch.zeros((len(indices), width, k), dtype=torch.long)
    lps = torch.zeros((len(indices), width, k), dtype=torch.float32)
    valid = torch.zeros((len(indices), width), dtype=torch.bool)
    for row, i in enumerate(indices):
        top_ids, top_lps, n = kd[i]
        start = data[i][1] - 1
        ids[row, start : start + n] = torch.from_numpy(top_ids.astype("int64"))
        lps[row, start : start + n] = torch.from_numpy(top_lps.copy())
        valid[row, start : start + n] = True
    return {"kd_ids": ids, "kd_logprobs": lps, "kd_valid": valid}


def completion_loss(acc: Any, model: Any, batch: dict, method: dict | None) -> torch.Tensor:
    """The micro-batch's summed loss over its completion tokens under the method: sft, the
    cross-entropy (`completion_ce`); kd, CE mixed with the top-k forward KL; on_policy, the
    generalized JSD against the teacher, which scores the same tokens here."""
    method = method or {}  # none: sft
    name = method.get("name", "sft")
    if name == "sft":
        return completion_ce(acc, model, batch)
    targets = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    keep = targets != -100
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    hidden, head = _hidden(acc, model, inputs, keep)
    chunk = max(1, CHUNK_BYTES // (8 * head.weight.shape[0]))
    if name == "kd":
        w, full = method["weight"], method["full"]
        rows = (hidden, targets[keep], *(batch[c][keep] for c in ("kd_ids", "kd_logprobs")))

        def fn(h: torch.Tensor, t: torch.Tensor, i: torch.Tensor, lp: torch.Tensor, v: Any):
            return distill_methods.kd_sum(head(h), t, i, lp, v, w, full)

        with acc.autocast():
            return distill_methods.chunked_sum(fn, chunk, *rows, batch["kd_valid"][keep])
    t0 = time.perf_counter()
    teacher = method["teacher"]
    with torch.no_grad():
        t_hidden, t_head = _hidden(acc, teacher, inputs, keep)
    method["extra"]["teacher_s"] += time.perf_counter() - t0
    method["extra"]["teacher_forward_tokens"] += int(batch["attention_mask"].sum())
    beta = distill_methods.on_policy_beta(method)

    def jsd(h: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
        return distill_methods.jsd_sum(head(h), t_head(th), beta)

    with acc.autocast():
        return distill_methods.chunked_sum(jsd, chunk, hidden, t_hidden)


def _hidden(acc: Any, model: Any, inputs: dict, keep: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The last hidden states at the `keep` positions (no logits computed) and the output layer."""
    out = model(**inputs, output_hidden_states=True, logits_to_keep=_NO_LOGITS.to(acc.device))
    head = acc.unwrap_model(model).get_output_embeddings()
    return out.hidden_states[-1][keep], head


def _chunked_loss(acc: Any, model: Any) -> bool:
    import inspect

    if _sharded(acc):
        return False
    base = acc.unwrap_model(model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _step(
    acc: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    batches: list[dict],
    clip: float,
    method: dict | None = None,
) -> tuple:
    """One optimizer step. The loss is the mean over every completion token of the effective batch,
    whichever micro-batch or process it sits in (a mean of micro-batch means would weight short
    completions up). Returns the loss and the global (targets, non-pad, padded) token counts."""
    local = [
        [(b["labels"][:, 1:] != -100).sum(), b["attention_mask"].sum(), b["labels"].numel()]
        for b in batches
    ]
    counts = acc.reduce(torch.tensor(local, dtype=torch.float64).sum(0).to(acc.device), "sum")
    # backward divides by grad_accum and DDP averages over processes: undo both
    scale = acc.gradient_accumulation_steps * acc.num_processes / counts[0]
    ce_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    for b in batches:
        b = {k: v.to(acc.device) for k, v in b.items()}
        with acc.accumulate(model):
            ce = completion_loss(acc, model, b, method)
            acc.backward(ce * scale)
            ce_sum += ce.detach()
    acc.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(acc.reduce(ce_sum, "sum") / counts[0]), counts


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad
    }


def _checkpoint_trainable_only(acc: Any) -> None:
    """Checkpoints hold the weights that train: for LoRA, not a copy of the frozen base."""
    from safetensors.torch import load_file, save_file

    def save(models_: list, weights: list, output_dir: str) -> None:
        weights.pop()  # accelerate would write the whole state dict
        if acc.is_main_process:
            save_file(_trainable(acc.unwrap_model(models_[0])), os.path.join(output_dir, TRAINABLE))

    def load(models_: list, input_dir: str) -> None:
        model = acc.unwrap_model(models_.pop())
        state = load_file(os.path.join(input_dir, TRAINABLE))
        result = model.load_state_dict(state, strict=False)
        if result.unexpected_keys or set(_trainable(model)) - set(state):
            raise UserError(f"{input_dir}: checkpoint does not fit the model; delete the folder.")

    if _sharded(acc):  # each rank saves and loads its own shard of every state (accelerate)
        return
    acc.register_save_state_pre_hook(save)
    acc.register_load_state_pre_hook(load)


def _sharded(acc: Any) -> bool:
    return acc.distributed_type.value in ("FSDP", "DEEPSPEED")


def _resume(acc: Any, cell_dir: Path) -> dict:
    """Progress of the last complete checkpoint, whose model, optimizer, schedule and RNG states
    are restored; or a fresh start."""
    ckpts = sorted((cell_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    if not ckpts:
        return {"step": 0, "tokens": 0, "positions": 0, "elapsed": 0.0, "resumed_from": None}
    acc.load_state(str(ckpts[-1]))
    fix = f"delete {ckpts[-1]} to resume from the start"
    progress = read_json(ckpts[-1] / "progress.json", fix)
    return {**progress, "resumed_from": progress["step"]}


def _checkpoint(acc: Any, cell_dir: Path, progress: dict) -> None:
    """save_state into a temporary folder, renamed once every process has written; older ones go."""
    root = cell_dir / "checkpoints"
    tmp, final = root / f".tmp-step-{progress['step']}", root / f"step-{progress['step']}"
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    acc.wait_for_everyone()
    acc.save_state(str(tmp))
    acc.wait_for_everyone()
    if acc.is_main_process:
        atomic_write_json(tmp / "progress.json", {**progress, "resumed_from": None})
        os.replace(tmp, final)
        for old in root.iterdir():
            if old != final:
                shutil.rmtree(old)
    acc.wait_for_everyone()


def _open_log(acc: Any, cell_dir: Path, step: int) -> JsonlWriter | None:
    """The step log, cut back to the step we resume from, so no step is logged twice."""
    if not acc.is_main_process:
        return None
    path = cell_dir / "train_log.jsonl"
    kept = [r for r in read_jsonl(path, repair=True) if r["step"] <= step]
    atomic_write_text(path, jsonl_text(kept))
    return JsonlWriter(path)


def _save(acc: Any, model: Any, tok: Any, cell_dir: Path, job: dict, method: str) -> None:
    """adapter/ in PEFT format (LoRA); merged/, a standalone model (full, or LoRA when merging).
    Sharded (FSDP, DeepSpeed), every rank takes part in gathering the full weights to rank 0."""
    acc.wait_for_everyone()
    state = acc.get_state_dict(model) if _sharded(acc) else None  # a collective
    if not acc.is_main_process:
        return
    model = acc.unwrap_model(model)
    if method == "lora":
        _write_dir(cell_dir / "adapter", lambda d: _save_adapter(model, d, state))
        if job["merge"]:  # after the adapter is written
            model = _merged(job, cell_dir / "adapter") if state else model.merge_and_unload()
            state = None
    if method == "full" or job["merge"]:
        _write_dir(
            cell_dir / "merged",
            lambda d: (model.save_pretrained(d, state_dict=state), tok.save_pretrained(d)),
        )


def _merged(job: dict, adapter: Path) -> Any:
    """The base model with the adapter merged in, built on this process from the saved files (a
    sharded model has no whole weights to merge into)."""
    import peft
    from transformers import AutoModelForCausalLM

    remote = job["trust_remote_code"]
    base = AutoModelForCausalLM.from_pretrained(job["model_dir"], trust_remote_code=remote)
    return peft.PeftModel.from_pretrained(base, adapter).merge_and_unload()


def _save_adapter(model: Any, out: Path, state: dict | None = None) -> None:
    """save_pretrained (from `state`, the gathered weights, when sharded), with the config's sets
    (target_modules) sorted: peft writes them in hash order, which differs from process to
    process, and artefacts must be byte-stable."""
    model.save_pretrained(out, state_dict=state)
    sets = {k for k, v in vars(model.peft_config["default"]).items() if isinstance(v, set)}
    path = Path(out) / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update({k: sorted(config[k]) for k in sets if isinstance(config.get(k), list)})
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


def _write_dir(path: Path, write: Any) -> None:
    """Write a directory under a temporary name, then rename it: it is complete or absent."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def _summary(cell_dir: Path, cfg: TrainConfig, progress: dict, n_examples: int, world: int) -> dict:
    log = read_jsonl(cell_dir / "train_log.jsonl")
    every = max(1, len(log) // 50)
    curve = [
        [r["step"], r["loss"]] for i, r in enumerate(log) if i % every == 0 or i == len(log) - 1
    ]
    micro_batches_seen = progress["step"] * cfg.grad_accum * world
    return {
        "method": cfg.method,
        "precision": train_precision(cfg),
        "examples": n_examples,
        "steps": progress["step"],
        "effective_batch": cfg.per_device_batch_size * cfg.grad_accum * world,
        "epochs": round(micro_batches_seen / math.ceil(n_examples / cfg.per_device_batch_size), 3),
        "tokens": progress["tokens"],
        "first_loss": log[0]["loss"],
        "final_loss": log[-1]["loss"],
        "loss_curve": curve,
        "wall_s": progress["elapsed"],
        "tokens_per_s": round(progress["tokens"] / max(progress["elapsed"], 1e-9), 1),
        "non_pad_share": round(progress["tokens"] / max(progress["positions"], 1), 4),
        "resumed_from": progress["resumed_from"],
        "adapter": "adapter" if (cell_dir / "adapter").is_dir() else None,
        "merged": "merged" if (cell_dir / "merged").is_dir() else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.stages.train_worker", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--cell-dir",
        type=Path,
        action="append",
        required=True,
        help="adapter cell (holds job.json); repeat to train several, in order",
    )
    parser.add_argument("--owner-pid", type=int, help="stop when this process (cotgap) is gone")
    args = parser.parse_args(argv)
    stop_on_signals()  # Ctrl-C to the process group, or cotgap stopping its workers (SIGTERM)
    cell_dir = None
    try:
        for cell_dir in args.cell_dir:
            if (cell_dir / "manifest.json").exists():  # completed by an earlier worker
                continue
            train_cell(cell_dir, args.owner_pid)
            gc.collect()  # the last model and optimizer go before the next cell's are built
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:  # cotgap reports the stop, not the worker
        if cell_dir is not None:  # a save or checkpoint cut short leaves no half-written folder
            for tmp in [*cell_dir.glob(".*.tmp*"), *cell_dir.glob("checkpoints/.tmp-*")]:
                if tmp.is_dir():  # a folder written whole (_write_dir, a checkpoint)
                    shutil.rmtree(tmp, ignore_errors=True)
                else:  # a file written whole (atomic_write_text)
                    tmp.unlink(missing_ok=True)
        return 128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
