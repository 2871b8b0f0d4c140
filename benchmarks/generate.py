"""Benchmark: cotgap's traces stage against a bare `vllm.LLM.generate`, and vLLM against transformers.

    .venv/bin/python -m benchmarks.generate [--items 256] [--n 2] [--max-tokens 96] [--out FILE]

One run, one engine session. The same prompts (a sandbox task's train questions through the
chat template), model and sampling parameters (per-request seeds included) go to
1. bare vLLM: `llm.generate(token prompts, per-request SamplingParams)` on the engine's `vllm.LLM`;
2. the stage: `generate.work` (load items, render, generate, score, stream JSONL, manifest);
3. the transformers engine through the same interface.
Both vLLM runs produce the same tokens, so tokens/s compare like for like; the goal for the stage
is >= 0.95 of bare vLLM. The two alternate `--repeats` times after a warm-up pass; the ratio is
of medians (and of best runs: on a shared machine the best run is the least disturbed one).
Start-up (import + engine construction) is reported apart, as is the load average.
Without --model, a random-init Llama (default 4 layers x 256 hidden) is built in a temporary
directory; its generations stop on EOS at random lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import add_run_options
from harness.sandbox.random_model import random_llama

TASK = "sandbox_addition"


def build_random_model(out: Path, hidden: int, layers: int) -> Path:
    # EOS made likely enough that lengths vary
    return random_llama(
        out,
        hidden=hidden,
        layers=layers,
        intermediate=4 * hidden,
        max_positions=1024,
        eos_boost=2.0,
    )


def experiment(model_dir: str, results: Path, items: int, n: int, max_tokens: int, engine: str):
    from harness.config import Experiment

    return Experiment.model_validate(
        {
            "name": "bench",
            "results_dir": str(results),
            "teachers": [{"name": "teacher", "path": model_dir}],
            "students": [{"name": "student", "path": model_dir}],
            "tasks": [{"name": TASK, "train_limit": items}],
            "generate": {
                "engine": engine,
                "n": n,
                "temperature": 0.7,
                "max_tokens": max_tokens,
                "seed": 0,
            },
            "train": {"max_steps": 1},
        }
    )


def traces_cell(exp):
    from harness import plan

    return next(c for c in plan.expand(exp) if c.kind == "traces")


def bare_vllm(engine, requests, sampling) -> tuple[float, int]:
    """The same work as the stage, straight through `LLM.generate`."""
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=engine.render(r)) for r in requests]
    params = [engine._params(r, sampling) for r in requests]
    t0 = time.perf_counter()
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(c.token_ids) for o in outs for c in o.outputs)


def stage(engine, model_dir: str, args, root: Path) -> tuple[float, int]:
    from harness import generate

    exp = experiment(model_dir, root, args.items, args.n, args.max_tokens, engine.name)
    cell = traces_cell(exp)
    t0 = time.perf_counter()
    summary = generate.work(exp, str(exp.root), [cell], engine=engine)[cell.key]
    return time.perf_counter() - t0, summary["generated_tokens"]


def engine_run(engine, requests, sampling) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = engine.generate(requests, sampling)
    return time.perf_counter() - t0, sum(s.completion_tokens for samples in out for s in samples)


def _core_list(spec: str) -> list[int]:
    cores = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a model directory (default: build a random-init Llama)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--items", type=int, default=256, help="train questions (prompts)")
    p.add_argument("--n", type=int, default=2, help="samples per question")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--skip-hf", action="store_true", help="leave out the transformers engine")
    add_run_options(p, 5, "timed runs of each vLLM variant (median)", "results/bench/generate.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print a table, write JSON to --out; return the results."""
    for k, v in {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    args = parse_args(argv)
    if args.cores:  # vLLM binds its threads to these; the transformers engine gets as many
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cores
        import torch

        torch.set_num_threads(len(_core_list(args.cores)))
    from harness import tasks
    from harness.engines import Request

    with tempfile.TemporaryDirectory(prefix="cotgap-bench-") as tmp:
        tmp_dir = Path(tmp)
        model_dir = args.model or str(
            build_random_model(tmp_dir / "model", args.hidden, args.layers)
        )
        task = tasks.load_task(TASK)
        items = tasks.load_items(task, "train", limit=args.items)
        requests = [
            Request(it.id, prompt=tasks.render_prompt(task, it, "zero_shot_cot")) for it in items
        ]
        result = {
            "workload": {
                "model": args.model or f"random Llama {args.layers}x{args.hidden}",
                "task": TASK,
                "prompts": len(requests),
                "n": args.n,
                "max_tokens": args.max_tokens,
                "repeats": args.repeats,
                "cpu_cores": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "all"),
            },
            **measure_vllm(model_dir, requests, args, tmp_dir),
        }
        if not args.skip_hf:
            measure_hf(model_dir, requests, args, result)
    _print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def measure_vllm(model_dir: str, requests: list, args: argparse.Namespace, tmp_dir: Path) -> dict:
    """Bare LLM.generate and the stage, alternating; then the vLLM engine on greedy decoding."""
    from harness.config import ModelSpec
    from harness.engines import Sampling, load

    sampling = Sampling.from_config(
        experiment(model_dir, tmp_dir, args.items, args.n, args.max_tokens, "vllm").generate
    )
    t0 = time.perf_counter()
    vllm = load("vllm", ModelSpec(name="teacher", path=model_dir))
    startup = time.perf_counter() - t0
    engine_run(vllm, requests, sampling)  # warm-up: kernels, and the prefix cache for every run
    load_before = os.getloadavg()[0]
    bare, staged = [], []
    for i in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        bare.append(bare_vllm(vllm, requests, sampling))
        staged.append(stage(vllm, model_dir, args, tmp_dir / f"stage-{i}"))
    if len({tok for _, tok in bare + staged}) != 1:
        raise RuntimeError(f"bare and stage runs generated different token counts: {bare} {staged}")
    tokens = bare[0][1]
    bare_s, stage_s = (statistics.median(dt for dt, _ in runs) for runs in (bare, staged))
    bare_best, stage_best = (min(dt for dt, _ in runs) for runs in (bare, staged))
    greedy_s, greedy_tokens = engine_run(vllm, requests, Sampling(max_tokens=args.max_tokens))
    vllm.close()
    return {
        "temperature": sampling.temperature,
        "completion_tokens": tokens,
        "load_average_at_start": round(load_before, 2),
        "vllm_startup_s": round(startup, 2),
        "bare_vllm": {"s": round(bare_s, 3), "tokens_per_s": round(tokens / bare_s, 1)},
        "stage": {"s": round(stage_s, 3), "tokens_per_s": round(tokens / stage_s, 1)},
        "stage_over_bare": round(bare_s / stage_s, 3),
        "stage_over_bare_best": round(bare_best / stage_best, 3),
        "runs_s": {
            "bare": [round(dt, 3) for dt, _ in bare],
            "stage": [round(dt, 3) for dt, _ in staged],
        },
        "engines": {  # greedy: both engines generate exactly the same tokens
            "decoding": "greedy, n=1",
            "completion_tokens": greedy_tokens,
            "vllm": {"s": round(greedy_s, 3), "tokens_per_s": round(greedy_tokens / greedy_s, 1)},
        },
    }


def measure_hf(model_dir: str, requests: list, args: argparse.Namespace, result: dict) -> None:
    from harness.config import ModelSpec
    from harness.engines import Sampling, load

    greedy = Sampling(max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    hf = load("hf", ModelSpec(name="teacher", path=model_dir))
    result["hf_startup_s"] = round(time.perf_counter() - t0, 2)
    engine_run(hf, requests[:8], greedy)
    hf_s, hf_tokens = engine_run(hf, requests, greedy)
    if hf_tokens != result["engines"]["completion_tokens"]:
        raise RuntimeError(f"greedy token counts differ: vllm {result['engines']}, hf {hf_tokens}")
    result["engines"]["hf"] = {"s": round(hf_s, 3), "tokens_per_s": round(hf_tokens / hf_s, 1)}
    result["vllm_over_hf"] = round(hf_s / result["engines"]["vllm"]["s"], 2)


def _print_table(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    w, e = r["workload"], r["engines"]
    table = Table(
        title=f"{w['prompts']} prompts x n={w['n']}, max {w['max_tokens']} tokens, {w['model']}"
    )
    for col in ("run", "tokens", "seconds", "tokens/s", "ratio"):
        table.add_column(col, justify="left" if col == "run" else "right")
    rows = [
        ("bare vLLM LLM.generate (sampled)", r["completion_tokens"], r["bare_vllm"], "1.00"),
        (
            "cotgap stage, vllm (sampled)",
            r["completion_tokens"],
            r["stage"],
            f"{r['stage_over_bare']:.2f}",
        ),
        ("engine vllm (greedy, n=1)", e["completion_tokens"], e["vllm"], "1.00"),
    ]
    if "hf" in e:
        rows.append(
            (
                "engine hf (greedy, n=1)",
                e["completion_tokens"],
                e["hf"],
                f"{1 / r['vllm_over_hf']:.2f}",
            )
        )
    for name, tokens, run, ratio in rows:
        table.add_row(name, f"{tokens:,}", f"{run['s']:.2f}", f"{run['tokens_per_s']:,.0f}", ratio)
    Console().print(table)
    startup = f"start-up: vllm {r['vllm_startup_s']} s"
    if "hf_startup_s" in r:
        startup += f", hf {r['hf_startup_s']} s"
    print(
        f"stage/bare on best runs {r['stage_over_bare_best']:.2f}; load average {r['load_average_at_start']}; {startup}"
    )


if __name__ == "__main__":
    main()
