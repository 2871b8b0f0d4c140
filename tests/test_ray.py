"""The Ray executor on a local Ray cluster: same leaderboard as the local executor, and a worker
killed mid-cell is retried to a complete, correct result."""

from __future__ import annotations

import csv
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import TEST_TEACHERS, sandbox_grid

from harness.analysis import analyze
from harness.config.loading import load_experiment
from harness.execution import plan
from harness.execution.schedule import RunOptions
from harness.sandbox import zoo
from harness.store import Store
from harness.workflow import grid

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.faults]  # make test-slow (CI runs it too)


def _killer(root: Path, stop: threading.Event, killed: list[int]) -> None:
    """Kill the first worker that starts a traces cell, once it has streamed some records."""
    logs = root / "logs"
    while not stop.is_set():
        for pid_file in logs.glob("traces-*.pid") if logs.is_dir() else []:
            traces = (
                root / "cells" / "traces" / pid_file.stem.removeprefix("traces-") / "traces.jsonl"
            )
            if traces.exists() and traces.stat().st_size > 0:
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.05)


def board(root: Path) -> list[dict]:
    with open(root / "analysis" / "leaderboard.csv") as f:
        rows = list(csv.DictReader(f))
    keep = (
        "row_type",
        "teacher",
        "student",
        "base_acc",
        "post_acc",
        "gain",
        "teacher_acc",
        "eval_key",
    )
    return [{k: r[k] for k in keep} for r in rows]


def test_ray_matches_local_and_survives_a_killed_worker(tmp_path):
    zoo.build(profile="test", progress=False)
    configs = {}
    for name in ("local", "ray"):
        data = sandbox_grid("raygrid", tmp_path / name, teachers=TEST_TEACHERS[:1], max_steps=8)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
        configs[name] = load_experiment(tmp_path / f"{name}.yaml")

    local = configs["local"]
    plan.run(local, Store(local.root))
    analyze.run(local, Store(local.root))

    exp = configs["ray"]
    store = Store(exp.root)
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_killer, args=(exp.root, stop, killed), daemon=True)
    watcher.start()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        counts = plan.run(exp, store, options=RunOptions(executor="ray"))
    finally:
        stop.set()
        ray.shutdown()
    assert killed, "the test never killed a worker"
    assert sum(counts.values()) == len(grid.expand(exp).unique())
    assert all(store.complete(c.kind, c.key) for c in grid.expand(exp))
    traces = next(c for c in grid.expand(exp) if c.kind == "traces")
    lines = (store.cell_dir("traces", traces.key) / "traces.jsonl").read_bytes()
    local_lines = (Store(local.root).cell_dir("traces", traces.key) / "traces.jsonl").read_bytes()
    assert lines == local_lines  # the retried cell resumed: nothing lost or duplicated
    assert not list(exp.root.rglob(".*.tmp-*"))
    analyze.run(exp, store)
    assert board(exp.root) == board(local.root)
