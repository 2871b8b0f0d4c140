"""The cell store: keys, atomic cells, JSONL that survives SIGKILL, the results-directory lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness.errors import LockedError
from harness.store import JsonlWriter, Store, cell_key, read_jsonl, safe_name


def test_cell_key_depends_on_config_upstream_and_versions():
    base = cell_key("traces", {"a": 1, "b": [1, 2]}, ("u1",), {"vllm": "0.32.0"})
    assert base == cell_key(
        "traces", {"b": [1, 2], "a": 1}, ("u1",), {"vllm": "0.32.0"}
    )  # key order
    assert len(base) == 20 and all(c in "0123456789abcdef" for c in base)
    assert base != cell_key("traces", {"a": 2, "b": [1, 2]}, ("u1",), {"vllm": "0.32.0"})
    assert base != cell_key("traces", {"a": 1, "b": [1, 2]}, ("u2",), {"vllm": "0.32.0"})
    assert base != cell_key("traces", {"a": 1, "b": [1, 2]}, ("u1",), {"vllm": "0.33.0"})
    assert base != cell_key("eval", {"a": 1, "b": [1, 2]}, ("u1",), {"vllm": "0.32.0"})


@pytest.mark.parametrize(
    "name", ["../../etc", "..", ".", "a/b", "/abs/path", "x\x00y", "", "Qwen/Qwen2.5-0.5B"]
)
def test_safe_name_cannot_escape(tmp_path, name):
    s = safe_name(name)
    assert s and "/" not in s and "\x00" not in s and s not in (".", "..")
    assert (tmp_path / s).resolve().parent == tmp_path.resolve()


def test_safe_name_is_injective_on_unsafe_names():
    assert safe_name("a/b") != safe_name("a_b")
    assert safe_name("plain-name.v1") == "plain-name.v1"


def test_cell_is_absent_until_finished_and_records_provenance(tmp_path):
    store = Store(tmp_path / "exp")
    key = cell_key("eval", {"x": 1})
    with store.open_cell("eval", key, {"x": 1}, upstream=["up"]) as cell:
        w = cell.jsonl("predictions.jsonl")
        w.write({"id": "a", "correct": True})
        assert not store.complete("eval", key)
        cell.write_json("metrics.json", {"accuracy": 1.0})
        manifest = cell.finish({"accuracy": 1.0})
    assert store.complete("eval", key)
    on_disk = json.loads((store.cell_dir("eval", key) / "manifest.json").read_text())
    assert on_disk == manifest
    assert set(manifest["outputs"]) == {"config.yaml", "metrics.json", "predictions.jsonl"}
    for field in ("git", "packages", "host", "start", "end", "wall_s", "upstream"):
        assert field in manifest
    assert "commit" in manifest["git"] and "dirty" in manifest["git"]
    assert not list(store.cell_dir("eval", key).glob(".*tmp*"))


def test_bad_cell_address_is_refused(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(ValueError):
        store.cell_dir("eval", "../../etc")
    with pytest.raises(ValueError):
        store.cell_dir("nonsense", "0" * 20)


def test_jsonl_repairs_partial_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"i": 0}\n{"i": 1}\n{"i": 2, "trunc')
    w = JsonlWriter(p)
    assert [r["i"] for r in w.records] == [0, 1]
    w.write({"i": 2})
    w.close()
    assert [r["i"] for r in read_jsonl(p)] == [0, 1, 2]


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from harness.store import JsonlWriter
    w = JsonlWriter(Path(sys.argv[1]))
    start = len(w.records)
    for i in range(start, 10**7):
        w.write({"i": i, "pad": "x" * (i % 300)})
        print(i, flush=True)  # printed only after the record was written
    """
)


@pytest.mark.parametrize("rounds", [3])
def test_sigkill_mid_stream_loses_and_duplicates_nothing(tmp_path, rounds):
    path = tmp_path / "stream.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    acknowledged = -1
    for r in range(rounds):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
        )
        deadline = time.time() + 30
        last = None
        # kill at a different point in each round
        target = 200 * (r + 1) + acknowledged
        for line in proc.stdout:
            last = int(line)
            if last >= target or time.time() > deadline:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert last is not None
        acknowledged = max(acknowledged, last)
        records = read_jsonl(path, repair=True)
        ids = [rec["i"] for rec in records]
        assert ids == list(range(len(ids))), "records lost, duplicated or reordered"
        assert len(ids) >= acknowledged + 1, "an acknowledged (flushed) record was lost"
    assert acknowledged >= 200 * rounds - 1


HOLDER = textwrap.dedent(
    """
    import sys, time
    from harness.store import Store
    with Store(sys.argv[1]).lock():
        print("locked", flush=True)
        time.sleep(60)
    """
)


def test_second_process_on_same_results_dir_is_refused_then_waits(tmp_path):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    root = tmp_path / "exp"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        with (
            pytest.raises(LockedError, match="another cotgap process"),
            Store(root).lock(timeout=0),
        ):
            pass
        t = time.time()
        with pytest.raises(LockedError), Store(root).lock(timeout=0.5):
            pass
        assert time.time() - t >= 0.45  # it waited before giving up
    finally:
        proc.kill()
        proc.wait()
    with Store(root).lock(timeout=5):  # the lock dies with its holder
        pass


def test_cell_lock_prevents_two_writers(tmp_path):
    store = Store(tmp_path)
    key = cell_key("traces", {"k": 1})
    first = store.open_cell("traces", key, {"k": 1})
    second = store.open_cell("traces", key, {"k": 1})
    with first, pytest.raises(LockedError, match="being computed"), second:
        pass


def test_no_lock_file_stays_behind(tmp_path):
    store = Store(tmp_path / "exp")
    key = cell_key("eval", {"x": 1})
    with store.lock(), store.open_cell("eval", key, {"x": 1}) as cell:
        assert (tmp_path / "exp" / ".lock").exists()
        cell.finish()
    with store.open_cell("eval", cell_key("eval", {"x": 2}), {"x": 2}):
        pass  # left unfinished: its directory stays, its lock file does not
    assert sorted(p.name for p in (tmp_path / "exp").rglob("*.lock")) == []
    with store.lock(timeout=0), store.open_cell("eval", key, {"x": 1}):
        pass  # and both locks can be taken again


def test_damaged_manifest_names_the_file_and_check_lists_the_cell(tmp_path):
    from harness.errors import UserError

    store = Store(tmp_path / "exp")
    keys = [cell_key("eval", {"x": i}) for i in range(4)]
    for i, key in enumerate(keys):
        with store.open_cell("eval", key, {"x": i}) as cell:
            cell.write_json("metrics.json", {"accuracy": i / 4})
            cell.finish({"accuracy": i / 4})
    assert store.check() == []
    d = [store.cell_dir("eval", k) for k in keys]
    manifest = d[0] / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])  # cut short (a full disk, a crash)
    (d[1] / "metrics.json").write_text('{"accuracy": 1.0}')  # changed
    (d[2] / "metrics.json").unlink()  # missing
    with pytest.raises(UserError) as e:
        store.manifest("eval", keys[0])
    assert str(manifest) in str(e.value) and f"delete {d[0]}" in str(e.value)
    assert "Traceback" not in str(e.value)
    assert sorted(store.check()) == sorted(
        [
            ("eval", keys[0], "manifest.json is damaged"),
            ("eval", keys[1], "metrics.json differs from its manifest hash"),
            ("eval", keys[2], "metrics.json is missing"),
        ]
    )


def test_lock_files_of_a_killed_run_go_with_the_next_run(tmp_path):
    """SIGKILL skips every release: the next run on the directory removes the cell lock files
    that no process holds, and leaves a held one alone."""
    store = Store(tmp_path / "exp")
    stale, held = (store.root / "cells" / "adapter" / f"{k * 20}.lock" for k in "ab")
    stale.parent.mkdir(parents=True)
    stale.touch()
    holder = store.open_cell("adapter", "b" * 20, {})
    with holder:
        with store.lock():
            pass
        assert not stale.exists() and held.exists()
    assert not held.exists()


def test_an_interrupted_atomic_write_leaves_no_temporary(tmp_path, monkeypatch):
    """A signal raised as an exception mid-write (errors.stop_on_signals) removes the temporary and
    keeps the old file whole."""
    from harness.errors import Interrupted
    from harness.store import atomic_write_text

    path = tmp_path / "train_log.jsonl"
    atomic_write_text(path, "old\n")

    def interrupted(fd):
        raise Interrupted(15)

    monkeypatch.setattr("harness.store.os.fsync", interrupted)
    with pytest.raises(Interrupted):
        atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["train_log.jsonl"]


def test_the_next_write_removes_a_killed_writers_temporary(tmp_path):
    """A SIGKILL between the write and the rename leaves `.<name>.tmp-<pid>`: the next write of the
    same file removes it; a live process's temporary is left alone."""
    from harness.store import atomic_write_text

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead_pid = int(dead.stdout)
    (tmp_path / f".index.csv.tmp-{dead_pid}").write_text("half")
    (tmp_path / f".index.csv.tmp-{os.getppid()}").write_text("being written")  # alive
    atomic_write_text(tmp_path / "index.csv", "a,b\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".index.csv.tmp-{os.getppid()}",
        "index.csv",
    ]
