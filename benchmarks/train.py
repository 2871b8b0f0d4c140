"""Benchmark: cotgap's training loop against a bare peft + accelerate loop on the same batches, and
the share of non-pad tokens with and without length grouping.

    .venv/bin/python -m benchmarks.train [--steps 20] [--repeats 4] [--threads 1]
                                        [--out results/bench-train.json]

Both loops train the same LoRA on the same random-init Llama (char tokenizer) for the same steps,
micro-batches (cotgap's sampler, ungrouped, so padding is equal) and schedule, in one process,
taking turns. `ratio` is the median over rounds of cotgap tokens/s / bare tokens/s (goal >= 0.95):
runs next to each other in time share the same noisy neighbours. A grouped cotgap run shows what
length grouping buys end to end. One torch thread by default: on a shared CPU, OpenMP threads
waiting for a busy core made the same run swing by 10x.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch

from harness.config.schema import TrainConfig
from harness.stages import encoding, train_worker

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(d: Path, hidden: int, layers: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.sandbox.tokenizer import make_tokenizer

    tok = make_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(d)
    tok.save_pretrained(d)


def build_examples(path: Path, n: int) -> None:
    """Sums with chains of thought of 1 to 12 lines: lengths vary ~10x, as CoT traces do."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randrange(10, 999), rng.randrange(10, 999)
        steps = [f"step {k}: {a} + {b * k} = {a + b * k}" for k in range(1, rng.randint(1, 12) + 1)]
        completion = "\n".join(steps) + f"\nThe answer is {a + b}."
        rows.append({"id": f"q{i}", "sample": 0, "prompt": f"{a}+{b}", "completion": completion})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def cotgap_run(model_dir: Path, examples: Path, cfg: dict, work: Path) -> dict:
    """The real worker, in this process, on a fresh cell directory."""
    cell_dir = Path(tempfile.mkdtemp(dir=work))
    job = {
        "model_dir": str(model_dir),
        "chat_template": True,
        "trust_remote_code": False,
        "examples": str(examples),
        "train": cfg,
        "seed": 0,
        "merge": False,
    }
    (cell_dir / "job.json").write_text(json.dumps(job))
    s = train_worker.train_cell(cell_dir)
    return {k: s[k] for k in ("tokens_per_s", "wall_s", "non_pad_share", "final_loss")}


def bare_run(model_dir: Path, examples: Path, cfg: dict) -> dict:
    """The textbook loop: accelerate.accumulate, the model's own loss, nothing else."""
    import peft
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM, get_scheduler

    c = TrainConfig.model_validate(cfg)
    acc = Accelerator(gradient_accumulation_steps=c.grad_accum, cpu=True)
    set_seed(0)
    tok = encoding.load_tokenizer(str(model_dir), True)
    data = [
        encoding.encode(tok, r["prompt"], r["completion"], True)
        for r in map(json.loads, examples.read_text().splitlines())
    ]
    lora = peft.LoraConfig(
        r=c.lora.r, lora_alpha=c.lora.alpha, target_modules=TARGETS, task_type="CAUSAL_LM"
    )
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.lr)
    sched = get_scheduler(c.schedule, opt, round(c.warmup_ratio * c.max_steps), c.max_steps)
    model, opt, sched = acc.prepare(model, opt, sched)
    n_micro = c.max_steps * c.grad_accum
    batches = islice(
        train_worker.micro_batches(
            [len(ids) for ids, _ in data], c.per_device_batch_size, False, 0
        ),
        n_micro,
    )
    model.train()
    tokens, began = 0, time.perf_counter()
    for idx in batches:
        batch = encoding.collate(data, idx, tok.pad_token_id)
        with acc.accumulate(model):
            loss = model(**batch).loss
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), c.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad()
        tokens += int(batch["attention_mask"].sum())
    wall = time.perf_counter() - began
    return {
        "tokens_per_s": round(tokens / wall, 1),
        "wall_s": round(wall, 3),
        "final_loss": round(float(loss.detach()), 6),
    }


def padding_shares(model_dir: Path, examples: Path, size: int, n_batches: int) -> dict:
    """Non-pad share of one epoch of micro-batches, with and without length grouping."""
    rows = [json.loads(line) for line in examples.read_text().splitlines()]
    tok = encoding.load_tokenizer(str(model_dir), True)
    lengths = [len(encoding.encode(tok, r["prompt"], r["completion"], True)[0]) for r in rows]
    out = {}
    for grouped in (False, True):
        batches = list(islice(train_worker.micro_batches(lengths, size, grouped, 0), n_batches))
        real = sum(lengths[i] for b in batches for i in b)
        padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
        out["grouped" if grouped else "ungrouped"] = round(real / padded, 4)
    return out


def measure(model_dir: Path, examples: Path, cfg: dict, repeats: int, work: Path) -> dict:
    """Runs of each loop, taking turns; the order flips every round so drift hits both alike."""
    bare_run(model_dir, examples, {**cfg, "max_steps": 3})  # warm-up: the first run pays set-up
    runs: dict[str, list[dict]] = {"cotgap": [], "bare": [], "cotgap_grouped": []}
    for i in range(repeats):
        for name in ("cotgap", "bare") if i % 2 == 0 else ("bare", "cotgap"):
            if name == "bare":
                runs[name].append(bare_run(model_dir, examples, cfg))
            else:
                runs[name].append(cotgap_run(model_dir, examples, cfg, work))
        grouped = {**cfg, "group_by_length": True}
        runs["cotgap_grouped"].append(cotgap_run(model_dir, examples, grouped, work))
    return runs


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--examples", type=int, default=512)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 = torch's default")
    p.add_argument("--out", type=Path, default=Path("results/bench-train.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = {
        "max_steps": args.steps,
        "per_device_batch_size": args.batch,
        "grad_accum": args.grad_accum,
        "lr": 1e-3,
        "max_length": 1024,
        "group_by_length": False,
        "precision": "fp32",  # the textbook loop below runs fp32: compare like with like
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": TARGETS},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir, examples = work / "model", work / "examples.jsonl"
        build_model(model_dir, args.hidden, args.layers)
        build_examples(examples, args.examples)
        runs = measure(model_dir, examples, cfg, args.repeats, work)
        epoch = math.ceil(args.examples / args.batch)
        shares = padding_shares(model_dir, examples, args.batch, epoch)

    def median_ratio(a: str, b: str) -> float:
        pairs = zip(runs[a], runs[b], strict=True)
        return round(statistics.median(x["tokens_per_s"] / y["tokens_per_s"] for x, y in pairs), 3)

    best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
    result = {
        "settings": {**vars(args), "out": str(args.out), "torch_threads": torch.get_num_threads()},
        "runs": runs,
        "best": best,
        "ratio": median_ratio("cotgap", "bare"),
        "grouped_speedup": median_ratio("cotgap_grouped", "cotgap"),
        "non_pad_share": shares,
    }
    print(f"{'loop':<16}{'tokens/s':>10}{'wall s':>9}{'final loss':>12}   (best of {args.repeats})")
    for name, r in best.items():
        print(f"{name:<16}{r['tokens_per_s']:>10.0f}{r['wall_s']:>9.2f}{r['final_loss']:>12.4f}")
    print(f"cotgap / bare tokens/s: {result['ratio']} (median over rounds; goal >= 0.95)")
    print(f"length grouping: x{result['grouped_speedup']} non-pad tokens/s")
    print(f"non-pad share: ungrouped {shares['ungrouped']}, grouped {shares['grouped']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
