"""Exports: a grid's traces, training sets, predictions and leaderboard as Hugging Face `datasets`
Parquet files with a dataset card (README.md) that records where each file came from.

    cotgap export configs/sandbox.yaml --out exports/sandbox

Every complete cell of the grid becomes one Parquet file whose rows are the cell's JSONL records
unchanged (written by `datasets.Dataset.to_parquet`, so the card's `configs:` and
`datasets.load_dataset("parquet", data_files=...)` both read them):

    traces/<task>/<teacher>.parquet                         a teacher's CoT samples (train split)
    train/<task>/<student>/<teacher>_<regime>.parquet       a training set (examples.jsonl)
    predictions/<task>/teacher_<teacher>.parquet            a teacher's test completions (test split)
    predictions/<task>/<student>_base.parquet               a student's baseline
    predictions/<task>/<student>_<teacher>_<regime>_seed<seed>.parquet   a distilled student
    leaderboard.parquet                                     analysis/leaderboard.csv, typed

With several trace draws (`generate.seeds`), a traces file, a training set and a distilled
student's predictions name their draw: `<teacher>_trace<s>.parquet`,
`<teacher>_<regime>_trace<s>.parquet`, `<student>_<teacher>_<regime>_trace<s>_seed<seed>.parquet`.

The export is built in a temporary directory next to `--out` and renamed into place, so `--out`
holds a whole export or the previous one. Cells not computed yet are left out and counted.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness.config.schema import Experiment
from harness.errors import UserError
from harness.store import Store, abandoned, atomic_write_text, read_json, read_jsonl, safe_name
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

MARKER = "<!-- cotgap export -->"
_FILES = {"traces": "traces.jsonl", "dataset": "examples.jsonl", "eval": "predictions.jsonl"}


def _provenance(store: Store, cell: Cell) -> dict[str, Any]:
    """What the card says about one file: the cell's resolved config and manifest essentials."""
    d = store.cell_dir(cell.kind, cell.key)
    manifest = read_json(d / "manifest.json", f"delete {d} and re-run")
    config = yaml.safe_load((d / "config.yaml").read_text(encoding="utf-8")) or {}
    task = config.get("task", {})
    out: dict[str, Any] = {
        "kind": cell.kind,
        "cell": f"cells/{cell.kind}/{cell.key}",
        "task": f"{task.get('name')} v{task.get('version')} ({task.get('split')} split, "
        f"limit {task.get('limit')}, extractor {task.get('extractor')})",
        "git": f"{manifest.get('git', {}).get('commit')}"
        + (" (dirty)" if manifest.get("git", {}).get("dirty") else ""),
        "created": manifest.get("end"),
    }
    for name in ("teacher", "student", "regime", "trace_seed", "seed", "role"):
        if getattr(cell, name, None) is not None:
            out[name] = getattr(cell, name)
    if cell.model not in out.values():  # an eval's model; a dataset's student is named already
        out["model"] = cell.model
    if cell.kind == "traces":
        g = config.get("generate", {})
        out["prompt_style"] = g.get("prompt_style")
        out["decoding"] = _decoding(g)
    elif cell.kind == "eval":
        e = config.get("evaluate", {})
        out["prompt_style"] = e.get("prompt_style")
        out["decoding"] = _decoding(e)
    else:  # a training set: how its teachers' traces were sampled, then how they were selected
        read = [config["teacher"]] if config.get("teacher") else config.get("teachers") or []
        traces = store.cell_dir("traces", read[0]) if read else None
        if traces is not None and (traces / "config.yaml").exists():
            g = yaml.safe_load((traces / "config.yaml").read_text(encoding="utf-8")).get(
                "generate", {}
            )
            out["traces"] = ", ".join(f"cells/traces/{key}" for key in read)
            out["prompt_style"] = g.get("prompt_style")
            out["decoding"] = _decoding(g)
        out["filter"] = (
            f"regime {config.get('regime')}: correct, finished teacher traces"
            + (
                " on questions every teacher solved"
                if config.get("regime") == "intersection"
                else ""
            )
            + (f", matched by {config.get('matched_by')}" if config.get("matched_by") else "")
            + f"; examples over max_length {config.get('max_length')} tokens dropped"
        )
    summary = manifest.get("summary") or {}
    for name in ("yield", "accuracy", "n_examples", "n_dropped_overlong"):
        if name in summary:
            out[name] = summary[name]
    return out


def _decoding(section: dict[str, Any]) -> str:
    names = ("decoding", "n", "temperature", "top_p", "top_k", "max_tokens", "seed", "num_fewshot")
    return ", ".join(f"{k}={section[k]}" for k in names if k in section)


def _files(exp: Experiment, grid: grids.Grid) -> list[tuple[str, Cell]]:
    """(path in the export, cell) for every file an export can hold, in report order."""
    out: list[tuple[str, Cell]] = []
    several = len(exp.generate.trace_seeds) > 1

    def draw(seed: int) -> str:
        return f"_trace{seed}" if several else ""

    for (task, teacher, trace_seed), c in grid.traces.items():
        out.append((f"traces/{safe_name(task)}/{safe_name(teacher)}{draw(trace_seed)}.parquet", c))
    for (task, teacher), e in grid.teachers.items():
        out.append((f"predictions/{safe_name(task)}/teacher_{safe_name(teacher)}.parquet", e))
    for (task, student), e in grid.baselines.items():
        out.append((f"predictions/{safe_name(task)}/{safe_name(student)}_base.parquet", e))
    seen = set()
    for (task, student, teacher, regime, trace_seed, seed), d in grid.distilled.items():
        stem, of = f"{safe_name(task)}/{safe_name(student)}", f"{safe_name(teacher)}_{regime}"
        if d.dataset.key not in seen:
            seen.add(d.dataset.key)
            out.append((f"train/{stem}/{of}{draw(trace_seed)}.parquet", d.dataset))
        name = f"{safe_name(student)}_{of}{draw(trace_seed)}_seed{seed}"
        out.append((f"predictions/{safe_name(task)}/{name}.parquet", d.eval))
    return out


def _write_parquet(records: list[dict], path: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(records).to_parquet(str(path))


def run(
    exp: Experiment, out: Path, log: Callable[[str], None] = print
) -> tuple[Path, dict[str, int]]:
    """Write the export to `out`; returns it and the counts of files written and cells missing."""
    out = out.resolve()
    if out.exists() and any(out.iterdir()):
        card = out / "README.md"
        if not (card.exists() and MARKER in card.read_text(encoding="utf-8", errors="replace")):
            raise UserError(
                f"{out}: exists and is not an earlier cotgap export (no README.md with the export "
                "marker); choose an empty or new directory for --out."
            )
    store, grid = Store(exp.root), grids.expand(exp)
    _remove_abandoned(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries, counts = [], {"files": 0, "rows": 0, "missing": 0}
    try:
        for rel, cell in _files(exp, grid):
            if not store.complete(cell.kind, cell.key):
                counts["missing"] += 1
                continue
            records = read_jsonl(store.cell_dir(cell.kind, cell.key) / _FILES[cell.kind])
            _write_parquet(records, tmp / rel)
            entries.append((rel, len(records), _provenance(store, cell)))
            counts["files"] += 1
            counts["rows"] += len(records)
        board = exp.root / "analysis" / "leaderboard.csv"
        if board.exists():
            import datasets
            import pandas as pd

            from harness.analysis.analyze import _DTYPES as COLUMN_DTYPES  # the CSV's typed columns
            from harness.tasks.suite import read_utf8

            text = io.StringIO(read_utf8(board))  # a clear error where the file is not UTF-8
            frame = pd.read_csv(text, dtype=COLUMN_DTYPES)  # Int64 seeds, boolean `degraded`
            datasets.Dataset.from_pandas(frame, preserve_index=False).to_parquet(
                str(tmp / "leaderboard.parquet")
            )
            entries.append(
                ("leaderboard.parquet", len(frame), {"kind": "leaderboard", "source": str(board)})
            )
            counts["files"] += 1
        else:
            log(f"export: {board} not found; run `cotgap analyze` to include the leaderboard")
        atomic_write_text(tmp / "README.md", card_text(exp, entries))
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if counts["missing"]:
        log(f"export: {counts['missing']} cell(s) not computed yet are left out")
    return out, counts


def _remove_abandoned(out: Path) -> None:
    """Delete what a killed export of `out` left: its temporary and replaced directories
    (`.<name>.tmp-<pid>`, `.<name>.old-<pid>`) whose process is gone."""
    for d in abandoned(
        [*out.parent.glob(f".{out.name}.tmp-*"), *out.parent.glob(f".{out.name}.old-*")]
    ):
        shutil.rmtree(d, ignore_errors=True)


def _split(rel: str) -> str:
    """The split a file's rows come from: test for predictions, train for traces and sets."""
    return "test" if rel.startswith("predictions/") else "train"


def _config_name(rel: str) -> str:
    return rel.removesuffix(".parquet").replace("/", "--")


def card_text(exp: Experiment, entries: list[tuple[str, int, dict[str, Any]]]) -> str:
    """The dataset card: `configs:` front matter (one config per file) and each file's provenance."""
    front = {
        "pretty_name": f"cotgap export: {exp.name}",
        "tags": ["cotgap", "chain-of-thought", "distillation"],
        "configs": [
            {"config_name": _config_name(rel), "data_files": [{"split": _split(rel), "path": rel}]}
            for rel, _, _ in entries
        ],
    }
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).rstrip(),
        "---",
        MARKER,
        f"# cotgap export: {exp.name}",
        "",
        f"Written by `cotgap export` from `{exp.root}`. Each Parquet file holds one cell's records "
        "unchanged (traces.jsonl, examples.jsonl or predictions.jsonl); load one with",
        "",
        "```python",
        "import datasets",
        f'datasets.load_dataset("parquet", data_files="{entries[0][0] if entries else "x.parquet"}")',
        "```",
        "",
        "## Files and provenance",
        "",
    ]
    for rel, n, prov in entries:
        lines.append(f"### `{rel}` ({n} rows)")
        lines.append("")
        lines.extend(f"- **{k}**: {v}" for k, v in prov.items())
        lines.append("")
    return "\n".join(lines)
