"""Benchmark: what a sandbox model of a given size can do in each rationale style.

    .venv/bin/python -m benchmarks.sandbox_styles [--task sums] [--steps 3000] [--items 300]
        --arch 1x64x256 --arch 4x128x512:fine,long [--out results/bench/sandbox_styles.json]

A capacity gap in the sandbox (the best teacher differs between two students) needs a style that a
larger student executes better than a smaller one does, *and* better than the other styles. This
measures that before any zoo is built: each `--arch LAYERSxHIDDENxFF[:STYLES]` is pretrained from
scratch as a zoo student is (`zoo._pretrain`: the demo's mixture of the task and coin flip, every
style of the task unless STYLES names some, bf16 where the CPU has it natively), then scored greedy
on the task's first `--items` test items four ways: `free` (the style the model picks), and each
style forced (`chunk` and `long` by their opening words as a prefix of the answer; `fine`, which
opens with a digit, by barring the other styles' first letters at the first step). A forced score
is what a distilled student that has taken that teacher's style can reach without learning more;
distillation adds to it (docs/sandbox.md), so it ranks styles, it does not predict gains.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO, offline_env

# the opening words each style's rationale starts with (harness/sandbox/tasks.py `_column_steps`)
OPENING = {"chunk": "By pairs: ", "long": "Columns: "}


def parse_arch(text: str, task: str) -> dict[str, Any]:
    from harness.sandbox import tasks

    shape, _, styles = text.partition(":")
    layers, hidden, ff = (int(x) for x in shape.split("x"))
    chosen = tuple(styles.split(",")) if styles else tasks.styles_of(task)
    heads = max(1, hidden // 32)  # a head dimension of 32, as the zoo's (vLLM's CPU kernels)
    return {
        "layers": layers,
        "hidden": hidden,
        "intermediate": ff,
        "heads": heads,
        "styles": chosen,
    }


def score(model: Any, task: str, n: int, style: str | None) -> float:
    """Greedy accuracy on the first `n` test items, in `style` (None: the model's own choice)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from harness.sandbox import tasks, zoo
    from harness.sandbox.tokenizer import make_tokenizer, vocab

    tokenizer, v = make_tokenizer(), vocab()
    items = tasks.generate_items(task, "test", n, zoo.EVAL_SEED)
    barred = [v[w[0]] for w in OPENING.values()]

    class FirstStepBar(LogitsProcessor):
        """`fine` opens with a digit: bar the other styles' first letters at the first step."""

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if input_ids.shape[1] == first:
                scores[:, barred] = -float("inf")
            return scores

    # every batch's prompts are padded to their longest: the first generated step is there
    first = 0
    processors = None
    if style == "fine":
        processors = LogitsProcessorList([FirstStepBar()])
        first = max(len(zoo.encode_example(it["question"])[0]) for it in items)
    return zoo.accuracy(
        model, tokenizer, items, batch_size=n, prefix=OPENING.get(style or "", ""),
        logits_processor=processors,
    )  # fmt: skip


def measure(arch: dict[str, Any], task: str, steps: int, items: int, seed: int) -> dict[str, Any]:
    from harness import precision as prec
    from harness.sandbox import tasks, zoo

    mixture = ((task, 0.7), ("coin_flip", 0.3))
    recipe = zoo.Recipe("student", "demo", steps=steps, mixture=mixture, seed=seed, **arch)
    start = time.time()
    model, stats = zoo._pretrain("styles", recipe, prec.choose(), progress=False)
    row: dict[str, Any] = {**arch, "styles": list(arch["styles"]), "params": stats["params"]}
    row["free"] = round(score(model, task, items, None), 3)
    for style in tasks.styles_of(task):
        row[style] = round(score(model, task, items, style), 3)
    row["coin_flip_free"] = round(score(model, "coin_flip", items, None), 3)
    row["train_s"] = stats["train_s"]
    row["wall_s"] = round(time.time() - start, 1)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="sums", help="a sandbox generator with styles")
    p.add_argument("--arch", action="append", required=True, help="LAYERSxHIDDENxFF[:STYLES]")
    p.add_argument("--steps", type=int, default=3000, help="pretraining steps (the students' 3000)")
    p.add_argument("--items", type=int, default=300, help="test items scored per style")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/bench/sandbox_styles.json")
    args = p.parse_args(argv)
    offline_env()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))  # as the zoo builds
    rows = []
    for text in args.arch:
        row = measure(parse_arch(text, args.task), args.task, args.steps, args.items, args.seed)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out) if Path(args.out).is_absolute() else REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"task": args.task, "steps": args.steps, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
