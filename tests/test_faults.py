"""Fault injection: `cotgap run` SIGKILLed at 20 seeded points across generate, train and evaluate,
resumed each time; the final artefacts equal an uninterrupted run's, byte for byte.

A kill is armed when the resumed run's log shows that a stage's work starts (see SCHEDULE) and
falls a seeded random delay later, so the kills land inside every stage's work. The whole process
group is killed: the CLI, its engine child and its training worker.

    make test-slow      (CI runs it too)
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
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
# Lines of a run's log that show a stage's work starting: the engine is up and the cell begins
# (generate, evaluate), a dataset group starts, the training loop starts. With the delay after
# them (seeded, uniform in [low, high] s), in stage order.
STAGES = {
    "traces": (r"generate \S+: traces:", 0.0, 1.0),
    "eval_pre": (r"evaluate \S+: eval:(teacher|baseline)", 0.0, 0.6),
    "dataset": (r"cells done\] dataset:", 0.0, 0.3),
    "adapter": (r"train adapter:\S+: \d+ to do", 0.0, 1.2),
    "eval": (r"evaluate \S+: eval:distilled", 0.0, 0.8),
    "analysis": (r"^analysis: ", 0.0, 1.5),
}
# The stage each kill aims at. A resumed run that has already passed that stage is killed in the
# next one it starts, so the kills walk through the whole run and every run is killed.
SCHEDULE = [
    *["traces"] * 4, *["eval_pre"] * 3, *["dataset"] * 2, *["adapter"] * 6, *["eval"] * 5,
    *["analysis"] * 2,
]  # fmt: skip
KILLS = len(SCHEDULE)
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


def stage_at(root: Path) -> str:
    """The stage a killed run was in: the kind of a cell it had started and not completed, else
    "between cells" (planning, start-up, analysis)."""
    cells = root / "cells"
    open_kinds = {
        d.parent.name
        for d in (cells.glob("*/*") if cells.is_dir() else [])
        if d.is_dir() and not (d / "manifest.json").exists()
    }
    return "/".join(sorted(open_kinds)) or "between cells"


def start(config: Path, output: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if output else subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: the kill takes its children too
    )


def wait_for_stage(proc: subprocess.Popen, stage: str, timeout: float = 600) -> str | None:
    """Read the run's log (stderr) until the work of `stage`, or of a later stage, starts; that
    stage's name, or None when the run ends first."""
    names = list(STAGES)
    later = names[names.index(stage) :]
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            hit = next((n for n in later if re.search(STAGES[n][0], line)), None)
            if hit and not seen:
                seen.append(hit)
                found.set()
        found.set()  # EOF: the run ended

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout)
    return seen[0] if seen and proc.poll() is None else None


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
    # more items and steps than the other test grids: the work between start-ups is long enough
    # (about a second a stage) for kills to land inside it
    grid = sandbox_grid(
        "faults", tmp / name, train_limit=64, max_steps=40, checkpoint_every=5, regimes=REGIMES
    )
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
    rng = random.Random(1234)
    killed_at, stages = [], []
    for aim in SCHEDULE:
        proc = start(config, output=True)
        stage = wait_for_stage(proc, aim)
        if stage:
            time.sleep(rng.uniform(*STAGES[stage][1:]))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at.append(progress(root))
            stages.append((stage, stage_at(root)))
    assert len(killed_at) >= KILLS - 2, f"only {len(killed_at)} kills landed: {stages}"
    exp = load_experiment(config)
    store = Store(exp.root)
    assert start(config).wait(timeout=1200) == 0
    assert all(
        store.complete(c.kind, c.key)
        for c in plan.expand(exp)
        if not plan.skip(store, c, set(), print)
    )
    hit = Counter(stage for stage, _ in stages)
    print(f"\n{len(killed_at)} kills, progress (of {total}): {killed_at}")
    print(f"kills by stage: {dict(hit)}; cells open at the kill: {[s for _, s in stages]}")
    assert set(hit) == set(STAGES), hit  # every stage of the run took kills

    got, want = artefacts(root), artefacts(ref_root)
    assert set(got) == set(want)
    assert [k for k in want if got[k] != want[k]] == []
    leftovers = [p for p in root.rglob("*") if ".tmp" in p.name]
    assert leftovers == []
