"""Every benchmark in one run: a table of ratios, and all results as JSON.

    .venv/bin/python -m benchmarks                       # or: make bench
    .venv/bin/python -m benchmarks --only evaluate,grid
    .venv/bin/python -m benchmarks --generate-args "--items 256 --repeats 5" --train-args "--steps 20"

1. generate  cotgap's traces stage vs a bare `vllm.LLM.generate`; vLLM vs the transformers engine
             (benchmarks/generate.py);
2. train     cotgap's training loop vs a bare peft + accelerate loop (benchmarks/train.py);
3. evaluate  cotgap's evaluate stage vs lm-evaluation-harness, same model, items and decoding
             (benchmarks/evaluate_lm_eval.py);
4. grid      a sandbox grid through `cotgap run`, then the same command again (benchmarks/grid.py).

The defaults are small (a few minutes on a 2-core machine); `--<name>-args` appends flags to a
benchmark's defaults (a later flag wins), to scale it up. A benchmark that fails is recorded with
its error in the JSON and printed; the others still run. Each writes its own JSON next to
`bench.json` (default results/bench/). In the table, ratio > 1 means cotgap's side is better
(faster, or more tokens/s) and the row names what is compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import offline_env

REPO = Path(__file__).resolve().parents[1]
NAMES = ("generate", "train", "evaluate", "grid")
DEFAULTS = {
    "generate": ["--items", "64", "--n", "2", "--max-tokens", "64", "--repeats", "3"],
    "train": ["--steps", "10", "--repeats", "2", "--examples", "128"],
    "evaluate": ["--items", "64", "--max-tokens", "160"],
    "grid": [],
}


def _module(name: str) -> Callable[[list[str]], dict]:
    if name == "generate":
        from benchmarks.generate import main
    elif name == "train":
        from benchmarks.train import main
    elif name == "evaluate":
        from benchmarks.evaluate_lm_eval import main
    else:
        from benchmarks.grid import main
    return main


def run_one(name: str, argv: list[str]) -> dict[str, Any]:
    """One benchmark; an exception (or an argparse exit) is recorded instead of raised."""
    print(f"\n=== {name}: {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    t0 = time.perf_counter()
    try:
        result = _module(name)(argv)
        return {"ok": True, "argv": argv, "wall_s": round(time.perf_counter() - t0, 1), **result}
    except (Exception, SystemExit) as e:
        if isinstance(e, SystemExit) and e.code in (0, None):
            error = "exited (--help?)"
        elif isinstance(e, SystemExit):
            code = e.code
            error = code if isinstance(code, str) else f"exit {code} (bad arguments? see above)"
        else:
            error = f"{type(e).__name__}: {e}"
        print(f"!!! {name} failed: {error}", flush=True)
        return {
            "ok": False,
            "argv": argv,
            "wall_s": round(time.perf_counter() - t0, 1),
            "error": error,
            "traceback": traceback.format_exc(),
        }


def _f(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


Row = dict[str, Any]


def _row(benchmark: str, cotgap: str, reference: str, ratio: str, **extra: Any) -> Row:
    return {
        "benchmark": benchmark,
        "cotgap": cotgap,
        "reference": reference,
        "ratio": ratio,
        **extra,
    }


def rows(results: dict[str, dict]) -> list[Row]:
    """The table's rows; a failed benchmark gets one row with its error."""
    out: list[Row] = []
    for name in NAMES:
        r = results.get(name)
        if r is None:
            continue
        if not r["ok"]:
            out.append(_row(name, "FAILED", r["error"].splitlines()[0][:60], "-"))
            continue
        try:
            out.extend(_rows(name, r))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            out.append(_row(name, "no summary", f"{type(e).__name__}: {e}", "-"))
    return out


def _rows(name: str, r: dict) -> list[Row]:
    """Speed ratios compare each side's best run (the least disturbed on a shared machine);
    the benchmark's own median ratio goes along as `ratio_median`."""
    if name == "generate":
        runs, tokens, e = r["runs_s"], r["completion_tokens"], r["engines"]
        got = [
            _row(
                f"generate: traces stage vs bare vLLM, tok/s (best of {len(runs['bare'])})",
                _f(tokens / min(runs["stage"]), 0),
                _f(tokens / min(runs["bare"]), 0),
                _f(r["stage_over_bare_best"]),
                ratio_median=r["stage_over_bare"],
            )
        ]
        if "hf" in e:
            got.append(
                _row(
                    "engines: vLLM vs transformers, greedy tok/s (one run)",
                    _f(e["vllm"]["tokens_per_s"], 0),
                    _f(e["hf"]["tokens_per_s"], 0),
                    _f(r["vllm_over_hf"]),
                )
            )
        return got
    if name == "train":
        b = r["best"]
        return [
            _row(
                f"train: cotgap loop vs bare peft+accelerate, tok/s (best of {len(r['runs']['bare'])})",
                _f(b["cotgap"]["tokens_per_s"], 0),
                _f(b["bare"]["tokens_per_s"], 0),
                _f(b["cotgap"]["tokens_per_s"] / b["bare"]["tokens_per_s"]),
                ratio_median=r["ratio"],
            )
        ]
    if name == "evaluate":
        cg, le, c = r["cotgap"], r["lm_eval"], r["comparison"]
        return [
            _row(
                f"evaluate: cotgap vs lm-eval, wall s, {c['items']} items (best of {len(cg['runs'])})",
                _f(cg["best_wall_s"]),
                _f(le["best_wall_s"]),
                _f(r["cotgap_over_lm_eval_speed_best"]),
                ratio_median=r["cotgap_over_lm_eval_speed"],
            ),
            _row(
                "evaluate: accuracy (ratio: items with the same verdict)",
                _f(cg["accuracy"], 3),
                _f(le["accuracy"], 3),
                _f(c["agreement"], 3),
            ),
            _row(
                "evaluate: identical completions | same answer value",
                f"{c['same_completion']:.1%}",
                f"{c['same_answer_value']:.1%}",
                "-",
            ),
        ]
    f, a = r["first_run"], r["rerun"]
    return [
        _row(
            "grid: re-run vs first run, wall s",
            _f(a["wall_s"]),
            _f(f["wall_s"]),
            _f(r["speedup"], 1),
        ),
        _row(
            "grid: cells computed (re-run vs first run)",
            str(a["cells"]),
            str(f["cells"]) + (f" (+{f['not_computed']} skipped)" if f.get("not_computed") else ""),
            "-",
        ),
    ]


def print_table(table_rows: list[Row], total_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cotgap benchmarks ({total_s:.0f} s)")
    table.add_column("benchmark")
    for col in ("cotgap", "reference", "ratio"):
        table.add_column(col, justify="right")
    for row in table_rows:
        table.add_row(row["benchmark"], row["cotgap"], row["reference"], row["ratio"])
    Console(width=120).print(table)
    print(
        "ratio > 1: cotgap's side is faster (reference time / cotgap time, or cotgap tok/s / "
        "reference tok/s). Speed rows compare each side's best run (the least disturbed on a "
        "shared machine; medians are in bench.json as ratio_median). Engines row: cotgap's vLLM "
        "engine vs its transformers engine. Grid rows: re-run (cotgap column) vs first run "
        "(reference column)."
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument(
        "--only",
        default=",".join(NAMES),
        help=f"comma-separated subset of {','.join(NAMES)} (default: all)",
    )
    for name in NAMES:
        p.add_argument(
            f"--{name}-args",
            default="",
            metavar="FLAGS",
            help=f"flags appended to the {name} benchmark's defaults: {' '.join(DEFAULTS[name]) or '(none)'}",
        )
    p.add_argument("--out-dir", type=Path, default=Path("results/bench"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        raise SystemExit(f"--only: unknown benchmark(s) {unknown}; valid: {', '.join(NAMES)}")
    offline_env()
    out_dir = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    started, load_start = time.time(), os.getloadavg()
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    for name in NAMES:
        if name not in chosen:
            continue
        extra = shlex.split(getattr(args, f"{name}_args"))
        out = ["--out", str(out_dir / f"{'evaluate_lm_eval' if name == 'evaluate' else name}.json")]
        results[name] = run_one(name, [*DEFAULTS[name], *out, *extra])
    total = time.perf_counter() - t0
    table_rows = rows(results)
    summary = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "total_wall_s": round(total, 1),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else None,
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
        },
        "table": table_rows,
        "failed": [n for n, r in results.items() if not r["ok"]],
        "benchmarks": results,
    }
    print()
    print_table(table_rows, total)
    for name in summary["failed"]:
        print(f"{name} failed: {results[name]['error']}")
    path = out_dir / "bench.json"
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return summary


if __name__ == "__main__":
    main()
