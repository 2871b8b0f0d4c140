"""`<results_dir>/<name>/index.csv`: the cells of the content-addressed store by name, one row
per cell, written after every run that computes cells.

    kind,key,label,task,role,model,teacher,student,regime,trace_seed,seed,status,path

`status` is complete, partial (started, not finished: a re-run resumes it) or missing (not run
yet); `path` is the cell's folder relative to the index. Rows of cells another experiment (or a
quick command) wrote into the same folder are kept, so the index covers the whole folder.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path

from harness.cells import Cell
from harness.store import Store, atomic_write_text

NAME = "index.csv"
COLUMNS = (
    "kind", "key", "label", "task", "role", "model", "teacher", "student", "regime",
    "trace_seed", "seed", "status", "path",
)  # fmt: skip


def _status(store: Store, kind: str, key: str) -> str:
    if store.complete(kind, key):
        return "complete"
    return "partial" if store.cell_dir(kind, key).is_dir() else "missing"


def _row(store: Store, c: Cell) -> dict[str, str]:
    values = {k: getattr(c, k, None) for k in COLUMNS}
    values.update(kind=c.kind, key=c.key, label=c.label, status=_status(store, c.kind, c.key))
    values["path"] = f"cells/{c.kind}/{c.key}"
    return {k: "" if v is None else str(v) for k, v in values.items()}


def _kept(store: Store, path: Path, keys: set[str]) -> list[dict[str, str]]:
    """Rows of the index on disk for cells outside `keys` whose folders still exist."""
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("key") and r["key"] not in keys]
    out = []
    for r in rows:
        if r.get("kind") and store.cell_dir(r["kind"], r["key"]).is_dir():
            out.append({k: r.get(k) or "" for k in COLUMNS})
            out[-1]["status"] = _status(store, r["kind"], r["key"])
    return out


def write(store: Store, cells: Iterable[Cell]) -> Path:
    """Write the index of `cells` (one row per key, in order) plus the kept rows; its path."""
    rows: dict[str, dict[str, str]] = {}
    for c in cells:
        rows.setdefault(c.key, _row(store, c))
    path = store.root / NAME
    text = io.StringIO()
    writer = csv.DictWriter(text, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows([*rows.values(), *_kept(store, path, set(rows))])
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text.getvalue())
    return path
