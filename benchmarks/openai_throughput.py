"""Benchmark: cotgap's served-model engine against vLLM's OpenAI-compatible server on this machine,
at several `max_concurrency` settings.

    .venv/bin/python -m benchmarks.openai_throughput [--model teacher-s] [--requests 96]
        [--max-tokens 64] [--concurrency 1,8,32] [--out FILE]

Starts `python -m vllm.entrypoints.openai.api_server` on a sandbox zoo model (benchmarks/
vllm_server.py), then sends the same requests (train questions of sandbox_addition, rendered to
token ids, sampled at temperature 0.8 with per-request seeds, so every setting asks for the same
completions) through `OpenAIEngine.generate` at each concurrency, after a warm-up call. Reports
wall time, requests/s and completion tokens/s (the server's usage records) per setting, and each
setting's throughput as a ratio of the first one's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import offline_env, resolve_model
from benchmarks.vllm_server import vllm_server

TASK = "sandbox_addition"


def _engine(url: str, path: str, name: str, concurrency: int) -> Any:
    from harness.config.schema import ModelSpec
    from harness.engines.openai_engine import OpenAIEngine

    settings = {"kind": "openai", "base_url": url, "model": name, "endpoint": "completions",
                "vllm_extensions": True, "max_concurrency": concurrency}  # fmt: skip
    return OpenAIEngine(ModelSpec.model_validate({"name": name, "path": path, "engine": settings}))


def _requests(k: int) -> list[Any]:
    from harness.engines import Request
    from harness.tasks import suite as tasks

    task = tasks.load_task(TASK)
    items = tasks.load_items(task, "train", limit=k)
    return [
        Request(it.id, prompt=tasks.render_prompt(task, it, "zero_shot_cot", 0)) for it in items
    ]


def measure(
    url: str, path: str, name: str, concurrency: int, requests: list, max_tokens: int
) -> dict:
    """One setting: a fresh engine (no journal: every request goes to the server), timed."""
    from harness.engines import Sampling

    engine = _engine(url, path, name, concurrency)
    sampling = Sampling(n=1, temperature=0.8, max_tokens=max_tokens, seed=0)
    t0 = time.perf_counter()
    out = engine.generate(requests, sampling)
    wall = time.perf_counter() - t0
    tokens = sum(s.completion_tokens for samples in out for s in samples)
    return {
        "max_concurrency": concurrency,
        "requests": len(requests),
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(requests) / wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="teacher-s", help="a sandbox zoo model or a model directory")
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--out", default="openai_throughput.json")
    args = p.parse_args()
    offline_env()
    path, model_dir = resolve_model(args.model)
    name = Path(model_dir).name
    requests = _requests(args.requests)
    levels = [int(c) for c in args.concurrency.split(",")]
    with (
        tempfile.TemporaryDirectory() as tmp,
        vllm_server(model_dir, name, Path(tmp) / "server.log") as url,
    ):
        measure(url, path, name, max(levels), requests[:16], args.max_tokens)  # warm-up
        rows = [measure(url, path, name, c, requests, args.max_tokens) for c in levels]
    for r in rows:
        r["tokens_per_s_ratio"] = round(r["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
        r["requests_per_s_ratio"] = round(r["requests_per_s"] / rows[0]["requests_per_s"], 2)
        print(json.dumps(r))
    Path(args.out).write_text(json.dumps({"model": args.model, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
