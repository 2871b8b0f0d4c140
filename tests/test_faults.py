"""Fault injection: `cotgap run` SIGKILLed at 20 seeded points across generate, train and evaluate,
resumed each time; the final artefacts equal an uninterrupted run's, byte for byte.

A kill is armed when the resumed run's log shows that a stage's work starts (see SCHEDULE) and
falls a seeded random delay later, so the kills land inside every stage's work. The whole process
group is killed: the CLI, its engine child and its training worker.

    make test-slow      (CI runs it too)
"""

from __future__ import annotations

import json
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

from harness.config.loading import load_experiment
from harness.execution import schedule
from harness.sandbox import zoo
from harness.sandbox.random_model import random_llama
from harness.store import Store, read_jsonl
from harness.workflow import grid as grids
from harness.workflow.cells import KINDS

pytestmark = [pytest.mark.slow, pytest.mark.faults]
REPO = Path(__file__).resolve().parents[1]
# Lines of a run's log that show a stage's work starting: the engine is up and the cell begins
# (generate, evaluate), a dataset group starts, the training loop starts. With the delay after
# them (seeded, uniform in [low, high] s), in stage order.
STAGES = {
    "traces": (r"generate \S+: traces:", 0.0, 1.0),
    "eval_pre": (r"evaluate \S+: eval:(teacher|baseline)", 0.0, 0.6),
    "dataset": (r"cells done\] dataset:", 0.0, 0.3),
    "adapter": (r"train adapter:\S+: \d+ steps to do", 0.0, 1.2),
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


# --- training groups: adapters of one student share a worker ------------------------------------


def training_workspace(tmp: Path, name: str, **train: object) -> Path:
    """A config whose traces cells are already on disk (written here, no engine), so that
    `cotgap train` builds the datasets and trains 2 teachers x 3 seeds = 6 adapters of one student
    (a random-init tiny Llama) in one worker."""
    model = tmp / "tiny-llama"
    if not model.is_dir():
        random_llama(model, tie_embeddings=False, max_positions=256)
    teachers = [
        {"name": n, "path": str(model), "engine": {"max_model_len": 200 + i}}
        for i, n in enumerate(["t-a", "t-b"])
    ]
    grid = sandbox_grid("groups", tmp / name, teachers=teachers, seeds=[0, 1, 2], **train)
    grid["students"] = [{"name": "stu", "path": str(model)}]
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(grid))
    exp = load_experiment(config)
    store = Store(exp.root)
    for cell in grids.expand(exp):
        if cell.kind == "traces":
            rng = random.Random(cell.model)
            with store.open_cell("traces", cell.key, cell.config) as out:
                out.write_text(
                    "traces.jsonl", "".join(json.dumps(coin(rng, i)) + "\n" for i in range(64))
                )
                out.finish()
    return config


def coin(rng: random.Random, i: int) -> dict:
    flips = " ".join(rng.choice(["flips", "keeps"]) for _ in range(rng.randint(1, 4)))
    answer = "yes" if flips.count("flips") % 2 == 0 else "no"
    return {
        "id": f"coin-{i}",
        "sample": 0,
        "prompt": f"A coin is heads up. Ann {flips} it. Is it still heads up?",
        "completion": f"Ann {flips} it. The answer is {answer}.",
        "finish_reason": "stop",
        "correct": True,
    }


CHECKPOINT_S = 1.0  # train.checkpoint_seconds in the group tests (the default is 60)
GROUP_STEPS = 60  # long enough for >= 3 kills on a fast idle machine (30 allowed only 2)


class Log:
    """A run's stderr, read by a thread: every line, and a wait for a pattern."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()
        with self._new:
            self.lines.append("")  # EOF
            self._new.notify_all()

    def text(self, timeout: float = 30) -> str:
        """All of it, once the run closed its stderr."""
        with self._new:
            self._new.wait_for(lambda: "" in self.lines, timeout)
            return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 300) -> bool:
        """Whether a line matching `pattern` came before EOF (and within `timeout` s)."""
        with self._new:
            return bool(
                self._new.wait_for(
                    lambda: any(re.search(pattern, ln) for ln in self.lines) or "" in self.lines,
                    timeout,
                )
                and any(re.search(pattern, ln) for ln in self.lines)
            )


def cotgap_popen(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Log]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, Log(proc)


def durable_steps(root: Path) -> tuple[int, float]:
    """(Steps a resume keeps: every complete adapter's plus each open one's last checkpoint;
    seconds of training logged after the open cells' last checkpoints: what the kill lost)."""
    kept, lost = 0, 0.0
    for cell in sorted((root / "cells" / "adapter").glob("*")):
        if not cell.is_dir():
            continue
        if (cell / "manifest.json").exists():
            kept += GROUP_STEPS
            continue
        steps = [int(p.name[5:]) for p in (cell / "checkpoints").glob("step-*")]
        at = max(steps, default=0)
        kept += at
        log = read_jsonl(cell / "train_log.jsonl")
        if log:
            before = [r["elapsed"] for r in log if r["step"] == at] or [0.0]
            lost += log[-1]["elapsed"] - before[0]
    return kept, lost


def group_artefacts(root: Path) -> dict[str, bytes]:
    """Training outputs that must not depend on kills: weights, adapter config, datasets, configs,
    and the step log without its timings."""
    out = {}
    for p in sorted((root / "cells").rglob("*")):
        rel = str(p.relative_to(root))
        if not p.is_file() or "checkpoints" in rel:
            continue
        if p.suffix == ".safetensors" or p.name in (
            "adapter_config.json",
            "examples.jsonl",
            "config.yaml",
        ):
            out[rel] = p.read_bytes()
        elif p.name == "train_log.jsonl":
            rows = [{k: r[k] for k in ("step", "loss", "lr", "tokens")} for r in read_jsonl(p)]
            out[rel] = json.dumps(rows).encode()
    return out


def test_kills_during_a_training_group_always_make_progress(tmp_path):
    """Finding: adapters sharing a worker were completed only when the whole group ended, and
    resumed from step 0, so kills closer together than a group never let a run finish. Now every
    kill (SIGKILL of the whole process group at a seeded random time after training starts) leaves
    more durable steps than the one before, loses at most about `checkpoint_seconds` of training,
    and the final artefacts equal an uninterrupted run's."""
    settings = {"max_steps": GROUP_STEPS, "checkpoint_seconds": CHECKPOINT_S}
    one = {"COTGAP_TRAIN_WORKERS": "1"}  # the six adapters in one worker: a group to kill into
    reference = training_workspace(tmp_path, "reference", **settings)
    # the uninterrupted run trains while the kills go on (its worker mostly has a core to itself:
    # the killed runs spend much of their time starting up); its weights do not depend on timing
    uninterrupted, _ = cotgap_popen("train", str(reference), env=one)
    config = training_workspace(tmp_path, "killed", **settings)
    root = load_experiment(config).root
    rng = random.Random(23)
    kept, lost, start = [0], [], time.time()
    for attempt in range(40):
        proc, log = cotgap_popen("train", str(config), env=one)
        if not log.wait_for(r"train adapter:\S+: \d+ steps to do"):
            break  # the run ended without training: nothing was left to do
        time.sleep(rng.uniform(CHECKPOINT_S + 1.0, CHECKPOINT_S + 2.0))
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        now, lost_s = durable_steps(root)
        assert now > kept[-1], f"kill {attempt + 1} made no progress: {kept} then {now}"
        kept.append(now)
        lost.append(lost_s)
    assert proc.wait() == 0, "".join(log.lines[-20:])
    print(
        f"\n{len(lost)} kills in {time.time() - start:.0f} s; durable steps after each kill "
        f"(of {6 * GROUP_STEPS}): {kept[1:]}; training lost per kill (s): "
        f"{[round(x, 2) for x in lost]}"
    )
    assert len(lost) >= 3, "the kills came too late to test anything"
    assert max(lost) <= CHECKPOINT_S + 2.0  # one checkpoint interval, one step, the save
    assert uninterrupted.wait(timeout=600) == 0
    got, want = group_artefacts(root), group_artefacts(load_experiment(reference).root)
    assert sum(k.endswith("adapter_model.safetensors") for k in want) == 6
    assert set(got) == set(want)
    assert [k for k in want if got[k] != want[k]] == []
    leftovers = [p for p in root.rglob("*") if ".tmp" in p.name or p.name.endswith(".lock")]
    assert leftovers == [] and not list(root.glob("cells/adapter/*/checkpoints"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_run_and_its_workers_and_the_run_resumes(tmp_path, sig):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM to cotgap
    alone (kill PID, a scheduler): the workers stop, one line says the results are kept, the exit
    status is 128 + the signal, nothing is left locked or half-written, and a re-run completes."""
    import psutil

    config = training_workspace(tmp_path, "sig", max_steps=GROUP_STEPS, checkpoint_seconds=1.0)
    root = load_experiment(config).root
    proc, log = cotgap_popen("train", str(config))
    assert log.wait_for(r"train adapter:\S+: \d+ steps to do"), "".join(log.lines)
    time.sleep(1.5)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers, "no training worker to stop"
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    assert proc.wait(timeout=60) == 128 + sig
    psutil.wait_procs(workers, timeout=30)
    assert not [w for w in workers if w.is_running()], "a worker outlived cotgap"
    text = log.text()
    assert "Traceback" not in text, text
    name = signal.Signals(sig).name
    line = f"interrupted ({name}): results in {root} are kept; re-run the same command to resume."
    assert text.rstrip().endswith(line), text[-2000:]
    assert not [p for p in root.rglob("*") if ".tmp" in p.name or p.name.endswith(".lock")]
    again, log = cotgap_popen("train", str(config))
    assert again.wait(timeout=600) == 0, "".join(log.lines[-20:])
    assert len(list(root.glob("cells/adapter/*/manifest.json"))) == 6


def test_sigkill_at_seeded_points_then_resume_equals_uninterrupted(tmp_path):
    zoo.build(profile="test", progress=False)
    # the uninterrupted run goes on while the kills do (the killed runs spend much of their time
    # starting up, on one core); what it writes does not depend on timing
    uninterrupted = start(write(tmp_path, "reference"))
    ref_root = tmp_path / "reference" / "faults"

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
    # nothing left to compute: a schedule of the whole grid hands no group to its stage table
    # (a fake table that records), only the skipped adapters of empty training sets
    g, left = grids.expand(exp), []
    record = {kind: lambda e, s, cells: left.extend(c.label for c in cells) for kind in KINDS}
    schedule.run_local(exp, store, schedule.Schedule(g, g, store), record)
    assert left == []
    assert uninterrupted.wait(timeout=1200) == 0
    hit = Counter(stage for stage, _ in stages)
    print(f"\n{len(killed_at)} kills, progress (of {progress(ref_root)}): {killed_at}")
    print(f"kills by stage: {dict(hit)}; cells open at the kill: {[s for _, s in stages]}")
    assert set(hit) == set(STAGES), hit  # every stage of the run took kills

    got, want = artefacts(root), artefacts(ref_root)
    assert set(got) == set(want)
    assert [k for k in want if got[k] != want[k]] == []
    leftovers = [p for p in root.rglob("*") if ".tmp" in p.name]
    assert leftovers == []
