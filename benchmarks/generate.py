"""Benchmark: cotgap's traces stage against a bare `vllm.LLM.generate` as the work grows; vLLM
against transformers.

    .venv/bin/python -m benchmarks.generate [--sizes 64,512,4096] [--n 2] [--max-tokens 64]
        [--model test-teacher-l] [--repeats 3] [--out FILE]

One engine session (a test-zoo model, built if missing). At each size (train questions of the
task, grown past its shipped split when a size asks for more, same generator and seed), the same
prompts (the chat template's token ids), model and sampling parameters (per-request seeds
included) go to
1. bare vLLM: `llm.generate(token prompts, per-request SamplingParams)` on the engine's `vllm.LLM`,
   the prompts rendered through the chat template inside the clock;
2. the stage: `generate.work` (load items, render, generate, score, stream JSONL, manifest) on a
   fresh traces cell;
in `--repeats` rounds after a warm-up pass, the rounds alternating which side goes first. Both
produce the same tokens, so tokens/s compare like for like; the goal for the stage is >= 0.97 of
bare vLLM at the largest size. Ratios are of best runs (on a shared machine the least disturbed
one), of medians, and the median over rounds of the ratio within a round. Over the sizes,
each side's best times are fitted to time = fixed + per_item x items; engine start-up (import +
construction) is outside both and reported apart. Last, at the smallest size, the vLLM and
transformers engines generate the same greedy tokens.
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

from benchmarks import add_run_options, resolve_model
from benchmarks.growth import DEFAULT_SIZES, fit, grown_task, parse_sizes

TASK = "sandbox_addition"


def experiment(model_dir: str, results: Path, items: int, n: int, max_tokens: int, engine: str):
    from harness.config.schema import Experiment

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
    from harness.workflow import grid

    return next(c for c in grid.expand(exp) if c.kind == "traces")


def bare_vllm(engine, requests, sampling) -> tuple[float, int]:
    """The same work as the stage, straight through `LLM.generate`: the prompts go through the
    chat template and the tokenizer inside the clock, as a bare-vLLM script must render them too
    (the evaluate benchmark's bare side does the same)."""
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    tok = engine.llm.get_tokenizer()
    prompts = [
        TokensPrompt(
            prompt_token_ids=tok.apply_chat_template(
                [{"role": "user", "content": r.prompt}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for r in requests
    ]
    params = [engine._params(r, sampling) for r in requests]
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(c.token_ids) for o in outs for c in o.outputs)


def stage(engine, model_dir: str, items: int, args, root: Path) -> tuple[float, int]:
    from harness.stages import generate

    exp = experiment(model_dir, root, items, args.n, args.max_tokens, engine.name)
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
    p.add_argument("--model", default="test-teacher-l", help="a sandbox zoo model or a model dir")
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"train questions per run (default {DEFAULT_SIZES})"
    )
    p.add_argument("--n", type=int, default=2, help="samples per question")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--skip-hf", action="store_true", help="leave out the transformers engine")
    add_run_options(p, 3, "timed runs of each side at each size", "results/bench/generate.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print a table, write JSON to --out; return the results."""
    for k, v in {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    args = parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if args.cores:  # vLLM binds its threads to these; the transformers engine gets as many
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cores
        import torch

        torch.set_num_threads(len(_core_list(args.cores)))
    _, model_dir = resolve_model(args.model)
    from harness.engines import Request
    from harness.tasks import suite as tasks

    with grown_task(TASK, max(sizes), 0):
        task = tasks.load_task(TASK)
        items = tasks.load_items(task, "train", limit=max(sizes))
    requests = [
        Request(it.id, prompt=tasks.render_prompt(task, it, "zero_shot_cot")) for it in items
    ]
    with tempfile.TemporaryDirectory(prefix="cotgap-bench-") as tmp:
        tmp_dir = Path(tmp)
        result = {
            "workload": {
                "model": args.model,
                "model_dir": model_dir,
                "task": TASK,
                "sizes": sizes,
                "n": args.n,
                "max_tokens": args.max_tokens,
                "repeats": args.repeats,
                "cpu_cores": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "all"),
            },
            **measure_vllm(model_dir, requests, sizes, args, tmp_dir),
        }
        if not args.skip_hf:
            measure_hf(model_dir, requests[: sizes[0]], args, result)
    _print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def measure_vllm(
    model_dir: str, requests: list, sizes: list[int], args: argparse.Namespace, tmp_dir: Path
) -> dict:
    """At each size, bare LLM.generate and the stage, alternating; then the vLLM engine on greedy
    decoding at the smallest size."""
    from harness.config.schema import ModelSpec
    from harness.engines import Sampling, load

    sampling = Sampling.from_config(
        experiment(model_dir, tmp_dir, sizes[0], args.n, args.max_tokens, "vllm").generate
    )
    t0 = time.perf_counter()
    vllm = load("vllm", ModelSpec(name="teacher", path=model_dir))
    startup = time.perf_counter() - t0
    engine_run(vllm, requests[: sizes[0]], sampling)  # warm-up: kernels, first-call set-up
    by_size = {}
    for size in sizes:
        load_before = os.getloadavg()[0]
        bare, staged = [], []
        for i in range(args.repeats):  # interleaved, so drift in machine load hits both alike
            # rounds alternate which side goes first, so that neither always runs second
            for side in ("bare", "stage") if i % 2 == 0 else ("stage", "bare"):
                if side == "bare":
                    bare.append(bare_vllm(vllm, requests[:size], sampling))
                    continue
                # the task grows only as far as this size needs: the stage generates the split
                with grown_task(TASK, size, 0):
                    root = tmp_dir / f"stage-{size}-{i}"
                    staged.append(stage(vllm, model_dir, size, args, root))
        if len({tok for _, tok in bare + staged}) != 1:
            raise RuntimeError(f"{size} items: bare and stage token counts differ: {bare} {staged}")
        by_size[str(size)] = _size_result(bare, staged, load_before)
        print(f"generate {size} items: {by_size[str(size)]['summary']}", flush=True)
    greedy_s, greedy_tokens = engine_run(
        vllm, requests[: sizes[0]], Sampling(max_tokens=args.max_tokens)
    )
    vllm.close()
    largest = by_size[str(sizes[-1])]
    return {
        "temperature": sampling.temperature,
        "vllm_startup_s": round(startup, 2),
        "by_size": by_size,
        "fit": {  # over each side's best time per size
            side: fit(sizes, [by_size[str(s)][side]["best_s"] for s in sizes])
            for side in ("bare_vllm", "stage")
        },
        "largest": sizes[-1],
        "stage_over_bare_best": largest["stage_over_bare_best"],
        "stage_over_bare": largest["stage_over_bare"],
        "stage_over_bare_paired_median": largest["stage_over_bare_paired_median"],
        "engines": {  # greedy: both engines generate exactly the same tokens
            "decoding": "greedy, n=1",
            "prompts": sizes[0],
            "completion_tokens": greedy_tokens,
            "vllm": {"s": round(greedy_s, 3), "tokens_per_s": round(greedy_tokens / greedy_s, 1)},
        },
    }


def _size_result(bare: list, staged: list, load: float) -> dict:
    tokens = bare[0][1]

    def side(runs: list) -> dict:
        times = [dt for dt, _ in runs]
        best, median = min(times), statistics.median(times)
        return {
            "best_s": round(best, 3),
            "median_s": round(median, 3),
            "tokens_per_s": round(tokens / best, 1),
            "tokens_per_s_median": round(tokens / median, 1),
            "runs_s": [round(t, 3) for t in times],
        }

    b, s = side(bare), side(staged)
    ratio_best = round(b["best_s"] / s["best_s"], 3)
    # each round's two runs ran back to back: the median of their ratios is the least sensitive
    # to one lucky or disturbed run
    paired = [round(x / y, 3) for (x, _), (y, _) in zip(bare, staged, strict=True)]
    return {
        "completion_tokens": tokens,
        "load_average_at_start": round(load, 2),
        "bare_vllm": b,
        "stage": s,
        "stage_overhead_s": round(s["best_s"] - b["best_s"], 3),
        "stage_over_bare_best": ratio_best,
        "stage_over_bare": round(b["median_s"] / s["median_s"], 3),
        "stage_over_bare_paired": paired,
        "stage_over_bare_paired_median": round(statistics.median(paired), 3),
        "summary": f"bare {b['best_s']:.2f} s, stage {s['best_s']:.2f} s, "
        f"{tokens:,} tokens, ratio {ratio_best:.3f} (best runs), "
        f"{statistics.median(paired):.3f} (median of rounds)",
    }


def measure_hf(model_dir: str, requests: list, args: argparse.Namespace, result: dict) -> None:
    from harness.config.schema import ModelSpec
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
        title=f"traces stage vs bare vLLM: n={w['n']}, max {w['max_tokens']} tokens, {w['model']}, "
        f"best of {w['repeats']}"
    )
    cols = ("items", "tokens", "bare s", "stage s", "overhead s", "bare tok/s", "stage tok/s")
    for col in (*cols, "ratio", "ratio, rounds"):
        table.add_column(col, justify="right")
    for size, x in r["by_size"].items():
        b, s = x["bare_vllm"], x["stage"]
        table.add_row(
            size,
            f"{x['completion_tokens']:,}",
            f"{b['best_s']:.2f}",
            f"{s['best_s']:.2f}",
            f"{x['stage_overhead_s']:.2f}",
            f"{b['tokens_per_s']:,.0f}",
            f"{s['tokens_per_s']:,.0f}",
            f"{x['stage_over_bare_best']:.3f}",
            f"{x['stage_over_bare_paired_median']:.3f}",
        )
    Console().print(table)
    fits = ", ".join(
        f"{side}: fixed {f['fixed_s']} s + {f['per_item_ms']} ms/item"
        for side, f in r["fit"].items()
        if f["fixed_s"] is not None
    )
    print(
        "ratio: best bare run / best stage run; ratio, rounds: the median over rounds of bare / "
        "stage within a round\n"
        f"overhead: stage minus bare (best runs); linear fit of best times: {fits}; "
        f"vllm start-up {r['vllm_startup_s']} s (outside both)"
    )
    if "hf" in e:
        print(
            f"engines, greedy, {e['prompts']} prompts: vllm {e['vllm']['tokens_per_s']:,.0f} tok/s, "
            f"hf {e['hf']['tokens_per_s']:,.0f} tok/s (vllm/hf {r['vllm_over_hf']})"
        )


if __name__ == "__main__":
    main()
