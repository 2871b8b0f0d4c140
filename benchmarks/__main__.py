"""Every benchmark in one run: a table of ratios, all results as JSON, a plot of time against size.

    .venv/bin/python -m benchmarks                       # or: make bench
    .venv/bin/python -m benchmarks --only evaluate,grid
    .venv/bin/python -m benchmarks --generate-args "--sizes 64,1024 --repeats 5" --train-args "--steps 20"

1. generate  cotgap's traces stage vs a bare `vllm.LLM.generate` at 64, 512 and 4,096 questions;
             vLLM vs the transformers engine (benchmarks/generate.py);
2. train     cotgap's training loop vs a bare peft + accelerate loop (benchmarks/train.py);
3. evaluate  cotgap's evaluate stage vs bare vLLM and vs lm-evaluation-harness at 64, 512 and
             4,096 items, same model, items and decoding (benchmarks/evaluate_lm_eval.py);
4. grid      a sandbox grid through `cotgap run`, then the same command again (benchmarks/grid.py).

`--<name>-args` appends flags to a benchmark's defaults (a later flag wins). A benchmark that
fails is recorded with its error in the JSON and printed; the others still run. Each writes its
own JSON next to `bench.json` (default results/bench/), and `growth.png` there plots time against
size for generate and evaluate (benchmarks/growth.py). In the table, ratio > 1 means cotgap's side
is better (faster, or more tokens/s) and the row names what is compared.
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
from benchmarks.growth import DEFAULT_SIZES, growth_title, panels, plot

REPO = Path(__file__).resolve().parents[1]
NAMES = ("generate", "train", "evaluate", "grid")
DEFAULTS = {
    "generate": ["--sizes", DEFAULT_SIZES, "--n", "2", "--max-tokens", "64", "--repeats", "3"],
    "train": ["--steps", "30", "--repeats", "3", "--examples", "128"],
    "evaluate": ["--sizes", DEFAULT_SIZES, "--max-tokens", "160", "--repeats", "3"],
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
        reps, got = r["workload"]["repeats"], []
        for size, x in r["by_size"].items():
            got.append(
                _row(
                    f"generate: traces stage vs bare vLLM, tok/s, {size} items (best of {reps})",
                    _f(x["stage"]["tokens_per_s"], 0),
                    _f(x["bare_vllm"]["tokens_per_s"], 0),
                    _f(x["stage_over_bare_best"], 3),
                    ratio_median=x["stage_over_bare"],
                    ratio_rounds=x["stage_over_bare_paired_median"],
                )
            )
        f, largest = r["fit"], str(r["largest"])
        got.append(
            _row(
                "generate: fixed s + per item ms (fit of best times over the sizes)",
                f"{f['stage']['fixed_s']} + {f['stage']['per_item_ms']}",
                f"{f['bare_vllm']['fixed_s']} + {f['bare_vllm']['per_item_ms']}",
                "-",
            )
        )
        got.append(
            _row(
                "generate: stage minus bare, s, smallest | largest size",
                f"{r['by_size'][str(r['workload']['sizes'][0])]['stage_overhead_s']} | "
                f"{r['by_size'][largest]['stage_overhead_s']}",
                "-",
                "-",
            )
        )
        e = r["engines"]
        if "hf" in e:
            got.append(
                _row(
                    f"engines: vLLM vs transformers, greedy tok/s, {e['prompts']} items (one run)",
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
        return _evaluate_rows(r)
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


def _evaluate_rows(r: dict) -> list[Row]:
    reps, got = r["workload"]["repeats"], []
    names = {"vllm": "bare vLLM", "lm_eval": "lm-eval"}
    for size, x in r["by_size"].items():
        cg = x["cotgap"]
        for side in ("vllm", "lm_eval"):
            if side not in x:
                continue
            ref, ratio = x[side], x["ratios"][f"cotgap_over_{side}"]
            got.append(
                _row(
                    f"evaluate vs {names[side]}: evaluation tok/s, {size} items (best of {reps})",
                    _f(cg["eval_tokens_per_s"], 0),
                    _f(ref["eval_tokens_per_s"], 0) if ref["eval_tokens_per_s"] else "-",
                    _f(ratio["eval"], 3),
                    ratio_median=ratio["eval_median"],
                )
            )
            got.append(
                _row(
                    f"evaluate vs {names[side]}: wall s, fresh process, {size} items",
                    _f(cg["wall_s"]),
                    _f(ref["wall_s"]),
                    _f(ratio["wall"], 3),
                    ratio_median=ratio["wall_median"],
                )
            )
    for side, f in r["fit"].items():
        if side != "cotgap":
            cg = r["fit"]["cotgap"]
            got.append(
                _row(
                    f"evaluate vs {names[side]}: fixed s + per item ms (fit of wall times)",
                    f"{cg['fixed_s']} + {cg['per_item_ms']}",
                    f"{f['fixed_s']} + {f['per_item_ms']}",
                    "-",
                )
            )
    x = r["by_size"][str(r["largest"])]
    c = x["comparison"]
    got += [
        _row(
            f"evaluate: accuracy vs lm-eval, {r['largest']} items (ratio: same verdict)",
            _f(x["cotgap"]["accuracy"], 3),
            _f(x["lm_eval"]["accuracy"], 3),
            _f(c["agreement"], 3),
        ),
        _row(
            "evaluate: identical completions | same answer value (vs lm-eval)",
            f"{c['same_completion']:.1%}",
            f"{c['same_answer_value']:.1%}",
            "-",
        ),
    ]
    return got


def cpu_model() -> tuple[str | None, bool | None]:
    """(model name, whether the flags include avx512_bf16) from /proc/cpuinfo (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, None
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in info.splitlines())
    )
    return fields.get("model name"), "avx512_bf16" in fields.get("flags", "").split()


def print_table(table_rows: list[Row], total_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cotgap benchmarks ({total_s:.0f} s)")
    table.add_column("benchmark")
    for col in ("cotgap", "reference", "ratio", "median"):
        table.add_column(col, justify="right")
    for row in table_rows:
        median = row.get("ratio_rounds", row.get("ratio_median"))
        median = "-" if median is None else _f(median, 3)
        table.add_row(row["benchmark"], row["cotgap"], row["reference"], row["ratio"], median)
    Console(width=120).print(table)
    print(
        "ratio > 1: cotgap's side is faster (reference time / cotgap time, or cotgap tok/s / "
        "reference tok/s). Speed rows compare each side's best run (the least disturbed on a "
        "shared machine); median: the ratio of the sides' median runs (generate: the median over "
        "rounds of the ratio within a round, two runs back to back). Engines row: cotgap's vLLM "
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
    model, bf16 = cpu_model()
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
            "cpu_model": model,
            "avx512_bf16": bf16,
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
    if growth := panels(results):
        print(f"wrote {plot(growth, out_dir / 'growth.png', growth_title(summary))}")
    return summary


if __name__ == "__main__":
    main()
