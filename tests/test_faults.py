"""Fault injection: `cotgap run` SIGKILLed at 20+ seeded points across generate, train, evaluate and
analysis, resumed each time; the final artefacts equal an uninterrupted run's, byte for byte.

Kill points are progress thresholds (records streamed, checkpoints and files written under the
results directory) drawn with a fixed seed from the uninterrupted run's final count, so they land in
every stage. The whole process group is killed: the CLI, its engine child and its training worker.

    make test-slow      (CI runs it too)
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import sandbox_grid

from harness import plan
from harness.config import load_experiment
from harness.sandbox import zoo
from harness.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.faults]
REPO = Path(__file__).resolve().parents[1]
KILLS = 20
REGIMES = ["per_teacher", "intersection"]


def progress(root: Path) -> int:
    """Records streamed plus files written under the results directory (monotone during a run)."""
    cells = root / "cells"
    if not cells.is_dir():
        return 0
    count = 0
    for p in cells.rglob("*"):
        if not p.is_file() or ".tmp" in p.name:
            continue
        count += 1
        if p.suffix == ".jsonl":
            with open(p, "rb") as f:
                count += f.read().count(b"\n")
    return count


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the kill takes its children too
    )


def artefacts(root: Path) -> dict[str, bytes]:
    """Every output that must not depend on interruptions (timings and manifests excluded)."""
    out = {}
    for p in sorted((root / "cells").rglob("*")):
        rel = str(p.relative_to(root))
        if (
            p.is_file()
            and p.name in ("traces.jsonl", "predictions.jsonl", "examples.jsonl", "config.yaml")
            or p.is_file()
            and p.suffix == ".safetensors"
            and "checkpoints" not in rel
        ):
            out[rel] = p.read_bytes()
    out["leaderboard.csv"] = (root / "analysis" / "leaderboard.csv").read_bytes()
    return out


def write(tmp: Path, name: str) -> Path:
    config = tmp / f"{name}.yaml"
    grid = sandbox_grid("faults", tmp / name, checkpoint_every=3, regimes=REGIMES)
    config.write_text(yaml.safe_dump(grid))
    return config


def test_sigkill_at_seeded_points_then_resume_equals_uninterrupted(tmp_path):
    zoo.build(profile="test", progress=False)
    reference = write(tmp_path, "reference")
    assert start(reference).wait(timeout=1200) == 0
    ref_root = tmp_path / "reference" / "faults"
    total = progress(ref_root)

    config = write(tmp_path, "killed")
    root = tmp_path / "killed" / "faults"
    thresholds = sorted(random.Random(1234).sample(range(1, total), KILLS))
    killed_at = []
    for threshold in thresholds:
        proc = start(config)
        while proc.poll() is None and progress(root) < threshold:
            time.sleep(0.02)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at.append(progress(root))
    assert len(killed_at) >= KILLS - 2, (
        f"only {len(killed_at)} kills landed before the run finished"
    )
    # the kills are spread over the stages: some before any adapter, some after the first
    exp = load_experiment(config)
    store = Store(exp.root)
    assert start(config).wait(timeout=1200) == 0
    assert all(
        store.complete(c.kind, c.key)
        for c in plan.expand(exp)
        if not plan.skip(store, c, set(), print)
    )
    assert min(killed_at) < total * 0.3 and max(killed_at) > total * 0.7, (killed_at, total)

    got, want = artefacts(root), artefacts(ref_root)
    assert set(got) == set(want)
    assert [k for k in want if got[k] != want[k]] == []
    leftovers = [p for p in root.rglob("*") if ".tmp" in p.name]
    assert leftovers == []
