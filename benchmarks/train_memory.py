"""Peak memory of one training step at Qwen2.5's vocabulary (151,936) and 4,096 completion tokens,
with a small hidden size so that the logits dominate: the plain loss (the whole batch's logits in
fp32) against cotgap's chunked linear cross-entropy (harness.stages.train_worker.completion_ce).

    .venv/bin/python -m benchmarks.train_memory                 # both, one fresh process each
    .venv/bin/python -m benchmarks.train_memory --tokens 2048 --hidden 128

Each variant runs in its own process; its peak resident set (getrusage ru_maxrss) is compared with
the resident set just before the step, so the figure is what the step itself adds on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

VOCAB = 151_936


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def step(variant: str, tokens: int, hidden: int, rows: int) -> dict:
    """One forward + backward of a full fine-tuning step; what it adds to the process's memory."""
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.stages import train_worker

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 32),
        head_dim=32,
        max_position_embeddings=tokens,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).float().train()
    acc = Accelerator(cpu=True)
    ids = torch.randint(0, VOCAB, (rows, tokens // rows))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    model(input_ids=ids[:, :8]).logits.sum().backward()  # allocator and kernels warmed up
    model.zero_grad(set_to_none=True)
    before = _rss_mib()
    if variant == "plain":
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits
        targets = F.pad(batch["labels"][:, 1:], (0, 1), value=-100).flatten()
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets, reduction="sum")
    else:
        loss = train_worker.completion_ce(acc, model, batch)
    loss.backward()
    return {
        "variant": variant,
        "tokens": tokens,
        "rows": rows,
        "hidden": hidden,
        "vocab": VOCAB,
        "params": model.num_parameters(),
        "loss": round(float(loss) / tokens, 4),
        "rss_before_step_mib": round(before, 1),
        "peak_rss_mib": round(_peak_mib(), 1),
        "step_adds_mib": round(_peak_mib() - before, 1),
        "fp32_logits_of_batch_mib": round(tokens * VOCAB * 4 / 2**20, 1),
        "chunk_positions": train_worker.CHUNK_BYTES // (4 * VOCAB),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rows", type=int, default=2, help="sequences the tokens are split into")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--variant", choices=["plain", "chunked"], help="run one, in this process")
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(step(args.variant, args.tokens, args.hidden, args.rows)))
        return 0
    results = []
    for variant in ("plain", "chunked"):
        cmd = [sys.executable, "-m", "benchmarks.train_memory", "--variant", variant]
        cmd += [
            "--tokens",
            str(args.tokens),
            "--hidden",
            str(args.hidden),
            "--rows",
            str(args.rows),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in results:
        print(
            f"{r['variant']:>8}: step adds {r['step_adds_mib']:8.1f} MiB (peak RSS "
            f"{r['peak_rss_mib']:.0f} MiB; fp32 logits of the batch {r['fp32_logits_of_batch_mib']:.0f}"
            f" MiB; loss/token {r['loss']})"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
