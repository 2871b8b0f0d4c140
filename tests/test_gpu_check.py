"""The GPU check's dry run on the CPU (`--device cpu`: tiny sizes), end to end: the sandbox grid
through `cotgap run`, LoRA and full fine-tuning steps through cotgap's loss, generation, an FSDP
run of the training worker; the figures it prints as JSON. On a GPU machine `make gpu-check`
runs the same code at full size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-slow


def test_the_cpu_dry_run_reports_every_figure(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["device"].startswith("CPU")
    assert got["grid"]["leaderboard_rows"] >= 1  # the test teacher's distilled row
    for step in ("lora", "full"):
        assert got[step]["tokens_per_s"] > 0 and got[step]["peak_gb"] > 0
        assert got[step]["params"] > 9_000_000  # Qwen2.5's 151,936-token vocabulary, tiny body
        assert got[step]["mfu"] is None  # no peak FLOP/s is known for a CPU
    assert got["generate"]["new_tokens"] == 8 and got["generate"]["tokens_per_s"] > 0
    assert "2. lora fine-tuning:" in run.stdout and "3. generation:" in run.stdout
    fsdp = got["fsdp"]  # accelerate FSDP2 through the worker: sharded checkpoint, whole weights
    assert fsdp["steps"] == 4 and fsdp["sharded_checkpoint"] and fsdp["whole"]
    assert fsdp["dtypes"] == {"trained": "float32", "frozen": None}


def test_asking_for_cuda_without_a_gpu_says_how_to_dry_run():
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--skip-grid"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 1 and "--device cpu" in run.stderr
