"""index.csv's by-name links: `results/<name>/by-name/<kind>/<label>` -> the cell's folder.

    pytest -q tests/test_index.py

A real grid's cells (the sandbox zoo's names; no model is loaded) written through the Store API;
only a file system without symbolic links is simulated (os.symlink made to fail).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import yaml

from harness.config.loading import load_experiment
from harness.store import Store
from harness.workflow import grid, index


@pytest.fixture
def written(tmp_path: Path):
    cfg = {
        "name": "idx",
        "results_dir": str(tmp_path / "res"),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": [{"name": "sandbox_addition", "test_limit": 4}],
        "train": {"max_steps": 2},
    }
    (tmp_path / "idx.yaml").write_text(yaml.safe_dump(cfg))
    exp = load_experiment(tmp_path / "idx.yaml")
    store, cells = Store(exp.root), grid.expand(exp)
    done = [c for c in cells.unique() if c.kind in ("traces", "eval")][:3]
    for c in done:
        with store.open_cell(c.kind, c.key, c.config, c.upstream) as w:
            w.finish({})
    started = cells.baselines["sandbox_addition", "s"]
    if started in done:
        done.remove(started)
        shutil.rmtree(store.cell_dir(started.kind, started.key))
    store.cell_dir(started.kind, started.key).mkdir(parents=True)  # begun, not finished
    return store, cells, done


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for kind in sorted((root / index.LINKS).iterdir()):
        for link in sorted(kind.iterdir()):
            assert link.is_symlink()
            out[f"{kind.name}/{link.name}"] = os.readlink(link)
    return out


def test_every_complete_cell_has_a_relative_link_by_its_name(written, tmp_path: Path) -> None:
    store, cells, done = written
    notes: list[str] = []
    index.write(store, cells, note=notes.append)
    tree = _tree(store.root)
    assert notes == [] and len(tree) == len(done)  # the partial and missing cells have none
    for c in done:
        name = f"{c.kind}/" + c.label.split(":", 1)[1].replace("/", "__")
        assert tree[name] == os.path.join("..", "..", "cells", c.kind, c.key)
        assert (store.root / index.LINKS / name / "manifest.json").is_file()

    # a link left from an earlier rebuild goes; the results folder can move
    (store.root / index.LINKS / "eval" / "gone").symlink_to("../../cells/eval/nothing")
    index.write(store, cells, note=notes.append)
    assert _tree(store.root) == tree
    assert not list(store.root.glob(f".{index.LINKS}*"))
    moved = tmp_path / "moved"
    shutil.move(store.root, moved)
    for name in tree:
        assert (moved / index.LINKS / name / "manifest.json").is_file()


def test_names_are_safe_and_distinct() -> None:
    rows = [
        {"kind": "eval", "key": "a" * 20, "label": "eval:teacher/../up/x y", "status": "complete"},
        {"kind": "eval", "key": "b" * 20, "label": "eval:twin", "status": "complete"},
        {"kind": "eval", "key": "c" * 20, "label": "eval:twin", "status": "complete"},
        {"kind": "eval", "key": "d" * 20, "label": "eval:late", "status": "partial"},
    ]
    names = index.link_names(rows)
    assert set(names) == {"a" * 20, "b" * 20, "c" * 20}
    for name in names.values():
        kind, leaf = name.split("/")
        assert kind == "eval" and leaf not in ("", ".", "..") and " " not in leaf
    assert names["b" * 20] == "eval/twin~bbbbbbbb" and names["c" * 20] == "eval/twin~cccccccc"


def test_without_symbolic_links_the_tree_is_left_out_with_one_note(written, monkeypatch) -> None:
    store, cells, _ = written

    def refuse(*args, **kwargs):  # a file system without symbolic links (FAT, some mounts)
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", refuse)
    notes: list[str] = []
    path = index.write(store, cells, note=notes.append)
    assert path.is_file() and not (store.root / index.LINKS).exists()
    assert len(notes) == 1 and "no symbolic links" in notes[0] and index.NAME in notes[0]
    assert not list(store.root.glob(f".{index.LINKS}*"))
