"""`<results_dir>/<name>/index.csv`: the cells of the content-addressed store by name, one row
per cell, written after every run that computes cells.

    kind,key,label,task,role,model,teacher,student,regime,trace_seed,seed,status,path

`status` is complete, partial (started, not finished: a re-run resumes it) or missing (not run
yet); `path` is the cell's folder relative to the index. Rows of cells another experiment (or a
quick command) wrote into the same folder are kept, so the index covers the whole folder.

Beside it, `by-name/<kind>/<label>` is a relative symbolic link to every complete cell's folder
(`by-name/eval/distilled__stu__t-large__gsm8k__per_teacher__trace0__0 -> ../../cells/eval/<key>`),
rebuilt whole with the index; where the file system has no symbolic links it is left out.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from harness.store import Store, atomic_write_text, safe_name
from harness.workflow.cells import Cell

NAME = "index.csv"
LINKS = "by-name"
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


def write(store: Store, cells: Iterable[Cell], note: Callable[[str], None] = print) -> Path:
    """Write the index of `cells` (one row per key, in order) plus the kept rows, and the by-name
    links next to it; the index's path. `note` hears why the links were left out, if they were."""
    rows: dict[str, dict[str, str]] = {}
    for c in cells:
        rows.setdefault(c.key, _row(store, c))
    path = store.root / NAME
    text = io.StringIO()
    writer = csv.DictWriter(text, COLUMNS, lineterminator="\n")
    writer.writeheader()
    every = [*rows.values(), *_kept(store, path, set(rows))]
    writer.writerows(every)
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text.getvalue())
    links(store.root, every, note)
    return path


def link_names(rows: list[dict[str, str]]) -> dict[str, str]:
    """key -> `<kind>/<name>` for the complete rows: the label without its kind, `/` as `__`,
    made file-name safe; labels two cells share get the key's first 8 digits."""
    names = {
        r["key"]: safe_name(r["label"].split(":", 1)[-1].replace("/", "__"), max_len=160)
        for r in rows
        if r["status"] == "complete"
    }
    counts: dict[tuple[str, str], int] = {}
    kind = {r["key"]: r["kind"] for r in rows}
    for key, name in names.items():
        counts[kind[key], name] = counts.get((kind[key], name), 0) + 1
    return {
        key: f"{kind[key]}/{name}" + (f"~{key[:8]}" if counts[kind[key], name] > 1 else "")
        for key, name in names.items()
    }


def links(root: Path, rows: list[dict[str, str]], note: Callable[[str], None]) -> Path | None:
    """Rebuild `root/by-name` in a temporary folder and swap it in whole (no stale link is left);
    None, and one note, where the file system has no symbolic links."""
    for stale in [*root.glob(f".{LINKS}.tmp-*"), *root.glob(f".{LINKS}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp, out = root / f".{LINKS}.tmp-{os.getpid()}", root / LINKS
    try:
        for key, name in link_names(rows).items():
            link = tmp / name
            link.parent.mkdir(parents=True, exist_ok=True)
            kind = name.split("/", 1)[0]
            os.symlink(Path("..", "..", "cells", kind, key), link, target_is_directory=True)
    except (OSError, NotImplementedError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        note(
            f"{out}: not written ({getattr(e, 'strerror', None) or e}): this file system has no "
            f"symbolic links; {NAME} names every cell's folder"
        )
        return None
    tmp.mkdir(exist_ok=True)  # an empty tree where no cell is complete yet
    old = root / f".{LINKS}.old-{os.getpid()}"
    if out.is_dir() and not out.is_symlink():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out
