"""How a benchmark's time grows with its size: bigger sandbox splits, the linear fit, the plot.

    .venv/bin/python -m benchmarks --only generate,evaluate        # writes results/bench/growth.png
    .venv/bin/python -m benchmarks.growth results/bench/bench.json # the plot again, from the JSON

Each compared side is timed at several sizes (items); `fit` splits its time into a fixed cost
and a cost per item (least squares over the sizes, time = fixed + per_item x items), and `plot`
draws time against size for every side of every benchmark.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

DEFAULT_SIZES = "64,512,4096"


def parse_sizes(text: str) -> list[int]:
    """'64,512,4096' -> [64, 512, 4096] (sorted, unique, each >= 1)."""
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise SystemExit(
            f"--sizes {text!r}: give comma-separated item counts, e.g. 64,512,4096"
        ) from None
    if not sizes or sizes[0] < 1:
        raise SystemExit(f"--sizes {text!r}: give at least one item count, each >= 1")
    return sizes


@contextlib.contextmanager
def grown_task(task: str, n_train: int, n_test: int) -> Iterator[Path]:
    """Within the block, cotgap reads its tasks from a temporary copy of the task directory whose
    sandbox `task` has at least these split sizes (the same generator and seed, so its first items
    are the shipped task's items). Sets $COTGAP_TASKS_DIR, which child processes inherit."""
    from harness.tasks import suite as tasks

    src = tasks.tasks_dir()
    config = yaml.safe_load((src / f"{task}.yaml").read_text())
    sandbox = (config.get("source") or {}).get("sandbox")
    if sandbox is None:
        raise SystemExit(f"task {task}: only sandbox tasks can grow to any size")
    sandbox["n_train"] = max(sandbox["n_train"], n_train)
    sandbox["n_test"] = max(sandbox["n_test"], n_test)
    before = os.environ.get("COTGAP_TASKS_DIR")
    with tempfile.TemporaryDirectory(prefix="cotgap-bench-tasks-") as tmp:
        (Path(tmp) / f"{task}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        os.environ["COTGAP_TASKS_DIR"] = tmp
        try:
            yield Path(tmp)
        finally:
            if before is None:
                os.environ.pop("COTGAP_TASKS_DIR", None)
            else:
                os.environ["COTGAP_TASKS_DIR"] = before


def fit(sizes: list[int], seconds: list[float]) -> dict[str, float | None]:
    """time = fixed_s + per_item_ms / 1000 x items, least squares on relative residuals (each
    size weighs alike, so the 4,096-item time does not swamp the small ones); None with fewer than
    2 sizes."""
    if len(set(sizes)) < 2:
        return {"fixed_s": None, "per_item_ms": None}
    import numpy as np

    y = np.array(seconds, float)
    slope, intercept = np.polyfit(np.array(sizes, float), y, 1, w=1 / y)
    return {"fixed_s": round(float(intercept), 3), "per_item_ms": round(float(slope) * 1e3, 4)}


def plot(panels: list[dict[str, Any]], path: Path, title: str) -> Path:
    """One panel per benchmark: {"title", "sizes", "series": {label: seconds per size}}; log-log
    axes, each series with its linear fit dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        sizes = panel["sizes"]
        grid = np.geomspace(min(sizes), max(sizes), 50)
        for label, seconds in panel["series"].items():
            (line,) = ax.plot(sizes, seconds, "o-", label=label)
            f = fit(sizes, seconds)
            if f["fixed_s"] is not None:
                ax.plot(
                    grid, f["fixed_s"] + f["per_item_ms"] / 1e3 * grid, "--", color=line.get_color()
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("items")
        ax.set_ylabel("seconds (best run)")
        ax.set_title(panel["title"], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def growth_title(summary: dict[str, Any]) -> str:
    m = summary["machine"]
    return (
        f"cotgap benchmarks, {summary['started']}, {m.get('cpu_model', '?')}, {m['cpus']} CPUs, "
        f"load average {m['load_average_start'][0]} at start, {m['load_average_end'][0]} at end"
    )


def panels(benchmarks: dict[str, dict]) -> list[dict[str, Any]]:
    """The plot's panels from bench.json's `benchmarks` (those that ran and have sizes)."""
    out = []
    g = benchmarks.get("generate")
    if g and g.get("ok", True) and "by_size" in g:
        sizes = g["workload"]["sizes"]
        out.append(
            {
                "title": f"traces stage vs bare vLLM.generate (n={g['workload']['n']}, one engine)",
                "sizes": sizes,
                "series": {
                    label: [g["by_size"][str(s)][side]["best_s"] for s in sizes]
                    for label, side in (("bare vLLM", "bare_vllm"), ("cotgap stage", "stage"))
                },
            }
        )
    e = benchmarks.get("evaluate")
    if e and e.get("ok", True) and "by_size" in e:
        sizes = e["workload"]["sizes"]
        names = {"cotgap": "cotgap evaluate", "vllm": "bare vLLM", "lm_eval": "lm-eval"}
        sides = [s for s in names if s in e["by_size"][str(sizes[0])]]
        for key, what in (("wall_s", "end to end, fresh process"), ("eval_s", "engine up")):
            out.append(
                {
                    "title": f"evaluate, greedy: {what}",
                    "sizes": sizes,
                    "series": {
                        names[side]: [e["by_size"][str(s)][side][key] for s in sizes]
                        for side in sides
                    },
                }
            )
    return out


if __name__ == "__main__":
    bench = Path(sys.argv[1] if len(sys.argv) > 1 else "results/bench/bench.json")
    summary = json.loads(bench.read_text())
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else bench.with_name("growth.png")
    print(plot(panels(summary["benchmarks"]), target, growth_title(summary)))
